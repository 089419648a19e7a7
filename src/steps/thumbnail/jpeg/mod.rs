//! JPEG's own syntax, read in Rust for two jobs jpeg-decoder and
//! jpeg-encoder leave to us: a big photo decoded at a reduced scale from
//! only the coefficients that scale needs (`scaled`, with jpeg-decoder's
//! arithmetic after them in `reconstruct`), and the thumbnail's JPEG
//! written again from its own coefficients with optimal Huffman tables,
//! as one baseline scan (`optimize`) or as libjpeg's progressive scans
//! (`progressive`). They read the markers before a scan (`syntax`) and
//! its Huffman-coded bits (`entropy`, `coefficients`) the same way, and
//! the writers code their scans through `scan_writer`.

mod coefficients;
mod entropy;
mod reconstruct;
mod scan_writer;
mod syntax;
#[cfg(test)]
mod test_images;

pub(super) mod optimize;
pub(super) mod progressive;
pub(super) mod scaled;
pub(super) use syntax::subsampling;
