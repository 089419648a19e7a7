//! `probe` on movies end to end on the emulators: MP4 (moov first or last),
//! MOV and M4A made by ffmpeg, read with ranged GETs only; truncated and
//! lying files fail their job with an error naming the box.

mod common;

use std::sync::atomic::Ordering;

use common::media::{av_clip, clip, upright_phone_clip};
use common::{Options, Pipeline};
use mediaonce::handler::{JobReport, Outcome};
use serde_json::Value;

async fn pipeline(params: &str) -> Pipeline {
    Pipeline::new(Options {
        recipes: Some(format!(
            r#"[{{"step":"probe","version":1,"params":{params}}}]"#
        )),
        // Outputs elsewhere: their notifications must not be received as uploads.
        separate_output_bucket: true,
        ..Options::default()
    })
    .await
}

/// Uploads `bytes` and handles its notification: the job and, if it ran,
/// its probe.json.
async fn run_probe(p: &Pipeline, key: &str, bytes: &[u8]) -> (JobReport, Option<Value>) {
    p.put(key, bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap().clone();
    let json = if job.outcome == Outcome::Ran {
        let bytes = p
            .output(&format!("derived/{}/probe.json", job.job_key))
            .await;
        Some(serde_json::from_slice(&bytes).unwrap())
    } else {
        None
    };
    (job, json)
}

fn track<'a>(probe: &'a Value, kind: &str) -> &'a Value {
    probe["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} track in {probe:#}"))
}

fn close(value: &Value, expected: f64, within: f64) -> bool {
    value
        .as_f64()
        .is_some_and(|v| (v - expected).abs() <= within)
}

#[tokio::test]
async fn an_mp4_reports_brand_duration_and_tracks_from_one_ranged_read() {
    let p = pipeline("{}").await;
    let path = av_clip(
        "faststart.mp4",
        "640x360",
        25,
        3,
        &["-movflags", "+faststart"],
    );
    let bytes = std::fs::read(&path).unwrap();
    let (job, probe) = run_probe(&p, "clips/a.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert_eq!(probe["content_type"], "video/mp4");
    assert_eq!(probe["major_brand"], "isom");
    assert!(close(&probe["duration"], 3.0, 0.05), "{probe:#}");
    assert_eq!(
        (probe["width"].as_u64(), probe["height"].as_u64()),
        (Some(640), Some(360))
    );
    let video = track(&probe, "video");
    assert_eq!(video["codec"], "avc1");
    assert!(
        video["codecs"].as_str().unwrap().starts_with("avc1."),
        "{video}"
    );
    assert_eq!(
        (video["width"].as_u64(), video["height"].as_u64()),
        (Some(640), Some(360))
    );
    assert_eq!(video["frame_rate"], 25.0);
    assert_eq!(video["samples"], 75);
    assert!(video["bitrate"].as_u64().unwrap() > 10_000, "{video}");
    let audio = track(&probe, "audio");
    assert_eq!(audio["codecs"], "mp4a.40.2");
    assert_eq!(audio["sample_rate"], 48_000);
    assert_eq!(audio["channels"], 1);
    assert!(close(&audio["bitrate"], 96_000.0, 20_000.0), "{audio}");
    assert_eq!(probe["sha256"], mediaonce::key::sha256_hex(&bytes));
    // The 256 KiB sniff read held the whole moov: nothing else was read.
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 0);
    assert_eq!(p.reads.ranged.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_moov_at_the_end_of_a_large_file_is_found_without_reading_the_media() {
    let p = pipeline("{}").await;
    // About 12 MB of media data (noise does not compress), then the moov.
    let path = av_clip(
        "moov-last.mp4",
        "1280x720",
        25,
        6,
        &["-vf", "noise=alls=40:allf=t", "-b:v", "16M"],
    );
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 8_000_000, "{} bytes", bytes.len());
    let moov_at = bytes.windows(4).rposition(|w| w == b"moov").unwrap();
    assert!(moov_at > bytes.len() / 2, "ffmpeg put the moov first");
    let (job, probe) = run_probe(&p, "clips/late.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert!(close(&probe["duration"], 6.0, 0.05), "{probe:#}");
    assert_eq!(track(&probe, "video")["height"], 720);
    assert!(
        close(&track(&probe, "video")["bitrate"], 16e6, 4e6),
        "{probe:#}"
    );
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 0);
    let reads = p.reads.ranged.load(Ordering::SeqCst);
    let read = p.reads.ranged_bytes.load(Ordering::SeqCst);
    eprintln!(
        "probe: {reads} ranged reads, {read} of {} bytes",
        bytes.len()
    );
    assert!(reads <= 3, "{reads} ranged reads");
    assert!(read < 400 * 1024, "{read} of {} bytes read", bytes.len());
}

#[tokio::test]
async fn a_mov_and_an_m4a() {
    let p = pipeline("{}").await;
    let mov = std::fs::read(av_clip("clip.mov", "320x240", 30, 2, &["-f", "mov"])).unwrap();
    let (job, probe) = run_probe(&p, "clips/b.mov", &mov).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert_eq!(probe["content_type"], "video/quicktime");
    assert_eq!(probe["major_brand"], "qt  ");
    assert_eq!(track(&probe, "video")["frame_rate"], 30.0);
    assert_eq!(track(&probe, "audio")["sample_rate"], 48_000);

    let m4a = std::fs::read(clip(
        "tone.m4a",
        &[
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=220:sample_rate=44100:duration=2",
            "-ac",
            "2",
            "-c:a",
            "aac",
            "-f",
            "ipod",
        ],
    ))
    .unwrap();
    let (job, probe) = run_probe(&p, "clips/c.m4a", &m4a).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert_eq!(probe["major_brand"], "M4A ");
    assert!(probe.get("width").is_none(), "{probe:#}");
    let audio = track(&probe, "audio");
    assert_eq!(
        (audio["sample_rate"].as_u64(), audio["channels"].as_u64()),
        (Some(44_100), Some(2))
    );
    assert!(close(&probe["duration"], 2.0, 0.05), "{probe:#}");
    assert_eq!(probe["tracks"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn truncated_and_lying_files_fail_with_the_box_named() {
    let p = pipeline("{}").await;
    let bytes = std::fs::read(av_clip("moov-last-small.mp4", "320x240", 25, 2, &[])).unwrap();

    // An upload cut short: the moov at the end is gone.
    let cut = &bytes[..bytes.len() * 3 / 5];
    let (job, _) = run_probe(&p, "clips/cut.mp4", cut).await;
    assert_eq!(job.outcome, Outcome::Unprocessable, "{job:?}");
    let reason = job.reason.unwrap();
    assert!(
        reason.contains("unreadable MP4/MOV: truncated file: box 'mdat'"),
        "{reason}"
    );

    // A sample table claiming a billion entries.
    let mut lying = bytes.clone();
    let at = lying.windows(4).rposition(|w| w == b"stts").unwrap() + 8;
    lying[at..at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    let (job, _) = run_probe(&p, "clips/lying.mp4", &lying).await;
    assert_eq!(job.outcome, Outcome::Unprocessable, "{job:?}");
    let reason = job.reason.unwrap();
    assert!(
        reason.contains("malformed box: 'stts' declares 1073741824 entries"),
        "{reason}"
    );
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn verify_reads_every_byte_and_checks_s3s_checksum() {
    let p = pipeline(r#"{"verify":true}"#).await;
    let bytes = std::fs::read(av_clip(
        "faststart.mp4",
        "640x360",
        25,
        3,
        &["-movflags", "+faststart"],
    ))
    .unwrap();
    let (job, probe) = run_probe(&p, "clips/v.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert_eq!(probe["sha256"], mediaonce::key::sha256_hex(&bytes));
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_rotated_clip_reports_its_rotation_and_coded_size() {
    let p = pipeline("{}").await;
    let bytes = std::fs::read(upright_phone_clip()).unwrap();
    let (job, probe) = run_probe(&p, "clips/phone.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    let video = track(&probe, "video");
    assert_eq!(
        (video["width"].as_u64(), video["height"].as_u64()),
        (Some(320), Some(240))
    );
    assert_eq!(video["rotation"], 90, "{video}");
}

#[tokio::test]
async fn a_fragmented_mp4_is_marked_so_with_its_tracks() {
    let p = pipeline("{}").await;
    let bytes = std::fs::read(av_clip(
        "fragmented.mp4",
        "320x240",
        25,
        2,
        // A keyframe a second: two fragments.
        &["-g", "25", "-movflags", "+frag_keyframe+empty_moov"],
    ))
    .unwrap();
    let (job, probe) = run_probe(&p, "clips/frag.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let probe = probe.unwrap();
    assert_eq!(probe["fragmented"], true);
    // From the last fragment, found through the index at the file's end.
    assert!(close(&probe["duration"], 2.0, 0.05), "{probe:#}");
    assert!(
        close(&track(&probe, "video")["duration"], 2.0, 0.05),
        "{probe:#}"
    );
    assert_eq!(track(&probe, "video")["codec"], "avc1");
    assert_eq!(track(&probe, "audio")["codecs"], "mp4a.40.2");
}

/// The handler on in-memory clients whose object store replaces
/// `clips/late.mp4` with `replacement` just before its GetObject number
/// `skip + 1`: (app, objects).
fn app_overwriting_before_read(
    skip: usize,
    replacement: &[u8],
) -> (
    std::sync::Arc<mediaonce::handler::App>,
    std::sync::Arc<mediaonce::store::memory::InMemoryObjects>,
) {
    use mediaonce::faults::{Call, FaultPlan};
    let steps = mediaonce::steps::StepRegistry::builtin();
    let vars = [
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "out"),
    ];
    let config = mediaonce::config::Config::from_lookup(
        |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        },
        &steps,
    )
    .unwrap();
    let objects = mediaonce::store::memory::InMemoryObjects::new();
    let plan = std::sync::Arc::new(FaultPlan::new());
    plan.overwrite_before(Call::GetObject, "clips/late.mp4", skip, replacement);
    let app = mediaonce::handler::App::new(
        config,
        mediaonce::ledger::Ledger::new(mediaonce::ledger::memory::InMemoryTable::new("jobs")),
        mediaonce::store::ObjectStore::new(mediaonce::store::faults::FaultyObjects::new(
            objects.clone(),
            plan,
        )),
        mediaonce::queue::Queue::new(std::sync::Arc::new(
            mediaonce::queue::RecordingQueue::default(),
        )),
    );
    (std::sync::Arc::new(app), objects)
}

/// An S3 notification of `key` with `etag`, as the queue would hand it over.
fn created(id: &str, key: &str, etag: &str) -> aws_lambda_events::event::sqs::SqsMessage {
    let body = serde_json::json!({"Records": [{
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "in"}, "object": {"key": key, "eTag": etag}}
    }]});
    let mut message = aws_lambda_events::event::sqs::SqsMessage::default();
    message.message_id = Some(id.into());
    message.receipt_handle = Some(format!("receipt-{id}"));
    message.body = Some(body.to_string());
    message
}

#[tokio::test]
async fn an_overwrite_between_two_ranged_reads_leaves_nothing_under_the_old_key() {
    // A moov at the end: probe's first read is the start, its second the moov.
    let old = std::fs::read(av_clip(
        "moov-last-small.mp4",
        "640x360",
        25,
        3,
        &["-vf", "noise=alls=40:allf=t", "-b:v", "4M"],
    ))
    .unwrap();
    assert!(old.len() > 600_000, "{} bytes", old.len());
    let new = std::fs::read(av_clip("hls-3s.mp4", "320x240", 24, 3, &[])).unwrap();
    let (app, objects) = app_overwriting_before_read(1, &new);
    let etag = objects.insert("in", "clips/late.mp4", &old, true);
    let old_key = mediaonce::key::job_key(
        &mediaonce::key::sha256_hex(&old),
        &app.config.recipes[0].recipe_hash,
    );

    let report =
        common::handle_with(app.clone(), vec![created("1", "clips/late.mp4", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Skipped, "{job:?}");
    assert_eq!(job.job_key, old_key);
    assert!(job
        .reason
        .as_deref()
        .unwrap()
        .contains("was replaced while the job read it"));
    assert!(report.response().batch_item_failures.is_empty());
    // No row (the claim was released) and no outputs under the old key.
    assert!(app.ledger.get(&old_key).await.unwrap().is_none());
    assert!(
        objects.keys("out", "").is_empty(),
        "{:?}",
        objects.keys("out", "")
    );

    // The new version's own event runs normally, under its own key.
    let new_etag = objects.insert("in", "clips/late.mp4", &new, true);
    let report =
        common::handle_with(app.clone(), vec![created("2", "clips/late.mp4", &new_etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    assert_ne!(job.job_key, old_key);
    let probe: Value = serde_json::from_slice(
        &objects
            .bytes("out", &format!("derived/{}/probe.json", job.job_key))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(track(&probe, "video")["width"], 320);
}

#[tokio::test]
async fn an_overwrite_between_the_head_and_the_read_is_skipped() {
    let old = std::fs::read(av_clip("hls-3s.mp4", "320x240", 24, 3, &[])).unwrap();
    let (app, objects) = app_overwriting_before_read(0, b"other bytes");
    let etag = objects.insert("in", "clips/late.mp4", &old, true);
    let report =
        common::handle_with(app.clone(), vec![created("1", "clips/late.mp4", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Skipped, "{job:?}");
    assert!(app.ledger.get(&job.job_key).await.unwrap().is_none());
    assert!(objects.keys("out", "").is_empty());
}

#[tokio::test]
async fn localstack_honours_if_match_on_get() {
    use mediaonce::store::{ErrorKind, ObjectRef};
    let p = pipeline("{}").await;
    let first = p.put("clips/pinned.bin", b"first bytes", false).await;
    let etag = first.e_tag().unwrap().trim_matches('"').to_string();
    let pinned = ObjectRef {
        bucket: p.bucket.clone(),
        key: "clips/pinned.bin".into(),
        version_id: None,
        if_match: Some(etag),
    };
    let store = mediaonce::store::ObjectStore::s3(p.s3.clone(), None);
    assert_eq!(store.get_range(&pinned, 0..5).await.unwrap(), b"first");
    p.put("clips/pinned.bin", b"second bytes", false).await;
    for err in [
        store.get_range(&pinned, 0..5).await.unwrap_err(),
        store.get(&pinned).await.unwrap_err(),
    ] {
        assert_eq!(err.kind, ErrorKind::PreconditionFailed, "{err}");
        assert!(err.to_string().contains("412"), "{err}");
    }
}
