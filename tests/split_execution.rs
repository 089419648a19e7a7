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
use aws_sdk_sfn::types::StateMachineType;
use common::hls::{run_direct, small_clip, step_in};
use common::{receive_from, unique, Options, Pipeline};
use mediaonce::config::{ENV_CHUNK_QUEUE_URL, ENV_EVENT_BUS, ENV_SPLIT_MACHINE_ARN};
use mediaonce::executions::{ExecutionClient, ExecutionStatus, SfnExecutions};
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::ledger::JobStatus;
use serde_json::Value;

const DEFINITION: &str = include_str!("../statemachine/hls-split.asl.json");

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
}

async fn split_pipeline(vars: Vec<(&'static str, String)>) -> Split {
    common::pipeline::require_emulators();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let sqs = mediaonce::aws::sqs_client(&sdk);
    let chunk_queue = sqs
        .create_queue()
        .queue_name(unique("chunks"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let chunk_queue_arn = common::sqs::queue_arn(&sqs, &chunk_queue).await;
    let machine = sfn
        .create_state_machine()
        .name(unique("hls-split"))
        .definition(DEFINITION)
        .role_arn("arn:aws:iam::000000000000:role/mediaonce-split")
        .r#type(StateMachineType::Standard)
        .send()
        .await
        .expect("the definition is accepted")
        .state_machine_arn;
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
    }
}

impl Split {
    /// Delivers the chunk queue's messages to the handler, batch by batch,
    /// deleting those it acknowledges (a message it sends back comes back
    /// at once), until `execution` has ended; its status and the chunk
    /// jobs' reports.
    async fn run_execution(&self, execution: &str) -> (ExecutionStatus, Vec<JobReport>) {
        let mut reports = Vec::new();
        for _poll in 0..600 {
            let messages = receive_from(&self.p.sqs, &self.chunk_queue).await;
            if messages.is_empty() {
                let status = self.sfn.describe_execution(execution).await.unwrap();
                match status {
                    Some(ExecutionStatus::Running) => continue,
                    Some(status) => return (status, reports),
                    None => panic!("no execution {execution}"),
                }
            }
            let batch: Vec<SqsMessage> = messages
                .iter()
                .cloned()
                .map(|m| common::sqs::lambda_message(m, &self.chunk_queue_arn))
                .collect();
            let report = self.p.handle(batch).await;
            reports.extend(report.jobs().cloned());
            let failed = common::failed_ids(&report);
            for message in messages {
                let receipt = message.receipt_handle().unwrap();
                if failed
                    .iter()
                    .any(|id| Some(id.as_str()) == message.message_id())
                {
                    self.p
                        .sqs
                        .change_message_visibility()
                        .queue_url(&self.chunk_queue)
                        .receipt_handle(receipt)
                        .visibility_timeout(0)
                        .send()
                        .await
                        .unwrap();
                } else {
                    self.p
                        .sqs
                        .delete_message()
                        .queue_url(&self.chunk_queue)
                        .receipt_handle(receipt)
                        .send()
                        .await
                        .unwrap();
                }
            }
        }
        panic!("execution {execution} did not end");
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
        row.split.is_none(),
        "nothing else about the split is on the row"
    );
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
        .filter(|(name, _)| name != "manifest.json")
        .collect();
    assert!(whole.contains_key("master.m3u8"), "{:?}", whole.keys());
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
    let walked = s.drain_jobs().await;
    let outcomes: Vec<Outcome> = walked.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Reused], "{walked:#?}");
}
