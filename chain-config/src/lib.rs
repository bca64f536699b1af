//! chain-config
