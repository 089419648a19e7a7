//! JPEG's own syntax, read in Rust for two jobs jpeg-decoder and
//! jpeg-encoder leave to mediaonce's thumbnail step: a big photo decoded
//! at a reduced scale from only the coefficients that scale needs
//! (`scaled`, with the IDCTs and colour conversion after them in
//! `reconstruct`, each subsampled chroma through an IDCT of its own
//! size), and the thumbnail's JPEG
//! written again from its own coefficients with optimal Huffman tables,
//! as one baseline scan (`optimize`) or as libjpeg's progressive scans
//! (`progressive`). They read the markers before a scan (`syntax`) and
//! its Huffman-coded bits (`entropy`, `coefficients`) the same way, and
//! the writers code their scans through `scan_writer`.
//!
//! A crate of its own so that it is built for speed (`opt-level = 3`, as
//! the codec crates it sits beside) while the rest of the bootstrap is
//! built for size: the decode of a 12 MP photo is most of a thumbnail's
//! time.

mod coefficients;
mod entropy;
mod reconstruct;
mod scan_writer;
mod syntax;
#[cfg(test)]
mod test_images;

pub mod optimize;
pub mod progressive;
pub mod scaled;
pub mod write;
pub use syntax::subsampling;
