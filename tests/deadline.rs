//! The invocation deadline: a Lambda that times out returns nothing and SQS
//! redelivers its whole batch, so the handler starts no job it cannot finish
//! and answers in time, failing exactly the unfinished messages.

mod common;

use common::now_ms;

use std::time::Duration;

use common::{failed_ids, handle_before, Options, Pipeline};
use mediaonce::config::{Config, ENV_DEADLINE_MARGIN_SECS, ENV_RECIPES, ENV_TABLE};
use mediaonce::handler::{App, Outcome};
use mediaonce::ledger::{JobStatus, Ledger};
use mediaonce::queue::Queue;
use mediaonce::step::{JobOutputs, Step, StepContext, StepError};
use mediaonce::steps::StepRegistry;
use mediaonce::store::ObjectStore;

#[tokio::test]
async fn too_close_to_the_deadline_no_job_starts() {
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"counted-probe","version":1,"params":{}}]"#.into()),
        ..Options::default()
    })
    .await;
    p.put("a.bin", b"a", true).await;
    p.put("b.bin", b"b", true).await;
    let messages = p.receive(2).await;
    let calls_before = p.ledger_calls.get();
    // 2 s left, 5 s needed (the default margin).
    let report = handle_before(p.app.clone(), messages, now_ms() + 2_000).await;
    assert_eq!(report.response().batch_item_failures.len(), 2);
    assert!(
        report.jobs().all(|j| j.outcome == Outcome::Deferred),
        "{report:?}"
    );
    assert!(report
        .jobs()
        .all(|j| j.reason.as_deref().unwrap().contains("invocation deadline")));
    assert_eq!(p.ledger_calls.get(), calls_before, "nothing claimed");
    assert_eq!(p.counted.runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_step_is_cut_off_and_only_its_message_comes_back() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hangs","version":1,"params":{},"match":{"prefix":"stuck/"}},
                {"step":"counted-probe","version":1,"params":{},"match":{"prefix":"ok/"}}]"#
                .into(),
        ),
        vars: vec![(ENV_DEADLINE_MARGIN_SECS, "1".into())],
        ..Options::default()
    })
    .await;
    p.put("stuck/a.bin", b"never finishes", true).await;
    p.put("ok/b.bin", b"fine", true).await;
    let messages = p.receive(2).await;
    let stuck_id = messages
        .iter()
        .find(|m| m.body.as_deref().unwrap().contains("stuck/"))
        .and_then(|m| m.message_id.clone())
        .unwrap();

    let deadline = now_ms() + 3_000;
    let report = handle_before(p.app.clone(), messages, deadline).await;
    assert!(now_ms() < deadline, "answered before the deadline");
    let failed = failed_ids(&report);
    assert_eq!(failed, vec![stuck_id.clone()]);
    assert_eq!(p.counted.runs(), 1);
    let stuck = report
        .messages
        .iter()
        .find(|m| m.message_id == stuck_id)
        .unwrap();
    assert_eq!(
        stuck.error.as_deref(),
        Some("unfinished at the invocation deadline")
    );

    // Its claim stays until the lease (deadline + margin) passes; then the
    // next delivery takes it over.
    let key = mediaonce::key::job_key(
        &mediaonce::key::sha256_hex(b"never finishes"),
        &p.app.config.recipes[0].recipe_hash,
    );
    let row = p.row(&key).await.unwrap();
    assert_eq!(row.status, JobStatus::Running);
    assert_eq!(row.lease_until_ms, deadline + 10_000);
}

/// A step that declares how long it may take, from its params.
struct Declared;

#[async_trait::async_trait]
impl Step for Declared {
    /// Seconds needed.
    type Params = u64;

    fn name(&self) -> &'static str {
        "declared"
    }

    fn params(&self, params: &serde_json::Map<String, serde_json::Value>) -> Result<u64, String> {
        params["needs_secs"]
            .as_u64()
            .ok_or_else(|| "needs_secs is a whole number of seconds".into())
    }

    fn time_needed(&self, needs_secs: &u64) -> Duration {
        Duration::from_secs(*needs_secs)
    }

    async fn run(
        &self,
        _params: &u64,
        _context: &StepContext<'_>,
        _outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        Ok(())
    }
}

#[tokio::test]
async fn each_recipe_has_the_margin_its_step_declares() {
    let mut steps = StepRegistry::builtin();
    steps.register(Declared);
    let recipes = r#"[{"step":"declared","version":1,"params":{"needs_secs":30}},
                      {"step":"declared","version":2,"params":{"needs_secs":12}},
                      {"step":"probe","version":1,"params":{}}]"#;
    let config = Config::from_lookup(
        |name| match name {
            ENV_TABLE => Some("t".into()),
            "MEDIAONCE_OUTPUT_BUCKET" => Some("out".into()),
            ENV_RECIPES => Some(recipes.into()),
            _ => None,
        },
        &steps,
    )
    .unwrap();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let app = App::new(
        config,
        Ledger::dynamodb(mediaonce::aws::dynamodb_client(&sdk), "t"),
        ObjectStore::s3(mediaonce::aws::s3_client(&sdk), None),
        Queue::sqs(mediaonce::aws::sqs_client(&sdk)),
    );
    let margins: Vec<Duration> = app
        .config
        .recipes
        .iter()
        .map(|rule| app.start_margin(rule))
        .collect();
    assert_eq!(
        margins,
        [
            Duration::from_secs(35),
            Duration::from_secs(17),
            Duration::from_secs(5)
        ]
    );
}

/// `mediaonce invoke --timeout` gives the batch the deadline a function
/// timeout would: with 2 s (less than the 5 s a job needs to start) the
/// job is deferred and its message fails; with 60 s it runs. A timeout
/// out of Lambda's range is refused, naming it.
#[tokio::test]
async fn invoke_with_a_timeout_defers_what_would_not_finish() {
    let p = Pipeline::new(Options::default()).await;
    p.put("a.bin", b"a", true).await;
    let message = p.receive(1).await.remove(0);
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    event.records = vec![message.clone()];
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("invoke-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("event.json");
    std::fs::write(&file, serde_json::to_vec(&event).unwrap()).unwrap();
    let invoke = |timeout: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
            .args(["invoke", "--event"])
            .arg(&file)
            .args(["--timeout", timeout])
            .env("MEDIAONCE_TABLE", &p.table)
            .env("MEDIAONCE_OUTPUT_BUCKET", &p.output_bucket)
            .output()
            .expect("mediaonce runs")
    };
    let response = |out: &std::process::Output| -> serde_json::Value {
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().last().expect("a response")).unwrap()
    };

    let out = invoke("2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        response(&out)["batchItemFailures"][0]["itemIdentifier"],
        message.message_id.clone().unwrap().as_str(),
        "{stderr}"
    );
    assert!(stderr.contains("invocation deadline"), "{stderr}");

    let out = invoke("60");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        response(&out)["batchItemFailures"],
        serde_json::json!([]),
        "{stderr}"
    );

    let out = invoke("901");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1..=900"));
}
