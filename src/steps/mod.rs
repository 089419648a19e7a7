//! The built-in steps.

pub mod probe;
pub mod thumbnail;
