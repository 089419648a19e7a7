//! Cutting an input into spans that separate ffmpeg runs encode, so that
//! their segments join into one package: where the cuts go, where
//! keyframes are forced, how audio is cut, and how long a chunk may be.
//! Pure.
//!
//! Every boundary is a whole number of milliseconds (no float's rounding
//! differs between runs), on the input's own timeline: each run keeps the
//! input's timestamps (`-copyts`, and [`super::TIMELINE_OFFSET_SECS`]).
//! - **Video**: a span holds the frames at or after its start and before
//!   its end (`trim`); keyframes are forced at the first frame at or after
//!   each segment start of the span, given as absolute times (ffmpeg's
//!   expression form counts `t` from the run's first frame, which drifts a
//!   frame from another run's on NTSC inputs).
//! - **Audio**: AAC frames (1,024 samples) lie on one grid from the
//!   input's time 0 (`aresample=first_pts` pads or trims a stream that
//!   starts off it). A span encodes from two frames before its grid start
//!   to two frames after its grid end (the encoder's MDCT windows see real
//!   signal on both sides of a cut, not silence), and keeps only the
//!   packets between (`noise=drop` on the encoded packets). Joined, the
//!   spans' packets are the whole run's timestamps, every one once.

use super::format_seconds;

/// Samples in an AAC-LC frame.
pub const AAC_FRAME_SAMPLES: u64 = 1024;

/// AAC frames encoded on each side of an audio cut and then dropped.
pub const AUDIO_ROLL_FRAMES: u64 = 2;

/// The longest chunk a recipe may ask for: its keyframe list stays a
/// short argument, and a chunk is an invocation's work.
pub const MAX_CHUNK_SECONDS: u64 = 3600;

/// A part of the input that one ffmpeg run encodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The chunk's place, from 0.
    pub index: u32,
    /// The frames at or after this time (ms on the input's timeline); 0 is
    /// the input's beginning, with no bound (frames before 0 are kept).
    pub start_ms: u64,
    /// The frames before this time; `None` is the input's end, whatever
    /// the container's stated duration.
    pub end_ms: Option<u64>,
    /// The number of the span's first segment (`seg-NNNNN.ts`).
    pub first_segment: u32,
    /// Where keyframes are forced: the first frame at or after each time
    /// (ms). Never a time before the span's start: ffmpeg forces one frame
    /// per listed time, so an earlier time would force the first frame
    /// and shift every later keyframe.
    pub keyframes_ms: Vec<u64>,
}

/// How a span's audio is cut, in samples on the input's timeline (the
/// audio filters' and the AAC encoder's time base is 1/sample rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioCut {
    /// The first sample encoded (a grid point).
    pub first_pts: u64,
    /// The first sample not encoded, if bounded.
    pub end_pts: Option<u64>,
    /// Packets before this are dropped (the pre-roll).
    pub keep_from: Option<u64>,
    /// Packets at or after this are dropped (the post-roll).
    pub keep_before: Option<u64>,
}

impl AudioCut {
    /// The filter chain for the span's audio: onto the grid, then cut.
    pub fn filter(&self) -> String {
        let mut chain = format!("aresample=first_pts={}", self.first_pts);
        if let Some(end) = self.end_pts {
            chain.push_str(&format!(",atrim=end_pts={end}"));
        }
        chain
    }

    /// The bitstream filter that drops the encoded pre- and post-roll, if
    /// any (commas escaped: `-bsf` splits a chain on them).
    pub fn drop_filter(&self) -> Option<String> {
        let conditions: Vec<String> = [
            self.keep_from.map(|from| format!("lt(pts\\,{from})")),
            self.keep_before
                .map(|before| format!("gte(pts\\,{before})")),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!conditions.is_empty()).then(|| format!("noise=drop={}", conditions.join("+")))
    }
}

/// The grid point at or before `ms`, in samples.
fn grid_at(ms: u64, sample_rate: u32) -> u64 {
    ms * sample_rate as u64 / 1000 / AAC_FRAME_SAMPLES * AAC_FRAME_SAMPLES
}

impl Span {
    /// The whole input as one span.
    pub fn whole(duration_ms: u64, segment_ms: u64) -> Span {
        plan(duration_ms, segment_ms, u64::MAX)
            .pop()
            .expect("a plan has a span")
    }

    /// The `trim` filter that keeps exactly the span's frames (`start`
    /// inclusive, `end` exclusive); `None` for the whole input.
    pub fn trim_filter(&self) -> Option<String> {
        let bounds: Vec<String> = [
            ("start", (self.start_ms > 0).then_some(self.start_ms)),
            ("end", self.end_ms),
        ]
        .into_iter()
        .filter_map(|(name, at)| Some(format!("{name}={}", format_ms(at?))))
        .collect();
        (!bounds.is_empty()).then(|| format!("trim={}", bounds.join(":")))
    }

    /// How the span's audio at `sample_rate` is cut.
    pub fn audio_cut(&self, sample_rate: u32) -> AudioCut {
        let roll = AUDIO_ROLL_FRAMES * AAC_FRAME_SAMPLES;
        let start = (self.start_ms > 0).then(|| grid_at(self.start_ms, sample_rate));
        let end = self.end_ms.map(|end| grid_at(end, sample_rate));
        AudioCut {
            first_pts: start.map_or(0, |start| start.saturating_sub(roll)),
            end_pts: end.map(|end| end + roll),
            keep_from: start,
            keep_before: end,
        }
    }

    /// Where the run seeks to (ms), if anywhere: a millisecond before the
    /// first video frame or audio sample it encodes (the seek's own cut
    /// rounds; the filters cut exactly).
    pub fn seek_ms(&self, sample_rate: Option<u32>) -> Option<u64> {
        if self.start_ms == 0 {
            return None;
        }
        let audio_ms = sample_rate
            .filter(|&rate| rate > 0)
            .map(|rate| self.audio_cut(rate).first_pts * 1000 / rate as u64);
        let first = audio_ms.map_or(self.start_ms, |ms| ms.min(self.start_ms));
        Some(first.saturating_sub(1))
    }

    /// The keyframe list as `-force_key_frames` takes it.
    pub fn keyframe_list(&self) -> String {
        let times: Vec<String> = self.keyframes_ms.iter().map(|&ms| format_ms(ms)).collect();
        times.join(",")
    }
}

/// Milliseconds as ffmpeg reads seconds: 6, 2.5, 12.012.
pub fn format_ms(ms: u64) -> String {
    format_seconds(ms as f64 / 1000.0)
}

/// The spans of an input lasting `duration_ms`: chunks of `chunk_ms`
/// rounded down to whole segments (at least one), from the input's
/// beginning to its end. One span (the whole input) when it is no longer
/// than one chunk.
pub fn plan(duration_ms: u64, segment_ms: u64, chunk_ms: u64) -> Vec<Span> {
    let segment_ms = segment_ms.max(1);
    let segments_per_chunk = (chunk_ms / segment_ms).max(1);
    let per_chunk = segments_per_chunk.saturating_mul(segment_ms);
    let count = duration_ms.div_ceil(per_chunk).max(1);
    (0..count)
        .map(|index| {
            let start_ms = index * per_chunk;
            let end_ms = (index + 1 < count).then(|| start_ms + per_chunk);
            // The last span lists keyframes past the stated duration: a
            // frame may lie beyond it, and an unused time forces nothing.
            let until = end_ms.unwrap_or(duration_ms.max(start_ms) + segment_ms);
            Span {
                index: index as u32,
                start_ms,
                end_ms,
                first_segment: (index * segments_per_chunk) as u32,
                keyframes_ms: (start_ms..until).step_by(segment_ms as usize).collect(),
            }
        })
        .collect()
}

/// CPU seconds x264 (`veryfast`, two threads) spends per second of 1080p30
/// input for the default ladder (1080, 720 and 360 lines): the worse of two
/// 30 s clips measured with the pinned ffmpeg on two x86_64 cores (a noisy
/// one; a clean one took 1.2). Other ladders scale from it by pixels.
pub const CPU_SECONDS_PER_SECOND_1080_LADDER: f64 = 2.2;

/// Pixels of the default ladder's renditions (16:9).
const DEFAULT_LADDER_PIXELS: f64 = (1920 * 1080 + 1280 * 720 + 640 * 360) as f64;

/// Lambda's CPU share: one vCPU per 1,769 MiB of memory.
const MIB_PER_VCPU: f64 = 1769.0;

/// How many seconds of input one invocation encodes in half of `timeout`
/// (the other half is the margin for slower content, the seek, the upload
/// and the deadline), for renditions `heights` tall at `threads` encoder
/// threads on a function of `memory_mib`, in whole segments (at least
/// one). What a recipe's `chunk_seconds` should be at most for a function
/// of that size.
pub fn default_chunk_seconds(
    heights: &[u32],
    threads: u32,
    memory_mib: u32,
    timeout_secs: u32,
    segment: f64,
) -> f64 {
    let pixels: f64 = heights
        .iter()
        .map(|&h| h as f64 * h as f64 * 16.0 / 9.0)
        .sum();
    let cpu_per_second = CPU_SECONDS_PER_SECOND_1080_LADDER * pixels / DEFAULT_LADDER_PIXELS;
    let cpus = (memory_mib as f64 / MIB_PER_VCPU).min(threads as f64);
    let seconds = timeout_secs as f64 / 2.0 * cpus / cpu_per_second;
    (seconds / segment).floor().max(1.0) * segment
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_on_segment_boundaries_from_start_to_end() {
        // 50 s in 6 s segments, 20 s asked: 18 s chunks.
        let spans = plan(50_000, 6_000, 20_000);
        let bounds: Vec<(u64, Option<u64>, u32)> = spans
            .iter()
            .map(|s| (s.start_ms, s.end_ms, s.first_segment))
            .collect();
        assert_eq!(
            bounds,
            [
                (0, Some(18_000), 0),
                (18_000, Some(36_000), 3),
                (36_000, None, 6)
            ]
        );
        assert_eq!(spans[2].index, 2);
        assert_eq!(spans[0].trim_filter().unwrap(), "trim=end=18");
        assert_eq!(spans[1].trim_filter().unwrap(), "trim=start=18:end=36");
        assert_eq!(spans[2].trim_filter().unwrap(), "trim=start=36");
        assert_eq!(spans[1].keyframe_list(), "18,24,30");
        // The last lists its segments to a segment past the duration.
        assert_eq!(spans[2].keyframe_list(), "36,42,48,54");
    }

    #[test]
    fn a_short_input_is_one_span_and_a_chunk_at_least_a_segment() {
        let whole = plan(18_000, 6_000, 20_000);
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].trim_filter(), None);
        assert_eq!(whole[0], Span::whole(18_000, 6_000));
        // A chunk shorter than a segment is a segment.
        assert_eq!(plan(13_000, 6_000, 2_000).len(), 3);
        assert_eq!(plan(0, 6_000, 2_000).len(), 1);
        // Boundaries are exact milliseconds, not a float's.
        let ntsc = plan(10_000, 2_002, 4_004);
        assert_eq!(ntsc[1].trim_filter().unwrap(), "trim=start=4.004:end=8.008");
        assert_eq!(ntsc[2].keyframe_list(), "8.008,10.01");
    }

    #[test]
    fn audio_is_cut_on_one_grid_with_a_roll_on_each_side() {
        let spans = plan(30_000, 6_000, 12_000);
        // 12 s at 48 kHz: sample 576000, frame 562.5: grid point 575488.
        let middle = spans[1].audio_cut(48_000);
        assert_eq!(middle.keep_from, Some(575_488));
        assert_eq!(middle.first_pts, 575_488 - 2048);
        assert_eq!(middle.keep_before, Some(1_152_000));
        assert_eq!(middle.end_pts, Some(1_152_000 + 2048));
        assert_eq!(
            middle.filter(),
            "aresample=first_pts=573440,atrim=end_pts=1154048"
        );
        assert_eq!(
            middle.drop_filter().unwrap(),
            "noise=drop=lt(pts\\,575488)+gte(pts\\,1152000)"
        );
        // One span's kept end is the next one's kept start.
        assert_eq!(
            spans[0].audio_cut(44_100).keep_before,
            spans[1].audio_cut(44_100).keep_from
        );
        let first = spans[0].audio_cut(48_000);
        assert_eq!((first.first_pts, first.keep_from), (0, None));
        let whole = Span::whole(30_000, 6_000).audio_cut(48_000);
        assert_eq!(whole.filter(), "aresample=first_pts=0");
        assert_eq!(whole.drop_filter(), None);
        // The seek is before both the audio pre-roll and the first frame.
        assert_eq!(spans[1].seek_ms(Some(48_000)), Some(11_945));
        assert_eq!(spans[1].seek_ms(None), Some(11_999));
        assert_eq!(spans[0].seek_ms(Some(48_000)), None);
    }

    #[test]
    fn the_default_chunk_fits_half_the_timeout() {
        let ladder = [1080, 720, 360];
        // One vCPU's worth (1769 MiB), 900 s: 450 s / 2.2 = 204 s, in 6 s.
        assert_eq!(default_chunk_seconds(&ladder, 2, 1769, 900, 6.0), 204.0);
        // Two threads cap the CPU used however large the function.
        assert_eq!(default_chunk_seconds(&ladder, 2, 10240, 900, 6.0), 408.0);
        // The template's default (1024 MiB, 120 s): 60 s x 0.58 / 2.2.
        assert_eq!(default_chunk_seconds(&ladder, 2, 1024, 120, 6.0), 12.0);
        // A 360-line ladder is a tenth of the pixels.
        assert!(default_chunk_seconds(&[360], 2, 1024, 120, 6.0) >= 120.0);
        assert_eq!(default_chunk_seconds(&ladder, 2, 128, 120, 6.0), 6.0);
    }
}
