//! Issue 38's engine, on LocalStack's Step Functions: the state machine of
//! `statemachine/hls-split.asl.json`, as the template will deploy it, run
//! with the test acting as the chunk function (receiving each task's
//! message from the chunk queue and answering with its task token). A
//! Map of chunk tasks (one retried after a transient failure), then the
//! join, then the announcement; the same name and input start the same
//! execution; a chunk that fails for good ends the execution through the
//! failure task and its announcement, its cause naming the chunk.

mod common;

use std::collections::BTreeMap;

use common::{receive_from, unique};
use mediaonce::executions::{
    ExecutionClient, ExecutionErrorKind, ExecutionStatus, InMemoryExecutions, SfnExecutions,
    TaskAnswer,
};
use serde_json::{json, Value};

struct Engine {
    sfn: aws_sdk_sfn::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    machine: String,
}

async fn engine() -> Engine {
    common::pipeline::require_emulators();
    let sdk = mediaonce::aws::load_sdk_config().await;
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let sqs = mediaonce::aws::sqs_client(&sdk);
    let queue_url = common::sfn::queue(&sqs, "chunks").await;
    let machine = common::sfn::split_machine(&sfn).await;
    Engine {
        sfn,
        sqs,
        queue_url,
        machine,
    }
}

fn input(engine: &Engine, job: &str, spans: usize) -> String {
    json!({
        "job": {"key": job, "attempt": 1},
        "queueUrl": engine.queue_url,
        "limits": {"maxConcurrency": 2, "heartbeatSeconds": 120, "chunkSeconds": 900, "joinSeconds": 900},
        "spans": (0..spans).map(|i| json!({"index": i, "startMs": i * 60_000, "endMs": (i + 1) * 60_000})).collect::<Vec<_>>(),
    })
    .to_string()
}

/// What the chunk function was asked, by message kind.
#[derive(Default, Debug)]
struct Asked {
    chunks: BTreeMap<u64, usize>,
    /// The spans each join was given.
    joins: Vec<Value>,
    failures: Vec<Value>,
    /// The outcome each announcement was given.
    announced: Vec<String>,
    /// Every task's `execution`.
    executions: Vec<String>,
}

impl Engine {
    /// Answers the execution's tasks as the chunk function would, with
    /// `answer` choosing each chunk's (`Ok` output or `Err` error), until
    /// the execution ends; returns its status and what was asked.
    async fn drive(
        &self,
        execution: &str,
        mut answer: impl FnMut(u64, usize) -> Result<Value, &'static str>,
    ) -> (ExecutionStatus, Asked) {
        let executions = SfnExecutions::new(self.sfn.clone());
        let mut asked = Asked::default();
        // LocalStack 2026.3 lost an answer that came before it armed a
        // task's heartbeat wait; `scripts/emulators.sh` mends it
        // (`patch_localstack.py`), so every answer here is given once.
        for _poll in 0..120 {
            let status = executions.describe_execution(execution).await.unwrap();
            match status {
                Some(ExecutionStatus::Running) => {}
                Some(status) => return (status, asked),
                None => panic!("no execution {execution}"),
            }
            let messages = receive_from(&self.sqs, &self.queue_url).await;
            for message in messages {
                let body: Value = serde_json::from_str(message.body().unwrap()).unwrap();
                let token = body["taskToken"].as_str().unwrap().to_string();
                asked
                    .executions
                    .push(body["execution"].as_str().unwrap_or_default().to_string());
                let result = match body["mediaonce"].as_str().unwrap() {
                    "hls-chunk/2" => {
                        let index = body["span"]["index"].as_u64().unwrap();
                        let seen = asked.chunks.entry(index).or_default();
                        *seen += 1;
                        answer(index, *seen)
                    }
                    "hls-join/2" => {
                        asked.joins.push(body["spans"].clone());
                        Ok(json!({}))
                    }
                    "hls-end/2" => {
                        asked
                            .announced
                            .push(body["outcome"].as_str().unwrap().to_string());
                        Ok(json!({}))
                    }
                    "hls-failed/2" => {
                        asked.failures.push(body["failure"].clone());
                        Ok(json!({"recorded": true}))
                    }
                    other => panic!("a task of kind {other}"),
                };
                reply(&executions, &token, result).await;
                self.sqs
                    .delete_message()
                    .queue_url(&self.queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
        panic!("the execution did not end: {asked:?}");
    }

    async fn start(&self, name: &str, input: &str) -> String {
        self.sfn
            .start_execution()
            .state_machine_arn(&self.machine)
            .name(name)
            .input(input)
            .send()
            .await
            .unwrap()
            .execution_arn
    }
}

/// SendTaskSuccess with `Ok`'s output, or SendTaskFailure with `Err`'s
/// error, through the function's own client; a token whose task ended
/// is refused, and that is fine.
async fn reply(executions: &SfnExecutions, token: &str, result: Result<Value, &'static str>) {
    let _ = match result {
        Ok(output) => {
            executions
                .send_task_success(token, &output.to_string())
                .await
        }
        Err(error) => executions.send_task_failure(token, error, "injected").await,
    };
}

#[tokio::test]
async fn chunks_fan_out_a_transient_failure_is_retried_and_the_join_gets_them_in_order() {
    let engine = engine().await;
    let job = "a".repeat(64);
    let name = format!("{}-1", &job[..16]);
    let input = input(&engine, &job, 3);
    let execution = engine.start(&name, &input).await;
    // The claimant's redelivery starts it again: the same execution.
    assert_eq!(engine.start(&name, &input).await, execution);
    let other = engine
        .sfn
        .start_execution()
        .state_machine_arn(&engine.machine)
        .name(&name)
        .input(input.replace("\"attempt\":1", "\"attempt\":2"))
        .send()
        .await;
    assert!(
        other.is_err_and(|e| format!("{e:?}").contains("ExecutionAlreadyExists")),
        "another input under the same name is refused"
    );

    let (status, asked) = engine
        .drive(&execution, |index, seen| match (index, seen) {
            (1, 1) => Err("mediaonce.Transient"),
            _ => Ok(json!({})),
        })
        .await;
    assert_eq!(status, ExecutionStatus::Succeeded, "{asked:?}");
    assert_eq!(asked.chunks, BTreeMap::from([(0, 1), (1, 2), (2, 1)]));
    assert_eq!(asked.joins.len(), 1, "{asked:?}");
    let indexes: Vec<u64> = asked.joins[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|span| span["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2], "the join is given every span, in order");
    assert!(asked.failures.is_empty());
    assert_eq!(asked.announced, ["joined"]);
    // Its history, counted: three chunks, one task failed and retried.
    let progress = SfnExecutions::new(engine.sfn.clone())
        .execution_progress(&execution)
        .await
        .unwrap();
    assert_eq!(
        (
            progress.chunks_started,
            progress.chunks_succeeded,
            progress.chunks_failed,
            progress.task_failures
        ),
        (3, 3, 0, 1),
        "{progress:?}"
    );
    // What it is billed for: the Map, a chunk task per span (its retry
    // does not enter the state again), the join, the announcement.
    assert_eq!(progress.states_entered, 1 + 3 + 1 + 1, "{progress:?}");
    assert!(
        asked.executions.iter().all(|e| *e == execution),
        "every task names its execution: {asked:?}"
    );
}

#[tokio::test]
async fn a_chunk_that_fails_for_good_ends_the_execution_through_the_failure_task() {
    let engine = engine().await;
    let job = "b".repeat(64);
    let execution = engine
        .start(&format!("{}-1", &job[..16]), &input(&engine, &job, 3))
        .await;
    let (status, asked) = engine
        .drive(&execution, |index, _| match index {
            2 => Err("mediaonce.Unprocessable"),
            _ => Ok(json!({})),
        })
        .await;
    assert_eq!(status, ExecutionStatus::Failed, "{asked:?}");
    assert_eq!(asked.chunks.get(&2), Some(&1), "not retried: {asked:?}");
    assert!(asked.joins.is_empty());
    assert_eq!(asked.failures.len(), 1, "{asked:?}");
    assert_eq!(asked.failures[0]["Error"], "mediaonce.Unprocessable");
    let cause = asked.failures[0]["Cause"].as_str().unwrap();
    assert!(cause.starts_with("chunk 2 (120000 ms on): "), "{cause}");
    assert_eq!(asked.announced, ["failed"], "the failure is announced too");
    let described = engine
        .sfn
        .describe_execution()
        .execution_arn(&execution)
        .send()
        .await
        .unwrap();
    assert_eq!(described.error(), Some("mediaonce.Unprocessable"));
}

/// The contract both execution clients keep (`mediaonce::executions`):
/// a start repeated with the same name and input is the same execution,
/// with other input it is refused as `AlreadyExists`; an execution that
/// does not exist is `None`; a token no task holds is `TaskGone`.
async fn keeps_the_execution_contract(client: &dyn ExecutionClient, machine: &str, input: &str) {
    let name = unique("contract");
    let arn = client.start_execution(machine, &name, input).await.unwrap();
    assert!(arn.ends_with(&format!(":{name}")), "{arn}");
    assert_eq!(
        client.start_execution(machine, &name, input).await.unwrap(),
        arn
    );
    let other = client
        .start_execution(
            machine,
            &name,
            &input.replace("\"attempt\":1", "\"attempt\":2"),
        )
        .await
        .unwrap_err();
    assert_eq!(other.kind, ExecutionErrorKind::AlreadyExists, "{other}");
    assert_eq!(
        client.describe_execution(&arn).await.unwrap(),
        Some(ExecutionStatus::Running)
    );
    let missing = arn.replace(&name, "never-started");
    assert_eq!(client.describe_execution(&missing).await.unwrap(), None);
    for err in [
        client
            .send_task_success("no-such-token", "{}")
            .await
            .unwrap_err(),
        client
            .send_task_failure("no-such-token", "mediaonce.Transient", "test")
            .await
            .unwrap_err(),
        client
            .send_task_heartbeat("no-such-token")
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.kind, ExecutionErrorKind::TaskGone, "{err}");
    }
}

#[tokio::test]
async fn step_functions_and_the_in_memory_twin_keep_the_execution_contract() {
    let engine = engine().await;
    let input = input(&engine, &"c".repeat(64), 1);
    let sfn = SfnExecutions::new(engine.sfn.clone());
    keeps_the_execution_contract(&sfn, &engine.machine, &input).await;
    let twin = InMemoryExecutions::default();
    keeps_the_execution_contract(
        &twin,
        "arn:aws:states:us-east-1:000000000000:stateMachine:hls-split",
        &input,
    )
    .await;

    // What only the twin can show here (LocalStack takes a second answer
    // to a task that ended): a token is answered once, heartbeats counted.
    twin.issue_task("t1");
    twin.send_task_heartbeat("t1").await.unwrap();
    twin.send_task_success("t1", "{\"index\":0}").await.unwrap();
    assert_eq!(twin.heartbeats_of("t1"), 1);
    assert_eq!(
        twin.send_task_failure("t1", "mediaonce.Transient", "late")
            .await
            .unwrap_err()
            .kind,
        ExecutionErrorKind::TaskGone
    );
    assert_eq!(
        twin.answer_of("t1"),
        Some(TaskAnswer::Success {
            output: "{\"index\":0}".into()
        })
    );
}
