//! `hls-package` with the pinned ffmpeg: a ladder into the job's prefix on the
//! emulators, playlists that parse with segment durations that fit, the same
//! bytes from two runs, and the error cases.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::hls::{run_direct, run_direct_at, run_recipe, small_clip, step_in, tempdir};
use common::media::{av_clip, clip, ffmpeg, upright_phone_clip};
use common::ts::read_segment;
use common::{Options, Pipeline};
use std::sync::atomic::Ordering;

use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::key::Recipe;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::step::Manifest;
use mediaonce::steps::ffmpeg::STOP_BEFORE_DEADLINE;
use mediaonce::steps::hls::chunk_job::{ChunkParams, ChunkSegments, HlsChunk};
use mediaonce::steps::hls::{Encoding, HlsPackage, HlsParams};

/// A media playlist: its target duration, segments and their durations.
#[derive(Debug)]
struct MediaPlaylist {
    target: f64,
    segments: Vec<(String, f64)>,
}

/// Parses a media playlist strictly enough to catch a broken one.
fn parse_media(text: &str) -> MediaPlaylist {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("#EXTM3U"), "{text}");
    let mut target = None;
    let mut segments = Vec::new();
    let mut pending = None;
    let mut ended = false;
    for line in lines {
        if let Some(v) = line.strip_prefix("#EXT-X-TARGETDURATION:") {
            target = Some(v.parse::<f64>().unwrap());
        } else if let Some(v) = line.strip_prefix("#EXTINF:") {
            pending = Some(v.trim_end_matches(',').parse::<f64>().unwrap());
        } else if line == "#EXT-X-ENDLIST" {
            ended = true;
        } else if !line.starts_with('#') && !line.is_empty() {
            let duration = pending.take().expect("a segment without #EXTINF");
            segments.push((line.to_string(), duration));
        }
    }
    assert!(ended, "no #EXT-X-ENDLIST in a VOD playlist: {text}");
    MediaPlaylist {
        target: target.expect("no #EXT-X-TARGETDURATION"),
        segments,
    }
}

/// The master playlist's variants: (attributes, playlist URI).
fn parse_master(text: &str) -> Vec<(BTreeMap<String, String>, String)> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("#EXTM3U"), "{text}");
    let mut variants = Vec::new();
    let mut pending = None;
    for line in lines {
        if let Some(attrs) = line.strip_prefix("#EXT-X-STREAM-INF:") {
            pending = Some(parse_attributes(attrs));
        } else if !line.starts_with('#') && !line.is_empty() {
            variants.push((
                pending.take().expect("a URI without #EXT-X-STREAM-INF"),
                line.to_string(),
            ));
        }
    }
    variants
}

/// `A=1,B="x,y"` into a map (quoted values may hold commas).
fn parse_attributes(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=').expect("NAME=value");
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').expect("closing quote");
            (&quoted[..end], &quoted[end + 1..])
        } else {
            after.split_at(after.find(',').unwrap_or(after.len()))
        };
        out.insert(name.to_string(), value.to_string());
        rest = after.strip_prefix(',').unwrap_or(after);
    }
    out
}

/// A segment's video codec and displayed size, read by the tests' own
/// MPEG-TS reader; also checks that it carries AAC when `with_audio`.
fn video_stream(bytes: &[u8], with_audio: bool) -> (String, u32, u32) {
    let segment = read_segment(bytes);
    assert!(segment.has_h264(), "{segment:?}");
    assert_eq!(segment.has_aac(), with_audio, "{segment:?}");
    let (width, height) = segment.video_size.expect("an H.264 stream has an SPS");
    ("h264".to_string(), width, height)
}

async fn package(p: &Pipeline, key: &str, bytes: &[u8]) -> JobReport {
    p.put(key, bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap().clone();
    job
}

/// An upload without a SHA-256 checksum is keyed by content in `auto`
/// identity, and the read that hashes it is the one ffmpeg's input comes
/// from: one GetObject in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchecksummed_movie_is_read_once_to_key_and_package() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[240],"segment":2,"preset":"ultrafast","min_seconds":5}}]"#
                .into(),
        ),
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let bytes = std::fs::read(av_clip("hls-5s.mp4", "640x360", 25, 5, &[])).unwrap();
    p.put("clips/plain.mp4", &bytes, false).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap().clone();
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{job:?}"
    );
    let recipe_hash = &p.app.config.recipes[0].recipe_hash;
    assert_eq!(job.job_key, job_key(&sha256_hex(&bytes), recipe_hash));
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 1);
    assert_eq!(p.reads.ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ladder_lands_in_the_job_prefix_with_playlists_that_parse() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":["720","360p",240],"segment":2,"preset":"ultrafast","min_seconds":5}}]"#
                .into(),
        ),
        // Outputs elsewhere: their notifications must not be received as uploads.
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let bytes = std::fs::read(av_clip("hls-5s.mp4", "640x360", 25, 5, &[])).unwrap();
    let job = package(&p, "clips/a.mp4", &bytes).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let prefix = format!("derived/{}/", job.job_key);
    let manifest: Manifest =
        serde_json::from_slice(&p.output(&format!("{prefix}_manifest.json")).await).unwrap();
    let listed: Vec<String> = manifest.outputs.iter().map(|o| o.name.clone()).collect();
    let mut stored: Vec<String> = p
        .output_keys(&prefix)
        .await
        .into_iter()
        .map(|k| k[prefix.len()..].to_string())
        .filter(|k| k != "_manifest.json")
        .collect();
    stored.sort();
    assert_eq!(listed, stored);

    // 720 is above the 360-line source: never upscaled.
    let master = String::from_utf8(p.output(&format!("{prefix}master.m3u8")).await).unwrap();
    let variants = parse_master(&master);
    let uris: Vec<&str> = variants.iter().map(|(_, uri)| uri.as_str()).collect();
    assert_eq!(uris, ["360p/index.m3u8", "240p/index.m3u8"], "{master}");
    let resolutions: Vec<&str> = variants
        .iter()
        .map(|(a, _)| a["RESOLUTION"].as_str())
        .collect();
    assert_eq!(resolutions, ["640x360", "426x240"]);
    for (attributes, uri) in &variants {
        let rendition = uri.trim_end_matches("/index.m3u8");
        let first = read_segment(&p.output(&format!("{prefix}{rendition}/seg-00000.ts")).await);
        assert_eq!(
            attributes["CODECS"],
            format!("{},mp4a.40.2", first.video_codec.unwrap())
        );
        assert_eq!(attributes["FRAME-RATE"], "25.000", "{master}");
        // Measured over the stored segments: the average is every byte over
        // the playlist's duration; the peak lies between the richest whole
        // 2 s segment's rate and the richest segment's.
        let text =
            String::from_utf8(p.output(&format!("{prefix}{rendition}/index.m3u8")).await).unwrap();
        let mut rates = Vec::new();
        let (mut bytes, mut seconds) = (0u64, 0f64);
        for (name, duration) in parse_media(&text).segments {
            let size = p.output(&format!("{prefix}{rendition}/{name}")).await.len() as u64;
            rates.push((size as f64 * 8.0 / duration, duration));
            bytes += size;
            seconds += duration;
        }
        let average: f64 = attributes["AVERAGE-BANDWIDTH"].parse().unwrap();
        assert!(
            (average - bytes as f64 * 8.0 / seconds).abs() <= 1.0,
            "{average} for {bytes} bytes in {seconds} s"
        );
        let peak: f64 = attributes["BANDWIDTH"].parse().unwrap();
        let whole = rates.iter().filter(|(_, d)| (*d - 2.0).abs() < 1e-3);
        let floor = whole.map(|(r, _)| *r).fold(0.0, f64::max);
        let ceiling = rates.iter().map(|(r, _)| *r).fold(0.0, f64::max);
        assert!(
            floor - 1.0 <= peak && peak <= ceiling + 1.0 && average <= peak,
            "{peak} outside [{floor}, {ceiling}]: {rates:?}"
        );
    }

    for (rendition, size) in [("360p", (640, 360)), ("240p", (426, 240))] {
        let text =
            String::from_utf8(p.output(&format!("{prefix}{rendition}/index.m3u8")).await).unwrap();
        let playlist = parse_media(&text);
        assert_eq!(playlist.segments.len(), 3, "{text}");
        let total: f64 = playlist.segments.iter().map(|(_, d)| d).sum();
        // The clip's 5 s, to within a frame.
        assert!((total - 5.0).abs() <= 0.04, "{total} s in {text}");
        for (i, (uri, duration)) in playlist.segments.iter().enumerate() {
            assert_eq!(uri, &format!("seg-{i:05}.ts"));
            assert!(
                *duration <= playlist.target,
                "{duration} > {}",
                playlist.target
            );
            if i + 1 < playlist.segments.len() {
                assert!((duration - 2.0).abs() < 0.05, "segment {i}: {duration} s");
            }
            assert!(stored.contains(&format!("{rendition}/{uri}")));
        }
        let segment = p.output(&format!("{prefix}{rendition}/seg-00000.ts")).await;
        assert_eq!(
            video_stream(&segment, true),
            ("h264".to_string(), size.0, size.1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_write_the_same_bytes() {
    // Two recipe versions: two jobs, two runs of the same work.
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[240,144],"segment":1,"preset":"ultrafast","min_seconds":5}},
                {"step":"hls-package","version":2,"params":{"ladder":[240,144],"segment":1,"preset":"ultrafast","min_seconds":5}}]"#
                .into(),
        ),
        // Outputs elsewhere: their notifications must not be received as uploads.
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let bytes = small_clip();
    p.put("clips/twice.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let jobs: Vec<&JobReport> = report.jobs().collect();
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|j| j.outcome == Outcome::Ran), "{report:?}");
    assert_ne!(jobs[0].job_key, jobs[1].job_key);
    let first = outputs(&p, &jobs[0].job_key).await;
    let second = outputs(&p, &jobs[1].job_key).await;
    // master, the index, 2 playlists and 2 I-frame playlists, 3 segments
    // each.
    assert_eq!(first.len(), 12, "{:?}", first.keys());
    assert_eq!(
        first.keys().collect::<Vec<_>>(),
        second.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &first {
        assert!(bytes == &second[name], "{name} differs between two runs");
    }
}

#[tokio::test]
async fn silent_video_gets_renditions_without_audio() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[240,144],"segment":1,"preset":"ultrafast","min_seconds":5}}]"#
                .into(),
        ),
        // Outputs elsewhere: their notifications must not be received as uploads.
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let silent = clip(
        "silent-3s.mp4",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=320x240:rate=24:duration=3",
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv420p",
        ],
    );
    let job = package(&p, "clips/silent.mp4", &std::fs::read(silent).unwrap()).await;
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let files = outputs(&p, &job.job_key).await;
    let master = String::from_utf8(files["master.m3u8"].clone()).unwrap();
    let variants = parse_master(&master);
    assert_eq!(variants.len(), 2, "{master}");
    for (attributes, _) in variants {
        assert!(!attributes["CODECS"].contains("mp4a"), "{master}");
    }
}

/// A job's outputs but its manifest, by name.
async fn outputs(p: &Pipeline, job_key: &str) -> BTreeMap<String, Vec<u8>> {
    let prefix = format!("derived/{job_key}/");
    let mut files = BTreeMap::new();
    for name in p.output_keys(&prefix).await {
        if !name.ends_with("_manifest.json") {
            files.insert(name[prefix.len()..].to_string(), p.output(&name).await);
        }
    }
    files
}

#[tokio::test]
async fn inputs_it_cannot_package_fail_their_job_with_the_reason() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[360],"min_seconds":5}}]"#
                .into(),
        ),
        // Outputs elsewhere: their notifications must not be received as uploads.
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let job = package(
        &p,
        "not-a-movie.png",
        include_bytes!("../events/sample.png"),
    )
    .await;
    // No retry can make a PNG a movie: unprocessable at once.
    assert_eq!(job.outcome, Outcome::Unprocessable);
    let reason = job.reason.unwrap();
    assert!(
        reason.contains("hls-package reads MP4/MOV inputs: not a movie"),
        "{reason}"
    );

    let tone = clip(
        "tone-1s.m4a",
        &[
            "-f",
            "lavfi",
            "-i",
            "sine=duration=1",
            "-c:a",
            "aac",
            "-f",
            "ipod",
        ],
    );
    let job = package(&p, "tone.m4a", &std::fs::read(tone).unwrap()).await;
    assert_eq!(job.outcome, Outcome::Unprocessable);
    assert!(job.reason.unwrap().contains("needs a video track"));
}

/// Params for the quickest real run: one 144-line rendition, ultrafast.
fn one_quick_rung() -> serde_json::Value {
    serde_json::json!({"ladder": [144], "preset": "ultrafast"})
}

/// A stand-in ffmpeg: a script that writes its own environment (as the
/// kernel holds it, `/proc/self/environ`) and its arguments into `record`,
/// then runs the real ffmpeg with the same arguments. Paths are written
/// into the script: it gets no environment to find them in.
fn recording_ffmpeg(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let record = dir.join("record");
    let script = dir.join("ffmpeg");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             mkdir -p '{record}'\n\
             tr '\\000' '\\n' < /proc/$$/environ > '{record}/environ'\n\
             printf '%s\\n' \"$@\" > '{record}/args'\n\
             exec '{real}' \"$@\"\n",
            record = record.display(),
            real = ffmpeg().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, record)
}

/// The step running [`recording_ffmpeg`], in a scratch directory of its
/// own: (step, the record folder).
fn recorded_step(name: &str) -> (HlsPackage, PathBuf) {
    let (script, record) = recording_ffmpeg(&tempdir(&format!("{name}_ffmpeg")));
    let step = HlsPackage {
        ffmpeg: script,
        ..step_in(name)
    };
    (step, record)
}

#[tokio::test]
async fn ffmpeg_gets_no_credentials_and_reads_only_the_local_movie() {
    let (step, record) = recorded_step("recorded");
    // The parent has credentials to hide (make test exports the emulators').
    let secrets: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("AWS_"))
        .collect();
    let bytes = small_clip();
    let files = run_direct(&step, &bytes, one_quick_rung(), None)
        .await
        .unwrap();
    assert!(files.contains_key("job/master.m3u8"), "{:?}", files.keys());

    let environ = std::fs::read_to_string(record.join("environ")).unwrap();
    let mut names: Vec<&str> = environ
        .lines()
        .filter_map(|l| l.split_once('=').map(|(name, _)| name))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["GCONV_PATH", "LANG", "PATH", "TMPDIR"],
        "{environ} (parent had {secrets:?})"
    );
    assert!(environ.contains("LANG=C\n"), "{environ}");
    // TMPDIR is the job's own scratch directory, removed after the step.
    let tmpdir = environ
        .lines()
        .find_map(|l| l.strip_prefix("TMPDIR="))
        .unwrap();
    assert!(
        tmpdir.starts_with(&step.scratch.join("mediaonce-direct").display().to_string()),
        "{tmpdir}"
    );
    assert!(!std::path::Path::new(tmpdir).exists());

    let args: Vec<String> = std::fs::read_to_string(record.join("args"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let input = args.iter().position(|a| a == "-i").unwrap();
    assert_eq!(
        args[input - 4..input],
        ["-protocol_whitelist", "file", "-f", "mov"],
        "{args:?}"
    );
    assert!(args[input + 1].ends_with("/input"), "{args:?}");
}

/// Clears the self-contained flag of the first `url ` data reference in a
/// movie's `dref`, as a QuickTime file whose media lives elsewhere has it.
fn with_external_data_reference(mut movie: Vec<u8>) -> Vec<u8> {
    let dref = movie.windows(4).position(|w| w == b"dref").expect("a dref");
    let url = dref + movie[dref..].windows(4).position(|w| w == b"url ").unwrap();
    // Type, then version (1 byte) and flags (3 bytes): flags 1 → 0.
    assert_eq!(movie[url + 4..url + 8], [0, 0, 0, 1]);
    movie[url + 7] = 0;
    movie
}

#[tokio::test]
async fn a_movie_with_external_data_is_refused_before_ffmpeg_runs() {
    let (step, record) = recorded_step("external_ref");
    let bytes = small_clip();
    let err = run_direct(
        &step,
        &with_external_data_reference(bytes),
        one_quick_rung(),
        None,
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("refuses a movie whose data is outside the file (track 1: 'url ')"),
        "{message}"
    );
    assert!(!record.exists(), "ffmpeg ran");
    assert_eq!(std::fs::read_dir(&step.scratch).unwrap().count(), 0);
}

#[tokio::test]
async fn without_ffmpeg_the_error_says_how_to_get_it() {
    let step = HlsPackage {
        ffmpeg: PathBuf::from("/nonexistent/ffmpeg"),
        ..step_in("no_ffmpeg")
    };
    let bytes = std::fs::read(av_clip("hls-5s.mp4", "640x360", 25, 5, &[])).unwrap();
    let err = run_direct(&step, &bytes, serde_json::json!({"ladder": [240]}), None)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("cannot run ffmpeg (/nonexistent/ffmpeg)"),
        "{message}"
    );
    assert!(message.contains("MEDIAONCE_FFMPEG"), "{message}");
    assert_eq!(
        std::fs::read_dir(&step.scratch).unwrap().count(),
        0,
        "scratch left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ffmpeg_is_stopped_before_the_deadline_and_its_scratch_removed() {
    let step = step_in("deadline");
    // Minutes of work at veryslow; the deadline leaves ffmpeg 1.5 s.
    let bytes = std::fs::read(av_clip("hls-1080p-8s.mp4", "1920x1080", 25, 8, &[])).unwrap();
    let deadline = common::now_ms() + STOP_BEFORE_DEADLINE.as_millis() as u64 + 1_500;
    let err = run_direct(
        &step,
        &bytes,
        serde_json::json!({"ladder": [1080, 720], "preset": "veryslow"}),
        Some(deadline),
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("ffmpeg stopped 10 s before the invocation deadline"),
        "{message}"
    );
    assert!(common::now_ms() < deadline - 5_000, "stopped too late");
    assert_eq!(
        std::fs::read_dir(&step.scratch).unwrap().count(),
        0,
        "scratch left behind"
    );
}

/// A worker's clock stopped at one instant.
#[derive(Debug)]
struct FixedClock(u64);

impl mediaonce::lease::Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

#[tokio::test]
async fn the_deadline_is_read_on_the_workers_clock() {
    let step = step_in("worker_clock");
    let bytes = small_clip();
    // By the worker's clock 9 s are left (less than the 10 s ffmpeg stops
    // before the deadline); by the system's, an hour: ffmpeg must not run on.
    let deadline = common::now_ms() + 3_600_000;
    let err = run_direct_at(
        &step,
        &bytes,
        one_quick_rung(),
        Some(deadline),
        &FixedClock(deadline - 9_000),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("ffmpeg stopped 10 s before the invocation deadline"),
        "{err}"
    );
}

#[tokio::test]
async fn an_input_that_does_not_fit_in_scratch_is_refused_before_spooling() {
    let step = step_in("no_room");
    let scratch = step.scratch.clone();
    // The real file system's free space, with a reserve it cannot meet
    // (a GiB over it: tests running beside this one free their scratch).
    let free = mediaonce::steps::hls::free_bytes(&scratch).unwrap();
    let step = HlsPackage {
        scratch_reserve: free + (1 << 30),
        ..step
    };
    let bytes = small_clip();
    let err = run_direct(&step, &bytes, serde_json::json!({"ladder": [240]}), None)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "the input ({} bytes) does not fit in {}",
            bytes.len(),
            scratch.display()
        )),
        "{message}"
    );
    assert!(
        message.contains("raise the function's ephemeral storage"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "spooled anyway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_clip_is_packaged_upright_by_its_displayed_height() {
    let step = step_in("rotated");
    // Coded 320x240, shown 240x320 (a phone held upright).
    let bytes = std::fs::read(upright_phone_clip()).unwrap();
    let files = run_direct(
        &step,
        &bytes,
        serde_json::json!({"ladder": [480, 320, 240], "segment": 1, "preset": "ultrafast"}),
        None,
    )
    .await
    .unwrap();
    let master = String::from_utf8(files["job/master.m3u8"].clone()).unwrap();
    let variants = parse_master(&master);
    // 480 is above the 320 displayed lines; 320 (which the coded 240
    // lines would rule out) and 240 fit, upright.
    let resolutions: Vec<&str> = variants
        .iter()
        .map(|(a, _)| a["RESOLUTION"].as_str())
        .collect();
    assert_eq!(resolutions, ["240x320", "180x240"], "{master}");
    for (rendition, width, height) in [("320p", 240, 320), ("240p", 180, 240)] {
        let segment = &files[&format!("job/{rendition}/seg-00000.ts")];
        assert_eq!(
            video_stream(segment, true),
            ("h264".to_string(), width, height)
        );
    }
}

/// Log lines, captured from a subscriber set for the current thread.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn ffmpegs_progress_is_logged_to_the_end() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test runtime has one thread: the step's logs land here.
    let _guard = tracing::subscriber::set_default(subscriber);
    let step = step_in("progress");
    let bytes = small_clip();
    run_direct(&step, &bytes, one_quick_rung(), None)
        .await
        .unwrap();
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let last = logs
        .lines()
        .rfind(|l| l.contains("hls-package: ffmpeg progress"))
        .unwrap_or_else(|| panic!("no progress logged: {logs}"));
    assert!(last.contains("job_key=\"direct\""), "{last}");
    assert!(last.contains("total_secs=3.0"), "{last}");
    let encoded: f64 = last
        .split("encoded_secs=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{last}"));
    assert!((encoded - 3.0).abs() < 0.1, "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_input_is_encoded_span_by_span_into_one_package() {
    // 1 s chunks of 1 s segments: the 3 s clip in three ffmpeg runs, as
    // three chunk jobs would encode it, against one run of the whole.
    let bytes = small_clip();
    let params = |chunk: u64| {
        serde_json::json!({"ladder": [144], "preset": "ultrafast", "segment": 1,
            "chunk_seconds": chunk})
    };
    let chunked = run_direct(&step_in("spans"), &bytes, params(1), None)
        .await
        .unwrap();
    let whole = run_direct(&step_in("spans-whole"), &bytes, params(60), None)
        .await
        .unwrap();
    let names = |files: &BTreeMap<String, Vec<u8>>| files.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&chunked),
        [
            "job/144p/iframes.m3u8",
            "job/144p/index.m3u8",
            "job/144p/seg-00000.ts",
            "job/144p/seg-00001.ts",
            "job/144p/seg-00002.ts",
            "job/master.m3u8",
            "job/package.json"
        ]
    );
    assert_eq!(names(&chunked), names(&whole));
    // The same durations, as measured from the segments.
    let playlist = |files: &BTreeMap<String, Vec<u8>>| {
        parse_media(std::str::from_utf8(&files["job/144p/index.m3u8"]).unwrap()).segments
    };
    assert_eq!(playlist(&chunked), playlist(&whole));
    // Continuous: frames 1/24 s apart (3,750 ticks), audio frames 1,024
    // samples apart, across both cuts; every segment opens on an IDR.
    let (mut video, mut audio) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let segment = read_segment(&chunked[&format!("job/144p/seg-{i:05}.ts")]);
        assert!(segment.idr[0], "segment {i} opens on an IDR");
        video.extend(segment.video_pts);
        audio.extend(segment.audio_pts);
    }
    assert_eq!(video.len(), 72);
    assert!(video.windows(2).all(|p| p[1] - p[0] == 3750), "{video:?}");
    let step = 1024 * 90_000 / 48_000;
    assert!(audio.windows(2).all(|p| p[1] - p[0] == step), "{audio:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_job_writes_its_span_s_segments_and_their_summaries() {
    // The 3 s clip in 1 s spans: chunk 1 run as a job of its own writes
    // the bytes the whole job writes for its span, and what the join needs.
    let bytes = small_clip();
    let package_params = serde_json::json!({"ladder": [144], "preset": "ultrafast",
        "segment": 1, "chunk_seconds": 1});
    let whole = run_direct(
        &step_in("chunk-job-whole"),
        &bytes,
        package_params.clone(),
        None,
    )
    .await
    .unwrap();
    let package = Recipe::from_value(&serde_json::json!({
        "step": "hls-package", "version": 1, "params": package_params
    }))
    .unwrap();
    let hls = HlsParams::from_params(&package.params).unwrap();
    let movie = mediaonce::bmff::read_movie(&bytes[..], bytes.len() as u64, &[])
        .await
        .unwrap();
    let spans = Encoding::of(&movie, &hls).unwrap().spans(&hls);
    assert_eq!(spans.len(), 3);
    let chunk_step = HlsChunk(step_in("chunk-job"));
    let span = &spans[1];
    let recipe = ChunkParams::recipe(&package, span.index, span.start_ms, span.end_ms);
    let files = run_recipe(
        &chunk_step,
        &bytes,
        &recipe,
        None,
        &mediaonce::lease::SystemClock,
    )
    .await
    .unwrap();
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(names, ["job/144p/seg-00001.ts", "job/segments.json"]);
    assert!(files["job/144p/seg-00001.ts"] == whole["job/144p/seg-00001.ts"]);
    let listing: ChunkSegments = serde_json::from_slice(&files["job/segments.json"]).unwrap();
    assert_eq!(listing.renditions.len(), 1);
    assert_eq!(listing.renditions[0].name, "144p");
    let segment = &listing.renditions[0].segments[0];
    assert_eq!(segment.name, "seg-00001.ts");
    assert_eq!(segment.frames, 24);
    assert!(segment.opens_on_keyframe);
    assert_eq!(segment.bytes, files["job/144p/seg-00001.ts"].len() as u64);

    // A span that is not the input's plan's is refused, and not as the
    // input's fault (a plan changed under a split in flight: retried, then
    // poisoned, never told to the upload as unprocessable).
    let mut wrong = recipe.clone();
    wrong.params["start_ms"] = 1500.into();
    let err = run_recipe(
        &chunk_step,
        &bytes,
        &wrong,
        None,
        &mediaonce::lease::SystemClock,
    )
    .await
    .unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    assert!(
        err.to_string()
            .contains("is not a span of this input's plan"),
        "{err}"
    );
}
