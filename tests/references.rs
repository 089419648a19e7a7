//! References on the emulators, through real notifications: which object
//! versions use a job's outputs (`refs`), released by deletes and
//! overwrites, idempotent under redelivery, and ordered by the events'
//! sequencers (DESIGN.md, "References").

mod common;

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_dynamodb::types::AttributeValue;
use common::{Options, Pipeline};
use mediaonce::config::{ENV_GC_GRACE_SECS, ENV_RELEASE_ON_DELETE_MARKER};
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::Outcome;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::references::VersionName;
use serde_json::Value;

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
    let (count, done_at) = refs(&p, &key).await;
    assert_eq!(count, Some(2));

    delete(&p, "post-1/a.bin", None).await;
    let removed = p.receive(1).await;
    handle_ok(&p, removed.clone()).await;
    let (count, released) = refs(&p, &key).await;
    assert_eq!(count, Some(1));
    assert!(released > done_at, "{released:?} after {done_at:?}");
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

/// Rows done before references were counted (no `refs`): written here by
/// removing what the count wrote, as a table from before it would hold.
async fn make_legacy(p: &Pipeline, job_keys: &[&str], versions: &[&str]) {
    for job_key in job_keys {
        p.dynamodb
            .update_item()
            .table_name(&p.table)
            .key("job_key", AttributeValue::S(job_key.to_string()))
            .update_expression("REMOVE refs, released_at_ms")
            .send()
            .await
            .expect("remove the count");
    }
    for key in versions {
        let version = VersionName {
            bucket: p.bucket.clone(),
            key: key.to_string(),
            version_id: None,
        };
        p.dynamodb
            .delete_item()
            .table_name(&p.table)
            .key("job_key", AttributeValue::S(version.row_key()))
            .send()
            .await
            .expect("delete the version row");
    }
}

fn refs_cli(p: &Pipeline, args: &[&str]) -> (std::process::Output, Vec<Value>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .arg("refs")
        .args(args)
        .env("MEDIAONCE_TABLE", &p.table)
        .env("MEDIAONCE_OUTPUT_BUCKET", &p.output_bucket)
        // Content identity now; the rows were keyed by version and ETag.
        .env("MEDIAONCE_IDENTITY", "content")
        .output()
        .expect("mediaonce runs");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    (out, lines)
}

async fn partial(p: &Pipeline, key: &str) -> (Option<u64>, bool) {
    let row = p.row(key).await.expect("the job's row");
    (row.refs, row.refs_partial)
}

#[tokio::test]
async fn rows_older_than_the_count_are_adopted_rebuilt_sealed_then_collected() {
    let p = pipeline(false, vec![(ENV_GC_GRACE_SECS, "0".into())]).await;
    const OTHER: &[u8] = b"bytes only one deleted object had";
    const THIRD: &[u8] = b"bytes uploaded without a checksum";
    p.put("post-1/a.bin", BYTES, true).await;
    p.put("post-2/a.bin", BYTES, true).await;
    p.put("post-3/b.bin", OTHER, true).await;
    p.put("post-5/c.bin", THIRD, false).await;
    let report = p.handle(p.receive(4).await).await;
    let (a, b) = (key_of(&p, BYTES), key_of(&p, OTHER));
    let c = report
        .jobs()
        .find(|j| j.input_hash_source == Some(FingerprintSource::VersionEtag))
        .expect("the upload without a checksum keyed by version and ETag")
        .job_key
        .clone();
    make_legacy(
        &p,
        &[&a, &b, &c],
        &[
            "post-1/a.bin",
            "post-2/a.bin",
            "post-3/b.bin",
            "post-5/c.bin",
        ],
    )
    .await;

    // Deleted before any rebuild: nothing was counted, nothing released.
    delete(&p, "post-3/b.bin", None).await;
    handle_ok(&p, p.receive(1).await).await;
    assert_eq!(partial(&p, &b).await, (None, false));
    // A new upload of old bytes adopts the job: counted from 1, partial.
    p.put("post-4/a.bin", BYTES, true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(report.count(Outcome::Reused), 1, "{report:?}");
    assert_eq!(partial(&p, &a).await, (Some(1), true));

    // A dry run says what it would reference and writes nothing.
    let (out, lines) = refs_cli(&p, &["rebuild", &format!("s3://{}", p.bucket), "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(partial(&p, &a).await, (Some(1), true));
    // The rebuild: every listed version counted once, by the key it was
    // keyed by then (post-5's content key has no row); twice is once.
    for _ in 0..2 {
        let (out, lines) = refs_cli(&p, &["rebuild", &format!("s3://{}", p.bucket)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut referenced: Vec<(String, String)> = lines
            .iter()
            .flat_map(|line| {
                let object = line["object"].as_str().unwrap().to_string();
                line["referenced"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |k| (object.clone(), k.as_str().unwrap().to_string()))
            })
            .collect();
        referenced.sort();
        let object = |key: &str| format!("s3://{}/{key}", p.bucket);
        assert_eq!(
            referenced,
            [
                (object("post-1/a.bin"), a.clone()),
                (object("post-2/a.bin"), a.clone()),
                (object("post-4/a.bin"), a.clone()),
                (object("post-5/c.bin"), c.clone()),
            ]
        );
        assert_eq!(partial(&p, &a).await, (Some(3), true));
        assert_eq!(partial(&p, &c).await, (Some(1), true));
    }

    // Every reference released: 0, but partial, so not collected.
    for key in ["post-1/a.bin", "post-2/a.bin", "post-4/a.bin"] {
        delete(&p, key, None).await;
    }
    handle_ok(&p, p.receive(3).await).await;
    assert_eq!(partial(&p, &a).await, (Some(0), true));
    let sweep = p.app.collect_due(false).await.unwrap();
    assert!(
        sweep.collected.is_empty() && sweep.failures.is_empty(),
        "{sweep:?}"
    );
    assert!(!p.output_keys(&format!("derived/{a}/")).await.is_empty());

    // The seal: counts complete; the orphan counted at 0.
    let (out, lines) = refs_cli(&p, &["seal"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut sealed: Vec<(String, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["job_key"].as_str().unwrap().to_string(),
                l["refs"].as_u64().unwrap(),
            )
        })
        .collect();
    sealed.sort();
    let mut expected = vec![(a.clone(), 0), (b.clone(), 0), (c.clone(), 1)];
    expected.sort();
    assert_eq!(sealed, expected);
    let mut collected: Vec<String> = p
        .app
        .collect_due(false)
        .await
        .unwrap()
        .collected
        .into_iter()
        .map(|c| c.job_key)
        .collect();
    collected.sort();
    let mut gone = vec![a.clone(), b.clone()];
    gone.sort();
    assert_eq!(collected, gone);
    for key in [&a, &b] {
        assert_eq!(p.row(key).await, None);
        assert!(p.output_keys(&format!("derived/{key}/")).await.is_empty());
    }
    assert_eq!(partial(&p, &c).await, (Some(1), false));
}
