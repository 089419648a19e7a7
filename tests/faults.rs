//! Injected failures on the emulators. Each test ends with the job done
//! exactly once (or failed for good), and no message lost: a message is
//! acknowledged only once its job is done.

mod common;

use common::now_ms;

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsMessage;
use common::{handle_with, Options, Pipeline};
use mediaonce::faults::{Call, FaultPlan};
use mediaonce::handler::{BatchReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::{JobRow, JobStatus, RetryPolicy};
use mediaonce::step::Manifest;

const BYTES: &[u8] = b"bytes that meet trouble";
/// Past any lease a worker on the system clock takes (deadline + margin).
const LATER: i64 = 120_000;

async fn upload(recipe_step: &str) -> (Pipeline, SqsMessage, String) {
    let p = Pipeline::new(Options {
        recipes: Some(format!(
            r#"[{{"step":"{recipe_step}","version":1,"params":{{}}}}]"#
        )),
        ..Options::default()
    })
    .await;
    p.put("trouble.bin", BYTES, true).await;
    let message = p.receive(1).await.remove(0);
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    (p, message, key)
}

fn only_job(report: &BatchReport) -> (Outcome, u64, String) {
    let job = report.jobs().next().expect("one job");
    (
        job.outcome,
        job.attempt,
        job.reason.clone().unwrap_or_default(),
    )
}

fn acked(report: &BatchReport) -> bool {
    report.response().batch_item_failures.is_empty()
}

/// The job is done, and its manifest lists exactly the outputs, as written.
async fn assert_done_once(p: &Pipeline, key: &str, attempts: u64) -> JobRow {
    let row = p.row(key).await.expect("row");
    assert_eq!(
        (row.status, row.attempts),
        (JobStatus::Done, attempts),
        "{row:?}"
    );
    let manifest: Manifest =
        serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await).unwrap();
    assert_eq!(manifest.job_key, key);
    for output in &manifest.outputs {
        let bytes = p.output(&format!("derived/{key}/{}", output.name)).await;
        assert_eq!(
            (bytes.len() as u64, sha256_hex(&bytes)),
            (output.size, output.sha256.clone())
        );
    }
    row
}

async fn has_manifest(p: &Pipeline, key: &str) -> bool {
    p.output_keys(&format!("derived/{key}/"))
        .await
        .iter()
        .any(|k| k.ends_with("/_manifest.json"))
}

#[tokio::test]
async fn throttled_claim_comes_back_then_runs() {
    let (p, message, key) = upload("counted-probe").await;
    let faults = Arc::new(FaultPlan::new());
    // Throttled on every one of the ledger's in-process attempts.
    faults.fail(
        Call::PutRow,
        RetryPolicy::default().attempts as usize,
        "ProvisionedThroughputExceededException (retries exhausted)",
    );
    let worker = p.worker(0, faults.clone());

    let first = handle_with(worker.clone(), vec![message.clone()]).await;
    let (outcome, _, reason) = only_job(&first);
    assert_eq!(outcome, Outcome::Failed);
    assert!(
        reason.contains("PutItem") && reason.contains("throttled"),
        "{reason}"
    );
    assert!(!acked(&first));
    assert_eq!(p.counted.runs(), 0, "nothing runs without a claim");
    assert!(p.row(&key).await.is_none());

    let second = handle_with(worker, vec![message]).await;
    assert_eq!(only_job(&second).0, Outcome::Ran);
    assert!(acked(&second));
    assert_eq!(p.counted.runs(), 1);
    assert_done_once(&p, &key, 1).await;
}

#[tokio::test]
async fn a_5xx_on_takeover_comes_back_then_takes_over() {
    let (p, message, key) = upload("counted-probe").await;
    // A worker that died: its lease has passed.
    let dead = JobRow {
        execution: None,
        job_key: key.clone(),
        step: "counted-probe".into(),
        input_hash: sha256_hex(BYTES),
        status: JobStatus::Running,
        lease_until_ms: now_ms() - 1,
        attempts: 1,
        owner: "dead-worker/1".into(),
        output_prefix: format!("s3://{}/derived/{key}/", p.output_bucket),
        error: None,
        updated_at_ms: now_ms() - 100_000,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
    };
    p.seed_row(&dead).await;
    let faults = Arc::new(FaultPlan::new());
    faults.fail(
        Call::TakeOver,
        1,
        "InternalServerError (HTTP 500, retries exhausted)",
    );
    let worker = p.worker(0, faults);

    let first = handle_with(worker.clone(), vec![message.clone()]).await;
    assert_eq!(only_job(&first).0, Outcome::Failed);
    assert!(!acked(&first));
    assert_eq!(
        p.row(&key).await.unwrap(),
        dead,
        "a failed takeover changes nothing"
    );

    let second = handle_with(worker, vec![message]).await;
    assert_eq!(only_job(&second).0, Outcome::Ran);
    assert_eq!(only_job(&second).1, 2);
    assert_eq!(p.counted.runs(), 1);
    assert_done_once(&p, &key, 2).await;
}

#[tokio::test]
async fn a_worker_that_dies_after_the_step_before_finish_is_taken_over_after_its_lease() {
    let (p, message, key) = upload("counted-probe").await;
    let faults = Arc::new(FaultPlan::new());
    faults.fail(Call::Finish, 1, "connection reset: the worker is gone");
    let first = handle_with(p.worker(0, faults), vec![message.clone()]).await;
    assert_eq!(only_job(&first).0, Outcome::Failed);
    assert!(!acked(&first));
    let row = p.row(&key).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Running, 1));

    // Redelivered while the lease lives: busy, nothing runs.
    let busy = p.handle(vec![message.clone()]).await;
    assert_eq!(only_job(&busy).0, Outcome::Busy);
    assert_eq!(p.counted.runs(), 1);

    // After the lease: taken over, the same prefix overwritten, done once.
    let later = handle_with(p.worker(LATER, Arc::new(FaultPlan::new())), vec![message]).await;
    assert_eq!((only_job(&later).0, only_job(&later).1), (Outcome::Ran, 2));
    assert!(acked(&later));
    assert_eq!(
        p.counted.runs(),
        2,
        "the unique job, plus the crash after its step started"
    );
    assert_done_once(&p, &key, 2).await;
}

#[tokio::test]
async fn slowdown_on_head_and_read_fail_the_attempt_then_it_runs() {
    let (p, message, key) = upload("counted-probe").await;
    let faults = Arc::new(FaultPlan::new());
    faults.fail(Call::HeadObject, 1, "SlowDown (HTTP 503)");
    faults.fail(Call::GetObject, 1, "SlowDown (HTTP 503)");
    let worker = p.worker(0, faults.clone());

    // HeadObject fails: no key, no claim.
    let first = handle_with(worker.clone(), vec![message.clone()]).await;
    assert_eq!(only_job(&first).0, Outcome::Failed);
    assert!(p.row(&key).await.is_none());
    // GetObject fails inside the step: attempt 1 is recorded as failed.
    let second = handle_with(worker.clone(), vec![message.clone()]).await;
    let (outcome, attempt, reason) = only_job(&second);
    assert_eq!((outcome, attempt), (Outcome::Failed, 1));
    assert!(
        reason.contains("GetObject") && reason.contains("SlowDown"),
        "{reason}"
    );
    let row = p.row(&key).await.unwrap();
    assert_eq!(row.status, JobStatus::Failed);
    assert!(row.error.unwrap().contains("SlowDown"));
    assert!(!has_manifest(&p, &key).await);
    // The retry takes the failed job over.
    let third = handle_with(worker, vec![message]).await;
    assert_eq!((only_job(&third).0, only_job(&third).1), (Outcome::Ran, 2));
    assert!(acked(&third));
    assert_eq!(faults.injected(), 2);
    assert_done_once(&p, &key, 2).await;
}

#[tokio::test]
async fn a_failed_output_write_leaves_no_manifest_and_the_retry_completes() {
    for output in ["probe.json", "_manifest.json"] {
        let (p, message, key) = upload("counted-probe").await;
        let faults = Arc::new(FaultPlan::new());
        faults.fail_key(Call::PutObject, output, 1, "InternalError (HTTP 500)");
        let worker = p.worker(0, faults);
        let first = handle_with(worker.clone(), vec![message.clone()]).await;
        let (outcome, _, reason) = only_job(&first);
        assert_eq!(outcome, Outcome::Failed, "{output}");
        assert!(reason.contains(output), "{output}: {reason}");
        assert_eq!(
            p.row(&key).await.unwrap().status,
            JobStatus::Failed,
            "{output}"
        );
        assert!(
            !has_manifest(&p, &key).await,
            "{output}: nothing reads as complete"
        );

        let second = handle_with(worker, vec![message]).await;
        assert_eq!(only_job(&second).0, Outcome::Ran, "{output}");
        assert!(acked(&second));
        assert_done_once(&p, &key, 2).await;
    }
}

#[tokio::test]
async fn a_worker_that_dies_halfway_through_its_outputs_leaves_the_job_unfinished() {
    let (p, message, key) = upload("counted-probe").await;
    // probe.json is written, then the worker is gone: no manifest, no finish.
    let faults = Arc::new(FaultPlan::new());
    faults.fail_key(Call::PutObject, "_manifest.json", 1, "the worker is gone");
    faults.fail(Call::Finish, 1, "the worker is gone");
    let first = handle_with(p.worker(0, faults), vec![message.clone()]).await;
    assert!(!acked(&first));
    let keys = p.output_keys(&format!("derived/{key}/")).await;
    assert_eq!(keys, vec![format!("derived/{key}/probe.json")]);
    assert_eq!(
        p.row(&key).await.unwrap().status,
        JobStatus::Running,
        "not done"
    );
    assert_eq!(
        only_job(&p.handle(vec![message.clone()]).await).0,
        Outcome::Busy
    );

    let later = handle_with(p.worker(LATER, Arc::new(FaultPlan::new())), vec![message]).await;
    assert_eq!(only_job(&later).0, Outcome::Ran);
    assert!(acked(&later));
    assert_done_once(&p, &key, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_that_wakes_after_a_takeover_cannot_finish_and_writes_identical_bytes() {
    let (p, message, key) = upload("gated-probe").await;
    // Worker A claims and stalls at the gate, inside its step.
    let stale = tokio::spawn(handle_with(p.app.clone(), vec![message.clone()]));
    p.gate.first_arrived().await;
    // Worker B, past A's lease, takes the job over and finishes it.
    let fresh = handle_with(p.worker(LATER, Arc::new(FaultPlan::new())), vec![message]).await;
    assert_eq!((only_job(&fresh).0, only_job(&fresh).1), (Outcome::Ran, 2));
    let probe_path = format!("derived/{key}/probe.json");
    let written_by_fresh = p.output(&probe_path).await;
    let row = assert_done_once(&p, &key, 2).await;

    // A wakes: it writes its outputs, but its finish is rejected.
    p.gate.open();
    let stale = stale.await.unwrap();
    let (outcome, attempt, reason) = only_job(&stale);
    assert_eq!((outcome, attempt), (Outcome::Busy, 1));
    assert!(reason.contains("lease lost"), "{reason}");
    assert_eq!(
        p.output(&probe_path).await,
        written_by_fresh,
        "identical bytes"
    );
    assert_eq!(p.row(&key).await.unwrap(), row, "B's result stands");
    assert_done_once(&p, &key, 2).await;
}
