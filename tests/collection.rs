//! Collection: a job nothing references loses its outputs, then its row,
//! after its grace, and never while a reference can reach it. The races
//! and crash points run on the in-memory and failure-injecting clients with
//! a clock the test moves; the round trip runs on the emulators.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use common::{Options, Pipeline};
use mediaonce::config::{Config, ENV_GC_GRACE_SECS, ENV_IDENTITY, ENV_RECIPES};
use mediaonce::faults::{Call, FaultPlan};
use mediaonce::handler::collect::{Collected, Sweep};
use mediaonce::handler::{
    handle_batch, App, BatchReport, Invocation, Outcome, COLLECT_LEASE, MARK_SETTLE_MS,
};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::lease::Clock;
use mediaonce::ledger::faults::{FaultyTable, Pause};
use mediaonce::ledger::memory::InMemoryTable;
use mediaonce::ledger::{JobRow, JobStatus, Ledger};
use mediaonce::queue::{Queue, RecordingQueue};
use mediaonce::steps::StepRegistry;
use mediaonce::store::faults::FaultyObjects;
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::ObjectStore;

const BYTES: &[u8] = b"shared bytes";
const GRACE_SECS: u64 = 60;

/// A clock the test moves.
#[derive(Debug, Clone, Default)]
struct TestClock(Arc<AtomicU64>);

impl TestClock {
    fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

struct World {
    app: Arc<App>,
    objects: Arc<InMemoryObjects>,
    clock: TestClock,
    faults: Arc<FaultPlan>,
    next_id: AtomicU64,
}

fn world(grace_secs: u64) -> World {
    world_holding(grace_secs, None).0
}

/// A world whose ledger holds the first `held` call until the test lets it
/// go.
fn world_holding(grace_secs: u64, held: Option<(Call, usize)>) -> (World, Option<Arc<Pause>>) {
    world_of(grace_secs, held, &[])
}

/// A probe, and a probe of its `probe.json` chained to it.
const CHAINED: &str = r#"[{"name":"probe","step":"probe","version":1,"params":{}},
    {"name":"probe-of-probe","step":"probe","version":1,"params":{},
     "input":{"recipe":"probe","file":"probe.json"}}]"#;

/// A world whose configuration also has `vars`.
fn world_of(
    grace_secs: u64,
    held: Option<(Call, usize)>,
    vars: &[(&str, &str)],
) -> (World, Option<Arc<Pause>>) {
    let steps = StepRegistry::builtin();
    let grace = grace_secs.to_string();
    let vars: HashMap<&str, &str> = [
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "out"),
        (ENV_GC_GRACE_SECS, grace.as_str()),
    ]
    .into_iter()
    .chain(vars.iter().copied())
    .collect();
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    let objects = InMemoryObjects::new();
    let faults = Arc::new(FaultPlan::new());
    let clock = TestClock(Arc::new(AtomicU64::new(1_000_000)));
    let mut table = FaultyTable::new(InMemoryTable::new("jobs"), faults.clone());
    let mut pause = None;
    if let Some((call, nth)) = held {
        let (paused, held) = table.pause_before(call, nth);
        (table, pause) = (paused, Some(held));
    }
    let app = App::new(
        config,
        Ledger::new(table),
        ObjectStore::new(FaultyObjects::new(objects.clone(), faults.clone())),
        Queue::new(Arc::new(RecordingQueue::default())),
    )
    .with_clock(clock.clone());
    let world = World {
        app: Arc::new(app),
        objects,
        clock,
        faults,
        next_id: AtomicU64::new(0),
    };
    (world, pause)
}

impl World {
    fn key(&self) -> String {
        job_key(&sha256_hex(BYTES), &self.app.config.recipes[0].recipe_hash)
    }

    async fn event(&self, name: &str, key: &str) -> BatchReport {
        let (event, invocation) = self.notification(name, key);
        handle_batch(self.app.clone(), event, invocation).await
    }

    /// A notification of `key`, with a sequencer newer than any before.
    fn notification(&self, name: &str, key: &str) -> (SqsEvent, Invocation) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let body = serde_json::json!({"Records": [{
            "eventName": name,
            "s3": {"bucket": {"name": "in"}, "object": {"key": key, "sequencer": format!("{id:04X}")}}
        }]});
        let mut message = SqsMessage::default();
        message.message_id = Some(format!("m{id}"));
        message.body = Some(body.to_string());
        let mut event = SqsEvent::default();
        event.records = vec![message];
        let invocation = Invocation {
            request_id: format!("r{id}"),
            deadline_ms: None,
            timeout_ms: None,
        };
        (event, invocation)
    }

    async fn upload(&self, key: &str) -> BatchReport {
        self.objects.insert("in", key, BYTES, true);
        self.event("ObjectCreated:Put", key).await
    }

    async fn remove(&self, key: &str) -> BatchReport {
        self.objects.remove("in", key);
        self.event("ObjectRemoved:Delete", key).await
    }

    fn outputs(&self) -> Vec<String> {
        self.objects
            .keys("out", &format!("derived/{}/", self.key()))
    }

    /// The job's status and how many versions reference it.
    async fn status(&self) -> Option<(JobStatus, Option<u64>)> {
        let row = self.app.ledger.get(&self.key()).await.unwrap()?;
        let refs = self.app.ledger.references(&self.key()).await.unwrap();
        Some((row.status, Some(refs.len() as u64)))
    }
}

/// A sweep's collections, after checking that none failed.
fn swept(sweep: Sweep) -> Vec<Collected> {
    assert!(sweep.failures.is_empty(), "{:?}", sweep.failures);
    sweep.collected
}

fn outcomes(report: &BatchReport) -> Vec<Outcome> {
    report.jobs().map(|j| j.outcome).collect()
}

#[tokio::test]
async fn after_the_grace_the_last_release_frees_outputs_and_row() {
    let w = world(GRACE_SECS);
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Ran]);
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Reused]);
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(2))));
    w.remove("a.bin").await;
    w.remove("b.bin").await;
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(0))));
    // Within the grace: kept.
    assert!(swept(w.app.collect_due(false).await.unwrap()).is_empty());
    assert!(!w.outputs().is_empty());

    w.clock.advance_ms(GRACE_SECS * 1_000);
    let dry = swept(w.app.collect_due(true).await.unwrap());
    assert_eq!(dry.len(), 1);
    assert_eq!(dry[0].deleted, w.outputs());
    assert!(!w.outputs().is_empty(), "a dry run touches nothing");
    let collected = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(collected[0].outcome, "collected");
    assert!(w.outputs().is_empty());
    assert_eq!(w.status().await, None);

    // Uploaded again: the job runs from nothing.
    assert_eq!(outcomes(&w.upload("c.bin").await), [Outcome::Ran]);
    assert!(!w.outputs().is_empty());
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

/// Issue 37, defect 1: a job whose runs failed (transiently) is referenced
/// by two versions; the first is deleted, and its release collects at once
/// (no grace). The collection finds the second's reference and gives the
/// row back as it was, `failed`: never `done` with no manifest and no
/// files, which every later upload of the bytes would reuse.
#[tokio::test]
async fn a_failed_job_a_collection_keeps_is_given_back_failed_never_done() {
    let w = world(0);
    w.faults
        .fail(Call::PutObject, 2, "InternalError (HTTP 500): injected");
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Failed]);
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Failed]);
    assert_eq!(w.status().await, Some((JobStatus::Failed, Some(2))));
    assert!(w.outputs().is_empty());

    w.remove("a.bin").await;
    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.collected_from),
        (JobStatus::Failed, None),
        "{row:?}"
    );
    assert_eq!(w.status().await, Some((JobStatus::Failed, Some(1))));

    // The next upload of the bytes runs the job; it is not handed nothing.
    assert_eq!(outcomes(&w.upload("c.bin").await), [Outcome::Ran]);
    let manifest = format!("derived/{}/_manifest.json", w.key());
    assert!(w.outputs().contains(&manifest), "{:?}", w.outputs());
}

/// Issue 37, defect 1, the same for a run that died: its row stays
/// `running`, a release marks it, and after its lease and the grace the
/// sweep takes it as abandoned, finds the other version's reference, and
/// gives it back `running` with its lease ended (taken over by the next
/// message), never `done` with the dead run's files.
#[tokio::test]
async fn a_dead_run_a_collection_keeps_is_given_back_running_never_done() {
    let w = world(GRACE_SECS);
    // The run's outputs and manifest are written, then its finish is lost.
    w.faults.fail(Call::Finish, 1, "the worker is gone");
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Failed]);
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Busy]);
    w.remove("a.bin").await;
    assert_eq!(w.status().await, Some((JobStatus::Running, Some(1))));

    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    w.clock
        .advance_ms(row.lease_until_ms - w.clock.now_ms() + GRACE_SECS * 1_000);
    let swept = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert_eq!(swept[0].outcome, "referenced: kept");
    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.collected_from, row.attempts),
        (JobStatus::Running, None, 1),
        "{row:?}"
    );
    assert!(row.lease_until_ms <= w.clock.now_ms());

    // b.bin's message comes back and takes the dead run over.
    let report = w.event("ObjectCreated:Put", "b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Ran], "{report:?}");
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

/// A run that died leaves its row `running`, and no release marks it: its
/// version's message was dead-lettered, so nothing comes back for it. After
/// its lease and a grace the sweep takes the row as abandoned, but reads
/// its references as it does a marked row's: the version lives, so the row
/// is kept with the files its run wrote, and a redrive of the message runs
/// the job. (Abandoned rows were deleted unread: found by the explorer,
/// issue 39, in a versioned bucket whose older version's job lost its
/// outputs so while the version lived.)
#[tokio::test]
async fn an_abandoned_job_a_live_version_references_keeps_its_files() {
    let w = world(GRACE_SECS);
    w.faults.fail(Call::Finish, 1, "the worker is gone");
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Failed]);
    assert_eq!(w.status().await, Some((JobStatus::Running, Some(1))));
    let files = w.outputs();
    assert!(!files.is_empty());

    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert_eq!(row.free_mark, None, "no release marked it");
    w.clock
        .advance_ms(row.lease_until_ms - w.clock.now_ms() + GRACE_SECS * 1_000);
    let swept = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert_eq!(swept[0].outcome, "referenced: kept");
    assert_eq!(w.outputs(), files);
    assert_eq!(w.status().await, Some((JobStatus::Running, Some(1))));

    let report = w.event("ObjectCreated:Put", "a.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Ran], "{report:?}");
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

/// Issue 37, defect 2: `refs rebuild` reads a version's job, and a sweep
/// collects it before the rebuild's reference lands (nothing referenced it
/// yet: the version's create was never handled, the reason to rebuild).
/// The rebuild reads the job again after its reference, as every adder
/// does, and reports it not done rather than `referenced`; the reference
/// stands, and the version's next event runs the job.
#[tokio::test]
async fn a_rebuild_says_referenced_only_of_a_job_done_after_its_reference() {
    let (w, pause) = world_holding(GRACE_SECS, Some((Call::ChangeRefs, usize::MAX)));
    let pause = pause.unwrap();
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Ran]);
    // b.bin holds the same bytes; its create was never handled.
    w.objects.insert("in", "b.bin", BYTES, true);
    w.remove("a.bin").await;
    w.clock.advance_ms(GRACE_SECS * 1_000);

    pause.hold_next();
    let app = w.app.clone();
    let rebuild = tokio::spawn(async move {
        let mut seen = Vec::new();
        let summary = app
            .rebuild_refs("in", "b.bin", false, |v| seen.push(v.clone()))
            .await;
        (summary, seen)
    });
    pause.reached().await;
    // Between the rebuild's read of the job and its reference.
    let collected = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(collected.len(), 1, "{collected:?}");
    assert_eq!(collected[0].outcome, "collected");
    pause.resume();
    let (summary, seen) = rebuild.await.unwrap();
    let summary = summary.unwrap();
    assert_eq!((summary.versions, summary.references), (1, 0), "{seen:?}");
    assert!(seen[0].referenced.is_empty(), "{seen:?}");
    assert_eq!(seen[0].not_done[0].job_key, w.key(), "{seen:?}");
    assert!(seen[0].not_done[0].reason.contains("collected"), "{seen:?}");
    assert_eq!(w.status().await, None);

    let report = w.event("ObjectCreated:Put", "b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Ran], "{report:?}");
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

/// Issue 37, defect 4, on the in-memory store: a DELETE in a
/// versioning-suspended bucket removes the null version for good and puts
/// a null marker. Its event releases the version's jobs whatever
/// `MEDIAONCE_RELEASE_ON_DELETE_MARKER` says (the default here: off), and
/// with no grace they are collected at once; they leaked for good before.
#[tokio::test]
async fn a_null_delete_marker_releases_the_version_it_removed() {
    let w = world(0);
    assert_eq!(outcomes(&w.upload("a.bin").await), [Outcome::Ran]);
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Reused]);
    w.objects.delete_suspended("in", "a.bin");
    let report = w.event("ObjectRemoved:DeleteMarkerCreated", "a.bin").await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        w.status().await,
        Some((JobStatus::Done, Some(1))),
        "b.bin's"
    );
    w.objects.delete_suspended("in", "b.bin");
    let report = w.event("ObjectRemoved:DeleteMarkerCreated", "b.bin").await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(w.status().await, None);
    assert!(w.outputs().is_empty());
}

/// Issue 37, defect 3: an ETag is not the bytes' identity. The same bytes
/// uploaded again to an unversioned key as a multipart upload (another
/// ETag, not their MD5; S3 also gives other ETags under SSE-KMS and
/// SSE-C) keep the chained job their first upload referenced: before, it
/// was released and, with no grace, collected while the key held the
/// bytes that made it, and the same delivery ran it again. A stale delete
/// hint handled after the re-upload releases nothing either.
#[tokio::test]
async fn the_same_bytes_with_another_etag_keep_their_chained_jobs() {
    for sha256 in [true, false] {
        let w = world_of(0, None, &[(ENV_RECIPES, CHAINED)]).0;
        w.objects.insert("in", "a.bin", BYTES, sha256);
        let first = w.event("ObjectCreated:Put", "a.bin").await;
        assert_eq!(outcomes(&first), [Outcome::Ran, Outcome::Ran], "{first:?}");
        let jobs: Vec<String> = first.jobs().map(|j| j.job_key.clone()).collect();

        // Uploaded again in parts; its delete hint (stale: the key holds
        // the bytes) is handled before its create.
        w.objects.insert_multipart("in", "a.bin", BYTES, sha256);
        let stale = w.event("ObjectRemoved:Delete", "a.bin").await;
        assert!(stale.response().batch_item_failures.is_empty(), "{stale:?}");
        for job in &jobs {
            let row = w.app.ledger.get(job).await.unwrap();
            assert_eq!(
                row.map(|r| r.status),
                Some(JobStatus::Done),
                "sha256 {sha256}: {job}"
            );
        }
        let again = w.event("ObjectCreated:Put", "a.bin").await;
        let chained = again.jobs().last().unwrap();
        assert_eq!(
            (chained.job_key.as_str(), chained.outcome),
            (jobs[1].as_str(), Outcome::Reused),
            "sha256 {sha256}: not run again: {again:?}"
        );
        let refs = w.app.ledger.references(&jobs[1]).await.unwrap();
        assert_eq!(refs.len(), 1, "sha256 {sha256}");
    }
}

/// Bytes proven other (their single-part ETags, MD5s of the bytes, differ)
/// still release the old bytes' jobs at once.
#[tokio::test]
async fn other_bytes_proven_by_md5_etags_release_the_old_jobs() {
    let w = world_of(0, None, &[(ENV_RECIPES, CHAINED)]).0;
    w.objects.insert("in", "a.bin", BYTES, false);
    let first = w.event("ObjectCreated:Put", "a.bin").await;
    let jobs: Vec<String> = first.jobs().map(|j| j.job_key.clone()).collect();
    w.objects.insert("in", "a.bin", b"other bytes", false);
    let report = w.event("ObjectCreated:Put", "a.bin").await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(w.app.ledger.get(&jobs[0]).await.unwrap(), None, "collected");
}

/// A rebuild of an unversioned key whose bytes were overwritten (in parts:
/// an ETag that is not their MD5, no SHA-256 from S3) records the SHA-256
/// it computed to key the new bytes' jobs, so the old bytes' jobs, proven
/// other, are released. It recorded only the ETag before: nothing proved
/// the bytes other, the row kept the old jobs under the new ETag, and the
/// create's own event, finding that ETag, kept them for the key's life
/// (the lifecycle soak, seed 5883306060597069846).
#[tokio::test]
async fn a_rebuild_of_overwritten_bytes_releases_the_old_bytes_jobs() {
    // Keyed by content: under `auto`, a probe (which reads a header only)
    // keys bytes with no SHA-256 from S3 by version and ETag, and nothing
    // proves them other (DESIGN.md, "What identifies bytes").
    let w = world_of(
        0,
        None,
        &[(ENV_RECIPES, CHAINED), (ENV_IDENTITY, "content")],
    )
    .0;
    w.objects.insert("in", "a.bin", BYTES, true);
    let first = w.event("ObjectCreated:Put", "a.bin").await;
    assert_eq!(outcomes(&first), [Outcome::Ran, Outcome::Ran], "{first:?}");
    let old: Vec<String> = first.jobs().map(|j| j.job_key.clone()).collect();

    // Other bytes, in parts; their create is not handled before the rebuild.
    w.objects
        .insert_multipart("in", "a.bin", b"other bytes", false);
    let summary = w
        .app
        .rebuild_refs("in", "a.bin", false, |_| {})
        .await
        .unwrap();
    assert_eq!((summary.versions, summary.errors), (1, 0), "{summary:?}");
    for job in &old {
        let refs = w.app.ledger.references(job).await.unwrap();
        assert!(refs.is_empty(), "after the rebuild, {job}: {refs:?}");
    }
    let again = w.event("ObjectCreated:Put", "a.bin").await;
    assert_eq!(outcomes(&again), [Outcome::Ran, Outcome::Ran], "{again:?}");
    for job in &old {
        let refs = w.app.ledger.references(job).await.unwrap();
        assert!(refs.is_empty(), "after the create, {job}: {refs:?}");
    }
}

#[tokio::test]
async fn a_reference_between_the_last_release_and_the_collection_keeps_everything() {
    let w = world(GRACE_SECS);
    w.upload("a.bin").await;
    w.remove("a.bin").await;
    w.clock.advance_ms(GRACE_SECS * 1_000);
    // Due now, but another upload of the bytes arrives first: the
    // collection finds its reference and gives the job back.
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Reused]);
    let collected = w.app.collect(&w.key()).await.unwrap();
    assert_eq!(collected.outcome, "referenced: kept", "{collected:?}");
    assert!(!w.outputs().is_empty());
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

#[tokio::test]
async fn an_upload_between_the_collectors_mark_and_its_read_keeps_the_outputs() {
    // The collector has taken the row (`collecting`) and is held before it
    // reads the references.
    let (w, pause) = world_holding(GRACE_SECS, Some((Call::QueryRefs, 0)));
    let pause = pause.unwrap();
    w.upload("a.bin").await;
    w.remove("a.bin").await;
    w.clock.advance_ms(GRACE_SECS * 1_000);
    let app = w.app.clone();
    let sweep = tokio::spawn(async move { app.collect_due(false).await });
    pause.reached().await;
    assert_eq!(w.status().await.map(|s| s.0), Some(JobStatus::Collecting));

    // The adder writes its reference first, then reads the row: it sees
    // the collection and its message comes back.
    let report = w.upload("b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Busy], "{report:?}");
    assert_eq!(w.status().await, Some((JobStatus::Collecting, Some(1))));

    // The collector's read comes after the reference: it keeps the job.
    pause.resume();
    let collected = swept(sweep.await.unwrap().unwrap());
    assert_eq!(collected.len(), 1);
    assert_eq!(collected[0].outcome, "referenced: kept", "{collected:?}");
    assert!(collected[0].deleted.is_empty());
    assert!(!w.outputs().is_empty());
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));

    // The message comes back and reuses the outputs. The release's mark
    // stays until it has settled: sweeps look again and keep the job, and
    // the first after the settle time clears the mark for good.
    let report = w.event("ObjectCreated:Put", "b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Reused], "{report:?}");
    w.clock.advance_ms(MARK_SETTLE_MS);
    let collected = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(collected[0].outcome, "referenced: kept", "{collected:?}");
    assert_eq!(
        w.app.ledger.get(&w.key()).await.unwrap().unwrap().free_mark,
        None
    );
    w.clock.advance_ms(MARK_SETTLE_MS);
    assert!(swept(w.app.collect_due(false).await.unwrap()).is_empty());
    assert!(!w.outputs().is_empty());
}

#[tokio::test]
async fn a_release_whose_mark_the_collector_saw_young_is_still_collected() {
    // Two uploads of the bytes (two reference transactions), the first
    // removed (the third); the second removal marks the job and is held
    // before its transaction deletes the last reference item.
    let (w, pause) = world_holding(GRACE_SECS, Some((Call::ChangeRefs, 3)));
    let pause = pause.unwrap();
    w.upload("a.bin").await;
    w.upload("b.bin").await;
    w.remove("a.bin").await;
    w.objects.remove("in", "b.bin");
    let app = w.app.clone();
    let (event, invocation) = w.notification("ObjectRemoved:Delete", "b.bin");
    let release = tokio::spawn(handle_batch(app, event, invocation));
    pause.reached().await;
    let marked = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert!(marked.free_mark.is_some());

    // A sweep after the grace finds the reference still there: kept, and
    // the mark (younger than the settle time) stays for the next sweep.
    w.clock.advance_ms(GRACE_SECS * 1_000);
    let collected = swept(w.app.collect_due(false).await.unwrap());
    assert_eq!(collected.len(), 1);
    assert_eq!(collected[0].outcome, "referenced: kept", "{collected:?}");
    let kept = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert_eq!(kept.status, JobStatus::Done);
    assert_eq!(kept.free_mark, marked.free_mark);

    // The release deletes the last reference; the job is collected (by the
    // release itself, the grace having passed, or by the next sweep).
    pause.resume();
    release.await.unwrap();
    swept(w.app.collect_due(false).await.unwrap());
    assert!(w.outputs().is_empty());
    assert_eq!(w.status().await, None);
}

#[tokio::test]
async fn a_reference_during_the_deletes_waits_then_runs_the_job_again() {
    let w = world(0);
    w.upload("a.bin").await;
    // The collection the release starts dies after its conditional write
    // (its first listing and its back-off fail, as a crash would): the
    // row stays `collecting`.
    w.faults.fail(Call::ListObjects, 1, "crash");
    w.faults.fail(Call::DeferCollect, 1, "crash");
    w.remove("a.bin").await;
    assert_eq!(w.status().await.map(|s| s.0), Some(JobStatus::Collecting));

    // A new upload of the same bytes while the collection holds the row.
    let report = w.upload("b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Busy], "{report:?}");
    assert_eq!(report.response().batch_item_failures.len(), 1);

    // Its lease passes: the message comes back and runs the job from
    // nothing (the stopped collection never deletes again).
    w.clock
        .advance_ms(u64::try_from(COLLECT_LEASE.as_millis()).unwrap());
    let report = w.event("ObjectCreated:Put", "b.bin").await;
    assert_eq!(outcomes(&report), [Outcome::Ran], "{report:?}");
    assert!(!w.outputs().is_empty());
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
    let swept = swept(w.app.collect_due(false).await.unwrap());
    assert!(
        swept.iter().all(|c| c.outcome == "referenced: kept"),
        "{swept:?}"
    );
    assert!(!w.outputs().is_empty());
}

#[tokio::test]
async fn a_collection_stopped_at_any_step_is_finished_by_the_next() {
    for (call, skip) in [
        (Call::ListObjects, 0),
        (Call::DeleteObjects, 0),
        (Call::EndCollect, 0),
    ] {
        let w = world(0);
        w.upload("a.bin").await;
        // A crash: the call fails and so does the back-off after it.
        w.faults.fail_after(call, skip, 1, "crash");
        w.faults.fail(Call::DeferCollect, 1, "crash");
        w.remove("a.bin").await;
        assert_eq!(
            w.status().await.map(|s| s.0),
            Some(JobStatus::Collecting),
            "{call:?}"
        );
        // Not before its lease passes...
        assert!(swept(w.app.collect_due(false).await.unwrap()).is_empty());
        // ...then the sweep takes it over and finishes.
        w.clock
            .advance_ms(u64::try_from(COLLECT_LEASE.as_millis()).unwrap());
        let collected = swept(w.app.collect_due(false).await.unwrap());
        assert_eq!(collected.len(), 1, "{call:?}");
        assert_eq!(collected[0].outcome, "collected");
        assert!(w.outputs().is_empty(), "{call:?}");
        assert_eq!(w.status().await, None, "{call:?}");
    }
}

#[tokio::test]
async fn a_referenced_job_is_never_collected_and_nothing_else_is_touched() {
    let w = world(0);
    w.upload("a.bin").await;
    w.objects
        .insert("out", "derived/other/keep.bin", b"x", false);
    w.objects.insert(
        "out",
        &format!("derived/{}-suffix/keep.bin", w.key()),
        b"x",
        false,
    );
    assert_eq!(
        w.app.collect(&w.key()).await.unwrap().outcome,
        "referenced: kept"
    );
    w.remove("a.bin").await;
    assert_eq!(w.status().await, None, "collected at once with no grace");
    let mut left = w.objects.keys("out", "derived/");
    left.sort();
    let mut expected = vec![
        "derived/other/keep.bin".to_string(),
        format!("derived/{}-suffix/keep.bin", w.key()),
    ];
    expected.sort();
    assert_eq!(left, expected);
}

#[tokio::test]
async fn on_the_emulators_the_last_delete_collects_and_an_upload_brings_it_back() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        vars: vec![(ENV_GC_GRACE_SECS, "0".into())],
        ..Options::default()
    })
    .await;
    p.put("one.bin", BYTES, true).await;
    p.put("two.bin", BYTES, true).await;
    p.handle(p.receive(2).await).await;
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    let prefix = format!("derived/{key}/");
    assert_eq!(p.refs(&key).await, 2);

    for name in ["one.bin", "two.bin"] {
        p.s3.delete_object()
            .bucket(&p.bucket)
            .key(name)
            .send()
            .await
            .unwrap();
        let report = p.handle(p.receive(1).await).await;
        assert!(report.response().batch_item_failures.is_empty());
    }
    assert!(p.output_keys(&prefix).await.is_empty());
    assert_eq!(p.row(&key).await, None);

    p.put("three.bin", BYTES, true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(report.count(Outcome::Ran), 1, "{report:?}");
    assert!(!p.output_keys(&prefix).await.is_empty());
    assert_eq!(p.refs(&key).await, 1);
}

#[tokio::test]
async fn on_the_emulators_a_stopped_collection_is_finished_by_the_sweep() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        vars: vec![(ENV_GC_GRACE_SECS, "0".into())],
        ..Options::default()
    })
    .await;
    p.put("only.bin", BYTES, true).await;
    p.handle(p.receive(1).await).await;
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    let prefix = format!("derived/{key}/");

    // The release's collection dies after its conditional write (its
    // listing and its back-off fail, as a crash would).
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key("only.bin")
        .send()
        .await
        .unwrap();
    let stopping = Arc::new(FaultPlan::new());
    stopping.fail(Call::ListObjects, 1, "crash");
    stopping.fail(Call::DeferCollect, 1, "crash");
    let report = common::handle_with(p.worker(0, stopping), p.receive(1).await).await;
    assert!(report.response().batch_item_failures.is_empty());
    assert_eq!(p.row(&key).await.unwrap().status, JobStatus::Collecting);
    assert!(!p.output_keys(&prefix).await.is_empty());

    // The sweep (a Scan of the due rows) on a clock past the lease.
    let lease_ms = i64::try_from(COLLECT_LEASE.as_millis()).unwrap();
    assert!(
        swept(p.app.collect_due(false).await.unwrap()).is_empty(),
        "lease live"
    );
    let later = p.worker(lease_ms + 1_000, Arc::new(FaultPlan::new()));
    let dry = swept(later.collect_due(true).await.unwrap());
    assert_eq!(dry.len(), 1);
    assert!(!dry[0].deleted.is_empty());
    let collected = swept(later.collect_due(false).await.unwrap());
    assert_eq!(collected[0].outcome, "collected");
    assert!(p.output_keys(&prefix).await.is_empty());
    assert_eq!(p.row(&key).await, None);
}

/// One job whose outputs cannot be listed (permissions, Object Lock, a
/// missing bucket) never stops the sweep: the other due job is collected,
/// the failing one is reported, its lease ends at once (an upload of its
/// bytes runs it again without waiting), and it is backed off, an hour,
/// then two, before the next try.
#[tokio::test]
async fn a_failing_collection_is_backed_off_and_the_sweep_goes_on() {
    let w = world(GRACE_SECS);
    const OTHER: &[u8] = b"other bytes";
    let other = job_key(&sha256_hex(OTHER), &w.app.config.recipes[0].recipe_hash);
    w.upload("a.bin").await;
    w.objects.insert("in", "o.bin", OTHER, true);
    w.event("ObjectCreated:Put", "o.bin").await;
    w.remove("a.bin").await;
    w.remove("o.bin").await;
    w.clock.advance_ms(GRACE_SECS * 1_000);
    let failing = format!("{}/", w.key());
    w.faults
        .fail_key(Call::ListObjects, &failing, usize::MAX, "AccessDenied");

    let sweep = w.app.collect_due(false).await.unwrap();
    let collected: Vec<&str> = sweep.collected.iter().map(|c| c.job_key.as_str()).collect();
    assert_eq!(collected, [other.as_str()], "{sweep:?}");
    assert_eq!(sweep.failures.len(), 1, "{sweep:?}");
    assert_eq!(sweep.failures[0].job_key, w.key());
    assert!(
        sweep.failures[0].error.contains("AccessDenied"),
        "{sweep:?}"
    );
    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    let now = w.clock.now_ms();
    assert_eq!(row.status, JobStatus::Collecting);
    assert_eq!(row.lease_until_ms, now, "the lease ends at once");
    assert_eq!(row.collect_failures, 1);
    assert_eq!(row.collect_retry_at_ms, Some(now + 3_600_000));

    // Backed off: the next sweeps pass it by until the hour is up...
    w.clock.advance_ms(3_600_000 - 1);
    assert!(swept(w.app.collect_due(false).await.unwrap()).is_empty());
    // ...then try again, fail again, and wait twice as long.
    w.clock.advance_ms(1);
    let sweep = w.app.collect_due(false).await.unwrap();
    assert_eq!((sweep.collected.len(), sweep.failures.len()), (0, 1));
    let row = w.app.ledger.get(&w.key()).await.unwrap().unwrap();
    assert_eq!(row.collect_failures, 2);
    assert_eq!(row.collect_retry_at_ms, Some(w.clock.now_ms() + 7_200_000));
    assert!(!w.outputs().is_empty(), "nothing of it was deleted");

    // Meanwhile the bytes come back: the job runs again at once, not busy.
    assert_eq!(outcomes(&w.upload("b.bin").await), [Outcome::Ran]);
    assert_eq!(w.status().await, Some((JobStatus::Done, Some(1))));
}

#[test]
fn the_back_off_doubles_from_an_hour_to_a_week() {
    use mediaonce::handler::collect::back_off;
    let hours = |n: u64| std::time::Duration::from_secs(n * 3600);
    assert_eq!(back_off(1), hours(1));
    assert_eq!(back_off(2), hours(2));
    assert_eq!(back_off(5), hours(16));
    assert_eq!(back_off(9), hours(168));
    assert_eq!(back_off(u64::MAX), hours(168));
}

/// A due job with an output prefix no S3 call can read.
fn due_row(job_key: &str, output_prefix: String) -> JobRow {
    JobRow {
        execution: None,
        job_key: job_key.to_string(),
        step: "probe".into(),
        input_hash: sha256_hex(job_key.as_bytes()),
        status: JobStatus::Done,
        lease_until_ms: 0,
        attempts: 1,
        owner: "worker".into(),
        output_prefix,
        error: None,
        updated_at_ms: 1,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: Some("released".into()),
        released_at_ms: Some(1),
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
    }
}

/// `mediaonce gc` against the emulators, with one due job in a bucket that
/// does not exist: the other due job is collected, both are printed as
/// JSON lines (the failure with its cause), and the command exits 1 after
/// finishing the rest.
#[tokio::test]
async fn on_the_emulators_gc_finishes_the_sweep_past_a_failure_and_exits_1() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let (good, bad) = (sha256_hex(b"good job"), sha256_hex(b"bad job"));
    p.seed_row(&due_row(
        &good,
        format!("s3://{}/derived/{good}/", p.output_bucket),
    ))
    .await;
    p.s3.put_object()
        .bucket(&p.output_bucket)
        .key(format!("derived/{good}/out.json"))
        .body(b"{}".to_vec().into())
        .send()
        .await
        .unwrap();
    let missing = format!("{}-missing", p.output_bucket);
    p.seed_row(&due_row(&bad, format!("s3://{missing}/derived/{bad}/")))
        .await;

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .arg("gc")
        .env("MEDIAONCE_TABLE", &p.table)
        .env("MEDIAONCE_OUTPUT_BUCKET", &p.output_bucket)
        .env("MEDIAONCE_INPUT_BUCKET", &p.bucket)
        .output()
        .expect("mediaonce runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let by_key = |key: &str| {
        lines
            .iter()
            .find(|line| line["job_key"] == key)
            .unwrap_or_else(|| panic!("{key} not in {lines:?}"))
            .clone()
    };
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(by_key(&good)["outcome"], "collected");
    let failed = by_key(&bad);
    assert_eq!(failed["outcome"], "failed");
    assert!(
        failed["error"].as_str().unwrap().contains("NoSuchBucket"),
        "{failed}"
    );
    assert!(stderr.contains("1 failed"), "{stderr}");
    assert_eq!(p.row(&good).await, None);
    assert!(p.output_keys(&format!("derived/{good}/")).await.is_empty());
    let row = p.row(&bad).await.unwrap();
    assert_eq!(
        (row.status, row.collect_failures),
        (JobStatus::Collecting, 1)
    );
}
