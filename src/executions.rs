//! Step Functions executions: the calls mediaonce makes to run a long
//! video's split as an execution of `statemachine/hls-split.asl.json`
//! (issue 38; DESIGN.md, "Chunked HLS"). One trait, one async method per
//! call: [`SfnExecutions`] on AWS, [`InMemoryExecutions`] for tests and
//! local runs, keeping Step Functions' rules that the split leans on:
//!
//! - an execution's name is unique per state machine: a start with the
//!   name and input of an execution returns that execution, and with other
//!   input is refused ([`ExecutionErrorKind::AlreadyExists`]), so a start
//!   repeated by a redelivery starts nothing twice;
//! - a task token is answered once: an answer to a task that ended (or
//!   never was) is refused ([`ExecutionErrorKind::TaskGone`]), which a
//!   worker answering late takes as done.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::aws::describe_error;
use crate::error::ErrorKind;

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExecutionStatus {
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Aborted,
}

/// How far an execution got, from its history: what `mediaonce status`
/// prints beside the job's row.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExecutionProgress {
    /// The Map's iterations (one a chunk) started, succeeded and failed.
    pub chunks_started: u64,
    pub chunks_succeeded: u64,
    pub chunks_failed: u64,
    /// Tasks that failed (each retried or caught) or timed out.
    pub task_failures: u64,
    pub task_timeouts: u64,
    /// States entered: what Step Functions bills a Standard workflow for
    /// (its state transitions).
    pub states_entered: u64,
    /// History events read.
    pub events: u64,
}

/// What kind of refusal an execution call met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionErrorKind {
    /// `ExecutionAlreadyExists`: the name is taken by an execution with
    /// other input.
    AlreadyExists,
    /// The task ended already, or its token was never issued
    /// (`TaskTimedOut`, `TaskDoesNotExist`, `InvalidToken`).
    TaskGone,
    /// Throttled, a 5xx, a timeout: worth trying again.
    Transient,
    /// Anything else: denied, invalid, malformed.
    Other,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{call} failed: {message}")]
pub struct ExecutionError {
    /// The call, for example `StartExecution`.
    pub call: &'static str,
    pub message: String,
    pub kind: ExecutionErrorKind,
}

/// The Step Functions calls mediaonce makes.
#[async_trait::async_trait]
pub trait ExecutionClient: Send + Sync + std::fmt::Debug {
    /// StartExecution of `machine_arn` named `name` with `input` (JSON
    /// text): the execution's ARN, the same for a start repeated with the
    /// same name and input.
    async fn start_execution(
        &self,
        machine_arn: &str,
        name: &str,
        input: &str,
    ) -> Result<String, ExecutionError>;

    /// DescribeExecution: its status, `None` when there is no such
    /// execution.
    async fn describe_execution(
        &self,
        execution_arn: &str,
    ) -> Result<Option<ExecutionStatus>, ExecutionError>;

    /// SendTaskSuccess with `output` (JSON text).
    async fn send_task_success(&self, token: &str, output: &str) -> Result<(), ExecutionError>;

    /// SendTaskFailure with an error name (the definition's `Retry` and
    /// `Catch` match on it) and a cause for people.
    async fn send_task_failure(
        &self,
        token: &str,
        error: &str,
        cause: &str,
    ) -> Result<(), ExecutionError>;

    /// SendTaskHeartbeat: the task's worker is alive.
    async fn send_task_heartbeat(&self, token: &str) -> Result<(), ExecutionError>;

    /// GetExecutionHistory, every page, counted: how far the execution
    /// got.
    async fn execution_progress(
        &self,
        execution_arn: &str,
    ) -> Result<ExecutionProgress, ExecutionError>;
}

/// The prefix of every execution ARN of the state machine `machine_arn`
/// (`arn:<partition>:states:<region>:<account>:execution:<name>:`), or
/// `None` when it is not a state machine's ARN. Pure.
pub fn executions_prefix(machine_arn: &str) -> Option<String> {
    let parts: Vec<&str> = machine_arn.split(':').collect();
    match parts.as_slice() {
        ["arn", partition, "states", region, account, "stateMachine", name]
            if !name.is_empty() && !region.is_empty() && !account.is_empty() =>
        {
            Some(format!(
                "arn:{partition}:states:{region}:{account}:execution:{name}:"
            ))
        }
        _ => None,
    }
}

/// The ARN of the execution `name` of the state machine `machine_arn`,
/// as StartExecution will answer it. Pure.
pub fn execution_arn(machine_arn: &str, name: &str) -> String {
    format!(
        "{}:{name}",
        machine_arn.replacen(":stateMachine:", ":execution:", 1)
    )
}

/// The name of the execution that runs job `job_key`'s split for the
/// claim `owner`: the job key and 12 hex digits of the owner token's
/// SHA-256 (77 characters: names hold 80). One claim, one name: a
/// redelivery of the claimant's start starts nothing twice, and a
/// takeover (a new owner) starts an execution of its own. Pure.
pub fn execution_name(job_key: &str, owner: &str) -> String {
    let owner_hash = crate::key::sha256_hex(owner.as_bytes());
    format!("{job_key}-{}", &owner_hash[..12])
}

/// The kind of a Step Functions error: by its code, else by the kind
/// every client's errors have ([`ErrorKind`]). Pure.
pub fn error_kind(code: Option<&str>, kind: ErrorKind) -> ExecutionErrorKind {
    match code {
        Some("ExecutionAlreadyExists") => ExecutionErrorKind::AlreadyExists,
        Some("TaskTimedOut" | "TaskDoesNotExist" | "InvalidToken") => ExecutionErrorKind::TaskGone,
        _ if kind == ErrorKind::Transient => ExecutionErrorKind::Transient,
        _ => ExecutionErrorKind::Other,
    }
}

/// Step Functions.
#[derive(Debug, Clone)]
pub struct SfnExecutions {
    client: aws_sdk_sfn::Client,
}

impl SfnExecutions {
    pub fn new(client: aws_sdk_sfn::Client) -> Self {
        SfnExecutions { client }
    }
}

fn sdk_error<E, R>(
    call: &'static str,
    err: &aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> ExecutionError
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + crate::aws::HasStatus,
{
    use aws_smithy_types::error::metadata::ProvideErrorMetadata;
    ExecutionError {
        call,
        message: describe_error(err),
        kind: error_kind(err.code(), ErrorKind::of_sdk(err)),
    }
}

#[async_trait::async_trait]
impl ExecutionClient for SfnExecutions {
    async fn start_execution(
        &self,
        machine_arn: &str,
        name: &str,
        input: &str,
    ) -> Result<String, ExecutionError> {
        self.client
            .start_execution()
            .state_machine_arn(machine_arn)
            .name(name)
            .input(input)
            .send()
            .await
            .map(|out| out.execution_arn)
            .map_err(|err| sdk_error("StartExecution", &err))
    }

    async fn describe_execution(
        &self,
        execution_arn: &str,
    ) -> Result<Option<ExecutionStatus>, ExecutionError> {
        use aws_sdk_sfn::types::ExecutionStatus as Sdk;
        match self
            .client
            .describe_execution()
            .execution_arn(execution_arn)
            .send()
            .await
        {
            Ok(out) => Ok(Some(match out.status {
                Sdk::Running | Sdk::PendingRedrive => ExecutionStatus::Running,
                Sdk::Succeeded => ExecutionStatus::Succeeded,
                Sdk::TimedOut => ExecutionStatus::TimedOut,
                Sdk::Aborted => ExecutionStatus::Aborted,
                _ => ExecutionStatus::Failed,
            })),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_execution_does_not_exist()) =>
            {
                Ok(None)
            }
            Err(err) => Err(sdk_error("DescribeExecution", &err)),
        }
    }

    async fn send_task_success(&self, token: &str, output: &str) -> Result<(), ExecutionError> {
        self.client
            .send_task_success()
            .task_token(token)
            .output(output)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| sdk_error("SendTaskSuccess", &err))
    }

    async fn send_task_failure(
        &self,
        token: &str,
        error: &str,
        cause: &str,
    ) -> Result<(), ExecutionError> {
        self.client
            .send_task_failure()
            .task_token(token)
            .error(error)
            .cause(cause)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| sdk_error("SendTaskFailure", &err))
    }

    async fn send_task_heartbeat(&self, token: &str) -> Result<(), ExecutionError> {
        self.client
            .send_task_heartbeat()
            .task_token(token)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| sdk_error("SendTaskHeartbeat", &err))
    }

    async fn execution_progress(
        &self,
        execution_arn: &str,
    ) -> Result<ExecutionProgress, ExecutionError> {
        use aws_sdk_sfn::types::HistoryEventType as Event;
        let mut progress = ExecutionProgress::default();
        let mut pages = self
            .client
            .get_execution_history()
            .execution_arn(execution_arn)
            .max_results(1_000)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|err| sdk_error("GetExecutionHistory", &err))?;
            for event in page.events() {
                progress.events += 1;
                match event.r#type() {
                    Event::MapIterationStarted => progress.chunks_started += 1,
                    Event::MapIterationSucceeded => progress.chunks_succeeded += 1,
                    Event::MapIterationFailed | Event::MapIterationAborted => {
                        progress.chunks_failed += 1
                    }
                    Event::TaskFailed => progress.task_failures += 1,
                    Event::TaskTimedOut => progress.task_timeouts += 1,
                    _ => {}
                }
                if event.r#type().as_str().ends_with("StateEntered") {
                    progress.states_entered += 1;
                }
            }
        }
        Ok(progress)
    }
}

/// A task's answer, as [`InMemoryExecutions`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskAnswer {
    Success { output: String },
    Failure { error: String, cause: String },
}

/// A task as Step Functions holds it: its heartbeats (and when the last
/// came, on a timed twin), and its answer once given.
#[derive(Debug, Default)]
struct TaskState {
    beats: u64,
    last_beat_ms: Option<u64>,
    answer: Option<TaskAnswer>,
}

#[derive(Debug, Default)]
struct Machines {
    /// Executions by ARN: their input and status.
    executions: BTreeMap<String, (String, ExecutionStatus)>,
    /// Tasks by token.
    tasks: BTreeMap<String, TaskState>,
}

/// The time a timed twin reads (epoch ms).
type Now = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Step Functions in memory: starts and answers recorded under Step
/// Functions' rules (a name is one execution; a token is answered once).
/// A test drives the executions: it issues the tokens a state machine
/// would ([`InMemoryExecutions::issue_task`]), times them out
/// ([`InMemoryExecutions::time_out`]) and ends executions
/// ([`InMemoryExecutions::end`]).
#[derive(Default)]
pub struct InMemoryExecutions {
    machines: Mutex<Machines>,
    /// When set, each heartbeat's time is kept, for a model of the
    /// definition's `HeartbeatSeconds`.
    now: Option<Now>,
}

impl std::fmt::Debug for InMemoryExecutions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryExecutions")
            .field("machines", &*self.machines())
            .field("timed", &self.now.is_some())
            .finish()
    }
}

impl InMemoryExecutions {
    /// A twin that keeps the time of each heartbeat, read from `now`.
    pub fn timed(now: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        InMemoryExecutions {
            machines: Mutex::default(),
            now: Some(Arc::new(now)),
        }
    }

    fn machines(&self) -> std::sync::MutexGuard<'_, Machines> {
        self.machines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ARN Step Functions gives an execution of `machine_arn` named
    /// `name` (`arn:...:stateMachine:M` → `arn:...:execution:M:name`).
    pub fn execution_arn(machine_arn: &str, name: &str) -> String {
        execution_arn(machine_arn, name)
    }

    /// The executions started, by ARN, with their input.
    pub fn started(&self) -> BTreeMap<String, String> {
        self.machines()
            .executions
            .iter()
            .map(|(arn, (input, _))| (arn.clone(), input.clone()))
            .collect()
    }

    /// An execution's status.
    pub fn status_of(&self, execution_arn: &str) -> Option<ExecutionStatus> {
        self.machines()
            .executions
            .get(execution_arn)
            .map(|(_, status)| *status)
    }

    /// A task the state machine starts: its token can be answered once.
    pub fn issue_task(&self, token: &str) {
        self.machines()
            .tasks
            .insert(token.to_string(), TaskState::default());
    }

    /// The answer `token` got, if any.
    pub fn answer_of(&self, token: &str) -> Option<TaskAnswer> {
        self.machines()
            .tasks
            .get(token)
            .and_then(|t| t.answer.clone())
    }

    /// The heartbeats `token` got.
    pub fn heartbeats_of(&self, token: &str) -> u64 {
        self.machines().tasks.get(token).map_or(0, |t| t.beats)
    }

    /// When `token`'s last heartbeat came (a timed twin's).
    pub fn last_heartbeat_ms(&self, token: &str) -> Option<u64> {
        self.machines()
            .tasks
            .get(token)
            .and_then(|t| t.last_beat_ms)
    }

    /// The state machine's timeout of a task not answered: `error`
    /// (`States.HeartbeatTimeout` or `States.Timeout`) is its answer, and
    /// the worker's later calls with the token find it gone.
    pub fn time_out(&self, token: &str, error: &str) {
        if let Some(task) = self.machines().tasks.get_mut(token) {
            task.answer.get_or_insert_with(|| TaskAnswer::Failure {
                error: error.to_string(),
                cause: "the task's time ran out".into(),
            });
        }
    }

    /// Ends an execution with `status`, as its state machine would.
    pub fn end(&self, execution_arn: &str, status: ExecutionStatus) {
        if let Some(execution) = self.machines().executions.get_mut(execution_arn) {
            execution.1 = status;
        }
    }

    fn answer(
        &self,
        call: &'static str,
        token: &str,
        answer: TaskAnswer,
    ) -> Result<(), ExecutionError> {
        match self.machines().tasks.get_mut(token) {
            Some(task) if task.answer.is_none() => {
                task.answer = Some(answer);
                Ok(())
            }
            _ => Err(task_gone(call, token)),
        }
    }
}

fn task_gone(call: &'static str, token: &str) -> ExecutionError {
    ExecutionError {
        call,
        message: format!("TaskTimedOut: the task of token {token} is not running"),
        kind: ExecutionErrorKind::TaskGone,
    }
}

#[async_trait::async_trait]
impl ExecutionClient for InMemoryExecutions {
    async fn start_execution(
        &self,
        machine_arn: &str,
        name: &str,
        input: &str,
    ) -> Result<String, ExecutionError> {
        let arn = Self::execution_arn(machine_arn, name);
        let mut machines = self.machines();
        match machines.executions.get(&arn) {
            Some((started, _)) if started != input => Err(ExecutionError {
                call: "StartExecution",
                message: format!("ExecutionAlreadyExists: Execution Already Exists: '{arn}'"),
                kind: ExecutionErrorKind::AlreadyExists,
            }),
            Some(_) => Ok(arn),
            None => {
                machines
                    .executions
                    .insert(arn.clone(), (input.to_string(), ExecutionStatus::Running));
                Ok(arn)
            }
        }
    }

    async fn describe_execution(
        &self,
        execution_arn: &str,
    ) -> Result<Option<ExecutionStatus>, ExecutionError> {
        Ok(self
            .machines()
            .executions
            .get(execution_arn)
            .map(|(_, status)| *status))
    }

    /// No history is kept in memory (the test drives the states): every
    /// count is 0.
    async fn execution_progress(
        &self,
        _execution_arn: &str,
    ) -> Result<ExecutionProgress, ExecutionError> {
        Ok(ExecutionProgress::default())
    }

    async fn send_task_success(&self, token: &str, output: &str) -> Result<(), ExecutionError> {
        self.answer(
            "SendTaskSuccess",
            token,
            TaskAnswer::Success {
                output: output.to_string(),
            },
        )
    }

    async fn send_task_failure(
        &self,
        token: &str,
        error: &str,
        cause: &str,
    ) -> Result<(), ExecutionError> {
        self.answer(
            "SendTaskFailure",
            token,
            TaskAnswer::Failure {
                error: error.to_string(),
                cause: cause.to_string(),
            },
        )
    }

    async fn send_task_heartbeat(&self, token: &str) -> Result<(), ExecutionError> {
        let now = self.now.as_ref().map(|now| now());
        match self.machines().tasks.get_mut(token) {
            Some(task) if task.answer.is_none() => {
                task.beats += 1;
                task.last_beat_ms = now.or(task.last_beat_ms);
                Ok(())
            }
            _ => Err(task_gone("SendTaskHeartbeat", token)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_by_their_codes() {
        // As an answer's status and code come to it.
        let error_kind =
            |status, code| super::error_kind(code, ErrorKind::of_response(status, code));
        assert_eq!(
            error_kind(400, Some("ExecutionAlreadyExists")),
            ExecutionErrorKind::AlreadyExists
        );
        for code in ["TaskTimedOut", "TaskDoesNotExist", "InvalidToken"] {
            assert_eq!(
                error_kind(400, Some(code)),
                ExecutionErrorKind::TaskGone,
                "{code}"
            );
        }
        assert_eq!(
            error_kind(400, Some("ThrottlingException")),
            ExecutionErrorKind::Transient
        );
        assert_eq!(error_kind(503, None), ExecutionErrorKind::Transient);
        assert_eq!(
            error_kind(400, Some("InvalidArn")),
            ExecutionErrorKind::Other
        );
    }

    #[test]
    fn a_claims_execution_is_named_by_its_job_and_owner_and_fits_a_name() {
        let job = "a".repeat(64);
        let name = execution_name(&job, "request-1/uuid");
        assert_eq!(name.len(), 77);
        assert!(name.starts_with(&format!("{job}-")));
        assert_eq!(name, execution_name(&job, "request-1/uuid"));
        assert_ne!(name, execution_name(&job, "request-2/uuid"));
        let machine = "arn:aws:states:eu-west-1:123456789012:stateMachine:split";
        let prefix = executions_prefix(machine).unwrap();
        assert!(execution_arn(machine, &name).starts_with(&prefix));
        assert_eq!(
            prefix,
            "arn:aws:states:eu-west-1:123456789012:execution:split:"
        );
        for bad in [
            "arn:aws:states:eu-west-1:123456789012:activity:split",
            "arn:aws:sqs:eu-west-1:123456789012:stateMachine:split",
            "split",
        ] {
            assert_eq!(executions_prefix(bad), None, "{bad}");
        }
    }

    #[test]
    fn execution_arns_follow_the_machines() {
        assert_eq!(
            InMemoryExecutions::execution_arn(
                "arn:aws:states:us-east-1:123456789012:stateMachine:hls-split",
                "k-1"
            ),
            "arn:aws:states:us-east-1:123456789012:execution:hls-split:k-1"
        );
    }
}
