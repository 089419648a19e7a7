//! ISO base media files (MP4, MOV, M4A): what a movie holds, read from its
//! `ftyp` and `moov` boxes only.
//!
//! Two halves. [`locate_movie`] walks the top-level boxes through ranged
//! reads of any [`RangeSource`], jumping over `mdat` by its declared size, so
//! a `moov` at the end of a multi-gigabyte file costs two or three small
//! reads. [`parse_movie`] is pure: it turns the `ftyp` and `moov` bytes into
//! a [`MovieInfo`]. Every size in the file is checked against the bytes that
//! hold it, so a truncated or lying file is an error naming the box, never a
//! panic or an endless read.
//!
//! By concept: [`boxes`] (box headers, the bounds-checked cursor, children),
//! [`locate`] (the ranged walk over the top-level boxes), [`movie`] (the
//! pure parse of `ftyp` and `moov`), [`fragments`] (a fragmented file's
//! index and last fragment, for its duration), [`samples`] (where each
//! sample lies, and the bytes a stretch of the movie needs).

use std::ops::Range;

mod boxes;
mod fragments;
pub mod heif;
mod locate;
mod movie;
pub mod samples;

// The reader's API; the handler's steps use only part of it.
#[allow(unused_imports)]
pub use fragments::FragmentIndex;
#[allow(unused_imports)]
pub use locate::{locate_movie, looks_like_movie, MovieBoxes};
#[allow(unused_imports)]
pub use movie::{parse_boxes, parse_movie, MovieInfo, TrackInfo};

/// Bytes read at each top-level box whose header is not already at hand:
/// enough for `ftyp`, a small `moov` and the next header in one request.
pub const WINDOW_BYTES: u64 = 64 * 1024;

/// The largest `moov` read. A two-hour film's is a few megabytes; beyond
/// this the file is refused rather than held in memory.
pub const MAX_MOOV_BYTES: u64 = 64 * 1024 * 1024;

/// Top-level boxes walked before giving up (fragmented files have two per
/// fragment; thousands of tiny boxes are a lie or an attack).
pub const MAX_TOP_LEVEL_BOXES: usize = 100_000;

/// Why a file could not be read as a movie.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmffError {
    #[error("truncated file: {0}")]
    Truncated(String),
    #[error("malformed box: {0}")]
    Malformed(String),
    #[error("not a movie: {0}")]
    NotAMovie(String),
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("reading bytes {start}-{end} failed: {message}")]
    Read {
        start: u64,
        end: u64,
        message: String,
    },
}

impl BmffError {
    /// Whether the file itself is at fault (every error but a failed read):
    /// reading it again gives the same answer.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, BmffError::Read { .. })
    }
}

/// Where [`locate_movie`] reads from: an S3 object, a local file, a slice.
#[async_trait::async_trait]
pub trait RangeSource: Send + Sync {
    /// The bytes in `range`, which never reaches past the source's size.
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String>;
}

#[async_trait::async_trait]
impl RangeSource for [u8] {
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String> {
        self.get(range.start as usize..range.end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("range {range:?} outside {} bytes", self.len()))
    }
}

#[async_trait::async_trait]
impl RangeSource for std::fs::File {
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String> {
        use std::os::unix::fs::FileExt;
        // A moov can be 64 MiB: read it on a blocking thread, not a runtime one.
        let file = self.try_clone().map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0u8; (range.end - range.start) as usize];
            file.read_exact_at(&mut buffer, range.start)
                .map_err(|e| e.to_string())?;
            Ok(buffer)
        })
        .await
        .map_err(|e| format!("reading the file: {e}"))?
    }
}

/// Reads a movie from a source of `size` bytes whose first bytes, if the
/// caller has them, are `start`: [`locate_movie`], then [`parse_boxes`].
pub async fn read_movie<S: RangeSource + ?Sized>(
    source: &S,
    size: u64,
    start: &[u8],
) -> Result<MovieInfo, BmffError> {
    parse_boxes(&locate_movie(source, size, start).await?)
}

#[cfg(test)]
mod tests;
