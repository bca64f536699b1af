//! examples library

pub mod llama2;
