//! Cutting a long input into chunks that separate runs encode: where the
//! cuts go, and how long a chunk may be. Pure.
//!
//! Cuts fall on segment boundaries (whole multiples of the segment length
//! on the input's timeline), where every run forces a keyframe, and a chunk
//! run keeps each frame's timestamp from a whole run (`-copyts`, and
//! [`super::TIMELINE_OFFSET_SECS`]). Nothing runs chunks yet: DESIGN.md,
//! "Chunked HLS", lists what must change before they do.

use super::format_seconds;

/// A part of the input: the frames at or after `start` and before `end`
/// (seconds on the input's timeline); `None` is the input's beginning or
/// end, so no frame falls outside every span whatever the first
/// timestamp or the container's stated duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// The chunk's place, from 0.
    pub index: u32,
    pub start: Option<f64>,
    pub end: Option<f64>,
}

impl Span {
    /// The `trim` filter that keeps exactly the span's frames on the
    /// input's own timeline (ffmpeg's `trim`: `start` inclusive, `end`
    /// exclusive); empty for the whole input.
    pub fn trim_filter(&self) -> String {
        let bounds: Vec<String> = [("start", self.start), ("end", self.end)]
            .into_iter()
            .filter_map(|(name, at)| Some(format!("{name}={}", format_seconds(at?))))
            .collect();
        if bounds.is_empty() {
            String::new()
        } else {
            format!("trim={}", bounds.join(":"))
        }
    }
}

/// The chunks of an input lasting `duration` seconds: `chunk_seconds`
/// rounded down to whole segments (at least one), from the input's
/// beginning to its end. One span (the whole input) when it is no longer
/// than one chunk.
pub fn plan(duration: f64, segment: f64, chunk_seconds: f64) -> Vec<Span> {
    let per_chunk = (chunk_seconds / segment).floor().max(1.0) * segment;
    let count = (duration / per_chunk).ceil().max(1.0) as u32;
    (0..count)
        .map(|index| Span {
            index,
            start: (index > 0).then_some(index as f64 * per_chunk),
            end: (index + 1 < count).then_some((index + 1) as f64 * per_chunk),
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
/// one). The default `chunk_seconds`.
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
        let spans = plan(50.0, 6.0, 20.0);
        let bounds: Vec<(Option<f64>, Option<f64>)> =
            spans.iter().map(|s| (s.start, s.end)).collect();
        assert_eq!(
            bounds,
            [
                (None, Some(18.0)),
                (Some(18.0), Some(36.0)),
                (Some(36.0), None)
            ]
        );
        assert_eq!(spans[2].index, 2);
        assert_eq!(spans[0].trim_filter(), "trim=end=18");
        assert_eq!(spans[1].trim_filter(), "trim=start=18:end=36");
        assert_eq!(spans[2].trim_filter(), "trim=start=36");
    }

    #[test]
    fn a_short_input_is_one_span_and_a_chunk_at_least_a_segment() {
        let whole = plan(18.0, 6.0, 20.0);
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].trim_filter(), "");
        // A chunk shorter than a segment is a segment.
        assert_eq!(plan(13.0, 6.0, 2.0).len(), 3);
        assert_eq!(plan(0.0, 6.0, 2.0).len(), 1);
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
