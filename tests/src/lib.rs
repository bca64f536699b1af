//! conformance helpers
