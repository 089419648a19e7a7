//! A long video's split as a Step Functions execution of
//! `statemachine/hls-split.asl.json` (DESIGN.md, "Chunked HLS"): the
//! execution's input, which carries everything its tasks need, and the
//! task messages the definition sends to the chunk queue, each with its
//! task token. Pure: no I/O.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::HAND_ON_MARKER;
use crate::key::Recipe;
use crate::step::ChunkSpan;

/// One span of the job's input, run as a chunk job.
pub const CHUNK_TASK: &str = "hls-chunk/2";
/// Every chunk done: their segments joined into the job's package.
pub const JOIN_TASK: &str = "hls-join/2";
/// The job ended (`outcome`): every version that uses it handed on.
pub const END_TASK: &str = "hls-end/2";
/// A chunk or the join failed: the job finished failed.
pub const FAILED_TASK: &str = "hls-failed/2";

/// At most this many spans in one execution, so that an inline Map stays
/// inside a Standard execution's 25,000 history events: each chunk task
/// writes about 8 (its iteration's start and end, the task's state entered,
/// scheduled, started, submitted, succeeded, exited) and each retry about
/// 4 more, so 1,000 chunks take about 8,000 with room for a retry of
/// every chunk and more; the input, and the join's message, stay far under
/// Step Functions' and SQS's 256 KiB (a span is about 50 bytes). 1,000
/// one-minute chunks are 16 hours of video.
pub const MAX_SPANS: usize = 1_000;

/// The job an execution runs, as its claimant claimed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SplitJob {
    /// The `hls-package` job's key.
    pub key: String,
    pub input_hash: String,
    /// The package recipe's name, for reports and events.
    pub recipe_name: String,
    /// The package recipe as claimed ({step, version, params}): the chunks
    /// and the join follow it, whatever the configuration says by then.
    pub recipe: Value,
    /// Where the package goes: the job row's `output_prefix`.
    pub output_prefix: String,
    /// Where the bytes were when the execution started: the claimant's
    /// version. A chunk that finds it gone reads any other version that
    /// references the job.
    pub locations: Vec<Location>,
    /// The queue the job's versions are handed on to at its end (the
    /// queue the claimant's message came from).
    pub hand_on_queue_url: String,
}

impl SplitJob {
    /// The package recipe, as claimed.
    pub fn package_recipe(&self) -> Result<Recipe, String> {
        Recipe::from_value(&self.recipe).map_err(|e| format!("the execution's recipe: {e}"))
    }
}

/// An object version holding the job's input bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Location {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    /// Unquoted: the bytes read are pinned to it (`If-Match`).
    #[serde(rename = "eTag")]
    pub etag: String,
}

/// A span, as the execution carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Span {
    pub index: u32,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
}

impl From<&ChunkSpan> for Span {
    fn from(span: &ChunkSpan) -> Self {
        Span {
            index: span.index,
            start_ms: span.start_ms,
            end_ms: span.end_ms,
        }
    }
}

/// The definition's limits, read from the input (`*Path` fields), so that
/// the definition has no substitutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// The Map's `MaxConcurrency` (0: unbounded).
    pub max_concurrency: u32,
    /// A task's worker heartbeats when it takes the message; a task silent
    /// this long is retried. Longer than an invocation and its lease
    /// margin, so that a worker that died mid-encode is not raced by a
    /// retry while its claim still holds the chunk.
    pub heartbeat_seconds: u32,
    /// A chunk task's whole time, its message's waits included.
    pub chunk_seconds: u32,
    /// The join's and the announcements' time.
    pub join_seconds: u32,
}

impl Limits {
    /// The template's: a 900 s invocation and a 60 s margin between
    /// heartbeats; an hour a chunk, an hour the join.
    pub fn standard(max_concurrency: u32) -> Self {
        Limits {
            max_concurrency,
            heartbeat_seconds: 960,
            chunk_seconds: 3_600,
            join_seconds: 3_600,
        }
    }
}

/// What StartExecution is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionInput {
    pub job: SplitJob,
    /// Where the task messages go: the chunk queue.
    pub queue_url: String,
    pub limits: Limits,
    pub spans: Vec<Span>,
}

/// The failure a `Catch` recorded (`$.failure`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    #[serde(rename = "Error", default)]
    pub error: Option<String>,
    #[serde(rename = "Cause", default)]
    pub cause: Option<String>,
}

/// One task's message, as the definition sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SplitTask {
    /// One of [`CHUNK_TASK`], [`JOIN_TASK`], [`END_TASK`], [`FAILED_TASK`].
    pub mediaonce: String,
    pub task_token: String,
    /// The execution's ARN (`$$.Execution.Id`).
    pub execution: String,
    pub job: SplitJob,
    /// A chunk task's span.
    #[serde(default)]
    pub span: Option<Span>,
    /// The join's and the ends' spans (the chunk keys follow from them).
    #[serde(default)]
    pub spans: Option<Vec<Span>>,
    /// An end's: `joined` or `failed`.
    #[serde(default)]
    pub outcome: Option<String>,
    /// The failure task's.
    #[serde(default)]
    pub failure: Option<Failure>,
}

/// EventBridge's `Step Functions Execution Status Change` event, as the
/// template's rule delivers it to the job queue for a split's execution
/// that closed without succeeding (failed, timed out, aborted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionClosed {
    pub execution_arn: String,
    pub state_machine_arn: String,
    /// `FAILED`, `TIMED_OUT`, `ABORTED` (or any other the rule passes).
    pub status: String,
    /// The execution's input, when the event includes it (EventBridge
    /// leaves out one past 248 KiB).
    pub input: Option<String>,
}

/// The event's `source` and `detail-type`.
pub const STATUS_CHANGE: (&str, &str) = ("aws.states", "Step Functions Execution Status Change");

impl ExecutionClosed {
    /// Whether a body (parsed) is a Step Functions status change event.
    pub fn is_status_change(body: &Value) -> bool {
        body.get("source").and_then(Value::as_str) == Some(STATUS_CHANGE.0)
            && body.get("detail-type").and_then(Value::as_str) == Some(STATUS_CHANGE.1)
    }

    /// The event in a body marked as one, or what it lacks.
    pub fn from_value(body: &Value) -> Result<ExecutionClosed, String> {
        let detail = &body["detail"];
        let text = |name: &str| {
            detail
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("an execution status change without detail.{name}"))
        };
        Ok(ExecutionClosed {
            execution_arn: text("executionArn")?,
            state_machine_arn: text("stateMachineArn")?,
            status: text("status")?,
            input: detail
                .get("input")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// The job the execution ran: its name's first 64 characters
    /// ([`crate::executions::execution_name`]).
    pub fn job_key(&self) -> Option<&str> {
        let name = self.execution_arn.rsplit(':').next()?;
        name.get(..64)
            .filter(|key| key.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

impl SplitTask {
    /// Whether a message body is a split task (of any kind this build
    /// knows, or a later one: it is refused by name, not misread).
    pub fn is_task(body: &Value) -> bool {
        body.get(HAND_ON_MARKER.0)
            .and_then(Value::as_str)
            .is_some_and(|kind| [CHUNK_TASK, JOIN_TASK, END_TASK, FAILED_TASK].contains(&kind))
    }

    /// A task's message, checked: the fields its kind needs are there.
    pub fn from_value(body: Value) -> Result<SplitTask, String> {
        let task: SplitTask = serde_json::from_value(body)
            .map_err(|e| format!("a split task's message is malformed: {e}"))?;
        let missing = |field: &str| Err(format!("a {} message has no {field}", task.mediaonce));
        match task.mediaonce.as_str() {
            CHUNK_TASK if task.span.is_none() => return missing("span"),
            JOIN_TASK | END_TASK if task.spans.is_none() => return missing("spans"),
            END_TASK if task.outcome.is_none() => return missing("outcome"),
            _ => {}
        }
        if task.job.locations.is_empty() {
            return missing("location of its input");
        }
        Ok(task)
    }

    /// The spans the message names (a chunk's one, or every one).
    pub fn spans(&self) -> Vec<Span> {
        match (&self.spans, &self.span) {
            (Some(spans), _) => spans.clone(),
            (None, Some(span)) => vec![*span],
            (None, None) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input() -> ExecutionInput {
        ExecutionInput {
            job: SplitJob {
                key: "k".repeat(64),
                input_hash: "h".repeat(64),
                recipe_name: "hls".into(),
                recipe: json!({"step": "hls-package", "version": 1, "params": {"ladder": [144]}}),
                output_prefix: "s3://out/derived/k/".into(),
                locations: vec![Location {
                    bucket: "in".into(),
                    key: "talks/long.mp4".into(),
                    version_id: Some("v1".into()),
                    etag: "e".into(),
                }],
                hand_on_queue_url: "https://sqs/q".into(),
            },
            queue_url: "https://sqs/chunks".into(),
            limits: Limits::standard(40),
            spans: vec![
                Span {
                    index: 0,
                    start_ms: 0,
                    end_ms: Some(60_000),
                },
                Span {
                    index: 1,
                    start_ms: 60_000,
                    end_ms: None,
                },
            ],
        }
    }

    #[test]
    fn the_input_names_what_the_definition_reads() {
        let value = serde_json::to_value(input()).unwrap();
        // The definition's paths: $.spans, $.queueUrl, $.job, $.limits.*.
        assert!(value["spans"].is_array());
        assert!(value["queueUrl"].is_string());
        for limit in [
            "maxConcurrency",
            "heartbeatSeconds",
            "chunkSeconds",
            "joinSeconds",
        ] {
            assert!(value["limits"][limit].is_u64(), "{limit}");
        }
        assert_eq!(value["job"]["locations"][0]["eTag"], "e");
        assert_eq!(value["spans"][1]["endMs"], Value::Null);
        let back: ExecutionInput = serde_json::from_value(value).unwrap();
        assert_eq!(back, input());
    }

    #[test]
    fn the_documented_chunk_task_fixture_round_trips() {
        let event: Value =
            serde_json::from_str(include_str!("../../events/hls-chunk.json")).unwrap();
        let body = event["Records"][0]["body"].as_str().unwrap();
        let value: Value = serde_json::from_str(body).unwrap();
        assert!(SplitTask::is_task(&value));
        let task = SplitTask::from_value(value.clone()).unwrap();
        assert_eq!(task.mediaonce, CHUNK_TASK);
        assert_eq!(
            task.spans(),
            [Span {
                index: 2,
                start_ms: 120_000,
                end_ms: Some(180_000)
            }]
        );
        assert!(task.job.package_recipe().is_ok());
        let again = serde_json::to_value(&task).unwrap();
        for field in ["mediaonce", "taskToken", "execution", "job", "span"] {
            assert_eq!(again[field], value[field], "{field}");
        }
    }

    #[test]
    fn the_documented_status_change_fixture_names_its_execution_and_job() {
        let event: Value =
            serde_json::from_str(include_str!("../../events/split-execution-aborted.json"))
                .unwrap();
        let body: Value =
            serde_json::from_str(event["Records"][0]["body"].as_str().unwrap()).unwrap();
        assert!(ExecutionClosed::is_status_change(&body));
        let closed = ExecutionClosed::from_value(&body).unwrap();
        assert_eq!(closed.status, "ABORTED");
        let input: ExecutionInput = serde_json::from_str(closed.input.as_deref().unwrap()).unwrap();
        assert_eq!(closed.job_key(), Some(input.job.key.as_str()));
        let mut no_arn = body.clone();
        no_arn["detail"]
            .as_object_mut()
            .unwrap()
            .remove("executionArn");
        assert!(ExecutionClosed::from_value(&no_arn)
            .unwrap_err()
            .contains("executionArn"));
    }

    #[test]
    fn task_messages_parse_as_the_definition_sends_them() {
        let job = serde_json::to_value(input().job).unwrap();
        let chunk = json!({"mediaonce": CHUNK_TASK, "taskToken": "t", "execution": "arn:x",
            "job": job, "span": {"index": 1, "startMs": 60000, "endMs": null}});
        assert!(SplitTask::is_task(&chunk));
        let task = SplitTask::from_value(chunk).unwrap();
        assert_eq!(
            task.spans(),
            [Span {
                index: 1,
                start_ms: 60_000,
                end_ms: None
            }]
        );
        let failed = json!({"mediaonce": FAILED_TASK, "taskToken": "t", "execution": "arn:x",
            "job": job, "failure": {"Error": "mediaonce.Unprocessable", "Cause": "chunk 1: bad"}});
        let task = SplitTask::from_value(failed).unwrap();
        assert_eq!(
            task.failure.unwrap().error.as_deref(),
            Some("mediaonce.Unprocessable")
        );
        let no_span = json!({"mediaonce": CHUNK_TASK, "taskToken": "t", "execution": "arn:x",
            "job": job});
        assert!(SplitTask::from_value(no_span).unwrap_err().contains("span"));
        assert!(!SplitTask::is_task(&json!({"mediaonce": "pipeline/1"})));
    }
}
