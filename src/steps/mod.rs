//! The built-in steps.

pub mod hls;
pub mod probe;
pub mod thumbnail;
