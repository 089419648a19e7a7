//! A long video's `hls-package` job split into chunk jobs, on the
//! emulators: the upload's message splits it and is done (`waiting`), the
//! chunk messages come through the queue and run, the last to finish
//! joins them, and the version is handed on to walk its pipeline again.
//! The package is held, byte for byte, to one run of the whole input.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use aws_lambda_events::event::sqs::SqsMessage;
use common::hls::{play, run_direct, small_clip, step_in};
use common::media::av_clip;
use common::ts::read_segment;
use common::{Options, Pipeline};

use mediaonce::config::ENV_EVENT_BUS;
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::{JobRow, JobStatus};
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

/// The completion events the application's queue got (at least one: a
/// version may be handed on twice), each the same result.
async fn completion_events(p: &Pipeline, queue_url: &str) -> Vec<serde_json::Value> {
    let mut got: Vec<serde_json::Value> = Vec::new();
    for _ in 0..20 {
        let batch = common::receive_from(&p.sqs, queue_url).await;
        if batch.is_empty() && !got.is_empty() {
            break;
        }
        for message in batch {
            got.push(serde_json::from_str(message.body().unwrap()).expect("an event"));
        }
    }
    assert!(!got.is_empty(), "no completion event");
    let ids: BTreeSet<String> = got
        .iter()
        .map(|e| e["detail"]["eventId"].to_string())
        .collect();
    assert_eq!(ids.len(), 1, "{got:#?}");
    got
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
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = common::events::subscribed_bus(&p0).await;
    let p = split_pipeline(vec![(ENV_EVENT_BUS, bus)]).await;
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
    // Handed on at least once (two chunks finishing together may both end
    // the split).
    assert!(!parent_reports.is_empty());
    assert!(
        parent_reports.iter().all(|o| *o == Outcome::Reused),
        "{parent_reports:?}"
    );

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

    // The version's completion event, sent by its hand-on: the package
    // done, every file listed and counted.
    let event = &completion_events(&p, &app_queue).await[0];
    assert_eq!(
        event["detail-type"], "Media Pipeline Succeeded",
        "{event:#}"
    );
    assert_eq!(event["detail"]["key"], "talks/long.mp4");
    let job = &event["detail"]["jobs"][0];
    assert_eq!(
        (job["jobKey"].as_str(), job["status"].as_str()),
        (Some(parent.job_key.as_str()), Some("done"))
    );
    assert_eq!(job["fileCount"], whole.len());
    assert_eq!(job["files"].as_array().unwrap().len(), whole.len());

    // Read as a player would: every segment opens on an IDR, frames 1/24 s
    // apart and audio frames 1,024 samples apart across every chunk's cut;
    // and it plays end to end in ffmpeg's HLS client, every frame and
    // every sample of the clip.
    let (mut video, mut audio) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let segment = read_segment(&package[&format!("144p/seg-{i:05}.ts")]);
        assert!(segment.idr[0], "segment {i} opens on an IDR");
        video.extend(segment.video_pts);
        audio.extend(segment.audio_pts);
    }
    assert_eq!(video.len(), 120);
    assert!(video.windows(2).all(|p| p[1] - p[0] == 3_750), "{video:?}");
    let step = 1024 * 90_000 / 48_000;
    assert!(audio.windows(2).all(|p| p[1] - p[0] == step), "{audio:?}");
    let dir = common::hls::tempdir("split-played");
    for (name, bytes) in &package {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let (frames, samples) = play(&dir.join("master.m3u8"), &dir);
    assert_eq!(frames, 120);
    // The clip's 240,000 samples, less than one AAC frame of padding after
    // them, and the encoder's 1,024 samples of priming before (MPEG-TS has
    // no edit list to trim them; one run's package holds the same).
    let extra = samples.checked_sub(5 * 48_000 + 1_024);
    assert!(extra.is_some_and(|e| e < 1_024), "{samples} samples");

    // A duplicated upload message and a redelivered chunk message run
    // nothing: the parent is reused, the chunk skipped (its split is over).
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
            ("hls-chunk", Outcome::Skipped)
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_fails_for_good_fails_its_parent_with_the_reason() {
    // One failure poisons a job here, so chunk 2 fails for good at once.
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = common::events::subscribed_bus(&p0).await;
    let p = split_pipeline(vec![
        (ENV_EVENT_BUS, bus),
        (
            "MEDIAONCE_FFMPEG",
            common::hls::ffmpeg_failing_span_2().display().to_string(),
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

    // Chunk 2 runs first; its run fails and its message comes back.
    let mut messages = p.receive(3).await;
    let second = messages
        .iter()
        .position(|m| m.body.as_deref().unwrap_or("").contains("\"index\":2"))
        .expect("chunk 2's message");
    let second = messages.remove(second);
    let second_body = second.body.clone().unwrap();
    let report = p.handle(vec![second]).await;
    assert_eq!(report.response().batch_item_failures.len(), 1, "{report:?}");
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Running
    );

    // The others run, and settle: chunk 2 failed for good (one failure is
    // the cap), so the parent fails with its reason, its chunks released
    // and its waiting version handed on. In one batch: a settle that finds
    // the other's worker ending the parent is done too.
    let report = p.handle(messages).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let row = p.row(&parent.job_key).await.unwrap();
    // Poisoned by its count, not permanent: the chunk's runs were spent on
    // a failure that was not its input's fault, so the waiting version's
    // message goes on to the dead-letter queue (issue 37, defect 7), and
    // is not told its upload is unprocessable.
    assert_eq!(
        (row.status, row.permanent, row.failures),
        (JobStatus::Failed, false, 1)
    );
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("chunk 2") && error.contains("injected failure"),
        "{error}"
    );
    assert_eq!(row.split, None);
    for chunk in &split.chunks {
        assert_eq!(p.refs(chunk).await, 0, "chunk {chunk} released");
    }
    // The version, handed on, sees the parent poisoned; chunk 2's message,
    // come back, runs nothing.
    let drained = drain(&p).await;
    let parents: Vec<(&str, Outcome)> = drained
        .jobs
        .iter()
        .map(|j| (j.step.as_str(), j.outcome))
        .collect();
    // At least once: two settles that both find the parent ended may
    // each hand its version on (the second walk reuses what the first saw).
    assert!(!parents.is_empty(), "{parents:?}");
    assert!(
        parents
            .iter()
            .all(|p| *p == ("hls-package", Outcome::Poisoned)),
        "{parents:?}"
    );
    let report = p.handle(vec![p.send_raw(&second_body).await]).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Skipped], "{report:?}");
    // The version's event says the package failed, naming the chunk.
    let event = &completion_events(&p, &app_queue).await[0];
    assert_eq!(event["detail-type"], "Media Pipeline Failed", "{event:#}");
    let message = event["detail"]["jobs"][0]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("chunk 2") && message.contains("injected failure"),
        "{message}"
    );
}

/// Two chunks settling at once: the second finds the first's worker
/// joining and is done (its message acknowledged). The joiner's own
/// message carries the join: its worker dies, and that message's
/// redelivery, past the join's lease, takes the join over and ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_carried_by_the_joiners_message_alone() {
    let p = split_pipeline(Vec::new()).await;
    let bytes = small_clip();
    p.put("talks/joined.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    let mut messages = p.receive(3).await;
    assert_eq!(messages.len(), 3);
    messages.sort_by_key(|m| {
        (0..3)
            .position(|i| {
                m.body
                    .as_deref()
                    .unwrap_or("")
                    .contains(&format!("\"index\":{i}"))
            })
            .expect("a chunk message")
    });
    let chunk_1 = messages[1].body.clone().unwrap();
    let last = messages.pop().unwrap();
    let last_body = last.body.clone().unwrap();

    // Chunks 0 and 1 run; neither joins.
    let report = p.handle(messages).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );

    // Chunk 2's worker takes the row and writes the package, and is held
    // before it finishes the job (its second finish: the first is its
    // chunk's own).
    let (joiner, held) = p.paused_worker(mediaonce::faults::Call::Finish, 1);
    let joining = tokio::spawn(common::handle_with(joiner, vec![last]));
    held.reached().await;
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Running);
    assert!(row.split.as_ref().is_some_and(|s| s.joining), "{row:?}");

    // Chunk 1's message again: its chunk is reused, and its settle finds
    // the join held by a live worker: nothing left to do.
    let report = p.handle(vec![p.send_raw(&chunk_1).await]).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Reused], "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );

    // The joiner dies before its finish; its message comes back after the
    // join's lease, and that redelivery joins and hands the version on.
    joining.abort();
    assert!(joining.await.unwrap_err().is_cancelled());
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Running
    );
    let later = p.worker(
        3_600_000,
        std::sync::Arc::new(mediaonce::faults::FaultPlan::new()),
    );
    let report = common::handle_with(later, vec![p.send_raw(&last_body).await]).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Reused], "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let row = p.row(&parent.job_key).await.unwrap();
    // Taking a join counts no run.
    assert_eq!(
        (row.status, row.attempts, row.split),
        (JobStatus::Done, 1, None)
    );
    let drained = drain(&p).await;
    let parents: Vec<Outcome> = drained.jobs.iter().map(|j| j.outcome).collect();
    assert_eq!(parents, [Outcome::Reused]);
    // The package the new joiner wrote: its manifest lists every other
    // file, each as stored.
    let package = package_of(&p, &parent.job_key).await;
    let manifest: Manifest = serde_json::from_slice(&package["_manifest.json"]).unwrap();
    assert_eq!(
        manifest.outputs.len() + 1,
        package.len(),
        "{:?}",
        package.keys()
    );
    for file in &manifest.outputs {
        assert_eq!(
            file.sha256,
            sha256_hex(&package[&file.name]),
            "{}",
            file.name
        );
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_chunk_is_taken_over_and_no_sweep_takes_a_chunk_the_split_holds() {
    // No grace: a job nothing references is collected at once.
    let p = split_pipeline(vec![("MEDIAONCE_GC_GRACE_SECS", "0".into())]).await;
    let bytes = std::fs::read(av_clip("hls-split-5s.mp4", "320x240", 24, 5, &[])).unwrap();
    let whole = run_direct(&step_in("split-sweep-whole"), &bytes, split_params(), None)
        .await
        .unwrap();
    p.put("talks/swept.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    let split = p.row(&parent.job_key).await.unwrap().split.unwrap();

    // Chunk 1's worker died mid-encode: its row is running, its lease gone.
    let now = p.app.now_ms();
    let crashed = JobRow {
        execution: None,
        job_key: split.chunks[1].clone(),
        step: "hls-chunk".into(),
        input_hash: sha256_hex(&bytes),
        status: JobStatus::Running,
        lease_until_ms: now - 1,
        attempts: 1,
        owner: "crashed-worker/1".into(),
        output_prefix: p.app.config.output_location(&split.chunks[1]),
        error: None,
        updated_at_ms: now - 60_000,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
        split: None,
    };
    p.seed_row(&crashed).await;

    // Every chunk but the last runs; chunk 1 is taken over (its 2nd run).
    let mut messages = p.receive(5).await;
    let last = messages
        .iter()
        .position(|m| m.body.as_deref().unwrap_or("").contains("\"index\":4"))
        .expect("chunk 4's message");
    let last = messages.remove(last);
    let report = p.handle(messages).await;
    assert!(report.response().batch_item_failures.is_empty());
    let mut runs: Vec<(String, Outcome, u64)> = report
        .jobs()
        .map(|j| (j.job_key.clone(), j.outcome, j.attempt))
        .collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected: Vec<(String, Outcome, u64)> = split.chunks[..4]
        .iter()
        .map(|key| {
            (
                key.clone(),
                Outcome::Ran,
                if *key == split.chunks[1] { 2 } else { 1 },
            )
        })
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(runs, expected);

    // A sweep now finds four done chunks marked for collection, and keeps
    // each: the split references it.
    let sweep = p.app.collect_due(false).await.unwrap();
    assert!(sweep.failures.is_empty(), "{sweep:?}");
    assert_eq!(sweep.objects(), 0, "{sweep:?}");
    for chunk in &split.chunks[..4] {
        assert!(!p.output_keys(&format!("derived/{chunk}/")).await.is_empty());
    }

    // The last chunk joins them; then, with no grace, the chunks go.
    let report = p.handle(vec![last]).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Done
    );
    for chunk in &split.chunks {
        assert_eq!(p.row(chunk).await, None, "chunk {chunk} collected");
        assert!(p.output_keys(&format!("derived/{chunk}/")).await.is_empty());
    }
    let drained = drain(&p).await;
    let parents: Vec<Outcome> = drained.jobs.iter().map(|j| j.outcome).collect();
    assert_eq!(parents, [Outcome::Reused]);
    let package = package_of(&p, &parent.job_key).await;
    for (name, bytes) in &whole {
        assert!(package[&name["job/".len()..]] == *bytes, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_of_the_same_video_in_one_batch_all_wait_and_are_all_handed_on() {
    let p = split_pipeline(Vec::new()).await;
    let bytes = small_clip();
    p.put("a/talk.mp4", &bytes, true).await;
    p.put("b/talk.mp4", &bytes, true).await;
    let report = p.handle(p.receive(2).await).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Waiting, Outcome::Waiting], "{report:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let parent = report.jobs().next().unwrap().job_key.clone();
    let split = p.row(&parent).await.unwrap().split.unwrap();
    assert_eq!(split.waiters.len(), 2, "{:?}", split.waiters);

    let drained = drain(&p).await;
    assert!(drained.failed.is_empty(), "{:?}", drained.failed);
    let handed_on: Vec<Outcome> = drained
        .jobs
        .iter()
        .filter(|j| j.step == "hls-package")
        .map(|j| j.outcome)
        .collect();
    assert!(handed_on.len() >= 2, "{handed_on:?}");
    assert!(
        handed_on.iter().all(|o| *o == Outcome::Reused),
        "{handed_on:?}"
    );
    for key in ["a/talk.mp4", "b/talk.mp4"] {
        assert!(
            drained
                .bodies
                .iter()
                .any(|b| b.contains("pipeline/1") && b.contains(key)),
            "{key} was handed on"
        );
    }
    let ran = drained
        .jobs
        .iter()
        .filter(|j| j.step == "hls-chunk" && j.outcome == Outcome::Ran)
        .count();
    assert_eq!(ran, 3, "each chunk ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_whose_lease_passed_is_taken_over_and_sends_only_its_chunks_not_done() {
    let p = split_pipeline(Vec::new()).await;
    let bytes = small_clip();
    p.put("talks/stalled.mp4", &bytes, true).await;
    let upload = p.receive(1).await;
    let upload_body = upload[0].body.clone().unwrap();
    let report = p.handle(upload).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");

    // Chunks 0 and 1 run; chunk 2's message is lost (dead-lettered).
    let mut messages = p.receive(3).await;
    messages.retain(|m| !m.body.as_deref().unwrap_or("").contains("\"index\":2"));
    assert_eq!(messages.len(), 2);
    let report = p.handle(messages).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Running
    );

    // Past the split's lease, the upload's message (a redelivery, a new
    // upload of the bytes) takes the job over: a run counted, and only
    // chunk 2 is sent again.
    let later = p.worker(
        2 * 3_600_000,
        std::sync::Arc::new(mediaonce::faults::FaultPlan::new()),
    );
    let report = common::handle_with(later.clone(), vec![p.send_raw(&upload_body).await]).await;
    let taken = report.jobs().next().unwrap();
    assert_eq!(
        (taken.outcome, taken.attempt),
        (Outcome::Waiting, 2),
        "{report:?}"
    );
    let resent = p.receive(1).await;
    assert_eq!(resent.len(), 1);
    let body = resent[0].body.clone().unwrap();
    assert!(body.contains("\"index\":2"), "{body}");

    // It joins them; the version is handed on once.
    let report = common::handle_with(later.clone(), resent).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(
        (row.status, row.attempts, row.split),
        (JobStatus::Done, 2, None)
    );
    let drained = drain(&p).await;
    let outcomes: Vec<Outcome> = drained.jobs.iter().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Reused]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_keyed_by_version_and_etag_splits_too() {
    // Keyed without reading it (as an upload past what is read whole is in
    // `auto`): the chunks trust the key their version's HEAD gives again.
    let p = split_pipeline(vec![("MEDIAONCE_IDENTITY", "checksum".into())]).await;
    let bytes = small_clip();
    p.put("talks/big.mp4", &bytes, false).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(
        (parent.outcome, parent.input_hash_source),
        (Outcome::Waiting, Some(FingerprintSource::VersionEtag)),
        "{parent:?}"
    );
    let drained = drain(&p).await;
    assert!(drained.failed.is_empty(), "{:?}", drained.failed);
    let chunks = drained
        .jobs
        .iter()
        .filter(|j| j.step == "hls-chunk" && j.outcome == Outcome::Ran)
        .count();
    assert_eq!(chunks, 3);
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!((row.status, row.split), (JobStatus::Done, None));
}
