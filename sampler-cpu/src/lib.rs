//! sampler-cpu
