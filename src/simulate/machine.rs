//! The split's state machine in the simulated month: a model of
//! `statemachine/hls-split.asl.json` over [`InMemoryExecutions`], the
//! client the real handler starts executions and answers tasks with. Each
//! step of the month it moves every execution on as Step Functions would:
//! a started execution sends its chunk tasks (at most `maxConcurrency` at
//! once), each a message with a fresh task token; an answered token moves
//! its execution on: a chunk done, a transient failure retried with a new
//! token after the definition's backoff, any other failure caught into
//! the failure task and its announcement; every chunk done, the join, then
//! the announcement. A task silent past its `HeartbeatSeconds` (from when
//! it was sent, or its last heartbeat) or unanswered past its
//! `TimeoutSeconds` times out, and is retried or caught as the definition
//! says. What it does is counted: executions, tasks, retries
//! and state transitions (one per state entered, as Step Functions bills).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::executions::{ExecutionStatus, InMemoryExecutions, TaskAnswer};
use crate::pipeline::split::{
    ExecutionInput, Limits, CHUNK_TASK, END_TASK, FAILED_TASK, JOIN_TASK,
};

/// The simulated state machine's ARN.
pub const MACHINE_ARN: &str = "arn:aws:states:us-east-1:000000000000:stateMachine:mediaonce-split";

/// The definition's retry of `mediaonce.Transient`: 2 s, doubling, 5 times.
const RETRY_FIRST_MS: u64 = 2_000;
const RETRY_ATTEMPTS: u32 = 5;
/// Its retry of a chunk's or the join's timeout: after 960 s, twice.
const TIMEOUT_RETRY_MS: u64 = 960_000;
const TIMEOUT_ATTEMPTS: u32 = 2;
/// The announcements' and the failure task's retry of any error: 2 s,
/// doubling, 8 times.
const END_ATTEMPTS: u32 = 8;
/// The errors a task's timeouts end it with.
const HEARTBEAT_TIMEOUT: &str = "States.HeartbeatTimeout";
const TIMEOUT: &str = "States.Timeout";
/// What ends a task its Map abandoned (another chunk failed).
const ABORTED: &str = "States.Aborted";

/// What the executions came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MachineCounts {
    pub executions_started: u64,
    pub executions_succeeded: u64,
    pub executions_failed: u64,
    /// Task messages sent (chunks, joins, failure tasks, announcements).
    pub tasks_sent: u64,
    pub chunk_tasks: u64,
    /// Tasks sent again by a `Retry`.
    pub task_retries: u64,
    /// States entered, as Step Functions bills a Standard workflow.
    pub state_transitions: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chunk(u32),
    Join,
    Failed,
    End { joined: bool },
}

#[derive(Debug)]
struct Task {
    kind: Kind,
    /// Retries by the retrier of its errors (transient), and of timeouts:
    /// Step Functions counts each retrier's attempts apart.
    attempts: u32,
    timeouts: u32,
    /// When it was sent, and when its last heartbeat came (or was seen).
    sent_ms: u64,
    beat_ms: u64,
    beats_seen: u64,
}

impl Task {
    /// When it times out unanswered, as last seen: its whole time (a
    /// chunk's, or the join's and the announcements') from when it was
    /// sent, and its heartbeat limit from its last heartbeat.
    fn times_out_at(&self, limits: &Limits) -> (u64, u64) {
        let whole = match self.kind {
            Kind::Chunk(_) => limits.chunk_seconds,
            _ => limits.join_seconds,
        };
        (
            self.sent_ms + u64::from(whole) * 1_000,
            self.beat_ms + u64::from(limits.heartbeat_seconds) * 1_000,
        )
    }

    fn new(kind: Kind) -> Task {
        Task {
            kind,
            attempts: 0,
            timeouts: 0,
            sent_ms: 0,
            beat_ms: 0,
            beats_seen: 0,
        }
    }
}

#[derive(Debug)]
struct Run {
    input: ExecutionInput,
    /// Chunks not sent yet, in order.
    unsent: Vec<u32>,
    done: BTreeSet<u32>,
    /// Tokens awaiting an answer.
    tasks: BTreeMap<String, Task>,
    failure: Option<Value>,
}

/// The model: the executions the handler started, moved on step by step.
#[derive(Debug)]
pub struct SimMachine {
    pub executions: Arc<InMemoryExecutions>,
    runs: BTreeMap<String, Run>,
    ended: BTreeSet<String>,
    tokens: u64,
    pub counts: MachineCounts,
}

impl SimMachine {
    pub fn new(executions: Arc<InMemoryExecutions>) -> Self {
        SimMachine {
            executions,
            runs: BTreeMap::new(),
            ended: BTreeSet::new(),
            tokens: 0,
            counts: MachineCounts::default(),
        }
    }

    /// The executions ended, by ARN.
    pub fn ended(&self) -> &BTreeSet<String> {
        &self.ended
    }

    /// Executions started and not ended.
    pub fn running(&self) -> usize {
        self.runs.len()
    }

    /// When the first task not answered times out, as last seen.
    pub fn next_timeout(&self) -> Option<u64> {
        self.runs
            .values()
            .flat_map(|run| {
                let limits = run.input.limits;
                run.tasks.values().map(move |task| {
                    let (whole, silent) = task.times_out_at(&limits);
                    whole.min(silent)
                })
            })
            .min()
    }

    /// Moves every execution on at `now_ms`: the task messages to
    /// deliver, each with when (a retry's after its backoff).
    pub fn step(&mut self, now_ms: u64) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for (arn, input) in self.executions.started() {
            if self.runs.contains_key(&arn) || self.ended.contains(&arn) {
                continue;
            }
            let Ok(input) = serde_json::from_str::<ExecutionInput>(&input) else {
                self.executions.end(&arn, ExecutionStatus::Failed);
                self.ended.insert(arn);
                continue;
            };
            self.counts.executions_started += 1;
            // The Map state.
            self.counts.state_transitions += 1;
            let unsent = input.spans.iter().rev().map(|s| s.index).collect();
            self.runs.insert(
                arn,
                Run {
                    input,
                    unsent,
                    done: BTreeSet::new(),
                    tasks: BTreeMap::new(),
                    failure: None,
                },
            );
        }
        let arns: Vec<String> = self.runs.keys().cloned().collect();
        for arn in arns {
            if let Some(status) = self.advance(&arn, now_ms, &mut out) {
                self.executions.end(&arn, status);
                match status {
                    ExecutionStatus::Succeeded => self.counts.executions_succeeded += 1,
                    _ => self.counts.executions_failed += 1,
                }
                self.runs.remove(&arn);
                self.ended.insert(arn);
            }
        }
        out
    }

    /// One execution moved on; its end status once it ends.
    fn advance(
        &mut self,
        arn: &str,
        now_ms: u64,
        out: &mut Vec<(u64, String)>,
    ) -> Option<ExecutionStatus> {
        let mut sends: Vec<(u64, Task)> = Vec::new();
        let mut ended = None;
        {
            let run = self.runs.get_mut(arn)?;
            time_out(&self.executions, run, now_ms);
            let answered: Vec<(String, TaskAnswer)> = run
                .tasks
                .keys()
                .filter_map(|token| Some((token.clone(), self.executions.answer_of(token)?)))
                .collect();
            for (token, answer) in answered {
                // A task the Map abandoned (below) is gone with it.
                let Some(task) = run.tasks.remove(&token) else {
                    continue;
                };
                match (task.kind, answer) {
                    (Kind::Chunk(index), TaskAnswer::Success { .. }) => {
                        run.done.insert(index);
                    }
                    (Kind::Join, TaskAnswer::Success { .. }) => {
                        sends.push((now_ms, Task::new(Kind::End { joined: true })));
                    }
                    (Kind::Failed, TaskAnswer::Success { .. }) => {
                        sends.push((now_ms, Task::new(Kind::End { joined: false })));
                    }
                    (Kind::End { joined }, TaskAnswer::Success { .. }) => {
                        // The announcement's end, then `Fail` on the failure path.
                        ended = Some(if joined {
                            ExecutionStatus::Succeeded
                        } else {
                            ExecutionStatus::Failed
                        });
                    }
                    (kind, TaskAnswer::Failure { error, .. })
                        if retry(kind, &error, &task).is_some() =>
                    {
                        // The definition's Retry: the task again, later.
                        let (backoff, timed_out) = retry(kind, &error, &task).expect("retried");
                        let mut again = Task::new(kind);
                        again.attempts = task.attempts + u32::from(!timed_out);
                        again.timeouts = task.timeouts + u32::from(timed_out);
                        sends.push((now_ms + backoff, again));
                        self.counts.task_retries += 1;
                    }
                    (Kind::Chunk(_) | Kind::Join, TaskAnswer::Failure { error, cause }) => {
                        // Caught: the chunks still out are abandoned.
                        if run.failure.is_none() {
                            run.failure = Some(json!({"Error": error, "Cause": cause}));
                            // Their tokens end with the Map's iterations: a
                            // worker's later call with one finds it gone.
                            run.tasks.retain(|token, t| {
                                let chunk = matches!(t.kind, Kind::Chunk(_));
                                if chunk {
                                    self.executions.time_out(token, ABORTED);
                                }
                                !chunk
                            });
                            run.unsent.clear();
                            sends.retain(|(_, t)| !matches!(t.kind, Kind::Chunk(_)));
                            sends.push((now_ms, Task::new(Kind::Failed)));
                        }
                    }
                    (Kind::Failed | Kind::End { .. }, TaskAnswer::Failure { .. }) => {
                        ended = Some(ExecutionStatus::Failed);
                    }
                }
            }
            if run.failure.is_none() && ended.is_none() {
                let limit = match run.input.limits.max_concurrency {
                    0 => usize::MAX,
                    n => n as usize,
                };
                let is_chunk = |t: &Task| matches!(t.kind, Kind::Chunk(_));
                let out_now = run.tasks.values().filter(|t| is_chunk(t)).count()
                    + sends.iter().filter(|(_, t)| is_chunk(t)).count();
                for _ in out_now..limit {
                    let Some(index) = run.unsent.pop() else { break };
                    sends.push((now_ms, Task::new(Kind::Chunk(index))));
                }
                let past_chunks = run.tasks.values().any(|t| !is_chunk(t))
                    || sends.iter().any(|(_, t)| !is_chunk(t));
                if run.done.len() == run.input.spans.len() && !past_chunks {
                    sends.push((now_ms, Task::new(Kind::Join)));
                }
            }
        }
        if ended.is_some() {
            return ended;
        }
        for (at, mut task) in sends {
            task.sent_ms = at;
            task.beat_ms = at;
            let body = self.send(arn, task);
            out.push((at, body));
        }
        None
    }

    /// A task's message with a fresh token.
    fn send(&mut self, arn: &str, task: Task) -> String {
        self.tokens += 1;
        let token = format!("sim-token-{}", self.tokens);
        self.executions.issue_task(&token);
        self.counts.tasks_sent += 1;
        self.counts.state_transitions += 1;
        let run = self.runs.get_mut(arn).expect("running");
        let job = serde_json::to_value(&run.input.job).expect("the job serializes");
        let spans = serde_json::to_value(&run.input.spans).expect("spans serialize");
        let mut body = json!({"taskToken": token, "execution": arn, "job": job});
        match task.kind {
            Kind::Chunk(index) => {
                self.counts.chunk_tasks += 1;
                let span = run.input.spans.iter().find(|s| s.index == index).copied();
                body["mediaonce"] = CHUNK_TASK.into();
                body["span"] = serde_json::to_value(span).expect("a span serializes");
            }
            Kind::Join => {
                body["mediaonce"] = JOIN_TASK.into();
                body["spans"] = spans;
            }
            Kind::Failed => {
                body["mediaonce"] = FAILED_TASK.into();
                body["failure"] = run.failure.clone().unwrap_or(Value::Null);
            }
            Kind::End { joined } => {
                body["mediaonce"] = END_TASK.into();
                body["spans"] = spans;
                body["outcome"] = if joined { "joined" } else { "failed" }.into();
            }
        }
        run.tasks.insert(token, task);
        body.to_string()
    }
}

/// The definition's `Retry` of a task that failed with `error`: after
/// how long it is sent again, and whether the timeouts' retrier sends it;
/// `None` once the retrier's attempts are spent (or none matches). A
/// chunk's or the join's transient failure 5 times (2 s, doubling), its
/// timeouts twice (960 s); any failure of the failure task or an
/// announcement 8 times (2 s, doubling).
fn retry(kind: Kind, error: &str, task: &Task) -> Option<(u64, bool)> {
    match kind {
        Kind::Chunk(_) | Kind::Join => match error {
            "mediaonce.Transient" if task.attempts < RETRY_ATTEMPTS => {
                Some((RETRY_FIRST_MS << task.attempts, false))
            }
            HEARTBEAT_TIMEOUT | TIMEOUT if task.timeouts < TIMEOUT_ATTEMPTS => {
                Some((TIMEOUT_RETRY_MS, true))
            }
            _ => None,
        },
        Kind::Failed | Kind::End { .. } => {
            (task.attempts < END_ATTEMPTS).then(|| (RETRY_FIRST_MS << task.attempts, false))
        }
    }
}

/// Times out `run`'s tasks not answered at `now_ms`: past their whole
/// time, or silent past the heartbeat limit since they were sent or last
/// heartbeat ([`Task::times_out_at`]).
fn time_out(executions: &InMemoryExecutions, run: &mut Run, now_ms: u64) {
    let limits = run.input.limits;
    for (token, task) in &mut run.tasks {
        if executions.answer_of(token).is_some() {
            continue;
        }
        let beats = executions.heartbeats_of(token);
        if beats > task.beats_seen {
            task.beats_seen = beats;
            task.beat_ms = executions.last_heartbeat_ms(token).unwrap_or(now_ms);
        }
        let (whole, silent) = task.times_out_at(&limits);
        if now_ms >= whole {
            executions.time_out(token, TIMEOUT);
        } else if now_ms >= silent {
            executions.time_out(token, HEARTBEAT_TIMEOUT);
        }
    }
}
