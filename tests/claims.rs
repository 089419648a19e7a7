//! The claim state machine on DynamoDB (moto, or LocalStack in Docker):
//! busy, takeover, retry after failure, and the fencing of stale owners.

mod common;

use common::now_ms;

use common::{claim_request, fresh_ledger, Options, Pipeline};
use mediaonce::handler::Outcome;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::{ClaimOutcome, ClaimRequest, FinishError, JobRow, JobStatus};

const BYTES: &[u8] = b"claimed bytes";

/// A pipeline with one uploaded object, its message, and its job key.
async fn one_upload() -> (Pipeline, aws_lambda_events::event::sqs::SqsMessage, String) {
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"counted-probe","version":1,"params":{}}]"#.into()),
        ..Options::default()
    })
    .await;
    p.put("object.bin", BYTES, true).await;
    let message = p.receive(1).await.remove(0);
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    (p, message, key)
}

/// Writes a row as another worker would have left it.
async fn seed(
    p: &Pipeline,
    key: &str,
    status: JobStatus,
    lease_until_ms: u64,
    error: Option<&str>,
) -> JobRow {
    let row = JobRow {
        execution: None,
        job_key: key.to_string(),
        step: "counted-probe".into(),
        input_hash: sha256_hex(BYTES),
        status,
        lease_until_ms,
        attempts: 1,
        owner: "another-worker/1".into(),
        output_prefix: format!("s3://{}/derived/{key}/", p.output_bucket),
        error: error.map(str::to_string),
        updated_at_ms: now_ms() - 1_000,
        // A failed row has failed once.
        failures: u64::from(status == JobStatus::Failed),
        permanent: false,
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
    };
    p.seed_row(&row).await;
    row
}

#[tokio::test]
async fn a_live_lease_elsewhere_is_busy_and_leaves_the_row_untouched() {
    let (p, message, key) = one_upload().await;
    let seeded = seed(&p, &key, JobStatus::Running, now_ms() + 600_000, None).await;
    let calls_before = p.ledger_calls.get();
    let report = p.handle(vec![message.clone()]).await;
    assert_eq!(
        report.jobs().map(|j| j.outcome).collect::<Vec<_>>(),
        vec![Outcome::Busy]
    );
    let failures = report.response().batch_item_failures;
    assert_eq!(failures.len(), 1);
    assert_eq!(
        Some(failures[0].item_identifier.clone()),
        message.message_id
    );
    assert_eq!(
        p.ledger_calls.get() - calls_before,
        2,
        "busy: the reference, then the claim's read (no write to the job)"
    );
    assert_eq!(p.counted.runs(), 0);
    assert_eq!(p.row(&key).await.unwrap(), seeded);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over() {
    let (p, message, key) = one_upload().await;
    seed(&p, &key, JobStatus::Running, now_ms() - 1, None).await;
    let calls_before = p.ledger_calls.get();
    let report = p.handle(vec![message]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!((job.outcome, job.attempt), (Outcome::Ran, 2), "{job:?}");
    assert!(report.response().batch_item_failures.is_empty());
    assert_eq!(
        p.ledger_calls.get() - calls_before,
        4,
        "takeover: claim, update, finish, reference"
    );
    assert_eq!(p.counted.runs(), 1);
    let row = p.row(&key).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Done, 2));
    assert_ne!(row.owner, "another-worker/1");
}

#[tokio::test]
async fn a_takeover_keeps_the_rows_output_prefix() {
    let (p, message, key) = one_upload().await;
    let mut row = seed(&p, &key, JobStatus::Running, now_ms() - 1, None).await;
    // Claimed under an earlier configuration (another output prefix).
    row.output_prefix = format!("s3://{}/earlier/{key}/", p.output_bucket);
    p.seed_row(&row).await;
    let report = p.handle(vec![message]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Ran);
    let done = p.row(&key).await.unwrap();
    assert_eq!(done.output_prefix, row.output_prefix);
    assert_eq!(
        p.output_keys(&format!("earlier/{key}/")).await.len(),
        2,
        "probe.json and the manifest where the row says"
    );
    assert!(p.output_keys(&format!("derived/{key}/")).await.is_empty());
}

#[tokio::test]
async fn a_failed_job_is_retried() {
    let (p, message, key) = one_upload().await;
    seed(
        &p,
        &key,
        JobStatus::Failed,
        now_ms() + 600_000,
        Some("earlier failure"),
    )
    .await;
    let report = p.handle(vec![message]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!((job.outcome, job.attempt), (Outcome::Ran, 2), "{job:?}");
    let row = p.row(&key).await.unwrap();
    assert_eq!(
        (row.status, row.attempts, row.error),
        (JobStatus::Done, 2, None)
    );
}

fn request(key: &str, owner: &str, lease_until_ms: u64) -> ClaimRequest {
    claim_request(key, owner, now_ms(), lease_until_ms)
}

#[tokio::test]
async fn a_stale_owner_cannot_finish_over_its_successor() {
    let ledger = fresh_ledger().await;
    let key = "k".repeat(64);
    // A claims with a lease that has already run out (its worker stalled).
    let ClaimOutcome::Run(stale) = ledger
        .claim(&request(&key, "A", now_ms() - 1))
        .await
        .unwrap()
    else {
        panic!("first claim runs");
    };
    // B takes over.
    let ClaimOutcome::Run(fresh) = ledger
        .claim(&request(&key, "B", now_ms() + 600_000))
        .await
        .unwrap()
    else {
        panic!("expired lease is taken over");
    };
    assert_eq!((stale.attempt, fresh.attempt), (1, 2));
    // A wakes up: neither done nor failed is recorded over B.
    assert!(matches!(
        ledger.finish_done(&stale, now_ms()).await,
        Err(FinishError::LostLease(_))
    ));
    assert!(matches!(
        ledger.finish_failed(&stale, "late", now_ms()).await,
        Err(FinishError::LostLease(_))
    ));
    let row = ledger.get(&key).await.unwrap().unwrap();
    assert_eq!((row.status, row.owner.as_str()), (JobStatus::Running, "B"));
    // C arrives while B's lease is live: busy, and B finishes.
    assert!(matches!(
        ledger
            .claim(&request(&key, "C", now_ms() + 600_000))
            .await
            .unwrap(),
        ClaimOutcome::Busy(_)
    ));
    ledger.finish_done(&fresh, now_ms()).await.unwrap();
    let row = ledger.get(&key).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Done, 2));
    assert!(matches!(
        ledger
            .claim(&request(&key, "D", now_ms() + 600_000))
            .await
            .unwrap(),
        ClaimOutcome::Done(_)
    ));
}

#[tokio::test]
async fn a_lost_takeover_race_is_busy_never_a_second_run() {
    let ledger = fresh_ledger().await;
    let key = "r".repeat(64);
    let ClaimOutcome::Run(first) = ledger
        .claim(&request(&key, "A", now_ms() + 600_000))
        .await
        .unwrap()
    else {
        panic!("first claim runs");
    };
    ledger
        .finish_failed(&first, "boom", now_ms())
        .await
        .unwrap();
    // Many workers see the failed row at once; one takes it over.
    let claims: Vec<_> = (0..8)
        .map(|i| {
            let ledger = ledger.clone();
            let req = request(&key, &format!("W{i}"), now_ms() + 600_000);
            tokio::spawn(async move { ledger.claim(&req).await.unwrap() })
        })
        .collect();
    let mut runs = 0;
    for claim in claims {
        match claim.await.unwrap() {
            ClaimOutcome::Run(c) => {
                runs += 1;
                assert_eq!(c.attempt, 2);
            }
            ClaimOutcome::Busy(_) => {}
            other => panic!("neither run nor busy: {other:?}"),
        }
    }
    assert_eq!(runs, 1);
    let row = ledger.get(&key).await.unwrap().unwrap();
    assert_eq!(
        row.error.as_deref(),
        Some("boom"),
        "the last error stays until the job is done"
    );
}

#[tokio::test]
async fn long_errors_are_cut_to_2000_characters() {
    let ledger = fresh_ledger().await;
    let key = "e".repeat(64);
    let ClaimOutcome::Run(claim) = ledger
        .claim(&request(&key, "A", now_ms() + 600_000))
        .await
        .unwrap()
    else {
        panic!("claim runs");
    };
    ledger
        .finish_failed(&claim, &"é".repeat(5_000), now_ms())
        .await
        .unwrap();
    let row = ledger.get(&key).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Failed);
    assert_eq!(row.error.unwrap().chars().count(), 2_000);
}

/// Runs the `mediaonce` command line against the pipeline's table.
fn cli(p: &Pipeline, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(args)
        .env("MEDIAONCE_TABLE", &p.table)
        .output()
        .expect("mediaonce runs")
}

#[tokio::test]
async fn a_job_that_failed_max_attempts_times_is_poisoned_until_retried() {
    let (p, message, key) = one_upload().await;
    let mut seeded = seed(&p, &key, JobStatus::Failed, 0, Some("decoder exploded")).await;
    (seeded.attempts, seeded.failures) = (3, 3);
    p.seed_row(&seeded).await;

    let calls_before = p.ledger_calls.get();
    let report = p.handle(vec![message.clone()]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(
        (job.outcome, job.attempt),
        (Outcome::Poisoned, 3),
        "{job:?}"
    );
    assert!(
        job.reason.as_deref().unwrap().contains("decoder exploded"),
        "{job:?}"
    );
    assert_eq!(report.response().batch_item_failures.len(), 1, "to the DLQ");
    assert_eq!(
        p.ledger_calls.get() - calls_before,
        2,
        "poisoned: the reference and the claim's read, no work"
    );
    assert_eq!(p.counted.runs(), 0);
    assert_eq!(p.row(&key).await.unwrap(), seeded);

    // `mediaonce status` shows the row.
    let status = cli(&p, &["status", &key]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(shown["status"], "failed");
    assert_eq!(shown["attempts"], 3);
    assert_eq!(shown["error"], "decoder exploded");
    assert_eq!(shown["owner"], "another-worker/1");
    assert_eq!(shown["output_prefix"], seeded.output_prefix.as_str());
    assert!(shown["lease_until_ms"].is_u64());

    // `mediaonce retry` makes it claimable, and the next delivery runs it.
    let retry = cli(&p, &["retry", &key]);
    assert!(
        retry.status.success(),
        "{}",
        String::from_utf8_lossy(&retry.stderr)
    );
    assert!(String::from_utf8_lossy(&retry.stdout).contains("decoder exploded"));
    assert_eq!(p.row(&key).await.unwrap().attempts, 0);
    let report = p.handle(vec![message]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!((job.outcome, job.attempt), (Outcome::Ran, 1), "{job:?}");
    assert_eq!(p.counted.runs(), 1);

    // A done job is refused, and so is a job that does not exist.
    let refused = cli(&p, &["retry", &key]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is done"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let missing = "0".repeat(64);
    let refused = cli(&p, &["retry", &missing]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no job"));
    let status = cli(&p, &["status", &missing]);
    assert_eq!(status.status.code(), Some(1));
}

#[tokio::test]
async fn retry_refuses_a_running_job() {
    let (p, _message, key) = one_upload().await;
    seed(&p, &key, JobStatus::Running, now_ms() + 600_000, None).await;
    let refused = cli(&p, &["retry", &key]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("is running") && stderr.contains("only a failed or poisoned job"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_job_that_keeps_failing_is_poisoned_after_max_attempts() {
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"panics","version":1,"params":{}}]"#.into()),
        ..Options::default()
    })
    .await;
    p.put("always-fails.bin", b"a step bug", true).await;
    let message = p.receive(1).await.remove(0);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let report = p.handle(vec![message.clone()]).await;
        assert_eq!(report.response().batch_item_failures.len(), 1);
        let job = report.jobs().next().unwrap();
        seen.push((job.outcome, job.attempt));
    }
    assert_eq!(
        seen,
        vec![
            (Outcome::Failed, 1),
            (Outcome::Failed, 2),
            (Outcome::Failed, 3),
            (Outcome::Poisoned, 3)
        ]
    );
}

#[tokio::test]
async fn a_busy_message_comes_back_when_the_holders_lease_ends_not_after_the_visibility_timeout() {
    // A lease margin (the clock skew allowed, added to the busy delay) of
    // 1 s: the deployed default is 10.
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"counted-probe","version":1,"params":{}}]"#.into()),
        vars: vec![("MEDIAONCE_LEASE_MARGIN_SECS", "1".into())],
        ..Options::default()
    })
    .await;
    p.put("object.bin", BYTES, true).await;
    let message = p.receive(1).await.remove(0);
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    // The queue's visibility timeout is 30 s; the holder's lease ends in 1 s.
    seed(&p, &key, JobStatus::Running, now_ms() + 1_000, None).await;
    let report = p.handle(vec![message.clone()]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Busy);
    assert!(job.busy_until_ms.is_some());
    // Long-polls of the real queue for at most ~10 s: without the new
    // visibility (2 to 4 s) the message would stay hidden for 30 s.
    let mut back = None;
    for _ in 0..10 {
        back = p
            .receive_batch()
            .await
            .into_iter()
            .find(|m| m.message_id == message.message_id);
        if back.is_some() {
            break;
        }
    }
    assert!(back.is_some(), "the busy message came back early");
}

#[tokio::test]
async fn failing_to_delay_a_busy_message_is_harmless() {
    let (p, mut message, key) = one_upload().await;
    seed(&p, &key, JobStatus::Running, now_ms() + 600_000, None).await;
    message.event_source_arn = Some("arn:aws:sqs:us-east-1:000000000000:no-such-queue".into());
    let report = p.handle(vec![message.clone()]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Busy);
    assert_eq!(report.response().batch_item_failures.len(), 1);
    message.event_source_arn = Some("not an arn".into());
    let report = p.handle(vec![message]).await;
    assert_eq!(report.response().batch_item_failures.len(), 1);
}

/// The release contract, on any table: only the claim's own owner, while
/// running, deletes the row; anyone else's release is `LostLease`.
async fn release_deletes_only_its_own_running_claim(ledger: mediaonce::ledger::Ledger) {
    let now = now_ms();
    let claim = |outcome| match outcome {
        ClaimOutcome::Run(claim) => claim,
        other => panic!("{other:?}"),
    };
    let mine = claim(
        ledger
            .claim(&claim_request("k1", "me/1", now, now + 60_000))
            .await
            .unwrap(),
    );
    let mut stranger = mine.clone();
    stranger.owner = "someone-else/1".into();
    assert!(matches!(
        ledger.release(&stranger).await,
        Err(FinishError::LostLease(_))
    ));
    assert!(ledger.get("k1").await.unwrap().is_some());
    ledger.release(&mine).await.unwrap();
    assert!(ledger.get("k1").await.unwrap().is_none());
    // Released twice: the row is gone, nothing to delete.
    assert!(matches!(
        ledger.release(&mine).await,
        Err(FinishError::LostLease(_))
    ));
    // A finished job is never released.
    let done = claim(
        ledger
            .claim(&claim_request("k2", "me/2", now, now + 60_000))
            .await
            .unwrap(),
    );
    ledger.finish_done(&done, now).await.unwrap();
    assert!(matches!(
        ledger.release(&done).await,
        Err(FinishError::LostLease(_))
    ));
    assert_eq!(
        ledger.get("k2").await.unwrap().unwrap().status,
        JobStatus::Done
    );
}

#[tokio::test]
async fn a_release_deletes_only_its_own_running_claim_on_dynamodb_and_in_memory() {
    release_deletes_only_its_own_running_claim(fresh_ledger().await).await;
    release_deletes_only_its_own_running_claim(mediaonce::ledger::Ledger::new(
        mediaonce::ledger::memory::InMemoryTable::new("jobs"),
    ))
    .await;
}

/// Issue 37, defect 8: a deployment with the claim table but no references
/// table fails at start-up, naming the missing table and its variable;
/// without the claim table, the error names that one.
#[tokio::test]
async fn start_up_names_the_table_that_is_missing() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    use mediaonce::config::Config;
    use mediaonce::handler::App;
    use mediaonce::steps::StepRegistry;

    common::pipeline::require_emulators();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let dynamodb = mediaonce::aws::dynamodb_client(&sdk);
    let table = common::unique("claims-only");
    dynamodb
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("job_key")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("job_key")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("create the claim table");
    let steps = StepRegistry::builtin();
    let start = |table: String| {
        let config = Config::from_lookup(
            |name| match name {
                "MEDIAONCE_TABLE" => Some(table.clone()),
                "MEDIAONCE_OUTPUT_BUCKET" => Some("out".into()),
                _ => None,
            },
            &steps,
        )
        .unwrap();
        App::from_config(config)
    };

    let error = start(table.clone()).await.unwrap_err().to_string();
    assert!(
        error.contains("MEDIAONCE_REFS_TABLE") && error.contains(&format!("table {table}-refs")),
        "{error}"
    );
    let missing = common::unique("no-such-claims");
    let error = start(missing.clone()).await.unwrap_err().to_string();
    assert!(
        error.contains("(MEDIAONCE_TABLE)") && error.contains(&format!("table {missing} ")),
        "{error}"
    );
}
