//! The handler end to end on the emulators: real objects, real S3 → SQS
//! notifications, real claims in DynamoDB.

mod common;

use common::{failed_ids, handle_with, Options, Pipeline};
use mediaonce::config::ENV_IDENTITY;
use mediaonce::handler::Outcome;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::JobStatus;
use mediaonce::step::Manifest;
use serde_json::Value;

/// The probe step under a name whose executions the tests count.
const COUNTED: &str = r#"[{"step":"counted-probe","version":1,"params":{}}]"#;

const PNG_3X2: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x03\0\0\0\x02\x08\x06\0\0\0\0\0\0\0";

fn probe_recipe_hash(pipeline: &Pipeline) -> String {
    pipeline.app.config.recipes[0].recipe_hash.clone()
}

fn outcomes(report: &mediaonce::handler::BatchReport) -> Vec<Outcome> {
    report.jobs().map(|j| j.outcome).collect()
}

#[tokio::test]
async fn first_run_writes_outputs_and_a_done_row_then_a_duplicate_reuses_them() {
    let p = Pipeline::new(Options::default()).await;
    p.put("photos/cat.png", PNG_3X2, true).await;
    let messages = p.receive(1).await;

    let calls_before = p.ledger_calls.get();
    let first = p.handle(messages.clone()).await;
    assert_eq!(outcomes(&first), vec![Outcome::Ran], "{first:?}");
    assert!(failed_ids(&first).is_empty());
    assert_eq!(
        p.ledger_calls.get() - calls_before,
        4,
        "first run: the version's reference (one transaction), the claim's read and put, the finish"
    );

    // The input hash is the object's own SHA-256 (full-object checksum).
    let key = job_key(&sha256_hex(PNG_3X2), &probe_recipe_hash(&p));
    let job = first.jobs().next().unwrap();
    assert_eq!(job.job_key, key);
    assert_eq!(job.attempt, 1);
    let row = p.row(&key).await.expect("row");
    assert_eq!(row.status, JobStatus::Done);
    assert_eq!(row.attempts, 1);
    assert_eq!(
        row.output_prefix,
        format!("s3://{}/derived/{key}/", p.output_bucket)
    );

    let probe: Value =
        serde_json::from_slice(&p.output(&format!("derived/{key}/probe.json")).await).unwrap();
    assert_eq!(probe["size"], PNG_3X2.len());
    assert_eq!(probe["sha256"], sha256_hex(PNG_3X2));
    assert_eq!(probe["content_type"], "image/png");
    assert_eq!(
        (probe["width"].as_u64(), probe["height"].as_u64()),
        (Some(3), Some(2))
    );
    // Nothing of the upload: the file is shared by every upload of the bytes.
    for field in ["bucket", "key", "version_id", "sha256_source"] {
        assert!(probe.get(field).is_none(), "{field} in {probe}");
    }

    let manifest_bytes = p.output(&format!("derived/{key}/_manifest.json")).await;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest.job_key, key);
    assert_eq!(
        manifest.recipe,
        serde_json::json!({"step": "probe", "version": 1, "params": {}})
    );
    assert_eq!(manifest.outputs.len(), 1);
    let probe_bytes = p.output(&format!("derived/{key}/probe.json")).await;
    assert_eq!(manifest.outputs[0].name, "probe.json");
    assert_eq!(manifest.outputs[0].size, probe_bytes.len() as u64);
    assert_eq!(manifest.outputs[0].sha256, sha256_hex(&probe_bytes));

    // The same message again (SQS redelivery): reused, three DynamoDB
    // calls (the reference transaction refused with the row, already
    // recorded; the row's `gen` moved on, as every hint of an unversioned
    // key's null version does; the claim's read), job row untouched.
    let calls_before = p.ledger_calls.get();
    let again = p.handle(messages).await;
    assert_eq!(outcomes(&again), vec![Outcome::Reused]);
    assert!(failed_ids(&again).is_empty());
    assert_eq!(
        p.ledger_calls.get() - calls_before,
        3,
        "duplicate: the refused reference, the null version's write and the claim's read"
    );
    assert_eq!(p.row(&key).await.unwrap(), row);
}

#[tokio::test]
async fn identical_bytes_share_one_key_and_run_once() {
    let p = Pipeline::new(Options::default()).await;
    let bytes = b"the same bytes, uploaded by two people";
    p.put("alice/clip.bin", bytes, true).await;
    p.put("bob/copy.bin", bytes, true).await;
    let messages = p.receive(2).await;

    // Delivered in two batches: the second reuses the first's output.
    let first = p.handle(vec![messages[0].clone()]).await;
    let second = p.handle(vec![messages[1].clone()]).await;
    assert_eq!(outcomes(&first), vec![Outcome::Ran]);
    assert_eq!(outcomes(&second), vec![Outcome::Reused]);
    let key = job_key(&sha256_hex(bytes), &probe_recipe_hash(&p));
    assert_eq!(first.jobs().next().unwrap().job_key, key);
    assert_eq!(second.jobs().next().unwrap().job_key, key);

    // In one batch: claimed once, the other message shares the outcome.
    let together = p.handle(messages).await;
    assert_eq!(together.count(Outcome::Ran), 0, "already done");
    let q = Pipeline::new(Options::default()).await;
    q.put("a.bin", bytes, true).await;
    q.put("b.bin", bytes, true).await;
    let messages = q.receive(2).await;
    let calls_before = q.ledger_calls.get();
    let one_batch = q.handle(messages).await;
    assert_eq!(one_batch.count(Outcome::Ran), 1, "{one_batch:?}");
    assert_eq!(one_batch.count(Outcome::Reused), 1, "{one_batch:?}");
    assert!(failed_ids(&one_batch).is_empty());
    assert_eq!(
        q.ledger_calls.get() - calls_before,
        6,
        "one claim (read, put) and one finish for the batch, one reference per object, \
         and the second object's read of the job after its reference"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_handlers_on_one_message_run_the_step_exactly_once() {
    let p = Pipeline::new(Options {
        recipes: Some(COUNTED.into()),
        ..Options::default()
    })
    .await;
    p.put("race.bin", b"contended", true).await;
    let message = p.receive(1).await.remove(0);

    let handlers: Vec<_> = (0..12)
        .map(|_| tokio::spawn(handle_with(p.app.clone(), vec![message.clone()])))
        .collect();
    let mut reports = Vec::new();
    for handler in handlers {
        reports.push(handler.await.expect("handler task"));
    }
    let all: Vec<Outcome> = reports.iter().flat_map(outcomes).collect();
    assert_eq!(p.counted.runs(), 1, "step executions; outcomes {all:?}");
    assert_eq!(
        all.iter().filter(|o| **o == Outcome::Ran).count(),
        1,
        "{all:?}"
    );
    assert!(
        all.iter()
            .all(|o| matches!(o, Outcome::Ran | Outcome::Busy | Outcome::Reused)),
        "{all:?}"
    );
    let key = job_key(&sha256_hex(b"contended"), &probe_recipe_hash(&p));
    let row = p.row(&key).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Done, 1));
}

#[tokio::test]
async fn a_test_event_is_acknowledged_and_a_bad_body_fails_alone() {
    let p = Pipeline::new(Options::default()).await;
    p.put("good.bin", b"good", true).await;
    let good = p.receive(1).await.remove(0);
    let test_event = p
        .send_raw(r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2026-12-02T00:00:00.000Z","Bucket":"b","RequestId":"r","HostId":"h"}"#)
        .await;
    let bad = p
        .send_raw("{\"Records\": [{\"eventName\": \"ObjectCreated:Put\"")
        .await;
    let not_s3 = p.send_raw(r#"{"hello": "world"}"#).await;

    let report = p
        .handle(vec![
            bad.clone(),
            good.clone(),
            test_event.clone(),
            not_s3.clone(),
        ])
        .await;
    let mut failed = failed_ids(&report);
    failed.sort();
    let mut expected = vec![
        bad.message_id.clone().unwrap(),
        not_s3.message_id.clone().unwrap(),
    ];
    expected.sort();
    assert_eq!(failed, expected);
    assert_eq!(outcomes(&report), vec![Outcome::Ran]);
    let bad_report = report
        .messages
        .iter()
        .find(|m| m.message_id == bad.message_id.clone().unwrap())
        .unwrap();
    assert!(
        bad_report.error.as_deref().unwrap().contains("not JSON"),
        "{bad_report:?}"
    );
    let not_s3_report = report
        .messages
        .iter()
        .find(|m| m.message_id == not_s3.message_id.clone().unwrap())
        .unwrap();
    assert!(
        not_s3_report
            .error
            .as_deref()
            .unwrap()
            .contains("no \"Records\""),
        "{not_s3_report:?}"
    );
}

#[tokio::test]
async fn outputs_written_into_the_source_bucket_trigger_no_jobs() {
    let p = Pipeline::new(Options::default()).await;
    p.put("in.bin", b"recursion", true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(outcomes(&report), vec![Outcome::Ran]);

    // probe.json and _manifest.json landed in the same bucket and notified the queue.
    let echoes = p.receive(2).await;
    let bodies: Vec<String> = echoes.iter().map(|m| m.body.clone().unwrap()).collect();
    assert!(bodies.iter().all(|b| b.contains("derived/")), "{bodies:?}");
    let calls_before = p.ledger_calls.get();
    let report = p.handle(echoes).await;
    assert_eq!(report.jobs().count(), 0, "{report:?}");
    assert!(failed_ids(&report).is_empty());
    assert_eq!(
        p.ledger_calls.get(),
        calls_before,
        "no claim for our own outputs"
    );
}

#[tokio::test]
async fn a_separate_output_bucket_gets_the_outputs() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    p.put("derived/looks-like-output.bin", b"but is an upload", true)
        .await;
    let report = p.handle(p.receive(1).await).await;
    // The recursion guard applies to the output bucket only.
    assert_eq!(outcomes(&report), vec![Outcome::Ran]);
    let key = &report.jobs().next().unwrap().job_key;
    assert_eq!(
        p.output_keys("derived/").await,
        vec![
            format!("derived/{key}/_manifest.json"),
            format!("derived/{key}/probe.json")
        ]
    );
}

#[tokio::test]
async fn a_key_with_spaces_and_plus_is_decoded() {
    let p = Pipeline::new(Options::default()).await;
    let object_key = "my photos/a+b c (1).bin";
    p.put(object_key, b"spaces and plus", false).await;
    let messages = p.receive(1).await;
    let body = messages[0].body.clone().unwrap();
    assert!(
        !body.contains(object_key),
        "the event carries the key encoded: {body}"
    );
    let report = p.handle(messages).await;
    assert_eq!(outcomes(&report), vec![Outcome::Ran], "{report:?}");
    // It ran: the HEAD and the reads found the object under the decoded
    // key (an undecoded one is gone, and the job skipped).
    let key = &report.jobs().next().unwrap().job_key;
    let probe: Value =
        serde_json::from_slice(&p.output(&format!("derived/{key}/probe.json")).await).unwrap();
    assert_eq!(probe["size"], b"spaces and plus".len());
}

#[tokio::test]
async fn checksum_identity_without_a_sha256_checksum_keys_by_version_and_etag() {
    let p = Pipeline::new(Options {
        versioned: true,
        // `auto` would key these by content: probe's verify reads every byte.
        vars: vec![(ENV_IDENTITY, "checksum".into())],
        // verify: probe hashes the bytes it read, so the report shows which.
        recipes: Some(r#"[{"step":"probe","version":1,"params":{"verify":true}}]"#.into()),
        ..Options::default()
    })
    .await;
    let v1 = p.put("doc.bin", b"version one", false).await;
    let v2 = p.put("doc.bin", b"version two", false).await;
    let report = p.handle(p.receive(2).await).await;
    assert_eq!(report.count(Outcome::Ran), 2, "{report:?}");

    for (put, bytes) in [(v1, &b"version one"[..]), (v2, &b"version two"[..])] {
        let version = put.version_id.expect("versioned bucket");
        let etag = put.e_tag.unwrap().trim_matches('"').to_string();
        let input_hash = sha256_hex(
            format!("s3-version-etag\n{}\ndoc.bin\n{version}\n{etag}", p.bucket).as_bytes(),
        );
        let key = job_key(&input_hash, &probe_recipe_hash(&p));
        let probe: Value =
            serde_json::from_slice(&p.output(&format!("derived/{key}/probe.json")).await).unwrap();
        // Each job read exactly the version its event named.
        assert_eq!(probe["sha256"], sha256_hex(bytes));
    }
}

#[tokio::test]
async fn a_gone_or_replaced_object_is_skipped_without_a_claim() {
    let p = Pipeline::new(Options::default()).await;
    p.put("gone.bin", b"soon deleted", false).await;
    p.put("replaced.bin", b"first", false).await;
    let first_events = p.receive(2).await;
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key("gone.bin")
        .send()
        .await
        .unwrap();
    p.put("replaced.bin", b"second", false).await;

    let calls_before = p.ledger_calls.get();
    let report = p.handle(first_events).await;
    assert_eq!(
        outcomes(&report),
        vec![Outcome::Skipped, Outcome::Skipped],
        "{report:?}"
    );
    assert!(
        failed_ids(&report).is_empty(),
        "skipped messages are acknowledged"
    );
    assert_eq!(
        p.ledger_calls.get(),
        calls_before,
        "no claim for bytes we won't process"
    );
    let reasons: Vec<String> = report.jobs().map(|j| j.reason.clone().unwrap()).collect();
    assert!(reasons.iter().any(|r| r.contains("gone")), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("replaced")),
        "{reasons:?}"
    );

    // The delete and the second put notified too: the removal is
    // acknowledged without a job, the new bytes run.
    let later = p.handle(p.receive(2).await).await;
    assert_eq!(outcomes(&later), vec![Outcome::Ran], "{later:?}");
    assert!(failed_ids(&later).is_empty());
}

#[tokio::test]
async fn recipes_match_by_prefix_and_suffix_and_each_match_is_a_job() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"probe","version":1,"params":{}},
                {"step":"probe","version":2,"params":{},"match":{"prefix":"img/","suffix":".png"}}]"#
                .into(),
        ),
        ..Options::default()
    })
    .await;
    p.put("img/a.png", PNG_3X2, true).await;
    p.put("doc/a.txt", b"text", true).await;
    let report = p.handle(p.receive(2).await).await;
    assert_eq!(report.count(Outcome::Ran), 3, "{report:?}");
    let png_jobs: Vec<_> = report.jobs().filter(|j| j.step == "probe").collect();
    assert_eq!(png_jobs.len(), 3);
    // Bumping the version gives a new key: fresh outputs beside the old.
    let v1 = job_key(&sha256_hex(PNG_3X2), &p.app.config.recipes[0].recipe_hash);
    let v2 = job_key(&sha256_hex(PNG_3X2), &p.app.config.recipes[1].recipe_hash);
    assert_ne!(v1, v2);
    assert!(p.row(&v1).await.is_some() && p.row(&v2).await.is_some());
}

#[tokio::test]
async fn a_panicking_step_fails_its_message_alone_and_its_job_is_marked_failed() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"counted-probe","version":1,"params":{},"match":{"prefix":"ok/"}},
                {"step":"panics","version":1,"params":{},"match":{"prefix":"boom/"}}]"#
                .into(),
        ),
        ..Options::default()
    })
    .await;
    p.put("boom/a.bin", b"triggers the bug", true).await;
    p.put("ok/b.bin", b"fine", true).await;
    let messages = p.receive(2).await;
    let boom_id = messages
        .iter()
        .find(|m| m.body.as_deref().unwrap().contains("boom/"))
        .and_then(|m| m.message_id.clone())
        .unwrap();
    let report = p.handle(messages).await;
    assert_eq!(failed_ids(&report), vec![boom_id]);
    assert_eq!(p.counted.runs(), 1);
    let failed = report.jobs().find(|j| j.step == "panics").unwrap();
    assert_eq!(failed.outcome, Outcome::Failed);
    let row = p.row(&failed.job_key).await.unwrap();
    assert_eq!(row.status, JobStatus::Failed);
    assert!(row
        .error
        .unwrap()
        .contains("step panicked: injected panic: a bug in the step"));
    // No manifest: nothing reads the prefix as complete.
    assert!(p
        .output_keys(&format!("derived/{}/", failed.job_key))
        .await
        .is_empty());
}

/// An S3 request's method and its `x-amz-expected-bucket-owner`, if sent.
type OwnerHeader = (String, Option<String>);

/// Records each S3 request's method and `x-amz-expected-bucket-owner`.
#[derive(Debug, Default, Clone)]
struct OwnerHeaders(std::sync::Arc<std::sync::Mutex<Vec<OwnerHeader>>>);

impl aws_sdk_s3::config::Intercept for OwnerHeaders {
    fn name(&self) -> &'static str {
        "OwnerHeaders"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_s3::config::RuntimeComponents,
        _cfg: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        let request = context.request();
        self.0.lock().unwrap().push((
            request.method().to_string(),
            request
                .headers()
                .get("x-amz-expected-bucket-owner")
                .map(str::to_string),
        ));
        Ok(())
    }
}

#[tokio::test]
async fn every_s3_call_names_the_expected_bucket_owner() {
    // LocalStack accepts the header without checking it (its provider never
    // compares it for these calls), so this proves what is sent; the
    // in-memory store's 403 proves what a mismatch does (handler tests).
    let p = Pipeline::new(Options::default()).await;
    let headers = OwnerHeaders::default();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        mediaonce::aws::s3_client(&sdk)
            .config()
            .to_builder()
            .interceptor(headers.clone())
            .build(),
    );
    let app = p.app_with_store(mediaonce::store::ObjectStore::s3(
        s3,
        Some("000000000000".into()),
    ));
    p.put("photos/owned.png", PNG_3X2, true).await;
    let report = handle_with(app, p.receive(1).await).await;
    assert_eq!(outcomes(&report), [Outcome::Ran]);
    let seen = headers.0.lock().unwrap().clone();
    let methods: Vec<&str> = seen.iter().map(|(m, _)| m.as_str()).collect();
    // HEAD, a ranged GET, then the report and the manifest.
    assert_eq!(methods, ["HEAD", "GET", "PUT", "PUT"], "{seen:?}");
    for (method, owner) in &seen {
        assert_eq!(owner.as_deref(), Some("000000000000"), "{method}");
    }
}

/// Set in the child process of the panic-hook test.
const PANIC_HOOK_CHILD: &str = "MEDIAONCE_PANIC_HOOK_CHILD";

#[test]
fn panic_hook_child() {
    if std::env::var_os(PANIC_HOOK_CHILD).is_none() {
        return;
    }
    common::quiet_injected_panics();
    let injected = std::panic::catch_unwind(|| panic!("{}: on purpose", common::INJECTED_PANIC));
    let real = std::panic::catch_unwind(|| panic!("a real bug"));
    assert!(injected.is_err() && real.is_err());
}

#[test]
fn injected_panics_are_quiet_and_real_ones_keep_their_backtrace() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "panic_hook_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PANIC_HOOK_CHILD, "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("on purpose"), "{stderr}");
    assert!(stderr.contains("a real bug"), "{stderr}");
    assert!(stderr.contains("stack backtrace"), "{stderr}");
}

/// Issue 37, defect 6: a job's outputs depend on its input bytes and recipe
/// alone. The same bytes, uploaded under two keys to two deployments (each
/// its own bucket, table and output bucket), one upload with S3's SHA-256
/// checksum and one without (mediaonce computes it), are one job key and
/// give byte-identical `probe.json` files naming neither upload.
#[tokio::test]
async fn the_same_bytes_under_two_keys_give_byte_identical_outputs() {
    let options = || Options {
        separate_output_bucket: true,
        recipes: Some(r#"[{"step":"probe","version":1,"params":{"verify":true}}]"#.into()),
        ..Options::default()
    };
    let (first, second) = (
        Pipeline::new(options()).await,
        Pipeline::new(options()).await,
    );
    first.put("alice/holiday.png", PNG_3X2, true).await;
    second.put("bob/copy of it.png", PNG_3X2, false).await;
    let mut files = Vec::new();
    for p in [&first, &second] {
        let report = p.handle(p.receive(1).await).await;
        assert_eq!(outcomes(&report), vec![Outcome::Ran], "{report:?}");
        let key = report.jobs().next().unwrap().job_key.clone();
        files.push((
            key.clone(),
            p.output(&format!("derived/{key}/probe.json")).await,
        ));
    }
    assert_eq!(files[0].0, files[1].0, "one job key for the same bytes");
    assert_eq!(
        String::from_utf8_lossy(&files[0].1),
        String::from_utf8_lossy(&files[1].1)
    );
    let text = String::from_utf8_lossy(&files[0].1);
    for upload in [
        "alice",
        "bob",
        first.bucket.as_str(),
        second.bucket.as_str(),
    ] {
        assert!(!text.contains(upload), "{upload} in {text}");
    }
}
