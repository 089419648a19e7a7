//! The built-in steps.

pub mod probe;
