//! A long video's split run by Step Functions (issue 38), on the
//! emulators: LocalStack's Step Functions runs the state machine of
//! `statemachine/hls-split.asl.json`, the test delivers the chunk queue's
//! task messages to the handler as the chunk function's event source
//! would, and the handler answers each task with its token. The upload's
//! message starts the execution and is done (`waiting`); the execution's
//! end hands every version that uses the job on.

mod common;

use std::collections::BTreeMap;

use aws_lambda_events::event::sqs::SqsMessage;
use common::hls::{run_direct, small_clip, step_in};
use common::{receive_from, unique, Options, Pipeline};
use mediaonce::config::{ENV_CHUNK_QUEUE_URL, ENV_EVENT_BUS, ENV_SPLIT_MACHINE_ARN};
use mediaonce::executions::{ExecutionClient, ExecutionStatus, SfnExecutions};
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::ledger::JobStatus;
use serde_json::Value;

/// 1 s segments in 1 s chunks at the quickest preset.
fn split_params() -> Value {
    serde_json::json!({"ladder": [144], "preset": "ultrafast", "segment": 1, "chunk_seconds": 1,
        "min_seconds": 5})
}

/// A pipeline whose splits run as executions of a fresh state machine,
/// their tasks on a chunk queue of their own.
struct Split {
    p: Pipeline,
    chunk_queue: String,
    chunk_queue_arn: String,
    sfn: SfnExecutions,
    /// Every task message the handler was given.
    handled: std::sync::Mutex<Vec<String>>,
}

async fn split_pipeline(vars: Vec<(&'static str, String)>) -> Split {
    common::pipeline::require_emulators();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let sqs = mediaonce::aws::sqs_client(&sdk);
    let chunk_queue = common::sfn::queue(&sqs, "chunks").await;
    let chunk_queue_arn = common::sqs::queue_arn(&sqs, &chunk_queue).await;
    let machine = common::sfn::split_machine(&sfn).await;
    let recipes = serde_json::json!([{"name": "hls", "step": "hls-package", "version": 1,
        "params": split_params()}]);
    let mut all = vec![
        (ENV_SPLIT_MACHINE_ARN, machine),
        (ENV_CHUNK_QUEUE_URL, chunk_queue.clone()),
    ];
    all.extend(vars);
    let p = Pipeline::new(Options {
        recipes: Some(recipes.to_string()),
        separate_output_bucket: true,
        versioned: true,
        vars: all,
    })
    .await;
    Split {
        p,
        chunk_queue,
        chunk_queue_arn,
        sfn: SfnExecutions::new(sfn),
        handled: Default::default(),
    }
}

impl Split {
    /// Delivers the chunk queue's messages to the handler, batch by batch,
    /// deleting those it acknowledges (a message it sends back comes back
    /// at once), until `execution` has ended; its status and the chunk
    /// jobs' reports.
    async fn run_execution(&self, execution: &str) -> (ExecutionStatus, Vec<JobReport>) {
        let (status, reports) = self.run_with(&self.p.app, execution, |_| false).await;
        (status.expect("run to its end"), reports)
    }

    /// The same, with `app` as the chunk function, stopping (the message
    /// left for later) at the first task message `stop_before` picks:
    /// `None` then.
    async fn run_with(
        &self,
        app: &std::sync::Arc<mediaonce::handler::App>,
        execution: &str,
        stop_before: impl Fn(&Value) -> bool,
    ) -> (Option<ExecutionStatus>, Vec<JobReport>) {
        let mut reports = Vec::new();
        for _poll in 0..600 {
            // Asked first: LocalStack goes on sending an aborted
            // execution's chunk tasks (each acknowledged: its token is
            // gone), so the queue alone never says this one ended.
            match self.sfn.describe_execution(execution).await.unwrap() {
                Some(ExecutionStatus::Running) => {}
                Some(status) => return (Some(status), reports),
                None => panic!("no execution {execution}"),
            }
            let messages = receive_from(&self.p.sqs, &self.chunk_queue).await;
            if messages.is_empty() {
                continue;
            }
            let stop = messages.iter().any(|m| {
                serde_json::from_str::<Value>(m.body().unwrap_or_default())
                    .is_ok_and(|body| stop_before(&body))
            });
            if stop {
                for message in &messages {
                    self.come_back(message).await;
                }
                return (None, reports);
            }
            let batch: Vec<SqsMessage> = messages
                .iter()
                .cloned()
                .map(|m| common::sqs::lambda_message(m, &self.chunk_queue_arn))
                .collect();
            self.handled
                .lock()
                .unwrap()
                .extend(messages.iter().filter_map(|m| m.body().map(str::to_string)));
            let report = common::handle_with(app.clone(), batch).await;
            reports.extend(report.jobs().cloned());
            let failed = common::failed_ids(&report);
            for message in messages {
                if failed
                    .iter()
                    .any(|id| Some(id.as_str()) == message.message_id())
                {
                    self.come_back(&message).await;
                } else {
                    self.p
                        .sqs
                        .delete_message()
                        .queue_url(&self.chunk_queue)
                        .receipt_handle(message.receipt_handle().unwrap())
                        .send()
                        .await
                        .unwrap();
                }
            }
        }
        panic!("execution {execution} did not end");
    }

    /// A chunk queue message made visible again at once.
    async fn come_back(&self, message: &aws_sdk_sqs::types::Message) {
        self.p
            .sqs
            .change_message_visibility()
            .queue_url(&self.chunk_queue)
            .receipt_handle(message.receipt_handle().unwrap())
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }

    /// The job queue's messages, handled and deleted, until it is empty.
    async fn drain_jobs(&self) -> Vec<JobReport> {
        let mut reports = Vec::new();
        for _ in 0..20 {
            let messages = self.p.receive_batch().await;
            if messages.is_empty() {
                break;
            }
            let batch: Vec<SqsMessage> = messages
                .iter()
                .cloned()
                .map(|m| self.p.lambda_message(m))
                .collect();
            let report = self.p.handle(batch).await;
            reports.extend(report.jobs().cloned());
            for message in messages {
                self.p
                    .sqs
                    .delete_message()
                    .queue_url(&self.p.queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
        reports
    }
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
async fn a_split_runs_as_an_execution_and_every_upload_of_the_bytes_gets_its_event() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = common::events::subscribed_bus(&p0).await;
    let s = split_pipeline(vec![(ENV_EVENT_BUS, bus)]).await;
    let p = &s.p;
    let bytes = small_clip();
    let whole = run_direct(&step_in("execution-whole"), &bytes, split_params(), None)
        .await
        .unwrap();

    // The first upload starts the execution; its message is done.
    let first = p.put("talks/first.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Running);
    let execution = row
        .execution
        .clone()
        .expect("the row records its execution");
    assert!(
        execution.contains(&format!(":{}-", parent.job_key)),
        "named by the job: {execution}"
    );

    // A second upload of the same bytes, while it runs: done, waiting.
    p.put("talks/second.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let second = report.jobs().next().unwrap().clone();
    assert_eq!(second.job_key, parent.job_key);
    assert_eq!(second.outcome, Outcome::Waiting, "{second:?}");
    assert!(report.response().batch_item_failures.is_empty());

    // The coordinating upload goes for good (its version deleted, the
    // notification handled): the chunks read the second upload's bytes.
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key("talks/first.mp4")
        .set_version_id(first.version_id)
        .send()
        .await
        .unwrap();
    let deleted = p.handle(p.receive(1).await).await;
    assert!(
        deleted.response().batch_item_failures.is_empty(),
        "{deleted:?}"
    );

    let (status, chunks) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded, "{chunks:#?}");
    let ran: Vec<&JobReport> = chunks
        .iter()
        .filter(|r| r.outcome == Outcome::Ran)
        .collect();
    // small_clip is 3 s: three 1 s chunks.
    assert_eq!(ran.len(), 3, "each chunk ran once: {chunks:#?}");

    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Done, "{row:?}");
    // The package is what one run of the whole input writes, byte for byte.
    let package = package_of(p, &parent.job_key).await;
    let whole: BTreeMap<String, Vec<u8>> = whole
        .into_iter()
        .filter_map(|(name, bytes)| Some((name.strip_prefix("job/")?.to_string(), bytes)))
        .filter(|(name, _)| name != "_manifest.json")
        .collect();
    assert!(whole.contains_key("master.m3u8"), "{:?}", whole.keys());
    // Its I-frame playlists and its index too: a storyboard is keyed by
    // the index's bytes, so a split video's storyboard is the same job,
    // with the same outputs, as an unsplit one's.
    assert!(whole.contains_key("package.json"), "{:?}", whole.keys());
    assert!(
        whole.keys().any(|name| name.ends_with("/iframes.m3u8")),
        "{:?}",
        whole.keys()
    );
    for (name, bytes) in &whole {
        assert_eq!(
            package.get(name),
            Some(bytes),
            "{name} differs from one run's"
        );
    }

    // The end handed the second upload on (the first is gone): it walks,
    // reuses the package, and its event is published.
    let walked = s.drain_jobs().await;
    let reused: Vec<&JobReport> = walked
        .iter()
        .filter(|r| r.job_key == parent.job_key)
        .collect();
    assert_eq!(reused.len(), 1, "{walked:#?}");
    assert_eq!(reused[0].outcome, Outcome::Reused);
    let events = common::events::events(&p0, &app_queue, 1).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["detail-type"], "Media Pipeline Succeeded");
    assert_eq!(events[0]["detail"]["key"], "talks/second.mp4");

    // The chunks are released: only the second upload references the job,
    // nothing holds the chunks.
    assert_eq!(p.refs(&parent.job_key).await, 1);

    // `mediaonce status` prints the row and its execution's progress.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(["status", &parent.job_key])
        .env("MEDIAONCE_TABLE", &p.table)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let printed: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(printed["status"], "done");
    let progress = &printed["split_progress"];
    assert_eq!(progress["execution"], execution.as_str(), "{printed:#}");
    assert_eq!(progress["status"], "SUCCEEDED", "{printed:#}");
    assert_eq!(progress["chunks_succeeded"], 3, "{printed:#}");

    // It plays end to end, as a player reads it.
    let dir = common::hls::tempdir("execution-played");
    for (name, bytes) in &package {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let (frames, _) = common::hls::play(&dir.join("master.m3u8"), &dir);
    assert!(frames > 0);

    // A duplicated upload message reuses the package; a chunk task's
    // message delivered again finds its task ended and runs nothing.
    let chunk_body = s
        .handled
        .lock()
        .unwrap()
        .iter()
        .find(|b| b.contains("hls-chunk/2"))
        .cloned()
        .expect("a chunk task went through the queue");
    let second_body = serde_json::json!({"Records": [{"eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": p.bucket}, "object": {"key": "talks/second.mp4"}}}]})
    .to_string();
    let report = p
        .handle(vec![
            p.send_raw(&second_body).await,
            p.send_raw(&chunk_body).await,
        ])
        .await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Reused], "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
}

/// A chunk that fails every run: the definition retries it, the chunk
/// spends its runs (one here), the execution fails through its failure
/// task, which finishes the job poisoned naming the chunk, and its end
/// hands the upload on: one `Media Pipeline Failed` event, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_always_fails_fails_the_job_once_with_one_event_naming_it() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = common::events::subscribed_bus(&p0).await;
    let s = split_pipeline(vec![
        (ENV_EVENT_BUS, bus),
        (
            "MEDIAONCE_FFMPEG",
            common::hls::ffmpeg_failing_span_2().display().to_string(),
        ),
        ("MEDIAONCE_MAX_ATTEMPTS", "1".into()),
    ])
    .await;
    let p = &s.p;
    p.put("talks/broken.mp4", &small_clip(), true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();

    let (status, chunks) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Failed, "{chunks:#?}");
    // Chunk 2's run failed once and the definition's retry found it
    // poisoned; the other two ran.
    let ran = chunks.iter().filter(|r| r.outcome == Outcome::Ran).count();
    assert_eq!(ran, 2, "{chunks:#?}");
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Failed, "{row:?}");
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("chunk 2") && error.contains("injected failure"),
        "{error}"
    );

    // The upload, handed on, sees the job poisoned: one failure event.
    let walked = s.drain_jobs().await;
    let outcomes: Vec<Outcome> = walked.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Poisoned], "{walked:#?}");
    let events = common::events::events(&p0, &app_queue, 1).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["detail-type"], "Media Pipeline Failed");
    let message = events[0]["detail"]["jobs"][0]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("chunk 2"), "{message}");
}

/// The claimant recorded its execution on the row and died before it
/// started it (the order is record, hold, start): the row is running, its
/// lease two days long, and no such execution exists. The upload's next
/// delivery asks Step Functions, takes the job over (a run counted) and
/// starts an execution of its own, which joins the package.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimant_that_died_before_starting_its_execution_is_taken_over() {
    use mediaonce::executions::{execution_arn, execution_name};
    use mediaonce::key::{job_key, sha256_hex, Recipe};
    use mediaonce::ledger::{ClaimRequest, JobRow};

    let s = split_pipeline(Vec::new()).await;
    let p = &s.p;
    let bytes = small_clip();
    let recipe = serde_json::json!({"step": "hls-package", "version": 1, "params": split_params()});
    let key = job_key(
        &sha256_hex(&bytes),
        &Recipe::from_value(&recipe).unwrap().hash(),
    );
    let now = common::now_ms();
    let dead = "dead-claimant/1";
    let machine = p.app.config.split_machine_arn.clone().unwrap();
    let lost = execution_arn(&machine, &execution_name(&key, dead));
    p.seed_row(&JobRow {
        execution: Some(lost.clone()),
        ..JobRow::claimed(&ClaimRequest {
            job_key: key.clone(),
            step: "hls-package".into(),
            input_hash: sha256_hex(&bytes),
            output_prefix: p.app.config.output_location(&key),
            owner: dead.into(),
            lease_until_ms: now + 2 * 86_400_000,
            now_ms: now,
            max_attempts: 3,
        })
    })
    .await;

    p.put("talks/retaken.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(parent.job_key, key);
    assert_eq!(parent.outcome, Outcome::Waiting, "{parent:?}");
    assert_eq!(parent.attempt, 2, "the takeover is a run counted");
    let row = p.row(&key).await.unwrap();
    let execution = row.execution.clone().unwrap();
    assert_ne!(execution, lost, "an execution of its own");

    let (status, _) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded);
    assert_eq!(p.row(&key).await.unwrap().status, JobStatus::Done);
    // The upload whose delivery started the execution: its job `ran`.
    let walked = s.drain_jobs().await;
    let outcomes: Vec<Outcome> = walked.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ran], "{walked:#?}");
}

/// Two uploads of one video in one batch: the first's claim starts the
/// execution, the second's reads the job running and waits too; the end
/// hands both on, and each gets its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_of_the_same_video_in_one_batch_both_wait_and_both_get_their_event() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = common::events::subscribed_bus(&p0).await;
    let s = split_pipeline(vec![(ENV_EVENT_BUS, bus)]).await;
    let p = &s.p;
    let bytes = small_clip();
    p.put("talks/a.mp4", &bytes, true).await;
    p.put("talks/b.mp4", &bytes, true).await;
    let report = p.handle(p.receive(2).await).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Waiting, Outcome::Waiting], "{report:?}");
    let key = report.jobs().next().unwrap().job_key.clone();
    let execution = p.row(&key).await.unwrap().execution.unwrap();
    let (status, _) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded);
    // The one whose claim started the execution ran the job; the other
    // reused it.
    let walked = s.drain_jobs().await;
    let mut outcomes: Vec<&str> = walked.iter().map(|r| r.outcome.as_str()).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["ran", "reused"], "{walked:#?}");
    let mut keys: Vec<String> = common::events::events(&p0, &app_queue, 2)
        .await
        .iter()
        .map(|e| e["detail"]["key"].as_str().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    assert_eq!(keys, ["talks/a.mp4", "talks/b.mp4"]);
}

/// Keyed without reading it (as an upload past what is read whole is in
/// `auto`): the chunks trust the key their version's HEAD gives again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_keyed_by_version_and_etag_splits_too() {
    let s = split_pipeline(vec![("MEDIAONCE_IDENTITY", "checksum".into())]).await;
    let p = &s.p;
    p.put("talks/big.mp4", &small_clip(), false).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    assert_eq!(
        (parent.outcome, parent.input_hash_source),
        (Outcome::Waiting, Some(FingerprintSource::VersionEtag)),
        "{parent:?}"
    );
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    let (status, chunks) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded, "{chunks:#?}");
    let ran = chunks.iter().filter(|r| r.outcome == Outcome::Ran).count();
    assert_eq!(ran, 3, "{chunks:#?}");
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Done
    );
}

/// With no grace a job nothing references is collected at once: a sweep
/// while the execution runs finds every done chunk held by it and keeps
/// it, and the join gets them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sweep_collects_a_chunk_the_execution_holds() {
    let s = split_pipeline(vec![("MEDIAONCE_GC_GRACE_SECS", "0".into())]).await;
    let p = &s.p;
    let (parent, execution, done) = chunks_done_before_the_join(&s, "talks/swept.mp4").await;
    let sweep = p.app.collect_due(false).await.unwrap();
    assert!(sweep.failures.is_empty(), "{sweep:?}");
    assert_eq!(sweep.objects(), 0, "{sweep:?}");
    for chunk in &done {
        assert_eq!(p.refs(chunk).await, 1, "held by the execution");
        assert!(!p.output_keys(&format!("derived/{chunk}/")).await.is_empty());
    }
    let (status, _) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded);
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Done
    );
    // Released by the end: with no grace, the next sweep collects them.
    for chunk in &done {
        assert_eq!(p.refs(chunk).await, 0, "released");
    }
}

/// A clip uploaded to `key` and split: its job's report, its execution,
/// and its chunk jobs, each run, with the join's message left waiting.
async fn chunks_done_before_the_join(s: &Split, key: &str) -> (JobReport, String, Vec<String>) {
    let p = &s.p;
    p.put(key, &small_clip(), true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    let (status, chunks) = s
        .run_with(&p.app, &execution, |body| body["mediaonce"] == "hls-join/2")
        .await;
    assert_eq!(status, None);
    let done: Vec<String> = chunks
        .iter()
        .filter(|r| r.outcome == Outcome::Ran)
        .map(|r| r.job_key.clone())
        .collect();
    assert_eq!(done.len(), 3, "{chunks:#?}");
    (parent, execution, done)
}

/// A claimant that died between holding its chunks and starting its
/// execution leaves a hold nothing would release once another claim took
/// the job over and died too (found by the explorer, seed 9081 of the
/// split world). The sweep drops such a hold once its execution has not
/// started an hour on, and collects the chunk; a younger one (its
/// claimant may still start it) and a running execution's keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_execution_never_started_frees_its_chunk_an_hour_on() {
    let s = split_pipeline(vec![("MEDIAONCE_GC_GRACE_SECS", "0".into())]).await;
    let p = &s.p;
    let (parent, execution, done) = chunks_done_before_the_join(&s, "talks/held.mp4").await;
    let now = common::now_ms();
    let dead = format!("split#{}-0000000000aa", parent.job_key);
    let young = format!("split#{}-0000000000bb", parent.job_key);
    p.app
        .ledger
        .hold(&dead, &done[..1], now - 2 * 3_600_000)
        .await
        .unwrap();
    p.app.ledger.hold(&young, &done[1..2], now).await.unwrap();
    // While the execution runs, its own hold keeps every chunk.
    let sweep = p.app.collect_due(false).await.unwrap();
    assert_eq!(sweep.objects(), 0, "{sweep:?}");
    let (status, _) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded);
    // Its end released its hold: the dead one is dropped and its chunk
    // collected; the young one keeps its chunk.
    let sweep = p.app.collect_due(false).await.unwrap();
    assert!(sweep.failures.is_empty(), "{sweep:?}");
    assert_eq!(p.refs(&done[0]).await, 0, "the dead hold is dropped");
    assert_eq!(p.row(&done[0]).await, None);
    assert!(p
        .output_keys(&format!("derived/{}/", done[0]))
        .await
        .is_empty());
    assert_eq!(p.refs(&done[1]).await, 1, "a young hold is kept");
    assert!(!p
        .output_keys(&format!("derived/{}/", done[1]))
        .await
        .is_empty());
    assert_eq!(p.row(&done[2]).await, None, "released and collected");
}

/// A deployment edits the recipe while the execution runs: the chunks,
/// the join and the manifest follow the recipe the execution started
/// with, so the package is the one its job key names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipe_edited_mid_split_changes_nothing_the_execution_runs() {
    let s = split_pipeline(Vec::new()).await;
    let p = &s.p;
    let bytes = small_clip();
    let whole = run_direct(&step_in("execution-edited"), &bytes, split_params(), None)
        .await
        .unwrap();
    p.put("talks/edited.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    let mut edited = split_params();
    edited["preset"] = "veryfast".into();
    edited["ladder"] = serde_json::json!([180]);
    let recipes = serde_json::json!([{"name": "hls", "step": "hls-package", "version": 1,
        "params": edited}]);
    let redeployed = p.worker_with(&[("MEDIAONCE_RECIPES", recipes.to_string())]);
    let (status, chunks) = s.run_with(&redeployed, &execution, |_| false).await;
    assert_eq!(status, Some(ExecutionStatus::Succeeded), "{chunks:#?}");
    let package = package_of(p, &parent.job_key).await;
    for (name, bytes) in &whole {
        let Some(name) = name.strip_prefix("job/") else {
            continue;
        };
        if name != "_manifest.json" {
            assert_eq!(package.get(name), Some(bytes), "{name}");
        }
    }
    let manifest: Value = serde_json::from_slice(&package["_manifest.json"]).unwrap();
    assert_eq!(manifest["recipe"]["params"], split_params());
}

/// A task message the function cannot trust is refused (it comes back,
/// to be dead-lettered) with nothing run: one of another state machine's
/// executions, and one whose job key does not follow from its input hash
/// and recipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_message_that_cannot_be_trusted_is_refused() {
    let s = split_pipeline(Vec::new()).await;
    let p = &s.p;
    let fixture: Value = serde_json::from_str(include_str!("../events/hls-chunk.json")).unwrap();
    let body: Value =
        serde_json::from_str(fixture["Records"][0]["body"].as_str().unwrap()).unwrap();
    let machine = p.app.config.split_machine_arn.clone().unwrap();
    let ours = mediaonce::executions::execution_arn(&machine, "x-1");
    let mut wrong_key = body.clone();
    wrong_key["execution"] = ours.into();
    for (body, why) in [
        (body.clone(), "not one of"),
        (wrong_key, "is not the key of its input hash and recipe"),
    ] {
        let report = p.handle(vec![p.send_raw(&body.to_string()).await]).await;
        assert_eq!(report.jobs().count(), 0, "{report:?}");
        assert_eq!(report.response().batch_item_failures.len(), 1);
        let error = report.messages[0].error.clone().unwrap_or_default();
        assert!(error.contains(why), "{error}");
    }
}

/// An execution aborted by hand (no failure task runs): the template's
/// EventBridge rule brings its status change to the job queue; the job,
/// still this execution's, is finished failed, the chunks' holds are
/// released and the upload is handed on: its walk takes the job over (a
/// run counted) and starts an execution of its own, which joins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_aborted_by_hand_ends_its_attempt_and_the_upload_splits_anew() {
    let s = split_pipeline(Vec::new()).await;
    let p = &s.p;
    p.put("talks/aborted.mp4", &small_clip(), true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    sfn.stop_execution()
        .execution_arn(&execution)
        .send()
        .await
        .unwrap();
    let described = sfn
        .describe_execution()
        .execution_arn(&execution)
        .send()
        .await
        .unwrap();
    // As EventBridge delivers the status change to the rule's target.
    let event = serde_json::json!({
        "version": "0", "id": unique("event"), "source": "aws.states",
        "detail-type": "Step Functions Execution Status Change",
        "resources": [execution],
        "detail": {"executionArn": execution, "stateMachineArn": described.state_machine_arn,
                   "status": "ABORTED", "input": described.input,
                   "inputDetails": {"included": true}}});
    let delivered = p.send_raw(&event.to_string()).await;
    let report = p.handle(vec![delivered.clone()]).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let row = p.row(&parent.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Failed, "{row:?}");
    assert!(row.error.unwrap_or_default().contains("ABORTED"));
    // Delivered again (EventBridge delivers at least once): nothing more.
    let report = p.handle(vec![delivered]).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );

    // The upload, handed on, takes the job over with an execution of its own.
    let walked = s.drain_jobs().await;
    let outcomes: Vec<(Outcome, u64)> = walked.iter().map(|r| (r.outcome, r.attempt)).collect();
    assert_eq!(outcomes, [(Outcome::Waiting, 2)], "{walked:#?}");
    let again = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    assert_ne!(again, execution);
    // The aborted execution's chunk tasks, still queued, find their tasks
    // ended and run nothing; the new one's run and join.
    let (status, _) = s.run_execution(&again).await;
    assert_eq!(status, ExecutionStatus::Succeeded);
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Done
    );
}

/// A chunk's worker died mid-encode: its chunk job's row is `running`
/// under a lease that has passed. The chunk's task (Step Functions'
/// retry after the heartbeat timeout, or SQS's redelivery) takes the
/// chunk over, a run counted, and the execution joins the package.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_whose_worker_died_mid_encode_is_taken_over_and_joined() {
    use mediaonce::key::{job_key, sha256_hex, Recipe};
    use mediaonce::ledger::{ClaimRequest, JobRow};
    use mediaonce::pipeline::split::ExecutionInput;
    use mediaonce::steps::hls::chunk_job::ChunkParams;

    let s = split_pipeline(Vec::new()).await;
    let p = &s.p;
    let bytes = small_clip();
    p.put("talks/crashed.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let parent = report.jobs().next().unwrap().clone();
    let execution = p.row(&parent.job_key).await.unwrap().execution.unwrap();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let described = aws_sdk_sfn::Client::new(&sdk)
        .describe_execution()
        .execution_arn(&execution)
        .send()
        .await
        .unwrap();
    let input: ExecutionInput = serde_json::from_str(described.input().unwrap()).unwrap();
    let package = Recipe::from_value(&input.job.recipe).unwrap();
    let span = input.spans[1];
    let chunk = ChunkParams::recipe(&package, span.index, span.start_ms, span.end_ms);
    let chunk_key = job_key(&sha256_hex(&bytes), &chunk.hash());
    let now = common::now_ms();
    p.seed_row(&JobRow::claimed(&ClaimRequest {
        job_key: chunk_key.clone(),
        step: "hls-chunk".into(),
        input_hash: sha256_hex(&bytes),
        output_prefix: p.app.config.output_location(&chunk_key),
        owner: "died-mid-encode/1".into(),
        lease_until_ms: now - 1,
        now_ms: now - 60_000,
        max_attempts: 3,
    }))
    .await;

    let (status, chunks) = s.run_execution(&execution).await;
    assert_eq!(status, ExecutionStatus::Succeeded, "{chunks:#?}");
    let taken = chunks
        .iter()
        .find(|r| r.job_key == chunk_key)
        .expect("the chunk ran");
    assert_eq!(
        (taken.outcome, taken.attempt),
        (Outcome::Ran, 2),
        "{taken:?}"
    );
    assert_eq!(
        p.row(&parent.job_key).await.unwrap().status,
        JobStatus::Done
    );
}
