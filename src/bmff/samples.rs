//! Where a movie's samples lie in its file, and which bytes a stretch of
//! it needs: so that a job encoding part of a long upload (a chunk of
//! `hls-package`) reads the `moov` and its own samples, not the whole
//! file. Pure: the `moov` body in, byte ranges out.
//!
//! Each track's sample table is expanded once: decode times (`stts`),
//! sizes (`stsz`), file offsets (`stsc` over `stco`/`co64`) and sync
//! samples (`stss`; none listed means every sample is one), placed on the
//! movie's presentation timeline by the track's edit list (`elst`: leading
//! empty edits delay it, the first edit's media time advances it). Every
//! count is checked against the bytes that hold it, and the samples a
//! table may expand to are capped, so a lying file is an error naming the
//! box, never a panic or an allocation it chose.

use std::ops::Range;

use super::boxes::{child, children, Cursor};
use super::movie::{handler_type, movie_header, time_header};
use super::BmffError;

/// The most samples a track may expand to (a 10-hour 60 fps video has
/// 2.2 million; 48 kHz AAC for 10 hours, 1.7 million).
pub const MAX_SAMPLES: u64 = 20_000_000;

/// What a track carries, as far as reading a stretch of it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackKind {
    Video,
    Audio,
    Other,
}

/// One track's samples, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackSamples {
    pub kind: TrackKind,
    /// Ticks per second of `dts`.
    pub timescale: u32,
    /// Seconds added to `dts / timescale` to place a sample on the
    /// movie's timeline (from the edit list; 0 without one).
    pub shift: f64,
    /// Each sample's decode time, in ticks, non-decreasing.
    pub dts: Vec<u64>,
    /// Each sample's first byte in the file, and its size.
    pub offsets: Vec<u64>,
    pub sizes: Vec<u32>,
    /// Sync samples (0-based, ascending); `None`: every sample is one.
    pub sync: Option<Vec<u32>>,
}

impl TrackSamples {
    /// A sample's time on the movie's timeline, in seconds.
    pub fn time(&self, sample: usize) -> f64 {
        self.dts[sample] as f64 / self.timescale as f64 + self.shift
    }

    /// The first sample whose time is at or after `at`.
    fn first_at(&self, at: f64) -> usize {
        let (mut low, mut high) = (0, self.dts.len());
        while low < high {
            let mid = (low + high) / 2;
            if self.time(mid) < at {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The sync sample at or before `sample` (the first sample if none).
    fn sync_at_or_before(&self, sample: usize) -> usize {
        match &self.sync {
            None => sample,
            Some(sync) => {
                let after = sync.partition_point(|&s| s as usize <= sample);
                if after == 0 {
                    0
                } else {
                    sync[after - 1] as usize
                }
            }
        }
    }

    /// The sync sample at or after `sample`, or the track's end.
    fn sync_at_or_after(&self, sample: usize) -> usize {
        match &self.sync {
            None => sample.min(self.dts.len()),
            Some(sync) => {
                let at = sync.partition_point(|&s| (s as usize) < sample);
                sync.get(at).map_or(self.dts.len(), |&s| s as usize)
            }
        }
    }

    /// The samples a decode of `[start, end)` (seconds; `None`: to the
    /// end) reads, `margin` seconds wider on each side: video from the
    /// sync sample at or before the widened start to the sync sample
    /// after the widened end (a decoder needs the GOP it starts in, and
    /// B-frames reach past the end); other tracks, the widened stretch.
    pub fn needed(&self, start: f64, end: Option<f64>, margin: f64) -> Range<usize> {
        let from = self.first_at(start - margin).min(self.dts.len());
        let to = end.map_or(self.dts.len(), |end| self.first_at(end + margin));
        match self.kind {
            TrackKind::Video => {
                let from = self.sync_at_or_before(from.min(self.dts.len().saturating_sub(1)));
                // The sync sample itself is read too: the demuxer reads
                // it before the decoder's output ends the run.
                let to = (self.sync_at_or_after(to) + 1).min(self.dts.len());
                from..to.max(from)
            }
            _ => from..to.max(from),
        }
    }

    /// The byte ranges of `samples`, adjacent ones merged.
    pub fn byte_ranges(&self, samples: Range<usize>) -> Vec<Range<u64>> {
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for i in samples {
            let range = self.offsets[i]..self.offsets[i] + self.sizes[i] as u64;
            match ranges.last_mut() {
                Some(last) if last.end == range.start => last.end = range.end,
                _ => ranges.push(range),
            }
        }
        ranges
    }
}

/// The byte ranges a decode of `[start, end)` seconds of the movie needs
/// from every video and audio track (see [`TrackSamples::needed`]),
/// sorted, overlapping and adjacent ones merged, and ranges less than
/// `gap` apart joined (one request costs more than a few bytes too many).
pub fn span_ranges(
    tracks: &[TrackSamples],
    start: f64,
    end: Option<f64>,
    margin: f64,
    gap: u64,
) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = tracks
        .iter()
        .filter(|t| t.kind != TrackKind::Other)
        .flat_map(|t| t.byte_ranges(t.needed(start, end, margin)))
        .collect();
    merge(&mut ranges, gap);
    ranges
}

/// Sorts `ranges` and merges those that overlap or lie less than `gap`
/// apart.
pub fn merge(ranges: &mut Vec<Range<u64>>, gap: u64) {
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges.drain(..) {
        match merged.last_mut() {
            Some(last) if range.start <= last.end.saturating_add(gap) => {
                last.end = last.end.max(range.end)
            }
            _ => merged.push(range),
        }
    }
    *ranges = merged;
}

/// Every track's samples, from a `moov` body.
pub fn track_samples(moov: &[u8]) -> Result<Vec<TrackSamples>, BmffError> {
    let boxes = children(moov, "moov")?;
    let (movie_timescale, _) = movie_header(&boxes)?;
    boxes
        .iter()
        .filter(|(kind, _)| kind == b"trak")
        .map(|(_, trak)| track(trak, movie_timescale))
        .collect()
}

fn track(trak: &[u8], movie_timescale: u32) -> Result<TrackSamples, BmffError> {
    let boxes = children(trak, "trak")?;
    let malformed = |what: &str| BmffError::Malformed(format!("a 'trak' has no {what}"));
    let mdia = children(child(&boxes, b"mdia").ok_or_else(|| malformed("'mdia'"))?, "mdia")?;
    let mdhd = child(&mdia, b"mdhd").ok_or_else(|| malformed("'mdhd'"))?;
    let (_, timescale, _) = time_header(mdhd, "mdhd")?;
    if timescale == 0 {
        return Err(BmffError::Malformed("'mdhd' timescale is 0".into()));
    }
    let kind = match handler_type(&mdia)? {
        Some(kind) if &kind == b"vide" => TrackKind::Video,
        Some(kind) if &kind == b"soun" => TrackKind::Audio,
        _ => TrackKind::Other,
    };
    let shift = match child(&boxes, b"edts") {
        Some(edts) => match child(&children(edts, "edts")?, b"elst") {
            Some(elst) => edit_shift(elst, movie_timescale, timescale)?,
            None => 0.0,
        },
        None => 0.0,
    };
    let minf = children(child(&mdia, b"minf").ok_or_else(|| malformed("'minf'"))?, "minf")?;
    let stbl = children(child(&minf, b"stbl").ok_or_else(|| malformed("'stbl'"))?, "stbl")?;
    let table = |kind: &[u8; 4]| child(&stbl, kind);
    let sizes = sizes(table(b"stsz").ok_or_else(|| malformed("'stsz'"))?)?;
    let dts = decode_times(
        table(b"stts").ok_or_else(|| malformed("'stts'"))?,
        sizes.len(),
    )?;
    let chunks = match (table(b"stco"), table(b"co64")) {
        (Some(stco), _) => chunk_offsets(stco, false)?,
        (None, Some(co64)) => chunk_offsets(co64, true)?,
        (None, None) => return Err(malformed("'stco' or 'co64'")),
    };
    let offsets = sample_offsets(
        table(b"stsc").ok_or_else(|| malformed("'stsc'"))?,
        &chunks,
        &sizes,
    )?;
    let sync = table(b"stss")
        .map(|stss| sync_samples(stss, sizes.len()))
        .transpose()?;
    Ok(TrackSamples {
        kind,
        timescale,
        shift,
        dts,
        offsets,
        sizes,
        sync,
    })
}

/// The seconds an edit list moves a track by: leading empty edits delay
/// it, the first real edit's media time advances it.
fn edit_shift(elst: &[u8], movie_timescale: u32, timescale: u32) -> Result<f64, BmffError> {
    let mut cursor = Cursor::new(elst, "elst");
    let version = cursor.version()?;
    let count = cursor.u32("entry count")?;
    let mut delay = 0u64;
    for _ in 0..count {
        let duration = cursor.sized(version, "segment duration")?.unwrap_or(0);
        let media_time = if version == 1 {
            cursor.u64("media time")? as i64
        } else {
            cursor.u32("media time")? as i32 as i64
        };
        cursor.skip(4, "media rate")?;
        if media_time < 0 {
            delay = delay.saturating_add(duration);
            continue;
        }
        return Ok(delay as f64 / movie_timescale as f64 - media_time as f64 / timescale as f64);
    }
    Ok(delay as f64 / movie_timescale as f64)
}

fn entries(cursor: &mut Cursor<'_>, box_name: &str, entry_bytes: usize) -> Result<usize, BmffError> {
    let count = cursor.u32("entry count")? as usize;
    if count > cursor.remaining() / entry_bytes {
        return Err(BmffError::Malformed(format!(
            "'{box_name}' declares {count} entries but holds only {}",
            cursor.remaining() / entry_bytes
        )));
    }
    Ok(count)
}

fn sizes(stsz: &[u8]) -> Result<Vec<u32>, BmffError> {
    let mut cursor = Cursor::new(stsz, "stsz");
    cursor.version()?;
    let constant = cursor.u32("sample size")?;
    let count = cursor.u32("sample count")? as u64;
    if count > MAX_SAMPLES {
        return Err(BmffError::TooLarge(format!(
            "'stsz' declares {count} samples (at most {MAX_SAMPLES} are read)"
        )));
    }
    if constant != 0 {
        return Ok(vec![constant; count as usize]);
    }
    if count > (cursor.remaining() / 4) as u64 {
        return Err(BmffError::Malformed(format!(
            "'stsz' declares {count} sample sizes but holds only {}",
            cursor.remaining() / 4
        )));
    }
    (0..count).map(|_| cursor.u32("sample size")).collect()
}

/// Each sample's decode time from `stts`, which must cover `samples`.
fn decode_times(stts: &[u8], samples: usize) -> Result<Vec<u64>, BmffError> {
    let mut cursor = Cursor::new(stts, "stts");
    cursor.version()?;
    let count = entries(&mut cursor, "stts", 8)?;
    let mut dts = Vec::with_capacity(samples);
    let mut at = 0u64;
    for _ in 0..count {
        let n = cursor.u32("sample count")? as usize;
        let delta = cursor.u32("sample delta")? as u64;
        for _ in 0..n.min(samples - dts.len()) {
            dts.push(at);
            at = at.saturating_add(delta);
        }
    }
    if dts.len() < samples {
        return Err(BmffError::Malformed(format!(
            "'stts' times {} samples of the {samples} 'stsz' sizes",
            dts.len()
        )));
    }
    Ok(dts)
}

fn chunk_offsets(table: &[u8], wide: bool) -> Result<Vec<u64>, BmffError> {
    let name = if wide { "co64" } else { "stco" };
    let mut cursor = Cursor::new(table, name);
    cursor.version()?;
    let count = entries(&mut cursor, name, if wide { 8 } else { 4 })?;
    (0..count)
        .map(|_| {
            if wide {
                cursor.u64("chunk offset")
            } else {
                cursor.u32("chunk offset").map(u64::from)
            }
        })
        .collect()
}

/// Each sample's file offset: `stsc` says how many samples each chunk
/// holds, one after another from the chunk's offset.
fn sample_offsets(stsc: &[u8], chunks: &[u64], sizes: &[u32]) -> Result<Vec<u64>, BmffError> {
    let mut cursor = Cursor::new(stsc, "stsc");
    cursor.version()?;
    let count = entries(&mut cursor, "stsc", 12)?;
    let mut runs = Vec::with_capacity(count);
    for _ in 0..count {
        let first_chunk = cursor.u32("first chunk")? as usize;
        let per_chunk = cursor.u32("samples per chunk")? as usize;
        cursor.skip(4, "sample description index")?;
        if first_chunk == 0 || runs.last().is_some_and(|&(last, _)| first_chunk <= last) {
            return Err(BmffError::Malformed(
                "'stsc' first chunks are not ascending from 1".into(),
            ));
        }
        runs.push((first_chunk, per_chunk));
    }
    let mut offsets = Vec::with_capacity(sizes.len());
    for (run, &(first_chunk, per_chunk)) in runs.iter().enumerate() {
        let last_chunk = runs
            .get(run + 1)
            .map_or(chunks.len(), |&(next, _)| (next - 1).min(chunks.len()));
        for chunk in first_chunk..=last_chunk {
            let mut at = chunks[chunk - 1];
            for _ in 0..per_chunk {
                let Some(&size) = sizes.get(offsets.len()) else {
                    return Ok(offsets);
                };
                offsets.push(at);
                at = at.saturating_add(size as u64);
            }
        }
    }
    if offsets.len() < sizes.len() {
        return Err(BmffError::Malformed(format!(
            "'stsc' places {} samples of the {} 'stsz' sizes",
            offsets.len(),
            sizes.len()
        )));
    }
    Ok(offsets)
}

fn sync_samples(stss: &[u8], samples: usize) -> Result<Vec<u32>, BmffError> {
    let mut cursor = Cursor::new(stss, "stss");
    cursor.version()?;
    let count = entries(&mut cursor, "stss", 4)?;
    let mut sync = Vec::with_capacity(count);
    for _ in 0..count {
        let number = cursor.u32("sample number")?;
        // 1-based; ascending; within the track.
        if number == 0
            || number as usize > samples
            || sync.last().is_some_and(|&last| number - 1 <= last)
        {
            return Err(BmffError::Malformed(format!(
                "'stss' lists sample {number} out of order or outside the track's {samples}"
            )));
        }
        sync.push(number - 1);
    }
    Ok(sync)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(body);
        out
    }

    /// A full box body: version 0, no flags, then `values`.
    fn full(values: &[u32]) -> Vec<u8> {
        [0u32]
            .iter()
            .chain(values)
            .flat_map(|v| v.to_be_bytes())
            .collect()
    }

    /// A `moov` body: one video track of ten 0.1 s samples (timescale
    /// 1000), sync at samples 0, 4 and 8, in two chunks of five at bytes
    /// 1000 and 5000, sample i being 10 + i bytes; its edit list starts
    /// at media time 200 (0.2 s earlier on the movie's timeline).
    fn moov(stss: &[u32], stsc: &[u32]) -> Vec<u8> {
        let mvhd = bx(b"mvhd", &full(&[0, 0, 1000, 1000, 0, 0, 0, 0]));
        let mdhd = bx(b"mdhd", &full(&[0, 0, 1000, 1000, 0]));
        let hdlr = bx(
            b"hdlr",
            &[&full(&[0])[..], b"vide", &[0; 13]].concat(),
        );
        let sizes: Vec<u32> = (10..20).collect();
        let stbl = bx(
            b"stbl",
            &[
                bx(b"stts", &full(&[1, 10, 100])),
                bx(b"stsz", &full(&[&[0, 10][..], &sizes].concat())),
                bx(b"stsc", &full(stsc)),
                bx(b"stco", &full(&[2, 1000, 5000])),
                bx(b"stss", &full(stss)),
            ]
            .concat(),
        );
        let mdia = bx(
            b"mdia",
            &[mdhd, hdlr, bx(b"minf", &stbl)].concat(),
        );
        let edts = bx(b"edts", &bx(b"elst", &full(&[1, 1000, 200, 0x10000])));
        [mvhd, bx(b"trak", &[edts, mdia].concat())].concat()
    }

    fn good() -> Vec<u8> {
        moov(&[3, 1, 5, 9], &[1, 1, 5, 1])
    }

    #[test]
    fn samples_lie_where_the_tables_say() {
        let tracks = track_samples(&good()).unwrap();
        let video = &tracks[0];
        assert_eq!(video.kind, TrackKind::Video);
        assert_eq!(video.dts, (0..10).map(|i| i * 100).collect::<Vec<u64>>());
        assert_eq!(video.offsets[..3], [1000, 1010, 1021]);
        assert_eq!(video.offsets[5..7], [5000, 5015]);
        assert_eq!(video.sync.as_deref(), Some(&[0, 4, 8][..]));
        assert!((video.time(3) - 0.1).abs() < 1e-9, "{}", video.time(3));
    }

    #[test]
    fn a_stretch_needs_its_gop_and_the_sync_sample_after() {
        let tracks = track_samples(&good()).unwrap();
        let video = &tracks[0];
        // 0.25 to 0.45 s: samples 5 to 6 (times 0.3, 0.4), from the sync
        // sample 4 to the sync sample 8, itself included.
        assert_eq!(video.needed(0.25, Some(0.45), 0.0), 4..9);
        // Widened by 0.1 s: from 0.15 s (sample 4), to 0.55 s (sample 8).
        assert_eq!(video.needed(0.25, Some(0.45), 0.1), 4..9);
        // To the end.
        assert_eq!(video.needed(0.45, None, 0.0), 4..10);
        assert_eq!(video.needed(-1.0, Some(0.05), 0.0), 0..5);
        // Bytes: 4 is the last of chunk one, 5 to 8 start chunk two.
        assert_eq!(
            video.byte_ranges(4..9),
            [1046..1060, 5000..5000 + 15 + 16 + 17 + 18]
        );
        let joined = span_ranges(&tracks, 0.25, Some(0.45), 0.0, 10_000);
        assert_eq!(joined.len(), 1);
        assert_eq!(joined[0], 1046..5066);
    }

    #[test]
    fn lying_tables_are_errors_not_panics() {
        // A sync sample past the track.
        let err = track_samples(&moov(&[1, 11], &[1, 1, 5, 1])).unwrap_err();
        assert!(err.to_string().contains("'stss' lists sample 11"), "{err}");
        // Chunks that hold fewer samples than the sizes.
        let err = track_samples(&moov(&[1, 1], &[1, 1, 4, 1])).unwrap_err();
        assert!(err.to_string().contains("places 8 samples of the 10"), "{err}");
        // More entries declared than held.
        let err = track_samples(&moov(&[5, 1], &[1, 1, 5, 1])).unwrap_err();
        assert!(err.to_string().contains("'stss' declares 5 entries"), "{err}");
        // Every truncation of a good moov: an error or a table, never a panic.
        let bytes = good();
        for cut in 0..bytes.len() {
            let _ = track_samples(&bytes[..cut]);
        }
    }

    #[test]
    fn ranges_merge_when_close() {
        let mut ranges = vec![10..20, 0..5, 18..30, 40..50];
        merge(&mut ranges, 0);
        assert_eq!(ranges, [0..5, 10..30, 40..50]);
        merge(&mut ranges, 10);
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0], 0..50);
    }
}
