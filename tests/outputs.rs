//! `mediaonce outputs`, run as an operator would, against the emulators:
//! an object's jobs, their rows and manifests.

mod common;

use std::process::{Command, Output};

use common::{Options, Pipeline};
use mediaonce::handler::Outcome;
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::queue::message_group;
use serde_json::Value;

const BYTES: &[u8] = b"bytes whose outputs we look up";

/// `mediaonce <command> <args>` with the pipeline's table and output
/// bucket, and `recipes` as `MEDIAONCE_RECIPES` (else the default).
fn mediaonce(p: &Pipeline, command: &str, args: &[&str], recipes: Option<&str>) -> Output {
    let mut run = Command::new(env!("CARGO_BIN_EXE_mediaonce"));
    run.arg(command)
        .args(args)
        .env("MEDIAONCE_TABLE", &p.table)
        .env("MEDIAONCE_OUTPUT_BUCKET", &p.output_bucket);
    if let Some(recipes) = recipes {
        run.env("MEDIAONCE_RECIPES", recipes);
    }
    run.output().expect("mediaonce runs")
}

fn outputs(p: &Pipeline, args: &[&str]) -> Output {
    mediaonce(p, "outputs", args, None)
}

#[tokio::test]
async fn outputs_lists_each_recipes_job_row_and_files() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    p.put("docs/a.bin", BYTES, true).await;
    p.put("docs/b.bin", BYTES, true).await;
    p.handle(p.receive(2).await).await;

    let out = outputs(&p, &[&format!("s3://{}/docs/a.bin", p.bucket)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let jobs = found.as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{found}");
    let job = &jobs[0];
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);
    assert_eq!(job["job_key"], key.as_str());
    assert_eq!(job["recipe"]["step"], "probe");
    assert_eq!(job["status"], "done");
    assert_eq!(job["refs"], 2);
    assert_eq!(job["input_hash_source"], "s3-checksum");
    assert_eq!(
        job["output_prefix"],
        format!("s3://{}/derived/{key}/", p.output_bucket).as_str()
    );
    let files: Vec<&str> = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["probe.json"]);

    let missing = outputs(&p, &[&format!("s3://{}/docs/none.bin", p.bucket)]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .contains("docs/none.bin does not exist"),
        "{stderr}"
    );
}

fn reprocess(p: &Pipeline, args: &[&str]) -> (Output, Vec<Value>) {
    reprocess_with(p, args, None)
}

fn reprocess_with(p: &Pipeline, args: &[&str], recipes: Option<&str>) -> (Output, Vec<Value>) {
    let out = mediaonce(p, "reprocess", args, recipes);
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line per job"))
        .collect();
    (out, lines)
}

#[tokio::test]
async fn reprocess_twice_runs_once_and_a_new_version_runs_beside() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    // A key that needs encoding in an event.
    p.put("docs/a b+c.bin", BYTES, true).await;
    let object = format!("s3://{}/docs/a b+c.bin", p.bucket);
    let key = job_key(&sha256_hex(BYTES), &p.app.config.recipes[0].recipe_hash);

    let (out, jobs) = reprocess(&p, &[&object]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (jobs[0]["outcome"].as_str(), jobs[0]["job_key"].as_str()),
        (Some("ran"), Some(key.as_str()))
    );
    let (out, jobs) = reprocess(&p, &[&object]);
    assert!(out.status.success());
    assert_eq!(jobs[0]["outcome"], "reused");
    assert_eq!(p.refs(&key).await, 1);

    let (out, jobs) = reprocess(
        &p,
        &[
            &object,
            "--recipe",
            r#"{"step":"probe","version":2,"params":{}}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(jobs[0]["outcome"], "ran");
    assert_ne!(jobs[0]["job_key"], key.as_str());

    let (missing, _) = reprocess(&p, &[&format!("s3://{}/docs/none.bin", p.bucket)]);
    assert_eq!(missing.status.code(), Some(1));
}

const CHAINED: &str = r#"[{"name":"probe","step":"probe","version":1,"params":{}},
    {"name":"probe-of-probe","step":"probe","version":2,"params":{},
     "input":{"recipe":"probe","file":"probe.json"}}]"#;

#[tokio::test]
async fn reprocess_runs_the_whole_pipeline_and_outputs_shows_its_tree() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(CHAINED.into()),
        ..Options::default()
    })
    .await;
    p.put("docs/a.bin", BYTES, true).await;
    let object = format!("s3://{}/docs/a.bin", p.bucket);

    let (out, jobs) = reprocess_with(&p, &[&object], Some(CHAINED));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran: Vec<(&str, &str)> = jobs
        .iter()
        .map(|j| {
            (
                j["recipe"].as_str().unwrap(),
                j["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(ran, [("probe", "ran"), ("probe-of-probe", "ran")]);
    let (_, again) = reprocess_with(&p, &[&object], Some(CHAINED));
    assert!(again.iter().all(|j| j["outcome"] == "reused"), "{again:?}");

    let out = mediaonce(&p, "outputs", &[&object], Some(CHAINED));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(tree[0]["name"], "probe", "{tree:#}");
    let chained = &tree[0]["downstream"][0];
    assert_eq!(chained["name"], "probe-of-probe", "{tree:#}");
    assert_eq!(chained["job_key"], jobs[1]["job_key"], "{tree:#}");
    assert_eq!(
        (chained["status"].as_str(), chained["refs"].as_u64()),
        (Some("done"), Some(1))
    );
    assert_eq!(chained["input_hash_source"], "upstream-manifest");
}

fn backfill(args: &[&str]) -> (Output, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .arg("backfill")
        .args(args)
        .output()
        .expect("mediaonce runs");
    let summary = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, summary)
}

/// Every message of `queue_url`, as Lambda would get them.
async fn drain(p: &Pipeline, queue_url: &str) -> Vec<aws_lambda_events::event::sqs::SqsMessage> {
    let mut got = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let batch = common::receive_from(&p.sqs, queue_url).await;
        empty = if batch.is_empty() { empty + 1 } else { 0 };
        got.extend(batch.into_iter().map(|m| p.lambda_message(m)));
    }
    got
}

#[tokio::test]
async fn backfill_sends_one_notification_per_object_and_twice_reuses() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let count = 23;
    for i in 0..count {
        p.put(
            &format!("old/{i:03} x.bin"),
            format!("object {i}").as_bytes(),
            true,
        )
        .await;
    }
    p.put("elsewhere.bin", b"not under the prefix", true).await;
    let queue_url = p
        .sqs
        .create_queue()
        .queue_name(common::unique("backfill"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let location = format!("s3://{}/old/", p.bucket);

    let (out, summary) = backfill(&[&location, "--queue-url", &queue_url, "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        (summary["listed"].as_u64(), summary["sent"].as_u64()),
        (Some(count), Some(0))
    );
    assert!(
        drain(&p, &queue_url).await.is_empty(),
        "a dry run sends nothing"
    );

    let (out, summary) = backfill(&[&location, "--queue-url", &queue_url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["sent"].as_u64(), Some(count));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{count} message(s) sent")));
    let messages = drain(&p, &queue_url).await;
    assert_eq!(messages.len() as u64, count);
    let report = p.handle(messages).await;
    assert_eq!(report.count(Outcome::Ran) as u64, count, "{report:?}");

    // Again: only reused jobs.
    backfill(&[&location, "--queue-url", &queue_url]);
    let report = p.handle(drain(&p, &queue_url).await).await;
    assert_eq!(report.count(Outcome::Reused) as u64, count, "{report:?}");
    assert_eq!(report.count(Outcome::Ran), 0);

    // Resumed after a key: only what follows it.
    let (_, summary) = backfill(&[
        &location,
        "--queue-url",
        &queue_url,
        "--start-after",
        "old/019 x.bin",
    ]);
    assert_eq!(summary["sent"].as_u64(), Some(3));
    assert_eq!(summary["last_key"], "old/022 x.bin");
    drain(&p, &queue_url).await;
}

/// Issue 41, defect 4: backfill to a FIFO queue (no content-based
/// deduplication) gives each notification its object's message group and
/// a deduplication id; SQS refused every entry before (`MissingParameter`).
#[tokio::test]
async fn backfill_to_a_fifo_queue_sends_each_object_in_its_group() {
    let p = Pipeline::new(Options::default()).await;
    for key in ["old/a.bin", "old/b c.bin"] {
        p.put(key, key.as_bytes(), true).await;
    }
    let queue_url = p
        .sqs
        .create_queue()
        .queue_name(format!("{}.fifo", common::unique("backfill")))
        .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let location = format!("s3://{}/old/", p.bucket);
    let (out, summary) = backfill(&[&location, "--queue-url", &queue_url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["sent"].as_u64(), Some(2));
    let mut groups: Vec<String> = common::receive_from(&p.sqs, &queue_url)
        .await
        .into_iter()
        .map(|m| {
            m.attributes.unwrap_or_default()
                [&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId]
                .clone()
        })
        .collect();
    groups.sort();
    let mut wanted = vec![
        message_group(&p.bucket, "old/a.bin"),
        message_group(&p.bucket, "old/b c.bin"),
    ];
    wanted.sort();
    assert_eq!(groups, wanted);
}
