//! `storyboard` chained to `hls-package`, on the emulators: a clip with a
//! clock (ffmpeg's `testsrc2`) gives sheets and cues whose count, size and
//! times follow from its duration and the interval, each cue's tile is
//! the frame ffmpeg extracts from the upload at the cue's time (and not
//! the next cue's), a phone clip held upright gets upright tiles, a bad
//! input fails for good with the reason, and every file is served
//! immutable.

mod common;
#[path = "common/ssim.rs"]
mod ssim;

use std::process::Command;

use common::media::{clock_clip, ffmpeg, upright_phone_clip};
use common::{Options, Pipeline};
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::step::{Manifest, IMMUTABLE};

/// An HLS package of 2 s segments and a storyboard chained to its index
/// for each of `storyboards` (params).
fn recipes(storyboards: &[&str]) -> String {
    let mut recipes = vec![
        r#"{"name":"hls","step":"hls-package","version":1,"params":{"ladder":[360,240],"segment":2,"preset":"ultrafast","min_seconds":5},"match":{"suffix":".mp4"}}"#
            .to_string(),
    ];
    for (i, params) in storyboards.iter().enumerate() {
        recipes.push(format!(
            r#"{{"name":"board-{i}","step":"storyboard","version":1,"params":{params},"input":{{"recipe":"hls","file":"package.json"}}}}"#
        ));
    }
    format!("[{}]", recipes.join(","))
}

async fn pipeline(storyboards: &[&str]) -> Pipeline {
    Pipeline::new(Options {
        recipes: Some(recipes(storyboards)),
        separate_output_bucket: true,
        ..Options::default()
    })
    .await
}

/// Uploads `bytes` and handles its message: the storyboard jobs' reports.
async fn storyboards_of(p: &Pipeline, key: &str, bytes: &[u8]) -> Vec<JobReport> {
    p.put(key, bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let jobs: Vec<JobReport> = report.jobs().cloned().collect();
    assert!(jobs.len() >= 2, "{report:?}");
    assert_eq!(jobs[0].outcome, Outcome::Ran, "{report:?}");
    jobs[1..].to_vec()
}

/// The frame ffmpeg extracts from `source` at `seconds` (an accurate seek,
/// rotation applied), scaled to `width`×`height`.
fn frame_at(source: &std::path::Path, seconds: f64, width: u32, height: u32) -> image::RgbImage {
    extract(source, seconds, width, height, &[])
}

/// [`frame_at`] with more input options (`-noautorotate`).
fn extract(
    source: &std::path::Path,
    seconds: f64,
    width: u32,
    height: u32,
    options: &[&str],
) -> image::RgbImage {
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(options)
        .arg("-ss")
        .arg(format!("{seconds:.3}"))
        .arg("-i")
        .arg(source)
        .args(["-frames:v", "1", "-vf"])
        .arg(format!("scale={width}:{height}:flags=lanczos"))
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    image::RgbImage::from_raw(width, height, out.stdout).expect("one frame")
}

/// A JPEG sheet's pixels.
fn decode_jpeg(bytes: &[u8]) -> image::RgbImage {
    let mut decoder = jpeg_decoder::Decoder::new(bytes);
    let pixels = decoder.decode().unwrap();
    let info = decoder.info().unwrap();
    image::RgbImage::from_raw(info.width.into(), info.height.into(), pixels).unwrap()
}

/// The SSIM of two pictures' luma (BT.601), as video tools report it
/// (ffmpeg's `ssim` filter's Y): the sheets' JPEG keeps a quarter of the
/// chroma, as every 4:2:0 picture does.
fn luma_ssim(a: &image::RgbImage, b: &image::RgbImage) -> f64 {
    ssim::ssim(&ssim::Plane::luma(a), &ssim::Plane::luma(b)).unwrap()
}

/// The cues of a WebVTT storyboard: (start s, end s, sheet, x, y, w, h).
fn read_cues(vtt: &str) -> Vec<(f64, f64, String, u32, u32, u32, u32)> {
    let seconds = |t: &str| {
        let parts: Vec<f64> = t.split(':').map(|p| p.parse().unwrap()).collect();
        parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
    };
    assert!(vtt.starts_with("WEBVTT\n\n"), "{vtt}");
    vtt.split("\n\n")
        .skip(1)
        .map(|block| {
            let mut lines = block.lines();
            let (start, end) = lines.next().unwrap().split_once(" --> ").unwrap();
            let (sheet, xywh) = lines.next().unwrap().split_once("#xywh=").unwrap();
            let n: Vec<u32> = xywh.split(',').map(|v| v.parse().unwrap()).collect();
            assert_eq!(lines.next(), None, "{block}");
            (
                seconds(start),
                seconds(end),
                sheet.to_string(),
                n[0],
                n[1],
                n[2],
                n[3],
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clocks_storyboard_shows_each_cues_frame() {
    // Every second (half the cues inside a segment: its frames decoded),
    // and every 2 s (each cue a segment's first frame: its I-frame range
    // alone decoded).
    let p = pipeline(&[r#"{"interval": 1, "columns": 4}"#, r#"{"interval": 2}"#]).await;
    let source = clock_clip();
    let jobs = storyboards_of(&p, "clips/clock.mp4", &std::fs::read(&source).unwrap()).await;
    assert_eq!(jobs.len(), 2);
    let job = &jobs[0];
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let prefix = format!("derived/{}/", job.job_key);
    let manifest: Manifest =
        serde_json::from_slice(&p.output(&format!("{prefix}_manifest.json")).await).unwrap();
    let names: Vec<&str> = manifest.outputs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["storyboard-0.jpg", "storyboard.vtt"]);

    // 7 s at 1 s: seven cues covering it, four to a row of 256x144 tiles.
    let vtt = String::from_utf8(p.output(&format!("{prefix}storyboard.vtt")).await).unwrap();
    let cues = read_cues(&vtt);
    assert_eq!(cues.len(), 7, "{vtt}");
    for (i, cue) in cues.iter().enumerate() {
        let i = i as u32;
        assert_eq!((cue.0, cue.1), (i as f64, i as f64 + 1.0), "{vtt}");
        assert_eq!(cue.2, "storyboard-0.jpg");
        assert_eq!(
            (cue.3, cue.4, cue.5, cue.6),
            (i % 4 * 256, i / 4 * 144, 256, 144)
        );
    }
    let sheet = decode_jpeg(&p.output(&format!("{prefix}storyboard-0.jpg")).await);
    assert_eq!(sheet.dimensions(), (4 * 256, 2 * 144));

    // Each tile is the upload's frame at its cue's time, and is closer to
    // it than to the next cue's frame (the clock moved).
    for (start, _, _, x, y, w, h) in &cues {
        let tile = image::imageops::crop_imm(&sheet, *x, *y, *w, *h).to_image();
        let own = luma_ssim(&tile, &frame_at(&source, *start, *w, *h));
        assert!(own >= 0.9, "cue at {start} s: SSIM {own}");
        if *start < 6.0 {
            let next = luma_ssim(&tile, &frame_at(&source, start + 1.0, *w, *h));
            eprintln!("cue at {start} s: SSIM {own:.4}, against the next cue's frame {next:.4}");
            assert!(own > next, "cue at {start} s: {own} vs the next {next}");
        }
    }

    // Served immutable, like every output.
    for name in names {
        let head =
            p.s3.head_object()
                .bucket(&p.output_bucket)
                .key(format!("{prefix}{name}"))
                .send()
                .await
                .unwrap();
        assert_eq!(head.cache_control(), Some(IMMUTABLE), "{name}");
    }
    let vtt_head =
        p.s3.head_object()
            .bucket(&p.output_bucket)
            .key(format!("{prefix}storyboard.vtt"))
            .send()
            .await
            .unwrap();
    assert_eq!(vtt_head.content_type(), Some("text/vtt"));

    // Every 2 s: four cues, the last 1 s long, one row.
    let job = &jobs[1];
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let prefix = format!("derived/{}/", job.job_key);
    let vtt = String::from_utf8(p.output(&format!("{prefix}storyboard.vtt")).await).unwrap();
    let cues = read_cues(&vtt);
    let spans: Vec<(f64, f64)> = cues.iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(spans, [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 7.0)]);
    let sheet = decode_jpeg(&p.output(&format!("{prefix}storyboard-0.jpg")).await);
    assert_eq!(sheet.dimensions(), (4 * 256, 144));
    for (start, _, _, x, y, w, h) in &cues {
        let tile = image::imageops::crop_imm(&sheet, *x, *y, *w, *h).to_image();
        let own = luma_ssim(&tile, &frame_at(&source, *start, *w, *h));
        assert!(own >= 0.9, "every 2 s, cue at {start} s: SSIM {own}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phone_clip_held_upright_gets_upright_tiles() {
    let p = pipeline(&[r#"{"width": 128, "format": "webp"}"#]).await;
    // Coded 320x240, shown 240x320: 2 s.
    let source = upright_phone_clip();
    let job = &storyboards_of(&p, "clips/phone.mp4", &std::fs::read(&source).unwrap()).await[0];
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let prefix = format!("derived/{}/", job.job_key);
    let vtt = String::from_utf8(p.output(&format!("{prefix}storyboard.vtt")).await).unwrap();
    let cues = read_cues(&vtt);
    // 2 s by default: a tile a second; 128 wide, portrait.
    assert_eq!(cues.len(), 2, "{vtt}");
    let (w, h) = (cues[0].5, cues[0].6);
    assert_eq!((w, h), (128, 170), "{vtt}");
    assert_eq!(cues[0].2, "storyboard-0.webp");
    let sheet = image::load_from_memory(&p.output(&format!("{prefix}storyboard-0.webp")).await)
        .unwrap()
        .to_rgb8();
    assert_eq!(sheet.dimensions(), (256, 170));
    // The upright frame, not the coded one squeezed upright: the 240p
    // rendition of a 320x240 test pattern at CRF 23 keeps less detail
    // than the clock's, so the bound is lower, the margin wide.
    for (start, _, _, x, y, w, h) in &cues {
        let tile = image::imageops::crop_imm(&sheet, *x, *y, *w, *h).to_image();
        let upright = luma_ssim(&tile, &frame_at(&source, *start, *w, *h));
        let coded = extract(&source, *start, *w, *h, &["-noautorotate"]);
        let sideways = luma_ssim(&tile, &coded);
        eprintln!("cue at {start} s: SSIM {upright:.4} upright, {sideways:.4} as coded");
        assert!(
            upright >= 0.8 && upright > sideways + 0.3,
            "cue at {start} s: SSIM {upright} upright, {sideways} as coded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storyboard_chained_to_another_file_fails_for_good_naming_it() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"name":"hls","step":"hls-package","version":1,"params":{"ladder":[240],"segment":2,"preset":"ultrafast","min_seconds":5}},
                {"step":"storyboard","version":1,"params":{},"input":{"recipe":"hls","file":"master.m3u8"}}]"#
                .into(),
        ),
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let job = &storyboards_of(&p, "clips/wrong.mp4", &common::hls::small_clip()).await[0];
    assert_eq!(job.outcome, Outcome::Unprocessable, "{job:?}");
    let error = job.reason.clone().unwrap_or_default();
    assert!(
        error.contains("must be an hls-package's package.json"),
        "{error}"
    );
}
