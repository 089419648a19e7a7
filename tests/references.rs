//! References on the emulators, through real notifications: which object
//! versions use a job's outputs (`refs`), released by deletes and
//! overwrites, idempotent under redelivery, and ordered by the events'
//! sequencers (DESIGN.md, "References").

mod common;

use aws_lambda_events::event::sqs::SqsMessage;
use common::{Options, Pipeline};
use mediaonce::config::ENV_RELEASE_ON_DELETE_MARKER;
use mediaonce::handler::Outcome;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::references::VersionName;

const BYTES: &[u8] = b"the same bytes under two keys";

async fn pipeline(versioned: bool, vars: Vec<(&'static str, String)>) -> Pipeline {
    Pipeline::new(Options {
        versioned,
        separate_output_bucket: true,
        vars,
        ..Options::default()
    })
    .await
}

fn key_of(p: &Pipeline, bytes: &[u8]) -> String {
    job_key(&sha256_hex(bytes), &p.app.config.recipes[0].recipe_hash)
}

async fn refs(p: &Pipeline, key: &str) -> (Option<u64>, Option<u64>) {
    let row = p.row(key).await.expect("the job's row");
    (row.refs, row.released_at_ms)
}

async fn delete(p: &Pipeline, key: &str, version_id: Option<&str>) {
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key(key)
        .set_version_id(version_id.map(str::to_string))
        .send()
        .await
        .expect("delete");
}

async fn handle_ok(p: &Pipeline, messages: Vec<SqsMessage>) {
    let report = p.handle(messages).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
}

#[tokio::test]
async fn two_keys_reference_one_job_until_both_are_deleted() {
    let p = pipeline(false, vec![]).await;
    p.put("post-1/a.bin", BYTES, true).await;
    p.put("post-2/a.bin", BYTES, true).await;
    let report = p.handle(p.receive(2).await).await;
    let mut outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    outcomes.sort_by_key(|o| o.as_str());
    assert_eq!(outcomes, [Outcome::Ran, Outcome::Reused], "{report:?}");
    let key = key_of(&p, BYTES);
    assert_eq!(refs(&p, &key).await, (Some(2), None));

    delete(&p, "post-1/a.bin", None).await;
    let removed = p.receive(1).await;
    handle_ok(&p, removed.clone()).await;
    let (count, released) = refs(&p, &key).await;
    assert_eq!(count, Some(1));
    assert!(released.is_some());
    assert!(!p.output_keys(&format!("derived/{key}/")).await.is_empty());
    // The same delete again: released once.
    handle_ok(&p, removed).await;
    assert_eq!(refs(&p, &key).await.0, Some(1));

    delete(&p, "post-2/a.bin", None).await;
    handle_ok(&p, p.receive(1).await).await;
    assert_eq!(refs(&p, &key).await.0, Some(0));
    // Both versions' rows are tombstones now.
    for name in ["post-1/a.bin", "post-2/a.bin"] {
        let version = VersionName {
            bucket: p.bucket.clone(),
            key: name.into(),
            version_id: None,
        };
        let row = p.app.ledger.version_refs(&version).await.unwrap().unwrap();
        assert!(row.deleted && row.job_keys.is_empty(), "{row:?}");
    }
}

#[tokio::test]
async fn an_unversioned_overwrite_releases_the_old_bytes() {
    let p = pipeline(false, vec![]).await;
    p.put("x.bin", b"first bytes", true).await;
    handle_ok(&p, p.receive(1).await).await;
    let old = key_of(&p, b"first bytes");
    assert_eq!(refs(&p, &old).await.0, Some(1));

    p.put("x.bin", b"second bytes", true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(report.count(Outcome::Ran), 1, "{report:?}");
    let new = key_of(&p, b"second bytes");
    assert_eq!(refs(&p, &new).await.0, Some(1));
    assert_eq!(refs(&p, &old).await.0, Some(0));
}

#[tokio::test]
async fn a_delete_marker_keeps_references_and_a_version_delete_releases_them() {
    let p = pipeline(true, vec![]).await;
    let put = p.put("v.bin", BYTES, true).await;
    let version_id = put.version_id.expect("a versioned bucket");
    handle_ok(&p, p.receive(1).await).await;
    let key = key_of(&p, BYTES);
    assert_eq!(refs(&p, &key).await.0, Some(1));

    // A plain delete in a versioned bucket: a marker; the version stays.
    delete(&p, "v.bin", None).await;
    handle_ok(&p, p.receive(1).await).await;
    assert_eq!(refs(&p, &key).await.0, Some(1));

    delete(&p, "v.bin", Some(&version_id)).await;
    handle_ok(&p, p.receive(1).await).await;
    assert_eq!(refs(&p, &key).await.0, Some(0));
}

#[tokio::test]
async fn with_the_setting_a_delete_marker_releases_every_version() {
    let p = pipeline(true, vec![(ENV_RELEASE_ON_DELETE_MARKER, "true".into())]).await;
    p.put("m.bin", b"version one", true).await;
    p.put("m.bin", b"version two", true).await;
    handle_ok(&p, p.receive(2).await).await;
    let (one, two) = (key_of(&p, b"version one"), key_of(&p, b"version two"));
    assert_eq!(refs(&p, &one).await.0, Some(1));
    assert_eq!(refs(&p, &two).await.0, Some(1));

    delete(&p, "m.bin", None).await;
    handle_ok(&p, p.receive(1).await).await;
    assert_eq!(refs(&p, &one).await.0, Some(0));
    assert_eq!(refs(&p, &two).await.0, Some(0));
}

#[tokio::test]
async fn a_delete_handled_before_its_create_leaves_no_reference() {
    let p = pipeline(true, vec![]).await;
    let put = p.put("late.bin", BYTES, true).await;
    let version_id = put.version_id.expect("a versioned bucket");
    let created = p.receive(1).await;
    delete(&p, "late.bin", Some(&version_id)).await;
    let removed = p.receive(1).await;

    // Out of order: the delete first, then the create.
    handle_ok(&p, removed).await;
    let report = p.handle(created).await;
    assert_eq!(report.count(Outcome::Ran), 0, "{report:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let version = VersionName {
        bucket: p.bucket.clone(),
        key: "late.bin".into(),
        version_id: Some(version_id),
    };
    let row = p.app.ledger.version_refs(&version).await.unwrap().unwrap();
    assert!(row.deleted && row.job_keys.is_empty(), "{row:?}");
    assert_eq!(p.row(&key_of(&p, BYTES)).await, None, "no job, no outputs");
    assert!(p
        .output_keys(&format!("derived/{}/", key_of(&p, BYTES)))
        .await
        .is_empty());
}
