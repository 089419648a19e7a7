//! The handler on in-memory clients: no emulators, no network. The
//! integration tests under `tests/` run the same paths on the emulators.

use std::collections::HashMap;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};

use super::*;
use crate::key::{job_key, sha256_hex};
use crate::ledger::memory::InMemoryTable;
use crate::ledger::{ClaimOutcome, ClaimRequest, JobRow, JobStatus};
use crate::queue::RecordingQueue;
use crate::store::memory::InMemoryObjects;

mod pipeline_ends;
mod split;

const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:jobs";

struct Fixture {
    app: Arc<App>,
    objects: Arc<InMemoryObjects>,
    queue: Arc<RecordingQueue>,
}

fn fixture() -> Fixture {
    fixture_with(None)
}

fn fixture_with(recipes: Option<&str>) -> Fixture {
    match recipes {
        Some(recipes) => fixture_with_vars(&[("MEDIAONCE_RECIPES", recipes)]),
        None => fixture_with_vars(&[]),
    }
}

/// An app on in-memory clients with the default configuration.
fn fixture_app() -> App {
    let steps = StepRegistry::builtin();
    let config = Config::from_lookup(
        |name| match name {
            "MEDIAONCE_TABLE" => Some("jobs".into()),
            "MEDIAONCE_OUTPUT_BUCKET" => Some("out".into()),
            _ => None,
        },
        &steps,
    )
    .unwrap();
    App::new(
        config,
        Ledger::new(InMemoryTable::new("jobs")),
        ObjectStore::new(InMemoryObjects::new()),
        Queue::new(Arc::new(RecordingQueue::default())),
    )
}

fn fixture_with_vars(extra: &[(&str, &str)]) -> Fixture {
    let steps = StepRegistry::builtin();
    let mut vars = HashMap::from([
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "in"),
    ]);
    vars.extend(extra.iter().copied());
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    let objects = InMemoryObjects::new();
    // As App::from_env gives the S3 client the configured owner.
    objects.expect_owner(config.expected_bucket_owner.clone());
    let queue = Arc::new(RecordingQueue::default());
    let app = App::new(
        config,
        Ledger::new(InMemoryTable::new("jobs")),
        ObjectStore::new(objects.clone()),
        Queue::new(queue.clone()),
    );
    Fixture {
        app: Arc::new(app),
        objects,
        queue,
    }
}

fn message(id: &str, key: &str, etag: &str) -> SqsMessage {
    let body = serde_json::json!({"Records": [{
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "in"}, "object": {"key": key, "eTag": etag, "size": 1}}
    }]});
    let mut m = SqsMessage::default();
    m.message_id = Some(id.into());
    m.receipt_handle = Some(format!("receipt-{id}"));
    m.body = Some(body.to_string());
    m.event_source_arn = Some(ARN.into());
    m
}

async fn handle(app: &Arc<App>, messages: Vec<SqsMessage>) -> BatchReport {
    let mut event = SqsEvent::default();
    event.records = messages;
    let invocation = Invocation {
        request_id: "req".into(),
        deadline_ms: Some(app.now_ms() + 60_000),
        timeout_ms: None,
    };
    handle_batch(app.clone(), event, invocation).await
}

#[tokio::test]
async fn runs_once_writes_outputs_then_reuses() {
    let f = fixture();
    let etag = f.objects.insert("in", "a.bin", b"abc", true);
    let first = handle(
        &f.app,
        vec![message("1", "a.bin", &etag), message("2", "a.bin", &etag)],
    )
    .await;
    let outcomes: Vec<Outcome> = first.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ran, Outcome::Reused]);
    assert!(first.response().batch_item_failures.is_empty());
    let key = first.jobs().next().unwrap().job_key.clone();
    assert_eq!(
        key,
        job_key(&sha256_hex(b"abc"), &f.app.config.recipes[0].recipe_hash)
    );
    assert_eq!(
        f.objects.keys("in", "derived/"),
        [
            format!("derived/{key}/_manifest.json"),
            format!("derived/{key}/probe.json")
        ]
    );
    let again = handle(&f.app, vec![message("3", "a.bin", &etag)]).await;
    assert_eq!(again.jobs().next().unwrap().outcome, Outcome::Reused);
    assert_eq!(
        f.app.ledger.get(&key).await.unwrap().unwrap().status,
        JobStatus::Done
    );
}

#[tokio::test]
async fn a_record_twice_in_one_body_runs_once_and_is_reused_once() {
    let f = fixture();
    let etag = f.objects.insert("in", "a.bin", b"abc", true);
    let mut twice = message("1", "a.bin", &etag);
    let record: serde_json::Value =
        serde_json::from_str::<serde_json::Value>(twice.body.as_deref().unwrap()).unwrap()
            ["Records"][0]
            .clone();
    twice.body = Some(serde_json::json!({"Records": [record.clone(), record]}).to_string());
    let report = handle(&f.app, vec![twice]).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ran, Outcome::Reused], "{report:?}");
}

#[tokio::test]
async fn a_slow_steps_need_defers_only_its_own_job() {
    // hls-package declares 60 + 10 s, probe nothing; 5 s margin each.
    let f = fixture_with(Some(
        r#"[{"step":"hls-package","version":1,"params":{"ladder":[360]}},
                {"step":"probe","version":1,"params":{}}]"#,
    ));
    assert_eq!(
        f.app.start_margin(&f.app.config.recipes[0]),
        Duration::from_secs(75)
    );
    assert_eq!(
        f.app.start_margin(&f.app.config.recipes[1]),
        Duration::from_secs(5)
    );
    let etag = f.objects.insert("in", "a.mp4", b"not yet a movie", true);
    let mut event = SqsEvent::default();
    event.records = vec![message("1", "a.mp4", &etag)];
    let invocation = Invocation {
        request_id: "req".into(),
        deadline_ms: Some(f.app.now_ms() + 30_000),
        timeout_ms: None,
    };
    let report = handle_batch(f.app.clone(), event, invocation).await;
    let outcomes: Vec<(&str, Outcome)> = report
        .jobs()
        .map(|j| (j.step.as_str(), j.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [("hls-package", Outcome::Deferred), ("probe", Outcome::Ran)]
    );
    // The message comes back for the deferred job; probe's is then reused.
    assert_eq!(report.response().batch_item_failures.len(), 1);
}

#[tokio::test]
async fn a_busy_message_is_handed_back_for_when_the_lease_ends() {
    let f = fixture();
    let etag = f.objects.insert("in", "b.bin", b"held", true);
    let key = job_key(&sha256_hex(b"held"), &f.app.config.recipes[0].recipe_hash);
    let lease_until_ms = f.app.now_ms() + 5_000;
    f.app
        .ledger
        .claim(&ClaimRequest {
            job_key: key.clone(),
            step: "probe".into(),
            input_hash: sha256_hex(b"held"),
            output_prefix: "s3://in/derived/".into(),
            owner: "elsewhere".into(),
            lease_until_ms,
            now_ms: f.app.now_ms(),
            max_attempts: 3,
        })
        .await
        .unwrap();
    let report = handle(&f.app, vec![message("1", "b.bin", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Busy);
    let changes = f.queue.changes();
    assert_eq!(changes.len(), 1);
    let (url, receipt, seconds) = &changes[0];
    assert_eq!(url, "https://sqs.us-east-1.amazonaws.com/123456789012/jobs");
    assert_eq!(receipt, "receipt-1");
    // The lease's 5 s, the margin's 10 (a worker up to the margin behind
    // must see the lease passed), and up to 1 s of jitter.
    assert!((15..=17).contains(seconds), "{seconds}");
    let row: JobRow = f.app.ledger.get(&key).await.unwrap().unwrap();
    assert_eq!(row.owner, "elsewhere");
}

/// A clock the test moves.
#[derive(Debug, Default)]
struct ManualClock(std::sync::atomic::AtomicU64);

impl Clock for Arc<ManualClock> {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn an_input_that_kills_its_worker_every_time_ends_poisoned() {
    use crate::faults::{Call, FaultPlan};
    use crate::ledger::faults::FaultyTable;
    let config = fixture_app().config;
    let objects = InMemoryObjects::new();
    let etag = objects.insert("in", "killer.bin", b"kills", true);
    let clock = Arc::new(ManualClock::default());
    clock
        .0
        .store(1_000_000, std::sync::atomic::Ordering::SeqCst);
    // Every run dies before it can finish: nothing records a failure.
    let plan = Arc::new(FaultPlan::new());
    plan.fail(Call::Finish, usize::MAX, "the worker died");
    let app = Arc::new(
        App::new(
            config,
            Ledger::new(FaultyTable::new(InMemoryTable::new("jobs"), plan)),
            ObjectStore::new(objects.clone()),
            Queue::new(Arc::new(RecordingQueue::default())),
        )
        .with_clock(clock.clone()),
    );
    let max_runs = crate::ledger::max_runs(app.config.max_attempts);
    let mut outcomes = Vec::new();
    for delivery in 0..max_runs + 2 {
        let report = handle(
            &app,
            vec![message(&delivery.to_string(), "killer.bin", &etag)],
        )
        .await;
        outcomes.push(report.jobs().next().unwrap().outcome);
        // The next delivery comes after the lease (deadline + margin).
        clock
            .0
            .fetch_add(120_000, std::sync::atomic::Ordering::SeqCst);
    }
    let runs = outcomes.iter().filter(|o| **o == Outcome::Failed).count() as u64;
    assert_eq!(runs, max_runs, "{outcomes:?}");
    assert_eq!(
        &outcomes[max_runs as usize..],
        [Outcome::Poisoned, Outcome::Poisoned]
    );
}

#[test]
fn owner_tokens_and_jitter_repeat_from_a_seed() {
    let app = |seed| fixture_app().with_seed(seed);
    let (a, b, c) = (app(7), app(7), app(8));
    let draws = |app: &App| {
        (
            app.owner_token("req"),
            app.owner_token("req"),
            app.jitter_ms(),
        )
    };
    assert_eq!(draws(&a), draws(&b));
    let (first, second, jitter) = draws(&c);
    assert_ne!(first, second, "a token per attempt");
    assert_ne!((first.clone(), second), (draws(&a).0, draws(&a).1));
    assert!(jitter <= 1_000);
    let uuid = first.strip_prefix("req/").unwrap();
    assert_eq!(uuid::Uuid::parse_str(uuid).unwrap().get_version_num(), 4);
}

#[tokio::test]
async fn a_takeover_writes_where_the_row_says_and_reuse_stays_there() {
    let f = fixture();
    let etag = f.objects.insert("in", "moved.bin", b"moved", true);
    let key = job_key(&sha256_hex(b"moved"), &f.app.config.recipes[0].recipe_hash);
    // A first attempt under an earlier configuration failed.
    let earlier = format!("s3://in/earlier/{key}/");
    let now = f.app.now_ms();
    let ClaimOutcome::Run(claim) = f
        .app
        .ledger
        .claim(&ClaimRequest {
            job_key: key.clone(),
            step: "probe".into(),
            input_hash: sha256_hex(b"moved"),
            output_prefix: earlier.clone(),
            owner: "earlier/1".into(),
            lease_until_ms: now + 5_000,
            now_ms: now,
            max_attempts: 3,
        })
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    f.app
        .ledger
        .finish_failed(&claim, "S3 was down", now)
        .await
        .unwrap();

    let report = handle(&f.app, vec![message("1", "moved.bin", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!((job.outcome, job.attempt), (Outcome::Ran, 2), "{job:?}");
    let row = f.app.ledger.get(&key).await.unwrap().unwrap();
    assert_eq!(row.output_prefix, earlier);
    assert_eq!(
        f.objects.keys("in", ""),
        [
            format!("earlier/{key}/_manifest.json"),
            format!("earlier/{key}/probe.json"),
            "moved.bin".to_string(),
        ]
    );
    // Done there: reused there, nothing written where the configuration says.
    let report = handle(&f.app, vec![message("2", "moved.bin", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Reused);
    assert!(f.objects.keys("in", "derived/").is_empty());
}

#[tokio::test]
async fn buckets_of_another_account_are_neither_read_nor_written() {
    let owner = [("MEDIAONCE_EXPECTED_BUCKET_OWNER", "111111111111")];
    let f = fixture_with_vars(&[owner[0], ("MEDIAONCE_OUTPUT_BUCKET", "out")]);
    f.objects.set_bucket_owner("in", "111111111111");
    f.objects.set_bucket_owner("out", "111111111111");
    let etag = f.objects.insert("in", "ours.bin", b"ours", true);
    let report = handle(&f.app, vec![message("1", "ours.bin", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Ran);

    // The input bucket's name now belongs to another account.
    f.objects.set_bucket_owner("in", "222222222222");
    let etag = f.objects.insert("in", "theirs.bin", b"theirs", true);
    let report = handle(&f.app, vec![message("2", "theirs.bin", &etag)]).await;
    assert_eq!(report.response().batch_item_failures.len(), 1);
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Failed);
    let reason = job.reason.clone().unwrap();
    assert!(reason.contains("HTTP 403 AccessDenied"), "{reason}");
    assert!(
        reason.contains(
            "not be owned by account 111111111111, which MEDIAONCE_EXPECTED_BUCKET_OWNER expects"
        ),
        "{reason}"
    );

    // The output bucket's: the job fails and nothing is written there.
    f.objects.set_bucket_owner("in", "111111111111");
    f.objects.set_bucket_owner("out", "222222222222");
    let etag = f.objects.insert("in", "new.bin", b"new", true);
    let report = handle(&f.app, vec![message("3", "new.bin", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Failed, "{job:?}");
    assert!(
        job.reason
            .as_deref()
            .unwrap()
            .contains("MEDIAONCE_EXPECTED_BUCKET_OWNER"),
        "{job:?}"
    );
    let key = job_key(&sha256_hex(b"new"), &f.app.config.recipes[0].recipe_hash);
    assert!(f.objects.keys("out", &format!("derived/{key}/")).is_empty());
}

#[tokio::test]
async fn a_replaced_object_is_skipped_and_our_outputs_are_ignored() {
    let f = fixture();
    f.objects.insert("in", "c.bin", b"new bytes", false);
    let report = handle(
        &f.app,
        vec![
            message("1", "c.bin", "etag-of-the-old-bytes"),
            message("2", "derived/x/probe.json", "e"),
        ],
    )
    .await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Skipped]);
    assert!(report.response().batch_item_failures.is_empty());
    assert!(f.objects.keys("in", "derived/").is_empty());
}

/// A small PNG the thumbnail step decodes.
fn png(seed: u8) -> Vec<u8> {
    let image = image::RgbImage::from_fn(24, 16, |x, y| {
        image::Rgb([seed, (x * 9) as u8, (y * 13) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

const THUMBNAIL: &str = r#"[{"step":"thumbnail","version":1,"params":{"widths":[8]}}]"#;

#[tokio::test]
async fn a_cached_hash_the_bytes_disprove_fails_its_job_and_is_forgotten() {
    use crate::fingerprint::FingerprintSource;
    use crate::identity::ObjectVersion;
    let f = fixture_with(Some(THUMBNAIL));
    let bytes = png(1);
    let etag = f.objects.insert("in", "a.png", &bytes, false);
    let head = f
        .app
        .store
        .head(&crate::store::ObjectRef {
            bucket: "in".into(),
            key: "a.png".into(),
            version_id: None,
            if_match: None,
        })
        .await
        .unwrap()
        .unwrap();
    // A wrong hash under this exact version (what an MD5-colliding
    // overwrite of an unversioned key would leave behind).
    let version = ObjectVersion::of(&head);
    let wrong = "ab".repeat(32);
    f.app.ledger.cache_input_hash(&version, &wrong, 0).await.unwrap();

    let report = handle(&f.app, vec![message("1", "a.png", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.input_hash_source, Some(FingerprintSource::Cached));
    assert_eq!(job.outcome, Outcome::Failed, "{report:?}");
    assert!(
        job.reason.as_deref().unwrap().contains("integrity error"),
        "{job:?}"
    );
    // Nothing was written under the wrong key; the entry is gone.
    assert!(f.objects.keys("in", &format!("derived/{}", job.job_key)).is_empty());
    assert_eq!(f.app.ledger.cached_input_hash(&version).await.unwrap(), None);

    let report = handle(&f.app, vec![message("2", "a.png", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{report:?}"
    );
    let recipe_hash = &f.app.config.recipes[0].recipe_hash;
    assert_eq!(job.job_key, job_key(&sha256_hex(&bytes), recipe_hash));
    assert_eq!(
        f.app.ledger.cached_input_hash(&version).await.unwrap(),
        Some(sha256_hex(&bytes))
    );
}

#[tokio::test]
async fn a_failing_hash_cache_costs_a_read_not_a_job() {
    use crate::faults::{Call, FaultPlan};
    use crate::fingerprint::FingerprintSource;
    use crate::ledger::faults::FaultyTable;
    let plan = Arc::new(FaultPlan::new());
    plan.fail(Call::GetInputHash, 2, "ThrottlingException");
    plan.fail(Call::PutInputHash, 1, "ThrottlingException");
    let base = fixture_with(Some(THUMBNAIL));
    let objects = base.objects.clone();
    let app = Arc::new(App::new(
        base.app.config.clone(),
        Ledger::new(FaultyTable::new(InMemoryTable::new("jobs"), plan.clone())),
        ObjectStore::new(objects.clone()),
        Queue::new(Arc::new(RecordingQueue::default())),
    ));
    let bytes = png(2);
    let etag = objects.insert("in", "b.png", &bytes, false);
    let report = handle(&app, vec![message("1", "b.png", &etag)]).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{report:?}"
    );
    // Not cached (the put failed), so read and hashed again: the same key.
    let again = handle(&app, vec![message("2", "b.png", &etag)]).await;
    let second = again.jobs().next().unwrap();
    assert_eq!(
        (second.outcome, second.input_hash_source),
        (Outcome::Reused, Some(FingerprintSource::Computed)),
        "{again:?}"
    );
    assert_eq!(second.job_key, job.job_key);
    assert_eq!(plan.injected(), 3);
}

#[tokio::test]
async fn a_batch_counts_its_calls_and_bytes_and_its_metrics_add_up() {
    let f = fixture();
    let etag = f.objects.insert("in", "a.bin", b"abc", true);
    let report = handle(
        &f.app,
        vec![message("1", "a.bin", &etag), message("2", "a.bin", &etag)],
    )
    .await;
    let written: u64 = f
        .objects
        .keys("in", "derived/")
        .iter()
        .map(|key| f.objects.bytes("in", key).unwrap().len() as u64)
        .sum();
    assert_eq!(report.usage.output_bytes_written, written);
    assert_eq!(report.usage.input_bytes_read, 3, "probe read the 3 bytes");
    // The reference, the claim's read and put, the finish; the second
    // message's reference is tried and finds the row, which (the null
    // version of an unversioned key) is written again with its `gen`
    // moved on (DESIGN.md, "References": why the null version's hint
    // always writes); its job is the batch's, read after the first
    // record's reference.
    assert_eq!(report.usage.dynamodb_calls, 6, "{:?}", report.usage);

    let documents = crate::metrics::batch_documents("mediaonce", &report, false, 1);
    for document in &documents {
        crate::metrics::tests::validate(document);
    }
    let jobs: Vec<(String, u64)> = documents
        .iter()
        .filter_map(|d| Some((d["Outcome"].as_str()?.to_string(), d["Jobs"].as_u64()?)))
        .collect();
    assert_eq!(jobs, [("ran".to_string(), 1), ("reused".to_string(), 1)]);
    let batch = documents.last().unwrap();
    assert_eq!(batch["DynamoDbCalls"], 6);
    assert_eq!(batch["InputBytesRead"], 3);

    // A redelivery (DESIGN.md's cost per path): the reference (cancelled
    // with the row), the null version's `gen` write and the claim's read,
    // no bytes.
    let again = handle(&f.app, vec![message("3", "a.bin", &etag)]).await;
    assert_eq!(again.jobs().next().unwrap().outcome, Outcome::Reused);
    assert_eq!(
        again.usage,
        crate::report::BatchUsage {
            input_bytes_read: 0,
            output_bytes_written: 0,
            dynamodb_calls: 3,
            dynamodb_retries: 0,
            ..Default::default()
        }
    );
}

/// An object client whose DeleteObjects never answers (a stalled
/// connection, the SDK retrying for minutes).
#[derive(Debug)]
struct StallingDeletes(Arc<InMemoryObjects>);

#[async_trait::async_trait]
impl crate::store::ObjectClient for StallingDeletes {
    async fn head_object(
        &self,
        object: &crate::store::ObjectRef,
    ) -> Result<Option<crate::fingerprint::ObjectHead>, crate::store::HeadError> {
        self.0.head_object(object).await
    }
    async fn get_object(
        &self,
        object: &crate::store::ObjectRef,
    ) -> Result<aws_sdk_s3::primitives::ByteStream, crate::store::GetError> {
        self.0.get_object(object).await
    }
    async fn get_object_range(
        &self,
        object: &crate::store::ObjectRef,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, crate::store::GetError> {
        self.0.get_object_range(object, range).await
    }
    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: crate::store::ObjectHeaders<'_>,
        body: aws_sdk_s3::primitives::ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), crate::store::PutError> {
        self.0.put_object(bucket, key, headers, body, checksum_sha256).await
    }
    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), crate::store::ListError> {
        self.0.list_objects(bucket, prefix, from).await
    }
    async fn delete_objects(
        &self,
        _bucket: &str,
        _keys: &[String],
    ) -> Result<(), crate::store::DeleteError> {
        std::future::pending().await
    }
    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<crate::store::VersionsPage, crate::store::ListError> {
        self.0.list_object_versions(bucket, prefix, from).await
    }
}

/// A DeleteObjects that stalls is abandoned well before the collection's
/// lease ends (so no delete is in flight when a claim may take the row
/// over and write the outputs again), and the collection is backed off.
#[tokio::test(start_paused = true)]
async fn a_stalled_page_of_deletes_is_abandoned_before_the_lease_ends() {
    let steps = StepRegistry::builtin();
    let config = Config::from_lookup(
        |name| match name {
            "MEDIAONCE_TABLE" => Some("jobs".into()),
            "MEDIAONCE_OUTPUT_BUCKET" => Some("out".into()),
            _ => None,
        },
        &steps,
    )
    .unwrap();
    let objects = InMemoryObjects::new();
    objects.insert("out", "derived/j/probe.json", b"{}", false);
    let table = InMemoryTable::new("jobs");
    table.insert(JobRow {
        execution: None,
        job_key: "j".into(),
        step: "probe".into(),
        input_hash: "i".into(),
        status: JobStatus::Done,
        lease_until_ms: 0,
        attempts: 1,
        owner: "o".into(),
        output_prefix: "s3://out/derived/j/".into(),
        error: None,
        updated_at_ms: 0,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: Some("m".into()),
        released_at_ms: Some(0),
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
    });
    let app = App::new(
        config,
        Ledger::new(table),
        ObjectStore::new(StallingDeletes(objects.clone())),
        Queue::new(Arc::new(RecordingQueue::default())),
    );
    let started = tokio::time::Instant::now();
    let err = app.collect("j").await.unwrap_err();
    assert!(err.contains("took more than 20 s"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let row = app.ledger.get("j").await.unwrap().unwrap();
    assert_eq!(row.collect_failures, 1, "{row:?}");
    assert!(row.lease_until_ms <= app.now_ms(), "the lease ended: {row:?}");
    assert!(objects.bytes("out", "derived/j/probe.json").is_some());
}

/// Two uploads of the same bytes in one batch share one run of their job.
/// When the object that run reads is replaced under it, the claim is
/// released and that record is skipped (its new bytes have their own
/// event); the other upload still holds the bytes, so its record runs the
/// job itself rather than share the skip and be acknowledged with nothing
/// run. Found by the explorer (issue 39, seed 227 of its first chained
/// worlds).
#[tokio::test]
async fn a_run_skipped_for_one_uploads_replaced_bytes_runs_again_for_the_other() {
    let bytes = png(3);
    // a.png's first read keys it (hashing the bytes); before the probe's
    // own read of it, another writer replaces it.
    let (app, objects, _) = probe_app_replacing("a.png", &png(4));
    let etag = objects.insert("in", "a.png", &bytes, false);
    objects.insert("in", "b.png", &bytes, false);
    let report = handle(
        &app,
        vec![message("1", "a.png", &etag), message("2", "b.png", &etag)],
    )
    .await;
    let outcomes: Vec<(&str, Outcome)> = report
        .messages
        .iter()
        .flat_map(|m| m.jobs.iter().map(move |j| (m.message_id.as_str(), j.outcome)))
        .collect();
    assert_eq!(
        outcomes,
        [("1", Outcome::Skipped), ("2", Outcome::Ran)],
        "{report:?}"
    );
    let job = job_key(&sha256_hex(&bytes), &app.config.recipes[0].recipe_hash);
    let row = app.ledger.get(&job).await.unwrap().expect("the job's row");
    assert_eq!(row.status, JobStatus::Done);
}

/// A collection that stopped leaves its row `collecting` with every file
/// still under the job's prefix; the claim that takes it over (attempt 2)
/// finds its input replaced while it reads it. The row is finished failed,
/// not deleted: deleted, it left those files under a prefix no row names,
/// for good. Found by the explorer (issue 39).
#[tokio::test]
async fn a_takeover_whose_input_is_replaced_keeps_the_row_that_names_its_files() {
    let bytes = png(5);
    // b.png's first read keys it; before the probe's own read, another
    // writer replaces it.
    let (app, objects, table) = probe_app_replacing("b.png", &png(6));
    let etag = objects.insert("in", "a.png", &bytes, false);
    objects.insert("in", "b.png", &bytes, false);
    let ran = handle(&app, vec![message("1", "a.png", &etag)]).await;
    assert_eq!(ran.jobs().next().unwrap().outcome, Outcome::Ran);
    let job = job_key(&sha256_hex(&bytes), &app.config.recipes[0].recipe_hash);
    let files = objects.keys("out", &format!("derived/{job}/"));
    assert!(!files.is_empty());

    // A collection began and stopped before its deletes; its lease passed.
    let mut row = app.ledger.get(&job).await.unwrap().unwrap();
    row.collected_from = Some(row.status);
    row.status = JobStatus::Collecting;
    row.owner = "collector-gone".into();
    row.lease_until_ms = app.now_ms();
    table.insert(row);

    let report = handle(&app, vec![message("2", "b.png", &etag)]).await;
    let skipped = report.jobs().next().unwrap();
    assert_eq!(
        (skipped.outcome, skipped.attempt),
        (Outcome::Skipped, 2),
        "{report:?}"
    );
    let row = app.ledger.get(&job).await.unwrap().expect("the row stays");
    assert_eq!(row.status, JobStatus::Failed);
    assert_eq!(objects.keys("out", &format!("derived/{job}/")), files);
}

/// An app running the `probe` recipe on jobs keyed by content, one record
/// at a time, whose objects are in memory and whose `key` another writer
/// replaces with `replacement` between its keying read and the next.
fn probe_app_replacing(
    key: &str,
    replacement: &[u8],
) -> (Arc<App>, Arc<InMemoryObjects>, Arc<InMemoryTable>) {
    use crate::faults::{Call, FaultPlan};
    let steps = StepRegistry::builtin();
    let vars = HashMap::from([
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "out"),
        ("MEDIAONCE_IDENTITY", "content"),
        ("MEDIAONCE_CONCURRENCY", "1"),
        (
            "MEDIAONCE_RECIPES",
            r#"[{"name":"probe","step":"probe","version":1,"params":{}}]"#,
        ),
    ]);
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    let objects = InMemoryObjects::new();
    let table = Arc::new(InMemoryTable::new("jobs"));
    let plan = Arc::new(FaultPlan::new());
    plan.overwrite_before(Call::GetObject, key, 1, replacement);
    let app = Arc::new(App::new(
        config,
        Ledger::new(crate::ledger::faults::FaultyTable::over(
            table.clone(),
            Arc::new(FaultPlan::new()),
        )),
        ObjectStore::new(crate::store::faults::FaultyObjects::new(
            objects.clone(),
            plan,
        )),
        Queue::new(Arc::new(RecordingQueue::default())),
    ));
    (app, objects, table)
}
