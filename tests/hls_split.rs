//! A long video's `hls-package` job split into chunk jobs, on the
//! emulators: the upload's message splits it and is done (`waiting`), the
//! chunk messages come through the queue and run, the last to finish
//! joins them, and the version is handed on to walk its pipeline again.
//! The package is held, byte for byte, to one run of the whole input.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use aws_lambda_events::event::sqs::SqsMessage;
use common::hls::{run_direct, small_clip, step_in};
use common::media::av_clip;
use common::{Options, Pipeline};

use mediaonce::handler::{JobReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::JobStatus;
use mediaonce::step::Manifest;

/// 1 s segments in 1 s chunks at the quickest preset.
fn split_params() -> serde_json::Value {
    serde_json::json!({"ladder": [144], "preset": "ultrafast", "segment": 1, "chunk_seconds": 1,
        "min_seconds": 5})
}

async fn split_pipeline(vars: Vec<(&'static str, String)>) -> Pipeline {
    let recipes = serde_json::json!([{"name": "hls", "step": "hls-package", "version": 1,
        "params": split_params()}]);
    Pipeline::new(Options {
        recipes: Some(recipes.to_string()),
        separate_output_bucket: true,
        vars,
        ..Options::default()
    })
    .await
}

/// What the queue brought, handled batch by batch as Lambda delivers it,
/// until a long poll finds it empty.
#[derive(Default)]
struct Drained {
    jobs: Vec<JobReport>,
    /// The bodies of the messages handled, and of those that came back.
    bodies: Vec<String>,
    failed: Vec<String>,
}

async fn drain(p: &Pipeline) -> Drained {
    let mut drained = Drained::default();
    for _ in 0..100 {
        let batch: Vec<SqsMessage> = p
            .receive_batch()
            .await
            .into_iter()
            .map(|m| p.lambda_message(m))
            .collect();
        if batch.is_empty() {
            break;
        }
        let report = p.handle(batch.clone()).await;
        for id in common::failed_ids(&report) {
            let message = batch.iter().find(|m| m.message_id.as_deref() == Some(&id));
            drained.failed.extend(message.and_then(|m| m.body.clone()));
        }
        drained
            .bodies
            .extend(batch.iter().filter_map(|m| m.body.clone()));
        drained.jobs.extend(report.jobs().cloned());
    }
    drained
}

/// Every object under the job's prefix, by name.
async fn package_of(p: &Pipeline, job_key: &str) -> BTreeMap<String, Vec<u8>> {
    let prefix = format!("derived/{job_key}/");
    let mut files = BTreeMap::new();
    for key in p.output_keys(&prefix).await {
        let bytes = p.output(&key).await;
        files.insert(key[prefix.len()..].to_string(), bytes);
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_video_is_split_into_chunk_jobs_and_joined_into_what_one_job_writes() {
    let p = split_pipeline(Vec::new()).await;
    // 5 s of picture and sound: five 1 s chunks.
    let bytes = std::fs::read(av_clip("hls-split-5s.mp4", "320x240", 24, 5, &[])).unwrap();
    let whole = run_direct(&step_in("split-whole"), &bytes, split_params(), None)
        .await
        .unwrap();

    p.put("talks/long.mp4", &bytes, true).await;
    let upload = p.receive(1).await;
    let upload_body = upload[0].body.clone().unwrap();
    let report = p.handle(upload).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Running);
    let split = row.split.clone().expect("the row records its split");
    assert_eq!(split.chunks.len(), 5);
    assert_eq!(split.waiters.len(), 1);
    for chunk in &split.chunks {
        assert_eq!(p.refs(chunk).await, 1, "the split references chunk {chunk}");
    }

    let Drained {
        jobs,
        bodies,
        failed,
    } = drain(&p).await;
    assert!(failed.is_empty(), "{failed:?}");
    // Each chunk ran once; the hand-on walked the version's pipeline again
    // and reused the joined job.
    let chunk_runs: Vec<&JobReport> = jobs.iter().filter(|j| j.step == "hls-chunk").collect();
    assert_eq!(chunk_runs.len(), 5, "{jobs:?}");
    assert!(chunk_runs.iter().all(|j| j.outcome == Outcome::Ran));
    let ran: BTreeSet<&String> = chunk_runs.iter().map(|j| &j.job_key).collect();
    assert_eq!(ran, split.chunks.iter().collect());
    let parent_reports: Vec<Outcome> = jobs
        .iter()
        .filter(|j| j.job_key == parent.job_key)
        .map(|j| j.outcome)
        .collect();
    assert_eq!(parent_reports, [Outcome::Reused]);

    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Done, 1));
    assert_eq!(row.split, None, "its end was handed on");
    for chunk in &split.chunks {
        assert_eq!(p.refs(chunk).await, 0, "chunk {chunk} released");
        let chunk_row = p.row(chunk).await.unwrap();
        assert!(
            chunk_row.free_mark.is_some(),
            "chunk {chunk} marked for the sweep"
        );
    }

    // The package: what one run of the whole input writes, byte for byte.
    let package = package_of(&p, &parent.job_key).await;
    let mut names: Vec<&str> = package.keys().map(String::as_str).collect();
    names.retain(|name| *name != "_manifest.json");
    let expected: Vec<&str> = whole.keys().map(|k| &k["job/".len()..]).collect();
    assert_eq!(names, expected);
    assert!(
        expected.len() >= 7,
        "5 segments and 2 playlists: {expected:?}"
    );
    for (name, bytes) in &whole {
        assert!(
            package[&name["job/".len()..]] == *bytes,
            "{name} differs from one run's"
        );
    }
    let manifest: Manifest = serde_json::from_slice(&package["_manifest.json"]).unwrap();
    assert_eq!(manifest.job_key, parent.job_key);
    assert_eq!(manifest.outputs.len(), whole.len());
    for file in &manifest.outputs {
        let one_run = &whole[&format!("job/{}", file.name)];
        assert_eq!(file.sha256, sha256_hex(one_run), "{}", file.name);
        assert_eq!(file.size, one_run.len() as u64, "{}", file.name);
    }

    // A duplicated upload message and a redelivered chunk message run
    // nothing: the parent is reused, the chunk reused and its parent ended.
    let chunk_body = bodies
        .iter()
        .find(|b| b.contains("hls-chunk/1"))
        .expect("a chunk message went through the queue");
    let report = p
        .handle(vec![
            p.send_raw(&upload_body).await,
            p.send_raw(chunk_body).await,
        ])
        .await;
    let outcomes: Vec<(&str, Outcome)> = report
        .jobs()
        .map(|j| (j.step.as_str(), j.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("hls-package", Outcome::Reused),
            ("hls-chunk", Outcome::Reused)
        ]
    );
    assert!(report.response().batch_item_failures.is_empty());
    assert!(
        drain(&p).await.jobs.is_empty(),
        "nothing was handed on again"
    );
}

/// A stand-in ffmpeg that fails the run of the span whose first segment
/// is `seg-00002.ts` (its `-start_number 2`) and runs the real one for the
/// rest.
fn ffmpeg_failing_span_2() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::hls::tempdir("failing-ffmpeg");
    let script = dir.join("ffmpeg");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             case \" $* \" in *' -start_number 2 '*) echo 'injected failure' >&2; exit 1;; esac\n\
             exec '{real}' \"$@\"\n",
            real = common::media::ffmpeg().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_fails_for_good_fails_its_parent_with_the_reason() {
    // One failure poisons a job here, so chunk 2 fails for good at once.
    let p = split_pipeline(vec![
        (
            "MEDIAONCE_FFMPEG",
            ffmpeg_failing_span_2().display().to_string(),
        ),
        ("MEDIAONCE_MAX_ATTEMPTS", "1".into()),
    ])
    .await;
    let bytes = small_clip();
    p.put("talks/broken.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    let split = p.row(&parent.job_key).await.unwrap().split.unwrap();
    assert_eq!(split.chunks.len(), 3);

    // The chunks run; chunk 2's run fails and its message comes back. (A
    // chunk that settles after that failure may fail the parent already.)
    let first = drain(&p).await;
    let failed_chunk: Vec<&String> = first
        .failed
        .iter()
        .filter(|body| body.contains("hls-chunk/1"))
        .collect();
    assert_eq!(failed_chunk.len(), 1, "{:?}", first.failed);
    assert!(failed_chunk[0].contains("\"index\":2"), "{failed_chunk:?}");

    // Its redelivery finds the chunk poisoned: the parent fails with the
    // chunk's reason, and the version, handed on, sees it poisoned.
    let report = p.handle(vec![p.send_raw(failed_chunk[0]).await]).await;
    let chunk = report.jobs().next().unwrap();
    assert_eq!(chunk.outcome, Outcome::Poisoned, "{report:?}");
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!((row.status, row.permanent), (JobStatus::Failed, true));
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("chunk 2") && error.contains("injected failure"),
        "{error}"
    );
    assert_eq!(row.split, None);
    for chunk in &split.chunks {
        assert_eq!(p.refs(chunk).await, 0, "chunk {chunk} released");
    }
    let mut jobs = first.jobs;
    jobs.extend(drain(&p).await.jobs);
    let parents: Vec<Outcome> = jobs
        .iter()
        .filter(|j| j.step == "hls-package")
        .map(|j| j.outcome)
        .collect();
    assert_eq!(parents, [Outcome::Poisoned], "{jobs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_message_is_refused_when_it_cannot_be_trusted() {
    let p = split_pipeline(Vec::new()).await;
    let bytes = small_clip();
    // No S3 checksum: the hash mediaonce computed (and cached) keys it.
    p.put("clips/chunked.mp4", &bytes, false).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    let input_hash = sha256_hex(&bytes);
    let head =
        p.s3.head_object()
            .bucket(&p.bucket)
            .key("clips/chunked.mp4")
            .send()
            .await
            .unwrap();
    let message = |input_hash: &str, parent: &str, recipe: &str| {
        serde_json::json!({"mediaonce": "hls-chunk/1", "bucket": p.bucket,
            "key": "clips/chunked.mp4", "versionId": null,
            "eTag": head.e_tag().unwrap().trim_matches('"'), "size": bytes.len(),
            "recipe": recipe, "inputHash": input_hash, "parent": parent,
            "index": 1, "startMs": 1000, "endMs": 2000})
        .to_string()
    };
    // A hash that is not the version's, a parent that does not follow, a
    // recipe that is not here: refused with the reason, nothing claimed.
    let forged = "0".repeat(64);
    for (body, why) in [
        (
            message(
                &forged,
                &job_key(&forged, &p.app.config.recipes[0].recipe_hash),
                "hls",
            ),
            "is not",
        ),
        (
            message(&input_hash, &forged, "hls"),
            "is not the key of its input hash",
        ),
        (
            message(&input_hash, &parent.job_key, "nope"),
            "no hls-package recipe",
        ),
    ] {
        let report = p.handle(vec![p.send_raw(&body).await]).await;
        assert_eq!(report.jobs().count(), 0, "{report:?}");
        assert_eq!(report.response().batch_item_failures.len(), 1);
        let error = report.messages[0].error.clone().unwrap_or_default();
        assert!(error.contains(why), "{error}");
    }
}
