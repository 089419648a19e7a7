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
use mediaonce::ledger::dynamodb::DynamoDbTable;
use mediaonce::ledger::memory::InMemoryTable;
use mediaonce::ledger::{
    Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, Finish, JobRow, JobStatus,
    LedgerTable, RefWrite,
};
use mediaonce::references::{self, RefChange, VersionName};
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::s3::S3Objects;
use mediaonce::store::{ObjectClient, ObjectRef};

fn row(key: &str, owner: &str, status: JobStatus, lease_until_ms: u64) -> JobRow {
    JobRow {
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
        refs: None,
        released_at_ms: None,
        refs_partial: false,
        collect_failures: 0,
        collect_retry_at_ms: None,
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

    // Done removes the error, and starts the time unreferenced.
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
    adoption_contract(&table).await;
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
    }
}

/// The write of a create whose bytes (ETag `etag`) S3 holds, every job
/// ready.
fn created(
    version: &VersionName,
    current: Option<&references::VersionRefs>,
    wanted: &BTreeSet<String>,
    etag: &str,
) -> RefChange {
    let keyed = references::Keyed {
        etag: etag.into(),
        wanted: wanted.clone(),
        ready: wanted.clone(),
    };
    let seen = references::Seen::Holds { etag: etag.into() };
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

/// Rows done before references were counted: a reference adopts one
/// (`refs` 1, partial), later ones add to it, a partial count is never
/// collected, and a seal makes counts complete (an uncounted row: 0,
/// its grace starting at the seal).
async fn adoption_contract(table: &impl LedgerTable) {
    let legacy = |key: &str| row(key, "w/1", JobStatus::Done, 0);
    table.put_new(&legacy("adopt-a")).await.unwrap();
    table.put_new(&legacy("adopt-orphan")).await.unwrap();
    let version = |key: &str| VersionName {
        bucket: "in".into(),
        key: key.into(),
        version_id: None,
    };
    let wanted: BTreeSet<String> = ["adopt-a".to_string()].into();
    let (one, two) = (version("adopt/1.jpg"), version("adopt/2.jpg"));

    // As a counted job, it refuses; adopted, it counts from 1.
    let mut change = created(&one, None, &wanted, "e");
    let RefWrite::Cancelled { refused, .. } = table.change_refs(&one, &change, 20).await.unwrap()
    else {
        panic!("an uncounted row cannot be added to");
    };
    assert_eq!(refused.len(), 1);
    assert!(change.count_as("adopt-a", false));
    assert_eq!(
        table.change_refs(&one, &change, 21).await.unwrap(),
        RefWrite::Applied
    );
    let a = table.get("adopt-a").await.unwrap().unwrap();
    assert_eq!((a.refs, a.refs_partial), (Some(1), true));
    // Adopted once: a second adoption refuses, an addition counts.
    let mut again = created(&two, None, &wanted, "e");
    again.count_as("adopt-a", false);
    let RefWrite::Cancelled { refused, .. } = table.change_refs(&two, &again, 22).await.unwrap()
    else {
        panic!("a counted row cannot be adopted");
    };
    assert_eq!(refused[0].1.as_ref().unwrap().refs, Some(1));
    again.count_as("adopt-a", true);
    assert_eq!(
        table.change_refs(&two, &again, 23).await.unwrap(),
        RefWrite::Applied
    );
    assert_eq!(table.get("adopt-a").await.unwrap().unwrap().refs, Some(2));

    // Both released: 0, but partial, so never due.
    for name in [&one, &two] {
        let current = table.get_version_refs(name).await.unwrap();
        let delete = deleted(name, current.as_ref());
        assert_eq!(
            table.change_refs(name, &delete, 30).await.unwrap(),
            RefWrite::Applied
        );
    }
    let a = table.get("adopt-a").await.unwrap().unwrap();
    assert_eq!((a.refs, a.refs_partial), (Some(0), true));
    let adopted = |rows: Vec<JobRow>| -> Vec<String> {
        let mut keys: Vec<String> = rows
            .into_iter()
            .map(|r| r.job_key)
            .filter(|k| k.starts_with("adopt-"))
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
        job_key: "adopt-a".into(),
        owner: "gc/1".into(),
        lease_until_ms: 1_000_000,
        due,
    };
    assert!(matches!(
        table.begin_collect(&collect).await.unwrap(),
        Conditional::Rejected(Some(_))
    ));
    assert!(adopted(table.scan_collectable(&due, None).await.unwrap().0).is_empty());

    // The seal: the partial count is complete, the orphan counted at 0.
    let unsealed = table.scan_unsealed(None).await.unwrap().0;
    assert_eq!(adopted(unsealed.clone()), ["adopt-a", "adopt-orphan"]);
    for row in unsealed.iter().filter(|r| r.job_key.starts_with("adopt-")) {
        assert_eq!(
            table.seal_refs(row, 40).await.unwrap(),
            Conditional::Applied(())
        );
        // Sealed once: the condition no longer holds.
        assert!(matches!(
            table.seal_refs(row, 41).await.unwrap(),
            Conditional::Rejected(Some(_))
        ));
    }
    let orphan = table.get("adopt-orphan").await.unwrap().unwrap();
    assert_eq!(
        (orphan.refs, orphan.released_at_ms, orphan.refs_partial),
        (Some(0), Some(40), false)
    );
    assert!(!table.get("adopt-a").await.unwrap().unwrap().refs_partial);
    assert!(adopted(table.scan_unsealed(None).await.unwrap().0).is_empty());
    assert_eq!(
        adopted(table.scan_collectable(&due, None).await.unwrap().0),
        ["adopt-a", "adopt-orphan"]
    );
}

/// Reference transactions: all or nothing, conditioned on the version
/// row's generation and on each job's state, with the reasons returned.
async fn references_contract(table: &impl LedgerTable) {
    let done = |key: &str, refs: Option<u64>| JobRow {
        refs,
        ..row(key, "w/1", JobStatus::Done, 0)
    };
    assert_eq!(
        table.put_new(&done("ref-a", Some(0))).await.unwrap(),
        Conditional::Applied(())
    );
    table.put_new(&done("ref-b", Some(0))).await.unwrap();
    table.put_new(&done("ref-legacy", None)).await.unwrap();
    table
        .put_new(&JobRow {
            refs: Some(0),
            ..row("ref-running", "w/2", JobStatus::Running, 99_000)
        })
        .await
        .unwrap();
    let version = VersionName {
        bucket: "in".into(),
        key: "photos/a b.jpg".into(),
        version_id: None,
    };
    let wanted: BTreeSet<String> = ["ref-a".to_string(), "ref-b".to_string()].into();
    let create = created(&version, None, &wanted, "e1");
    assert_eq!(table.get_version_refs(&version).await.unwrap(), None);
    assert_eq!(
        table.change_refs(&version, &create, 10).await.unwrap(),
        RefWrite::Applied
    );
    let stored = table.get_version_refs(&version).await.unwrap().unwrap();
    assert_eq!(stored, create.next);
    assert_eq!(table.get("ref-a").await.unwrap().unwrap().refs, Some(1));
    // The same change again: the row exists, nothing is written twice.
    assert_eq!(
        table.change_refs(&version, &create, 11).await.unwrap(),
        RefWrite::Cancelled {
            version: Some(Some(stored.clone())),
            refused: vec![],
        }
    );
    assert_eq!(table.get("ref-b").await.unwrap().unwrap().refs, Some(1));

    // Jobs that are not done and counted refuse, with their row; nothing
    // of the transaction is written.
    let other = VersionName {
        key: "other.jpg".into(),
        ..version.clone()
    };
    let keys: BTreeSet<String> = ["ref-a", "ref-running", "ref-legacy", "ref-missing"]
        .iter()
        .map(|k| k.to_string())
        .collect();
    let change = created(&other, None, &keys, "e2");
    let RefWrite::Cancelled {
        version: v,
        refused,
    } = table.change_refs(&other, &change, 12).await.unwrap()
    else {
        panic!("a running, a legacy and a missing job cannot gain a reference");
    };
    assert_eq!(v, None);
    let refused: Vec<(String, Option<JobStatus>)> = refused
        .into_iter()
        .map(|(key, row)| (key, row.map(|r| r.status)))
        .collect();
    assert_eq!(
        refused,
        [
            ("ref-legacy".to_string(), Some(JobStatus::Done)),
            ("ref-missing".to_string(), None),
            ("ref-running".to_string(), Some(JobStatus::Running)),
        ]
    );
    assert_eq!(table.get_version_refs(&other).await.unwrap(), None);
    assert_eq!(table.get("ref-a").await.unwrap().unwrap().refs, Some(1));

    // A stale generation: refused with the row as it is.
    let stale = RefChange {
        seen_gen: Some(stored.gen + 5),
        ..deleted(&version, Some(&stored))
    };
    assert_eq!(
        table.change_refs(&version, &stale, 13).await.unwrap(),
        RefWrite::Cancelled {
            version: Some(Some(stored.clone())),
            refused: vec![],
        }
    );
    // The delete: both released, a tombstone left.
    let delete = deleted(&version, Some(&stored));
    assert_eq!(
        table.change_refs(&version, &delete, 14).await.unwrap(),
        RefWrite::Applied
    );
    let a = table.get("ref-a").await.unwrap().unwrap();
    assert_eq!((a.refs, a.released_at_ms), (Some(0), Some(14)));
    let tomb = table.get_version_refs(&version).await.unwrap().unwrap();
    assert!(tomb.deleted && tomb.job_keys.is_empty());
    // A count never goes below zero.
    let again = RefChange {
        seen_gen: Some(tomb.gen),
        ..delete.clone()
    };
    let RefWrite::Cancelled { refused, .. } =
        table.change_refs(&version, &again, 15).await.unwrap()
    else {
        panic!("refs 0 cannot be released again");
    };
    assert_eq!(refused.len(), 2);
    assert_eq!(table.get("ref-b").await.unwrap().unwrap().refs, Some(0));
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
            "application/x-test",
            ByteStream::from(bytes.clone()),
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
    // PutObject asks for no checksum: none is kept to key by.
    assert_eq!(head.checksum_sha256, None);

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
            "application/x-test",
            ByteStream::from(b"new".to_vec()),
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
    let repinned = object(bucket, key, Some(new_head.etag));
    assert_eq!(
        client.get_object_range(&repinned, 0..3).await.unwrap(),
        b"new"
    );
}

#[tokio::test]
async fn the_in_memory_store_keeps_the_object_contract() {
    object_contract(InMemoryObjects::new(), "bucket").await;
}

#[tokio::test]
async fn s3_keeps_the_object_contract() {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let s3 = mediaonce::aws::s3_client(&sdk);
    let bucket = common::unique("conformance");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    object_contract(S3Objects::new(s3), &bucket).await;
}
