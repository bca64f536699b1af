//! examples library
