//! `hls-package` in chunks: a clip encoded whole and encoded as chunks
//! (each its own ffmpeg run over its span, all writing into one package)
//! cuts the same segments at the same frames with the same timestamps, its
//! audio frames lie on the whole run's grid, every one once, and the
//! joined package plays end to end in ffmpeg's HLS client. Read back by the
//! tests' own MPEG-TS reader.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::hls::play;
use common::media::{clip, ffmpeg};
use common::ts::{read_segment, Segment};
use mediaonce::steps::hls::{
    chunk, ffmpeg_args, plan_renditions, sparse, write_playlists, HlsParams, Span,
};

/// 40 s at NTSC's 29.97 frames a second (no segment boundary falls on a
/// frame), with B-frames (x264's encoder delay, which once shifted only
/// the runs that start at the beginning), and a 48 kHz stereo tone in AAC
/// (with its encoder's priming, as uploads have).
fn ntsc_clip() -> PathBuf {
    clip(
        "ntsc-40s-audio.mp4",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=320x180:rate=30000/1001:duration=40",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000:duration=40",
            "-ac",
            "2",
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
            "-c:a",
            "aac",
            "-b:a",
            "96k",
        ],
    )
}

const DURATION_MS: u64 = 40_000;
const SEGMENT_MS: u64 = 2_000;
const RATE: u32 = 48_000;

fn params() -> HlsParams {
    // Two renditions: each must get the keyframe list.
    let value = serde_json::json!({"ladder": [180, 144], "segment": 2, "preset": "veryfast"});
    HlsParams::from_params(value.as_object().unwrap()).unwrap()
}

/// Encodes `span` of `input` into the package at `out`.
fn encode(input: &Path, span: &Span, out: &Path) {
    let params = params();
    let renditions = plan_renditions(&params, 180);
    let args = ffmpeg_args(&params, &renditions, Some(RATE), span, input, out);
    let status = Command::new(ffmpeg())
        .args(&args)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "ffmpeg {args:?}");
}

/// A rendition's segments, in name order: (name, segment).
fn segments(out: &Path, rendition: &str) -> Vec<(String, Segment)> {
    let dir = out.join(rendition);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".ts"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let segment = read_segment(&std::fs::read(dir.join(&name)).unwrap());
            (name, segment)
        })
        .collect()
}

fn fresh(dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    dir.to_path_buf()
}

/// The `#EXTINF` lines of a media playlist.
fn durations(playlist: &Path) -> Vec<String> {
    std::fs::read_to_string(playlist)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("#EXTINF"))
        .map(str::to_string)
        .collect()
}

#[test]
fn chunks_join_into_the_whole_runs_segments_frames_and_audio() {
    let input = ntsc_clip();
    let scratch = fresh(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hls-chunks"));
    let whole_dir = fresh(&scratch.join("whole"));
    encode(&input, &Span::whole(DURATION_MS, SEGMENT_MS), &whole_dir);
    // 8 s chunks of 2 s segments: five runs, into one package.
    let spans = chunk::plan(DURATION_MS, SEGMENT_MS, 8_000);
    assert_eq!(spans.len(), 5);
    let joined_dir = fresh(&scratch.join("joined"));
    for span in &spans {
        encode(&input, span, &joined_dir);
    }
    let whole = segments(&whole_dir, "180p");
    let joined = segments(&joined_dir, "180p");
    let small = segments(&joined_dir, "144p");
    let small_pts: Vec<&Vec<u64>> = small.iter().map(|(_, s)| &s.video_pts).collect();
    let pts: Vec<&Vec<u64>> = joined.iter().map(|(_, s)| &s.video_pts).collect();
    assert_eq!(small_pts, pts, "both renditions cut at the same frames");

    assert_eq!(whole.len(), 20, "20 segments of 2 s");
    let names: Vec<&str> = joined.iter().map(|(name, _)| name.as_str()).collect();
    let expected: Vec<String> = (0..20).map(|i| format!("seg-{i:05}.ts")).collect();
    assert_eq!(names, expected, "numbered on across chunks, every one once");
    let frames: usize = whole.iter().map(|(_, s)| s.video_pts.len()).sum();
    assert_eq!(frames, 1199, "40 s at 29.97: frames 0 to 1198");
    for (i, ((_, w), (_, c))) in whole.iter().zip(&joined).enumerate() {
        // The same frames at the same presentation times.
        assert_eq!(w.video_pts, c.video_pts, "segment {i}");
        // Each opens on an IDR and holds no other.
        for s in [w, c] {
            assert!(s.idr[0], "segment {i} opens on an IDR");
            assert_eq!(s.idr.iter().filter(|&&k| k).count(), 1, "segment {i}");
            assert_eq!(s.audio_rate, Some(RATE), "segment {i}");
        }
    }
    // Continuous video: each frame one frame after the previous.
    let all: Vec<u64> = joined
        .iter()
        .flat_map(|(_, s)| s.video_pts.clone())
        .collect();
    for pair in all.windows(2) {
        assert_eq!(pair[1] - pair[0], 3003, "a gap or overlap: {pair:?}");
    }
    // Audio: the whole run's frames, every one once, continuous across
    // the four cuts (a chunk's first audio frame may sit in the segment
    // before the whole run's, so compare the streams, not the segments).
    let whole_audio: Vec<u64> = whole
        .iter()
        .flat_map(|(_, s)| s.audio_pts.clone())
        .collect();
    let joined_audio: Vec<u64> = joined
        .iter()
        .flat_map(|(_, s)| s.audio_pts.clone())
        .collect();
    assert_eq!(joined_audio, whole_audio);
    for pair in joined_audio.windows(2) {
        assert_eq!(pair[1] - pair[0], 1920, "an audio gap or overlap: {pair:?}");
    }
    // The input's 40 s of samples, within a frame, after the encoder's
    // one frame of priming.
    let samples = (joined_audio.len() as i64 - 1) * 1024;
    assert!(
        (samples - 40 * RATE as i64).abs() <= 1024,
        "{samples} samples"
    );

    // Joined, the playlists are the whole run's: the same durations.
    for dir in [&whole_dir, &joined_dir] {
        write_playlists(dir, vec!["180p".into(), "144p".into()], true).unwrap();
    }
    assert_eq!(
        durations(&joined_dir.join("180p/index.m3u8")),
        durations(&whole_dir.join("180p/index.m3u8"))
    );
    // And the package plays end to end: every frame, every sample, the
    // same as the whole run's.
    let played = play(&joined_dir.join("master.m3u8"), &scratch);
    assert_eq!(played.0, 1199);
    assert_eq!(played, play(&whole_dir.join("master.m3u8"), &scratch));
}

#[tokio::test]
async fn a_span_encodes_the_same_from_a_sparse_copy_of_its_samples() {
    let input = ntsc_clip();
    let scratch = fresh(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hls-sparse"));
    // 16 to 24 s: it starts inside a GOP (keyframes every 3.003 s).
    let spans = chunk::plan(DURATION_MS, SEGMENT_MS, 8_000);
    let file = std::fs::File::open(&input).unwrap();
    let size = file.metadata().unwrap().len();
    let boxes = mediaonce::bmff::locate_movie(&file, size, &[])
        .await
        .unwrap();
    for span in [&spans[2], &spans[4]] {
        let copy = sparse::plan_copy(&boxes, size, span).unwrap();
        // The moov and a fifth of the samples, with their margins.
        assert!(
            copy.bytes < size * 2 / 5,
            "span {}: {} of {size} bytes",
            span.index,
            copy.bytes
        );
        let sparse_input = scratch.join(format!("sparse-{}.mp4", span.index));
        sparse::write_copy(&file, size, &copy, &sparse_input)
            .await
            .unwrap();
        // Holes: the copy takes the bytes it holds, not the source's size.
        let allocated = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&sparse_input).unwrap().blocks() * 512
        };
        assert!(
            allocated < copy.bytes + 1024 * 1024,
            "{allocated} bytes allocated"
        );

        let full_dir = fresh(&scratch.join(format!("full-{}", span.index)));
        let sparse_dir = fresh(&scratch.join(format!("from-sparse-{}", span.index)));
        encode(&input, span, &full_dir);
        encode(&sparse_input, span, &sparse_dir);
        for rendition in ["180p", "144p"] {
            let full = segments(&full_dir, rendition);
            assert!(
                full.len() >= 4,
                "span {}: {} segments",
                span.index,
                full.len()
            );
            for (name, _) in &full {
                let path = |dir: &Path| dir.join(rendition).join(name);
                assert!(
                    std::fs::read(path(&full_dir)).unwrap()
                        == std::fs::read(path(&sparse_dir)).unwrap(),
                    "span {} {rendition}/{name} differs from the sparse copy",
                    span.index
                );
            }
        }
    }
}
