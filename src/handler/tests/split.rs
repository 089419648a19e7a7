//! Split jobs on in-memory clients: how a version waits for one.

use super::*;

/// A job split into chunks (its row says so) held by a live lease: a
/// version that claims it waits while it runs, and is busy once it is
/// being collected (nobody would hand it on).
#[tokio::test]
async fn a_version_waits_for_a_running_split_and_not_for_a_collected_one() {
    let f = fixture();
    let etag = f.objects.insert("in", "v.mp4", b"video", true);
    let rule = &f.app.config.recipes[0];
    let key = job_key(&sha256_hex(b"video"), &rule.recipe_hash);
    let waiter = crate::pipeline::HandOn::new(
        "in",
        "v.mp4",
        None,
        etag.trim_matches('"'),
        5,
        vec![rule.name.clone()],
        1,
    )
    .to_body();
    let now = f.app.now_ms();
    let split_row = |status, waiters: Vec<String>| JobRow {
        execution: None,
        job_key: key.clone(),
        step: rule.recipe.step.clone(),
        input_hash: sha256_hex(b"video"),
        status,
        lease_until_ms: now + 600_000,
        attempts: 1,
        owner: "coordinator/1".into(),
        output_prefix: format!("s3://in/derived/{key}/"),
        error: None,
        updated_at_ms: now,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
        split: Some(crate::ledger::JobSplit {
            chunks: vec!["c0".into(), "c1".into()],
            joining: false,
            waiters: waiters.into_iter().collect(),
            queue_url: "https://sqs.us-east-1.amazonaws.com/123456789012/jobs".into(),
        }),
    };
    let table = InMemoryTable::new("jobs");
    table.insert(split_row(JobStatus::Running, Vec::new()));
    let app = Arc::new(App::new(
        f.app.config.clone(),
        Ledger::new(table),
        ObjectStore::new(f.objects.clone()),
        Queue::new(f.queue.clone()),
    ));
    let report = handle(&app, vec![message("1", "v.mp4", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Waiting);
    assert!(report.response().batch_item_failures.is_empty());
    let row = app.ledger.get(&key).await.unwrap().unwrap();
    let waiters: Vec<String> = row.split.unwrap().waiters.into_iter().collect();
    assert_eq!(waiters, std::slice::from_ref(&waiter));

    // Being collected, with the version among its waiters already (its
    // hand-on came back): busy, so that its message comes back.
    let table = InMemoryTable::new("jobs");
    table.insert(split_row(JobStatus::Collecting, vec![waiter]));
    let app = Arc::new(App::new(
        f.app.config.clone(),
        Ledger::new(table),
        ObjectStore::new(f.objects.clone()),
        Queue::new(f.queue.clone()),
    ));
    let report = handle(&app, vec![message("2", "v.mp4", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Busy);
    assert_eq!(report.response().batch_item_failures.len(), 1);
}
