//! A partial copy of an MP4/MOV for encoding one span of it: the bytes a
//! demuxer reads to find the `moov` (the same walk, [`bmff::locate_movie`]),
//! and the samples the span's decode needs ([`bmff::samples::span_ranges`]),
//! written at their offsets in a sparse file of the source's size. Every
//! other byte is a hole: it takes no space in `/tmp` and is never read
//! from the source, so a chunk of a 20 GB upload costs its own stretch of
//! transfer and scratch space, not 20 GB.

use std::ops::Range;
use std::path::Path;

use super::Span;
use crate::bmff::{self, samples, RangeSource};
use crate::step::StepError;

/// Ranges less than this apart are read as one: a request costs more than
/// the bytes between.
pub const JOIN_GAP_BYTES: u64 = 256 * 1024;

/// Seconds of the source read on each side of a span beyond what it
/// encodes: the audio roll (two AAC frames) and the seek's own margin, with
/// room for an edit list's shift.
pub const MARGIN_SECONDS: f64 = 1.0;

/// What a partial copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseCopy {
    /// The ranges copied, sorted and merged.
    pub ranges: Vec<Range<u64>>,
    /// Their bytes.
    pub bytes: u64,
}

/// The ranges of a source of `size` bytes, whose walk to the `moov` was
/// `boxes`, that encoding `span` of it needs: that walk's reads, and the
/// span's samples. Pure.
pub fn plan_copy(
    boxes: &bmff::MovieBoxes,
    size: u64,
    span: &Span,
) -> Result<SparseCopy, bmff::BmffError> {
    let start = span.start_ms as f64 / 1000.0;
    let end = span.end_ms.map(|end| end as f64 / 1000.0);
    let tracks = samples::track_samples(&boxes.moov)?;
    let mut ranges = boxes.ranges.clone();
    ranges.extend(samples::span_ranges(
        &tracks,
        start,
        end,
        MARGIN_SECONDS,
        JOIN_GAP_BYTES,
    ));
    samples::merge(&mut ranges, 0);
    for range in &mut ranges {
        range.end = range.end.min(size);
    }
    ranges.retain(|r| r.start < r.end);
    let bytes = ranges.iter().map(|r| r.end - r.start).sum();
    Ok(SparseCopy { ranges, bytes })
}

/// Writes `copy`'s ranges of `source` at their offsets into a new file at
/// `path` of `size` bytes, the rest holes.
pub async fn write_copy<S: RangeSource + ?Sized>(
    source: &S,
    size: u64,
    copy: &SparseCopy,
    path: &Path,
) -> Result<(), StepError> {
    use std::os::unix::fs::FileExt;
    let failed = |what: String| StepError::Failed(format!("writing {}: {what}", path.display()));
    let file = std::fs::File::create(path).map_err(|e| failed(e.to_string()))?;
    file.set_len(size).map_err(|e| failed(e.to_string()))?;
    for range in &copy.ranges {
        // A piece at a time: a span's samples can be hundreds of MB.
        let mut at = range.start;
        while at < range.end {
            let piece = at..range.end.min(at + 8 * 1024 * 1024);
            let bytes = source
                .read_range(piece.clone())
                .await
                .map_err(|e| StepError::Input(format!("reading bytes {piece:?}: {e}")))?;
            if bytes.len() as u64 != piece.end - piece.start {
                return Err(StepError::Input(format!(
                    "reading bytes {piece:?}: got {} bytes",
                    bytes.len()
                )));
            }
            file.write_all_at(&bytes, piece.start)
                .map_err(|e| failed(e.to_string()))?;
            at = piece.end;
        }
    }
    file.sync_all().map_err(|e| failed(e.to_string()))
}
