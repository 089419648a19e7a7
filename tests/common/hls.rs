//! Running `hls-package` and `hls-chunk` directly, outside the handler:
//! the baseline a split job's package is held to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mediaonce::fingerprint::fingerprint;
use mediaonce::key::Recipe;
use mediaonce::step::{JobInput, JobOutputs, Step, StepContext, StepError};
use mediaonce::steps::hls::{HlsPackage, SCRATCH_RESERVE_BYTES};
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::{ObjectRef, ObjectStore};

use super::media::{av_clip, ffmpeg};

/// A 3 s clip of picture and sound, 320x240.
pub fn small_clip() -> Vec<u8> {
    std::fs::read(av_clip("hls-3s.mp4", "320x240", 24, 3, &[])).unwrap()
}

/// A scratch directory of the test's own.
pub fn tempdir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The step with the tests' ffmpeg and a scratch directory of its own.
pub fn step_in(scratch: &str) -> HlsPackage {
    HlsPackage {
        ffmpeg: ffmpeg(),
        scratch: tempdir(scratch),
        scratch_reserve: SCRATCH_RESERVE_BYTES,
    }
}

/// Runs the step directly on an in-memory store: (result, files left in
/// scratch afterwards).
pub async fn run_direct(
    step: &HlsPackage,
    input: &[u8],
    params: serde_json::Value,
    deadline_ms: Option<u64>,
) -> Result<BTreeMap<String, Vec<u8>>, StepError> {
    run_direct_at(
        step,
        input,
        params,
        deadline_ms,
        &mediaonce::lease::SystemClock,
    )
    .await
}

/// [`run_direct`] on a worker whose clock is `clock`.
pub async fn run_direct_at(
    step: &HlsPackage,
    input: &[u8],
    params: serde_json::Value,
    deadline_ms: Option<u64>,
    clock: &dyn mediaonce::lease::Clock,
) -> Result<BTreeMap<String, Vec<u8>>, StepError> {
    let recipe = Recipe::from_value(&serde_json::json!({
        "step": "hls-package", "version": 1, "params": params
    }))
    .unwrap();
    run_recipe(step, input, &recipe, deadline_ms, clock).await
}

/// Runs `step` on `recipe` directly on an in-memory store (the input
/// `in/clip.mp4`, the outputs under `out/job/`): its outputs.
pub async fn run_recipe<S: Step>(
    step: &S,
    input: &[u8],
    recipe: &Recipe,
    deadline_ms: Option<u64>,
    clock: &dyn mediaonce::lease::Clock,
) -> Result<BTreeMap<String, Vec<u8>>, StepError> {
    let objects = InMemoryObjects::new();
    objects.insert("in", "clip.mp4", input, true);
    let store = ObjectStore::new(objects.clone());
    let object = ObjectRef {
        bucket: "in".into(),
        key: "clip.mp4".into(),
        version_id: None,
        if_match: None,
    };
    let head = store.head(&object).await.unwrap().unwrap();
    let input = JobInput::new(store.clone(), head.clone(), fingerprint(&head));
    let context = StepContext {
        job_key: "direct",
        recipe,
        input: &input,
        deadline_ms,
        clock,
    };
    let mut outputs = JobOutputs::new(store, "out", "job/");
    let params = step.params(&recipe.params).expect("valid params");
    step.run(&params, &context, &mut outputs).await?;
    Ok(objects
        .keys("out", "job/")
        .into_iter()
        .map(|k| (k.clone(), objects.bytes("out", &k).unwrap()))
        .collect())
}

/// Plays `master` in ffmpeg's HLS client: (video frames decoded, audio
/// samples decoded, per channel). Its warnings too are failures: a
/// transport stream whose continuity counters jump where a chunk begins,
/// unflagged, is `Packet corrupt` to its demuxer (issue 38).
pub fn play(master: &Path, scratch: &Path) -> (usize, usize) {
    let audio = scratch.join("played.f32");
    let out = Command::new(ffmpeg())
        // The static ffmpeg's MPEG-TS demuxer converts DVB text with
        // iconv, whose static glibc loads gconv modules from the system
        // and crashes; with none found it falls back.
        .env("GCONV_PATH", "/nonexistent")
        .args([
            "-hide_banner",
            "-loglevel",
            "warning",
            "-nostdin",
            "-y",
            "-i",
        ])
        .arg(master)
        .args(["-map", "0:v:0", "-f", "framecrc", "-"])
        .args(["-map", "0:a:0", "-ac", "1", "-f", "f32le"])
        .arg(&audio)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "playing {}: {}",
        master.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let frames = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("0,"))
        .count();
    let samples = std::fs::metadata(&audio).unwrap().len() as usize / 4;
    (frames, samples)
}

/// An ffmpeg that fails the run of span 2 (`-start_number 2`), naming
/// the injected failure, and runs every other.
pub fn ffmpeg_failing_span_2() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("failing-ffmpeg");
    let script = dir.join("ffmpeg");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             case \" $* \" in *' -start_number 2 '*) echo 'injected failure' >&2; exit 1;; esac\n\
             exec '{real}' \"$@\"\n",
            real = super::media::ffmpeg().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}
