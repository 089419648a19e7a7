//! JPEG's own syntax, read in Rust for two jobs jpeg-decoder and
//! jpeg-encoder leave to us: a big photo decoded at a reduced scale from
//! only the coefficients that scale needs (`scaled`, with jpeg-decoder's
//! arithmetic after them in `reconstruct`), and optimal Huffman tables for
//! the files jpeg-encoder writes (`optimize`). Both read the markers
//! before the scan (`syntax`) and its Huffman-coded bits (`entropy`) the
//! same way.

mod entropy;
mod reconstruct;
mod syntax;

pub(super) mod optimize;
pub(super) mod scaled;
