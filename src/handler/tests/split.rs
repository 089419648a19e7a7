//! Split jobs on in-memory clients: what a version's claim does when it
//! meets a job a Step Functions execution made.

use std::collections::HashMap;

use aws_lambda_events::event::sqs::SqsEvent;

use super::*;
use crate::executions::{ExecutionClient, InMemoryExecutions};

/// A package job's split ended and a collection holds its row (another
/// version released it), while Step Functions has not yet closed the
/// execution its end task answered for: a version's claim finds the row
/// busy, and its message comes back (the collection gives the row back
/// `done`, and the next delivery reuses it and announces it). It was
/// acknowledged as waiting for an execution whose end had already handed
/// every version on, and the version never got its event (found by the
/// explorer: `mediaonce explore --seed 40224 --steps 100`).
#[tokio::test]
async fn a_version_meeting_a_collection_of_a_split_job_comes_back_not_waiting() {
    let machine = "arn:aws:states:us-east-1:123456789012:stateMachine:split";
    let recipes =
        r#"[{"name": "hls", "step": "hls-package", "version": 1, "params": {"ladder": [144]}}]"#;
    let vars = HashMap::from([
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "out"),
        ("MEDIAONCE_RECIPES", recipes),
        ("MEDIAONCE_SPLIT_MACHINE_ARN", machine),
    ]);
    let steps = StepRegistry::builtin();
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    let objects = InMemoryObjects::new();
    let bytes = b"a long video";
    let etag = objects.insert("in", "v.mp4", bytes, true);
    let key = job_key(&sha256_hex(bytes), &config.recipes[0].recipe_hash);
    // Its execution's end handed every version on; Step Functions has not
    // closed it yet.
    let executions = Arc::new(InMemoryExecutions::default());
    let arn = executions
        .start_execution(machine, &format!("{key}-000000000000"), "{}")
        .await
        .unwrap();
    let now = crate::lease::SystemClock.now_ms();
    let claimed = JobRow::claimed(&ClaimRequest {
        job_key: key.clone(),
        step: "hls-package".into(),
        input_hash: sha256_hex(bytes),
        output_prefix: config.output_location(&key),
        owner: "collector/1".into(),
        lease_until_ms: now + 300_000,
        now_ms: now,
        max_attempts: 3,
    });
    let table = InMemoryTable::new("jobs");
    table.insert(JobRow {
        status: JobStatus::Collecting,
        collected_from: Some(JobStatus::Done),
        execution: Some(arn),
        ..claimed
    });
    let app = Arc::new(
        App::new(
            config,
            Ledger::new(table),
            ObjectStore::new(objects.clone()),
            Queue::new(Arc::new(RecordingQueue::default())),
        )
        .with_executions(executions.clone()),
    );
    let mut event = SqsEvent::default();
    event.records = vec![message("1", "v.mp4", &etag)];
    let invocation = Invocation {
        request_id: "req".into(),
        deadline_ms: Some(app.now_ms() + 900_000),
        timeout_ms: None,
    };
    let report = handle_batch(app.clone(), event, invocation).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Busy, "{job:?}");
    assert_eq!(report.response().batch_item_failures.len(), 1, "it comes back");
}
