//! One contract per client trait, run on every implementation: the
//! in-memory twins re-implement DynamoDB's and S3's conditional semantics
//! by hand, and these suites are what keeps them honest. Each contract is
//! an async function over `impl LedgerTable` or `impl ObjectClient`; the
//! tests run it on the in-memory client and on the real service's client
//! against the emulators.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use mediaonce::error::ErrorKind;
use std::collections::BTreeSet;

use mediaonce::identity::ObjectVersion;
use mediaonce::key::sha256_hex;
use mediaonce::ledger::dynamodb::DynamoDbTable;
use mediaonce::ledger::memory::InMemoryTable;
use mediaonce::ledger::{
    Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, ExecutionRecord, Finish, JobRow,
    JobStatus, LedgerTable, RefWrite,
};
use mediaonce::references::{self, RefChange, RefHolder, VersionName};
use mediaonce::step::{output_headers, IMMUTABLE};
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::s3::S3Objects;
use mediaonce::store::{sha256_base64, ObjectClient, ObjectHeaders, ObjectRef};

fn row(key: &str, owner: &str, status: JobStatus, lease_until_ms: u64) -> JobRow {
    JobRow {
        execution: None,
        job_key: key.into(),
        step: "probe".into(),
        input_hash: "a".repeat(64),
        status,
        lease_until_ms,
        attempts: 1,
        owner: owner.into(),
        output_prefix: format!("s3://out/derived/{key}/"),
        error: None,
        updated_at_ms: 1_000,
        failures: 0,
        permanent: false,
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
    }
}

fn request(key: &str, owner: &str, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        job_key: key.into(),
        step: "probe".into(),
        input_hash: "a".repeat(64),
        // Another configuration's prefix: a takeover must keep the row's.
        output_prefix: format!("s3://elsewhere/derived/{key}/"),
        owner: owner.into(),
        lease_until_ms: now_ms + 60_000,
        now_ms,
        max_attempts: 3,
    }
}

fn claim(key: &str, owner: &str) -> Claim {
    Claim {
        job_key: key.into(),
        owner: owner.into(),
        attempt: 1,
        lease_until_ms: 0,
        output_prefix: String::new(),
        superseded: None,
    }
}

/// The contract of a [`LedgerTable`]: each call atomic and conditional
/// exactly as DESIGN.md's state machine says, and a rejected condition
/// answered with the row as it is.
async fn ledger_contract(table: impl LedgerTable) {
    // GetItem of nothing; PutItem on a new key; the row round-trips.
    assert_eq!(table.get("k").await.unwrap(), None);
    let first = row("k", "a/1", JobStatus::Running, 2_000);
    assert_eq!(
        table.put_new(&first).await.unwrap(),
        Conditional::Applied(())
    );
    assert_eq!(table.get("k").await.unwrap().as_ref(), Some(&first));

    // A second put is rejected with the row that exists.
    let second = row("k", "b/1", JobStatus::Running, 9_000);
    assert_eq!(
        table.put_new(&second).await.unwrap(),
        Conditional::Rejected(Some(first.clone()))
    );

    // A takeover conditioned on a stale view is rejected with the row.
    let mut stale = first.clone();
    stale.owner = "someone-else/1".into();
    assert_eq!(
        table
            .take_over(&stale, &request("k", "b/1", 3_000))
            .await
            .unwrap(),
        Conditional::Rejected(Some(first.clone()))
    );
    // On the row as it is: running for the new owner, one more attempt,
    // the row's output prefix kept.
    assert_eq!(
        table
            .take_over(&first, &request("k", "b/1", 3_000))
            .await
            .unwrap(),
        Conditional::Applied(2)
    );
    let taken = table.get("k").await.unwrap().unwrap();
    assert_eq!(
        (
            taken.owner.as_str(),
            taken.attempts,
            taken.status,
            taken.lease_until_ms
        ),
        ("b/1", 2, JobStatus::Running, 63_000)
    );
    assert_eq!(taken.output_prefix, first.output_prefix);
    assert_eq!(taken.updated_at_ms, 3_000);

    // Finishing is the owner's alone, and only while running.
    let failed = Finish::Failed {
        error: "decoder exploded",
        permanent: false,
    };
    assert_eq!(
        table
            .finish(&claim("k", "a/1"), failed, 4_000)
            .await
            .unwrap(),
        Conditional::Rejected(Some(taken.clone()))
    );
    assert_eq!(
        table
            .finish(&claim("k", "b/1"), failed, 4_000)
            .await
            .unwrap(),
        Conditional::Applied(())
    );
    let after = table.get("k").await.unwrap().unwrap();
    assert_eq!(
        (
            after.status,
            after.failures,
            after.permanent,
            after.error.as_deref()
        ),
        (JobStatus::Failed, 1, false, Some("decoder exploded"))
    );
    assert!(matches!(
        table
            .finish(&claim("k", "b/1"), Finish::Done, 4_001)
            .await
            .unwrap(),
        Conditional::Rejected(Some(_))
    ));

    // A permanent failure is marked so, and counted.
    table
        .put_new(&row("p", "a/1", JobStatus::Running, 2_000))
        .await
        .unwrap();
    let permanent = Finish::Failed {
        error: "not an image",
        permanent: true,
    };
    table
        .finish(&claim("p", "a/1"), permanent, 4_000)
        .await
        .unwrap();
    let marked = table.get("p").await.unwrap().unwrap();
    assert_eq!((marked.failures, marked.permanent), (1, true));

    // Spent: failed for good by its count, not permanent.
    table
        .put_new(&row("spent", "a/1", JobStatus::Running, 2_000))
        .await
        .unwrap();
    let spent = Finish::Spent {
        error: "chunk 2 failed for good",
        failures: 3,
    };
    table
        .finish(&claim("spent", "a/1"), spent, 4_000)
        .await
        .unwrap();
    let spent = table.get("spent").await.unwrap().unwrap();
    assert_eq!(
        (
            spent.status,
            spent.failures,
            spent.permanent,
            spent.error.as_deref()
        ),
        (JobStatus::Failed, 3, false, Some("chunk 2 failed for good"))
    );

    // Retry: a failed row's counters go back to 0 and the mark goes; the
    // row as it was comes back.
    assert_eq!(
        table.reset_attempts("p", 5_000).await.unwrap(),
        Conditional::Applied(marked.clone())
    );
    let reset = table.get("p").await.unwrap().unwrap();
    assert_eq!(
        (
            reset.attempts,
            reset.failures,
            reset.permanent,
            reset.error.as_deref()
        ),
        (0, 0, false, Some("not an image"))
    );
    // Not a live running row, nor a done one, nor a missing one.
    table
        .put_new(&row("live", "a/1", JobStatus::Running, 9_000))
        .await
        .unwrap();
    assert!(matches!(
        table.reset_attempts("live", 5_000).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert!(matches!(
        table.reset_attempts("live", 9_000).await.unwrap(),
        Conditional::Applied(_)
    ));
    assert_eq!(
        table.reset_attempts("missing", 5_000).await.unwrap(),
        Conditional::Rejected(None)
    );

    // Done removes the error, and marks the job for the sweep (its
    // owner's token, now).
    table
        .put_new(&row("d", "a/1", JobStatus::Running, 2_000))
        .await
        .unwrap();
    table
        .finish(&claim("d", "a/1"), Finish::Done, 4_000)
        .await
        .unwrap();
    let done = table.get("d").await.unwrap().unwrap();
    assert_eq!(
        (done.status, done.error, done.released_at_ms),
        (JobStatus::Done, None, Some(4_000))
    );
    assert_eq!(done.free_mark.as_deref(), Some("a/1"));
    assert!(matches!(
        table.reset_attempts("d", 5_000).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));

    // Release: the owner's running claim is deleted; anyone else's, or a
    // finished row, stays; nothing to release is rejected with nothing.
    table
        .put_new(&row("r", "a/1", JobStatus::Running, 2_000))
        .await
        .unwrap();
    assert!(matches!(
        table.release(&claim("r", "b/1")).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert_eq!(
        table.release(&claim("r", "a/1")).await.unwrap(),
        Conditional::Applied(())
    );
    assert_eq!(table.get("r").await.unwrap(), None);
    assert_eq!(
        table.release(&claim("r", "a/1")).await.unwrap(),
        Conditional::Rejected(None)
    );
    assert!(matches!(
        table.release(&claim("d", "a/1")).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));

    hash_cache_contract(&table).await;
    references_contract(&table).await;
    collection_contract(&table).await;
    legacy_contract(&table).await;
    abandoned_contract(&table).await;
}

/// Rows whose messages never came back (their objects are gone): a
/// `running` row whose lease ended a grace ago and a `failed` one untouched
/// for a grace are collected; live leases and poisoned rows are not.
async fn abandoned_contract(table: &impl LedgerTable) {
    let at = |key: &str, status: JobStatus, lease: u64, updated: u64| JobRow {
        updated_at_ms: updated,
        ..row(key, "w/1", status, lease)
    };
    let rows = [
        at("gone-running", JobStatus::Running, 50, 10),
        at("gone-running-live", JobStatus::Running, 150, 10),
        JobRow {
            attempts: 6,
            ..at("gone-running-spent", JobStatus::Running, 50, 10)
        },
        JobRow {
            failures: 1,
            ..at("gone-failed", JobStatus::Failed, 0, 50)
        },
        JobRow {
            failures: 1,
            ..at("gone-failed-recent", JobStatus::Failed, 0, 150)
        },
        JobRow {
            failures: 1,
            permanent: true,
            ..at("gone-failed-permanent", JobStatus::Failed, 0, 50)
        },
        JobRow {
            failures: 3,
            ..at("gone-failed-spent", JobStatus::Failed, 0, 50)
        },
    ];
    for row in &rows {
        table.put_new(row).await.unwrap();
    }
    let due = CollectDue {
        before_ms: 100,
        now_ms: 200,
        max_attempts: 3,
    };
    let mut found: Vec<String> = table
        .scan_collectable(&due, None)
        .await
        .unwrap()
        .0
        .into_iter()
        .map(|r| r.job_key)
        .filter(|k| k.starts_with("gone-"))
        .collect();
    found.sort();
    assert_eq!(found, ["gone-failed", "gone-running"]);
    for row in &rows {
        let request = CollectRequest {
            job_key: row.job_key.clone(),
            owner: "gc/2".into(),
            lease_until_ms: 500,
            due,
        };
        let begun = table.begin_collect(&request).await.unwrap();
        assert_eq!(
            matches!(begun, Conditional::Applied(_)),
            found.contains(&row.job_key),
            "{}: {begun:?}",
            row.job_key
        );
        // The status it had is kept beside `collecting`.
        if let Conditional::Applied(begun) = begun {
            assert_eq!(
                (begun.status, begun.collected_from),
                (JobStatus::Collecting, Some(row.status)),
                "{}",
                row.job_key
            );
        }
    }
    // A stopped collection taken over keeps what the first one saw, and a
    // collection that finds the job referenced gives it back so: `failed`,
    // never `done` (issue 37, defect 1).
    let taken = CollectRequest {
        job_key: "gone-failed".into(),
        owner: "gc/3".into(),
        lease_until_ms: 900,
        due: CollectDue {
            before_ms: 500,
            now_ms: 600,
            max_attempts: 3,
        },
    };
    let Conditional::Applied(begun) = table.begin_collect(&taken).await.unwrap() else {
        panic!("a stopped collection is taken over");
    };
    assert_eq!(begun.collected_from, Some(JobStatus::Failed));
    assert_eq!(begun.kept_status(), JobStatus::Failed);
    assert_eq!(
        table
            .keep_collected("gone-failed", "gc/3", JobStatus::Failed, None, 601)
            .await
            .unwrap(),
        Conditional::Applied(())
    );
    let kept = table.get("gone-failed").await.unwrap().unwrap();
    assert_eq!(
        (
            kept.status,
            kept.collected_from,
            kept.failures,
            kept.lease_until_ms
        ),
        (JobStatus::Failed, None, 1, 601)
    );
}

/// The write of a create whose bytes (ETag `etag`) S3 holds.
fn created(
    version: &VersionName,
    current: Option<&references::VersionRefs>,
    wanted: &BTreeSet<String>,
    etag: &str,
) -> RefChange {
    let bytes = references::BytesId {
        etag: etag.into(),
        sha256: Some(format!("{etag:0>64}")),
        etag_md5: true,
        crc64nvme: Some(format!("crc-{etag}")),
    };
    let keyed = references::Keyed {
        bytes: bytes.clone(),
        wanted: wanted.clone(),
    };
    let seen = references::Seen::Holds(bytes);
    references::reconcile(version, current, &seen, Some(&keyed))
        .change
        .expect("a write")
}

/// The write of a hint that finds the version gone.
fn deleted(version: &VersionName, current: Option<&references::VersionRefs>) -> RefChange {
    references::reconcile(version, current, &references::Seen::Gone, None)
        .change
        .expect("a write")
}

/// Rows done before reference items: never due; a seal gives each
/// `ref_items` and a mark (due after the grace from the seal), once.
async fn legacy_contract(table: &impl LedgerTable) {
    let legacy = |key: &str| JobRow {
        ref_items: false,
        free_mark: Some("old".into()),
        released_at_ms: Some(0),
        ..row(key, "w/1", JobStatus::Done, 0)
    };
    table.put_new(&legacy("legacy-a")).await.unwrap();
    table.put_new(&legacy("legacy-b")).await.unwrap();
    let legacy_keys = |rows: Vec<JobRow>| -> Vec<String> {
        let mut keys: Vec<String> = rows
            .into_iter()
            .map(|r| r.job_key)
            .filter(|k| k.starts_with("legacy-"))
            .collect();
        keys.sort();
        keys
    };
    let due = CollectDue {
        before_ms: 100,
        now_ms: 100,
        max_attempts: 3,
    };
    let collect = CollectRequest {
        job_key: "legacy-a".into(),
        owner: "gc/1".into(),
        lease_until_ms: 1_000_000,
        due,
    };
    assert!(matches!(
        table.begin_collect(&collect).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert!(legacy_keys(table.scan_collectable(&due, None).await.unwrap().0).is_empty());
    let unsealed = table.scan_unsealed(None).await.unwrap().0;
    assert_eq!(legacy_keys(unsealed.clone()), ["legacy-a", "legacy-b"]);
    for row in unsealed.iter().filter(|r| r.job_key.starts_with("legacy-")) {
        assert_eq!(
            table.seal_refs(row, 40).await.unwrap(),
            Conditional::Applied(())
        );
        assert!(matches!(
            table.seal_refs(row, 41).await.unwrap(),
            Conditional::Rejected(Some(_))
        ));
    }
    let a = table.get("legacy-a").await.unwrap().unwrap();
    assert!(a.ref_items);
    assert_eq!(a.released_at_ms, Some(40));
    assert_eq!(
        a.free_mark,
        Some(mediaonce::ledger::seal_mark("legacy-a", 40))
    );
    assert!(legacy_keys(table.scan_unsealed(None).await.unwrap().0).is_empty());
    assert_eq!(
        legacy_keys(table.scan_collectable(&due, None).await.unwrap().0),
        ["legacy-a", "legacy-b"]
    );
}

/// Reference transactions: the version row and its reference items, all
/// or nothing, conditioned on the row's generation and (exactly) on each
/// deleted item existing, with the reasons returned; no job row in them.
async fn references_contract(table: &impl LedgerTable) {
    let version = VersionName {
        bucket: "in".into(),
        key: "photos/a b.jpg".into(),
        version_id: None,
    };
    let wanted: BTreeSet<String> = ["ref-a".to_string(), "ref-b".to_string()].into();
    let create = created(&version, None, &wanted, "e1");
    assert!(create.exact && create.next.ref_items);
    assert_eq!(table.get_version_refs(&version).await.unwrap(), None);
    assert_eq!(
        table.change_refs(&version, &create, 10).await.unwrap(),
        RefWrite::Applied
    );
    let stored = table.get_version_refs(&version).await.unwrap().unwrap();
    assert_eq!(stored, create.next);
    let refs_of = |job: &'static str| async move {
        let mut found = Vec::new();
        for shard in 0..references::REF_SHARDS {
            found.extend(table.query_refs(job, shard, None, None).await.unwrap().0);
        }
        found
    };
    // Each item names its version (what a split job's end hands on) and
    // when it was written (what judges a split's hold).
    let named = |version: &VersionName, at: u64| RefHolder {
        version_row: version.row_key(),
        version: Some(version.clone()),
        created_at_ms: Some(at),
    };
    assert_eq!(refs_of("ref-a").await, [named(&version, 10)]);
    assert_eq!(refs_of("ref-b").await, [named(&version, 10)]);
    // No job row was needed, and none was written.
    assert_eq!(table.get("ref-a").await.unwrap(), None);
    // The same change again: the row exists, nothing is written twice.
    assert_eq!(
        table.change_refs(&version, &create, 11).await.unwrap(),
        RefWrite::Cancelled {
            version: Some(Some(stored.clone())),
            missing: vec![],
        }
    );
    // A second version of the same job: its own item, in its own shard.
    let other = VersionName {
        key: "other.jpg".into(),
        ..version.clone()
    };
    let just_a: BTreeSet<String> = ["ref-a".to_string()].into();
    let change = created(&other, None, &just_a, "e2");
    assert_eq!(
        table.change_refs(&other, &change, 12).await.unwrap(),
        RefWrite::Applied
    );
    let mut both = vec![named(&version, 10), named(&other, 12)];
    both.sort_by(|a, b| a.version_row.cmp(&b.version_row));
    let mut found = refs_of("ref-a").await;
    found.sort_by(|a, b| a.version_row.cmp(&b.version_row));
    assert_eq!(found, both);
    // A shard's Query pages: one item each, all of them by `next`.
    let shard = references::shard_of(&other.row_key());
    let (page, _) = table
        .query_refs("ref-a", shard, Some(1), None)
        .await
        .unwrap();
    assert_eq!(page.len(), 1);

    // A stale generation: refused with the row as it is.
    let stale = RefChange {
        seen_gen: Some(stored.gen + 5),
        ..deleted(&version, Some(&stored))
    };
    assert_eq!(
        table.change_refs(&version, &stale, 13).await.unwrap(),
        RefWrite::Cancelled {
            version: Some(Some(stored.clone())),
            missing: vec![],
        }
    );
    // The delete: both items gone, a tombstone left.
    let delete = deleted(&version, Some(&stored));
    assert!(delete.exact);
    assert_eq!(
        table.change_refs(&version, &delete, 14).await.unwrap(),
        RefWrite::Applied
    );
    assert_eq!(refs_of("ref-a").await, [named(&other, 12)]);
    assert!(refs_of("ref-b").await.is_empty());
    let tomb = table.get_version_refs(&version).await.unwrap().unwrap();
    assert!(tomb.deleted && tomb.job_keys.is_empty());
    // Deleting them again, exactly: each missing item is named, nothing
    // is written.
    let again = RefChange {
        seen_gen: Some(tomb.gen),
        ..delete.clone()
    };
    let RefWrite::Cancelled {
        version: v,
        missing,
    } = table.change_refs(&version, &again, 15).await.unwrap()
    else {
        panic!("a missing item cannot be deleted exactly");
    };
    assert_eq!(v, None);
    assert_eq!(missing, ["ref-a".to_string(), "ref-b".to_string()]);
    assert_eq!(
        table.get_version_refs(&version).await.unwrap(),
        Some(tomb.clone())
    );
    // Not exactly (a row from before items): nothing to miss.
    let lenient = RefChange {
        exact: false,
        ..again
    };
    assert_eq!(
        table.change_refs(&version, &lenient, 16).await.unwrap(),
        RefWrite::Applied
    );
}

/// The collector's writes: the release's mark (on an existing row only),
/// a collection given back as done (its mark cleared only when it is the
/// one named), the record that deletes start.
async fn collection_contract(table: &impl LedgerTable) {
    assert_eq!(
        table.mark_released("mark-none", "n1", 10).await.unwrap(),
        Conditional::Rejected(None)
    );
    table
        .put_new(&row("mark-a", "w/1", JobStatus::Done, 0))
        .await
        .unwrap();
    assert_eq!(
        table.mark_released("mark-a", "n1", 10).await.unwrap(),
        Conditional::Applied(())
    );
    let marked = table.get("mark-a").await.unwrap().unwrap();
    assert_eq!(
        (marked.free_mark.as_deref(), marked.released_at_ms),
        (Some("n1"), Some(10))
    );
    let due = CollectDue {
        before_ms: 10,
        now_ms: 20,
        max_attempts: 3,
    };
    let collect = CollectRequest {
        job_key: "mark-a".into(),
        owner: "gc/1".into(),
        lease_until_ms: 1_000,
        due,
    };
    let Conditional::Applied(begun) = table.begin_collect(&collect).await.unwrap() else {
        panic!("a marked done row is due");
    };
    assert_eq!(
        (
            begun.status,
            begun.free_mark.as_deref(),
            begun.collected_from
        ),
        (JobStatus::Collecting, Some("n1"), Some(JobStatus::Done))
    );
    // A release marks it again meanwhile: the collector's clear of n1 is
    // refused, its plain give-back is not, and n2 stays.
    table.mark_released("mark-a", "n2", 21).await.unwrap();
    assert!(matches!(
        table
            .keep_collected("mark-a", "gc/1", JobStatus::Done, Some("n1"), 22)
            .await
            .unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert!(matches!(
        table
            .keep_collected("mark-a", "gc/other", JobStatus::Done, None, 22)
            .await
            .unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert_eq!(
        table
            .keep_collected("mark-a", "gc/1", JobStatus::Done, None, 22)
            .await
            .unwrap(),
        Conditional::Applied(())
    );
    let kept = table.get("mark-a").await.unwrap().unwrap();
    assert_eq!(
        (kept.status, kept.free_mark.as_deref(), kept.collected_from),
        (JobStatus::Done, Some("n2"), None)
    );
    // Collected again, the mark named: cleared.
    let later = CollectRequest {
        owner: "gc/2".into(),
        due: CollectDue {
            before_ms: 21,
            now_ms: 30,
            max_attempts: 3,
        },
        ..collect.clone()
    };
    assert!(matches!(
        table.begin_collect(&later).await.unwrap(),
        Conditional::Applied(_)
    ));
    assert_eq!(
        table
            .keep_collected("mark-a", "gc/2", JobStatus::Done, Some("n2"), 31)
            .await
            .unwrap(),
        Conditional::Applied(())
    );
    let cleared = table.get("mark-a").await.unwrap().unwrap();
    assert_eq!((cleared.status, cleared.free_mark), (JobStatus::Done, None));
    // Without a mark, never due.
    assert!(matches!(
        table.begin_collect(&later).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    // Deletes start: only the collection's owner records it.
    table.mark_released("mark-a", "n3", 32).await.unwrap();
    let last = CollectRequest {
        owner: "gc/3".into(),
        due: CollectDue {
            before_ms: 40,
            now_ms: 40,
            max_attempts: 3,
        },
        ..collect
    };
    assert!(matches!(
        table.begin_collect(&last).await.unwrap(),
        Conditional::Applied(_)
    ));
    assert!(matches!(
        table.start_deletes("mark-a", "gc/2", 41).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert_eq!(
        table.start_deletes("mark-a", "gc/3", 41).await.unwrap(),
        Conditional::Applied(())
    );
    assert_eq!(
        table
            .get("mark-a")
            .await
            .unwrap()
            .unwrap()
            .deletes_started_at_ms,
        Some(41)
    );
    assert_eq!(
        table.end_collect("mark-a", "gc/3").await.unwrap(),
        Conditional::Applied(())
    );
}

/// The hash cache rows that share the table: one per object version, a
/// read of another version (any field changed) misses, a put replaces,
/// a delete forgets; job rows are untouched.
async fn hash_cache_contract(table: &impl LedgerTable) {
    let version = ObjectVersion {
        bucket: "in".into(),
        key: "photos/a b.jpg".into(),
        version_id: None,
        etag: "d41d8cd98f00b204e9800998ecf8427e".into(),
        size: 10,
        crc64nvme: None,
    };
    let hash = "c".repeat(64);
    assert_eq!(table.get_input_hash(&version).await.unwrap(), None);
    table.put_input_hash(&version, &hash, 5).await.unwrap();
    assert_eq!(
        table.get_input_hash(&version).await.unwrap(),
        Some(hash.clone())
    );
    for other in [
        ObjectVersion {
            etag: "0cc175b9c0f1b6a831c399e269772661".into(),
            ..version.clone()
        },
        ObjectVersion {
            version_id: Some("v2".into()),
            ..version.clone()
        },
        ObjectVersion {
            crc64nvme: Some("AAAAAAAAAAA=".into()),
            ..version.clone()
        },
        ObjectVersion {
            key: "photos/a+b.jpg".into(),
            ..version.clone()
        },
    ] {
        assert_eq!(
            table.get_input_hash(&other).await.unwrap(),
            None,
            "{other:?}"
        );
    }
    let with_crc = ObjectVersion {
        crc64nvme: Some("AAAAAAAAAAA=".into()),
        ..version.clone()
    };
    table
        .put_input_hash(&with_crc, &"d".repeat(64), 6)
        .await
        .unwrap();
    assert_eq!(
        table.get_input_hash(&with_crc).await.unwrap(),
        Some("d".repeat(64))
    );
    assert_eq!(table.get_input_hash(&version).await.unwrap(), Some(hash));
    table
        .put_input_hash(&version, &"e".repeat(64), 7)
        .await
        .unwrap();
    assert_eq!(
        table.get_input_hash(&version).await.unwrap(),
        Some("e".repeat(64))
    );
    table.forget_input_hash(&version).await.unwrap();
    assert_eq!(table.get_input_hash(&version).await.unwrap(), None);
    table.forget_input_hash(&version).await.unwrap();
    // A cache row is not a job row.
    assert_eq!(
        table.get("d").await.unwrap().map(|r| r.status),
        Some(JobStatus::Done)
    );
    split_contract(table).await;
}

/// A split's execution: recorded by its claim's owner only, on a running
/// row, with its lease; removed by a takeover; its chunks held by the
/// execution's holder and released.
async fn split_contract<T: LedgerTable>(table: &T) {
    let claimed = row("s", "claimant/1", JobStatus::Running, 10_000);
    table.put_new(&claimed).await.unwrap();
    let chunks = vec!["c0".to_string(), "c1".to_string()];
    let arn = "arn:aws:states:us-east-1:1:execution:split:s-1";
    let record = |owner| ExecutionRecord {
        owner,
        execution: arn,
        lease_until_ms: 50_000,
    };
    let rejected = |c: Conditional<()>| matches!(c, Conditional::Rejected(Some(_)));
    assert!(rejected(
        table
            .record_execution("s", record("other/1"), 5)
            .await
            .unwrap()
    ));
    assert_eq!(
        table
            .record_execution("s", record("claimant/1"), 5)
            .await
            .unwrap(),
        Conditional::Applied(())
    );
    let recorded = table.get("s").await.unwrap().unwrap();
    assert_eq!(
        (recorded.execution.as_deref(), recorded.lease_until_ms),
        (Some(arn), 50_000)
    );
    // Not on a row that is not running.
    let done = row("d-exec", "claimant/1", JobStatus::Done, 10_000);
    table.put_new(&done).await.unwrap();
    assert!(rejected(
        table
            .record_execution("d-exec", record("claimant/1"), 6)
            .await
            .unwrap()
    ));
    // A takeover (an execution that closed) removes it.
    let request = ClaimRequest {
        job_key: "s".into(),
        step: "probe".into(),
        input_hash: "i".into(),
        output_prefix: "derived/s/".into(),
        owner: "taker/1".into(),
        lease_until_ms: 60_000,
        now_ms: 7,
        max_attempts: 3,
    };
    assert_eq!(
        table.take_over(&recorded, &request).await.unwrap(),
        Conditional::Applied(recorded.attempts + 1)
    );
    assert_eq!(table.get("s").await.unwrap().unwrap().execution, None);

    let holder = "split#s";
    let shard = references::shard_of(holder);
    table
        .write_holder_refs(holder, &chunks, &[], 1)
        .await
        .unwrap();
    for chunk in &chunks {
        let (found, _) = table.query_refs(chunk, shard, None, None).await.unwrap();
        let found: Vec<_> = found
            .into_iter()
            .map(|h| (h.version_row, h.version))
            .collect();
        assert_eq!(found, [(holder.to_string(), None)]);
    }
    table
        .write_holder_refs(holder, &[], &chunks, 2)
        .await
        .unwrap();
    let (found, _) = table.query_refs("c0", shard, None, None).await.unwrap();
    assert!(found.is_empty());
}

#[tokio::test]
async fn the_in_memory_table_keeps_the_ledger_contract() {
    ledger_contract(InMemoryTable::new("jobs")).await;
}

#[tokio::test]
async fn dynamodb_keeps_the_ledger_contract() {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let client = mediaonce::aws::dynamodb_client(&sdk);
    let table = common::unique("conformance");
    common::create_table(&client, &table).await;
    ledger_contract(DynamoDbTable::new(client, table)).await;
}

fn object(bucket: &str, key: &str, if_match: Option<String>) -> ObjectRef {
    ObjectRef {
        bucket: bucket.into(),
        key: key.into(),
        version_id: None,
        if_match,
    }
}

/// The contract of an [`ObjectClient`] on an existing, unversioned bucket.
async fn object_contract(client: impl ObjectClient, bucket: &str) {
    let key = "dir/a b+c.bin";
    // HeadObject of nothing is `None`, not an error; GetObject is NotFound.
    assert!(client
        .head_object(&object(bucket, key, None))
        .await
        .unwrap()
        .is_none());
    let missing = client
        .get_object(&object(bucket, key, None))
        .await
        .unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing}");

    let bytes: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    client
        .put_object(
            bucket,
            key,
            ObjectHeaders::typed("application/x-test"),
            ByteStream::from(bytes.clone()),
            None,
        )
        .await
        .unwrap();
    let head = client
        .head_object(&object(bucket, key, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((head.bucket.as_str(), head.key.as_str()), (bucket, key));
    assert_eq!(head.size, 10_000);
    assert!(
        !head.etag.is_empty() && !head.etag.contains('"'),
        "{}",
        head.etag
    );
    assert_eq!(head.version_id, None);
    assert_eq!(head.content_type.as_deref(), Some("application/x-test"));
    assert_eq!(head.cache_control, None);
    // PutObject asks for no checksum: none is kept to key by.
    assert_eq!(head.checksum_sha256, None);

    // With a SHA-256 (an output, whose manifest records it): kept as the
    // object's full-object checksum; bytes that do not match are refused.
    let checked = format!("{key}.checked");
    let sha256 = sha256_base64(&sha256_hex(&bytes)).unwrap();
    client
        .put_object(
            bucket,
            &checked,
            ObjectHeaders {
                content_type: "application/x-test",
                cache_control: Some(IMMUTABLE),
            },
            ByteStream::from(bytes.clone()),
            Some(&sha256),
        )
        .await
        .unwrap();
    let checked_head = client
        .head_object(&object(bucket, &checked, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        checked_head.checksum_sha256.as_deref(),
        Some(sha256.as_str())
    );
    // Its Cache-Control is kept and served back.
    assert_eq!(checked_head.cache_control.as_deref(), Some(IMMUTABLE));
    assert!(client
        .put_object(
            bucket,
            &checked,
            ObjectHeaders::typed("application/x-test"),
            ByteStream::from(b"other bytes".to_vec()),
            Some(&sha256),
        )
        .await
        .is_err());

    // Whole and ranged reads, pinned to the head's ETag.
    let pinned = object(bucket, key, Some(head.etag.clone()));
    let whole = client
        .get_object(&pinned)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(whole.into_bytes().to_vec(), bytes);
    assert_eq!(
        client.get_object_range(&pinned, 100..356).await.unwrap(),
        bytes[100..356]
    );
    assert_eq!(
        client
            .get_object_range(&pinned, 9_999..10_000)
            .await
            .unwrap(),
        [bytes[9_999]]
    );
    assert!(client
        .get_object_range(&pinned, 5..5)
        .await
        .unwrap()
        .is_empty());

    // An overwrite changes the ETag; reads pinned to the old one fail 412.
    client
        .put_object(
            bucket,
            key,
            ObjectHeaders::typed("application/x-test"),
            ByteStream::from(b"new".to_vec()),
            None,
        )
        .await
        .unwrap();
    let new_head = client
        .head_object(&object(bucket, key, None))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(new_head.etag, head.etag);
    assert_eq!(new_head.size, 3);
    for err in [
        client.get_object_range(&pinned, 0..3).await.unwrap_err(),
        client.get_object(&pinned).await.unwrap_err(),
    ] {
        assert_eq!(err.kind, ErrorKind::PreconditionFailed, "{err}");
    }
    let repinned = object(bucket, key, Some(new_head.etag.clone()));
    assert_eq!(
        client.get_object_range(&repinned, 0..3).await.unwrap(),
        b"new"
    );

    // CopyObject, server-side, pinned: the bytes arrive, with the headers
    // given, under the new key (one needing encoding in the copy source); pinned
    // to an old ETag it fails 412 and writes nothing.
    let copied_key = "copies/a b+c (1).bin";
    client
        .copy_object(&repinned, bucket, copied_key, output_headers("seg.ts"))
        .await
        .unwrap();
    let copy = object(bucket, copied_key, None);
    let copied = client.head_object(&copy).await.unwrap().unwrap();
    assert_eq!(copied.etag, new_head.etag);
    // The copy's headers are the ones given, not the source's.
    assert_eq!(copied.content_type.as_deref(), Some("video/mp2t"));
    assert_eq!(copied.cache_control.as_deref(), Some(IMMUTABLE));
    assert_eq!(client.get_object_range(&copy, 0..3).await.unwrap(), b"new");
    let stale = client
        .copy_object(&pinned, bucket, "copies/stale.bin", output_headers("a.bin"))
        .await
        .unwrap_err();
    assert_eq!(stale.kind, ErrorKind::PreconditionFailed, "{stale}");
    assert!(client
        .head_object(&object(bucket, "copies/stale.bin", None))
        .await
        .unwrap()
        .is_none());
    // A source that does not exist: NotFound, nothing written.
    let missing = client
        .copy_object(
            &object(bucket, "copies/no-such-source.bin", None),
            bucket,
            "copies/from-nothing.bin",
            output_headers("a.bin"),
        )
        .await
        .unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing}");
    assert!(client
        .head_object(&object(bucket, "copies/from-nothing.bin", None))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn the_in_memory_store_keeps_the_object_contract() {
    object_contract(InMemoryObjects::new(), "bucket").await;
}

#[tokio::test]
async fn a_client_without_its_own_copy_keeps_the_object_contract() {
    // The tests' read counter implements no CopyObject: the trait's
    // default (HEAD, GET, PUT) stands in.
    let client = common::counting::ReadCounter::new(InMemoryObjects::new());
    object_contract(client, "bucket").await;
}

#[tokio::test]
async fn a_client_without_its_own_copy_keeps_the_object_contract_on_s3() {
    // The default's PUT to S3 needs a body of known size.
    let sdk = mediaonce::aws::load_sdk_config().await;
    let s3 = mediaonce::aws::s3_client(&sdk);
    let bucket = common::unique("conformance-nocopy");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    let client = common::counting::ReadCounter::new(S3Objects::new(s3));
    object_contract(client, &bucket).await;
}

#[tokio::test]
async fn s3_keeps_the_object_contract() {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let s3 = mediaonce::aws::s3_client(&sdk);
    let bucket = common::unique("conformance");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    object_contract(S3Objects::new(s3), &bucket).await;
}

/// The contract of an [`ObjectClient`] on a bucket whose versioning is
/// enabled: each put a version of its own, read by its id; a DELETE of the
/// key a delete marker, behind which the key reads as missing (and the
/// marker's own id too: S3 answers 405 there) while its versions stay.
async fn versioned_contract(client: impl ObjectClient, bucket: &str) {
    let key = "clips/a b.bin";
    for body in ["one", "two!"] {
        client
            .put_object(
                bucket,
                key,
                ObjectHeaders::typed("application/x-test"),
                ByteStream::from(body.as_bytes().to_vec()),
                None,
            )
            .await
            .unwrap();
    }
    let page = client
        .list_object_versions(bucket, key, None)
        .await
        .unwrap();
    let ids: Vec<String> = page
        .versions
        .iter()
        .map(|(listed, id)| {
            assert_eq!(listed, key);
            id.clone().expect("a versioned bucket's versions have ids")
        })
        .collect();
    assert_eq!(ids.len(), 2, "{page:?}");
    assert_ne!(ids[0], ids[1]);
    // Newest first, the newest current.
    let latest: Vec<bool> = page.entries.iter().map(|e| e.is_latest).collect();
    assert_eq!(latest, [true, false], "{page:?}");
    let (newest, oldest) = (ids[0].clone(), ids[1].clone());
    let versioned = |id: &str| ObjectRef {
        version_id: Some(id.to_string()),
        ..object(bucket, key, None)
    };
    let current = client
        .head_object(&object(bucket, key, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (current.version_id.as_deref(), current.size),
        (Some(newest.as_str()), 4)
    );
    let old = client
        .head_object(&versioned(&oldest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (old.version_id.as_deref(), old.size),
        (Some(oldest.as_str()), 3)
    );
    assert_eq!(
        client
            .get_object_range(&versioned(&oldest), 0..3)
            .await
            .unwrap(),
        b"one"
    );

    // A DELETE of the key: a delete marker, current; the versions stay.
    client
        .delete_objects(bucket, &[key.to_string()])
        .await
        .unwrap();
    assert!(client
        .head_object(&object(bucket, key, None))
        .await
        .unwrap()
        .is_none());
    let missing = client
        .get_object(&object(bucket, key, None))
        .await
        .unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing}");
    let (listed, _) = client.list_objects(bucket, "clips/", None).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    let page = client
        .list_object_versions(bucket, key, None)
        .await
        .unwrap();
    assert_eq!(page.versions.len(), 2, "{page:?}");
    let marker = page
        .entries
        .iter()
        .find(|e| e.delete_marker)
        .expect("the marker is listed");
    assert!(marker.is_latest, "{page:?}");
    let marker_id = marker.version_id.clone().expect("the marker has an id");
    assert!(client
        .head_object(&versioned(&marker_id))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        client
            .head_object(&versioned(&newest))
            .await
            .unwrap()
            .map(|h| h.size),
        Some(4)
    );
}

#[tokio::test]
async fn the_in_memory_store_keeps_the_versioned_contract() {
    let objects = InMemoryObjects::new();
    objects.enable_versioning("bucket");
    versioned_contract(objects, "bucket").await;
}

#[tokio::test]
async fn s3_keeps_the_versioned_contract() {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let s3 = mediaonce::aws::s3_client(&sdk);
    let bucket = common::unique("conformance-versioned");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    s3.put_bucket_versioning()
        .bucket(&bucket)
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .unwrap();
    versioned_contract(S3Objects::new(s3), &bucket).await;
}
