//! `hls-package` in chunks: a clip encoded whole and encoded as chunks
//! (each its own ffmpeg run over its span) cuts the same segments at the
//! same frames with the same timestamps, read back by the tests' own
//! MPEG-TS reader.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::media::{clip, ffmpeg};
use common::ts::{read_segment, Segment};
use mediaonce::steps::hls::{chunk, ffmpeg_args, plan_renditions, HlsParams, Span};

/// 14 s at NTSC's 29.97 frames a second (no segment boundary falls on a
/// frame), with B-frames (x264's encoder delay, which once shifted only
/// the runs that start at the beginning).
fn ntsc_clip() -> PathBuf {
    clip(
        "ntsc-14s.mp4",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=320x180:rate=30000/1001:duration=14",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-bf",
            "2",
            "-g",
            "90",
            "-pix_fmt",
            "yuv420p",
        ],
    )
}

fn params() -> HlsParams {
    let value = serde_json::json!({"ladder": [180], "segment": 2, "preset": "veryfast"});
    HlsParams::from_params(value.as_object().unwrap()).unwrap()
}

/// Encodes `span` (or the whole) of `input` into `out`; its segments in
/// order.
fn encode(input: &Path, span: Option<&Span>, out: &Path) -> Vec<Segment> {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).unwrap();
    let params = params();
    let renditions = plan_renditions(&params, 180);
    let args = ffmpeg_args(&params, &renditions, false, span, input, out);
    let status = Command::new(ffmpeg())
        .args(&args)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "ffmpeg {args:?}");
    let dir = out.join("180p");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ts"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| read_segment(&std::fs::read(p).unwrap()))
        .collect()
}

#[test]
fn chunks_cut_the_same_segments_at_the_same_frames_and_times_as_a_whole_run() {
    let input = ntsc_clip();
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hls-chunks");
    let whole = encode(&input, None, &scratch.join("whole"));
    // 4 s chunks of 2 s segments: four runs, the last 2 s.
    let spans = chunk::plan(14.0, 2.0, 4.0);
    assert_eq!(spans.len(), 4);
    let chunked: Vec<Segment> = spans
        .iter()
        .flat_map(|span| {
            encode(
                &input,
                Some(span),
                &scratch.join(format!("chunk-{}", span.index)),
            )
        })
        .collect();

    assert_eq!(whole.len(), 7, "7 segments of 2 s");
    assert_eq!(chunked.len(), whole.len());
    let frames: usize = whole.iter().map(|s| s.video_pts.len()).sum();
    assert_eq!(frames, 420, "14 s at 29.97: frames 0 to 419");
    for (i, (w, c)) in whole.iter().zip(&chunked).enumerate() {
        // The same frames at the same presentation times.
        assert_eq!(w.video_pts, c.video_pts, "segment {i}");
        // Each opens on an IDR and holds no other.
        for s in [w, c] {
            assert!(s.idr[0], "segment {i} opens on an IDR");
            assert_eq!(s.idr.iter().filter(|&&k| k).count(), 1, "segment {i}");
        }
    }
    // Continuous: each segment starts one frame after the previous ends.
    let all: Vec<u64> = chunked.iter().flat_map(|s| s.video_pts.clone()).collect();
    for pair in all.windows(2) {
        let step = pair[1] - pair[0];
        assert_eq!(step, 3003, "a gap or overlap: {pair:?}");
    }
}
