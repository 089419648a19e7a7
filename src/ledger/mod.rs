//! The claim ledger: one row per job key, claimed before any work.
//!
//! See DESIGN.md for the state machine. In short: a conditional put creates
//! the row (`running`, attempts 1); if a row exists, its state decides:
//! `done` is reused, a live `running` lease is busy, a `failed` row at the
//! attempts cap is poisoned, and a `failed` row or an expired lease is taken
//! over by one conditional update on the owner just read. Finishing is
//! conditioned on still being the owner.
//!
//! The algorithm ([`Ledger`]) is written once over [`LedgerTable`], one
//! method per DynamoDB call: [`dynamodb::DynamoDbTable`] is the real one,
//! [`memory::InMemoryTable`] keeps rows in a map (unit tests, local tools),
//! and [`faults::FaultyTable`] injects failures into either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::identity::ObjectVersion;
use crate::lease::is_live;
use crate::references::{RefChange, RefHolder, VersionName, VersionRefs};

// DynamoDB's contention, modelled: the simulation's and the tests'.
mod collection;
pub mod contention;
pub mod dynamodb;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod faults;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
pub(crate) mod faults;
mod items;
pub use collection::{collectable, seal_mark, unsealed, CollectDue, CollectRequest, DeferCollect};
// In memory: the simulation's (`mediaonce simulate`) and the tests'.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod memory;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
pub(crate) mod memory;

/// Attribute names of a job row, named once.
pub mod attr {
    pub const JOB_KEY: &str = "job_key";
    pub const STEP: &str = "step";
    pub const INPUT_HASH: &str = "input_hash";
    pub const STATUS: &str = "status";
    pub const LEASE_UNTIL_MS: &str = "lease_until_ms";
    pub const ATTEMPTS: &str = "attempts";
    pub const OWNER: &str = "owner";
    pub const OUTPUT_PREFIX: &str = "output_prefix";
    pub const ERROR: &str = "error";
    pub const UPDATED_AT_MS: &str = "updated_at_ms";
    pub const FAILURES: &str = "failures";
    pub const PERMANENT: &str = "permanent";
    /// Collections of the job that failed since it was last collectable.
    pub const COLLECT_FAILURES: &str = "collect_failures";
    /// No collection of the job starts before this (epoch ms).
    pub const COLLECT_RETRY_AT_MS: &str = "collect_retry_at_ms";
    /// A collection began deleting the outputs (epoch ms).
    pub const DELETES_STARTED_AT_MS: &str = "deletes_started_at_ms";
    /// The status a row had when its collection began: a collection that
    /// finds the job referenced gives it back in that status, so only a
    /// row that was `done` (a run wrote its manifest) is `done` again.
    pub const COLLECTED_FROM: &str = "collected_from";
    /// S: the ARN of the Step Functions execution that runs the job's
    /// split (DESIGN.md, "Chunked HLS"), recorded by its claimant before
    /// it starts it; removed by a takeover.
    pub const SPLIT_EXECUTION: &str = "split_execution";
}

/// Stored errors are cut to this many characters.
pub const MAX_ERROR_CHARS: usize = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JobStatus {
    Running,
    Done,
    Failed,
    /// No version references it any more: its outputs are being deleted,
    /// then the row. Claims and references wait (busy).
    Collecting,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Collecting => "collecting",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "running" => Some(JobStatus::Running),
            "done" => Some(JobStatus::Done),
            "failed" => Some(JobStatus::Failed),
            "collecting" => Some(JobStatus::Collecting),
            _ => None,
        }
    }
}

/// One job's row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobRow {
    pub job_key: String,
    pub step: String,
    pub input_hash: String,
    pub status: JobStatus,
    pub lease_until_ms: u64,
    pub attempts: u64,
    pub owner: String,
    pub output_prefix: String,
    pub error: Option<String>,
    pub updated_at_ms: u64,
    /// Runs that ended failed (a takeover of an expired lease is not one).
    pub failures: u64,
    /// The last failure can never succeed (an undecodable input): no retry.
    pub permanent: bool,
    /// Every version referencing the job has a reference item (rows
    /// claimed since reference items; `mediaonce refs seal` sets it on
    /// older rows). A row without it is never collected.
    pub ref_items: bool,
    /// The nonce of the last release of the job (or of its finish): the
    /// sweep's sign that nothing may reference it now. `None`: nothing to
    /// look at.
    pub free_mark: Option<String>,
    /// When `free_mark` was written (epoch ms).
    pub released_at_ms: Option<u64>,
    /// When a collection found no reference and began deleting the
    /// outputs (epoch ms): from then on they are partial, and the job is
    /// never given back as `done`.
    pub deletes_started_at_ms: Option<u64>,
    /// Collections of this job that failed (`collect_failures`).
    pub collect_failures: u64,
    /// A failed collection backs off: no collection starts before this.
    pub collect_retry_at_ms: Option<u64>,
    /// While `collecting`: the status the row had when its collection
    /// began (`collected_from`), what a collection that finds the job
    /// referenced gives it back as. `None` outside a collection; a
    /// collection begun before this attribute existed reads `None` (or
    /// `Collecting`), and is given back `failed`, retryable
    /// ([`JobRow::kept_status`]).
    pub collected_from: Option<JobStatus>,
    /// The ARN of the Step Functions execution running the job's split
    /// (its claimant's): while it runs the job is held, and its end
    /// finishes the job.
    pub execution: Option<String>,
}

/// The claim's run is split by a Step Functions execution
/// ([`LedgerTable::record_execution`]): its ARN recorded (before the
/// execution starts) and the lease set to the execution's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionRecord<'a> {
    pub owner: &'a str,
    pub execution: &'a str,
    pub lease_until_ms: u64,
}

/// How a claim ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish<'a> {
    Done,
    /// `permanent`: no retry can fix it; the job is poisoned at once.
    Failed {
        error: &'a str,
        permanent: bool,
    },
    /// Failed for good, but not for its input's sake: `failures` is set to
    /// `failures` (the cap), so the job is poisoned, and not `permanent`.
    /// A split job whose chunk spent its runs: no run of the job can end
    /// otherwise until `mediaonce retry` of the chunk, and its waiting
    /// versions' messages go on to the dead-letter queue, as a poisoned
    /// job's do, rather than being told their input is unprocessable.
    Spent {
        error: &'a str,
        failures: u64,
    },
}

/// Runs started (first run plus takeovers) after which a job whose lease
/// expired again is poisoned instead of taken over: an input that kills
/// its worker every time (out of memory, a decoder abort) records no
/// failure, so only its runs can stop it. Twice the failures cap, so that a
/// lease lost once or twice to a slow neighbour costs no failure.
pub fn max_runs(max_attempts: u64) -> u64 {
    max_attempts.saturating_mul(2)
}

/// What an existing row means for a caller who wants to run its job. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The output exists: reuse it.
    Done,
    /// Someone holds a live lease: come back later.
    Busy,
    /// Failed, or its lease has passed: take it over.
    TakeOver,
    /// Run no more (its message goes to the DLQ): a permanent failure,
    /// `max_attempts` failures, or `max_runs` runs that never finished.
    Poisoned,
}

pub fn judge(row: &JobRow, now_ms: u64, max_attempts: u64) -> Verdict {
    let runs_spent = row.attempts >= max_runs(max_attempts);
    match row.status {
        JobStatus::Done => Verdict::Done,
        JobStatus::Failed if row.permanent || row.failures >= max_attempts || runs_spent => {
            Verdict::Poisoned
        }
        JobStatus::Failed => Verdict::TakeOver,
        JobStatus::Running if is_live(row.lease_until_ms, now_ms) => Verdict::Busy,
        JobStatus::Running if runs_spent => Verdict::Poisoned,
        JobStatus::Running => Verdict::TakeOver,
        JobStatus::Collecting if is_live(row.lease_until_ms, now_ms) => Verdict::Busy,
        // A collection that stopped half-way: its outputs may be partly
        // gone, so the job runs again from nothing (a run rewrites every
        // output and the manifest last).
        JobStatus::Collecting => Verdict::TakeOver,
    }
}

/// Why a poisoned row is poisoned, for its log event. Pure.
pub fn poison_reason(row: &JobRow) -> String {
    let error = row.error.as_deref().unwrap_or("no error recorded");
    if row.permanent {
        format!("failed permanently (no retry can fix it): {error}")
    } else if row.status == JobStatus::Running {
        format!(
            "{} runs never finished (the worker died or ran out of time each time; \
             {} failures recorded)",
            row.attempts, row.failures
        )
    } else {
        format!(
            "failed {} times in {} runs, last: {error}",
            row.failures, row.attempts
        )
    }
}

/// A request to claim a job.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub job_key: String,
    pub step: String,
    pub input_hash: String,
    pub output_prefix: String,
    /// Unique per attempt: the fencing token.
    pub owner: String,
    pub lease_until_ms: u64,
    pub now_ms: u64,
    /// A failed job that has had this many attempts is poisoned.
    pub max_attempts: u64,
}

impl JobRow {
    /// The row a first claim of `request` writes: `running`, the first
    /// attempt, leased to its owner. (Tests seed other workers' rows from
    /// it, changing what they need.)
    pub fn claimed(request: &ClaimRequest) -> JobRow {
        JobRow {
            execution: None,
            job_key: request.job_key.clone(),
            step: request.step.clone(),
            input_hash: request.input_hash.clone(),
            status: JobStatus::Running,
            lease_until_ms: request.lease_until_ms,
            attempts: 1,
            owner: request.owner.clone(),
            output_prefix: request.output_prefix.clone(),
            error: None,
            updated_at_ms: request.now_ms,
            failures: 0,
            permanent: false,
            // A new job: every reference to it is an item.
            ref_items: true,
            free_mark: None,
            released_at_ms: None,
            deletes_started_at_ms: None,
            collect_failures: 0,
            collect_retry_at_ms: None,
            collected_from: None,
        }
    }
}

/// A claim this worker holds: it must run the job and then finish it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub job_key: String,
    pub owner: String,
    /// 1 for the first run, then one more per takeover.
    pub attempt: u64,
    pub lease_until_ms: u64,
    /// Where this attempt writes: the row's `output_prefix`, which a
    /// takeover keeps, so one job's files never land in two places.
    pub output_prefix: String,
    /// The execution of the attempt taken over (a split by Step Functions
    /// that failed, or whose execution closed or never started): the new
    /// attempt releases its holds on the chunks once its own are written.
    pub superseded: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Run the job (a first run, or a takeover when `attempt` > 1).
    Run(Claim),
    /// Already done: the row says where the output is.
    Done(JobRow),
    /// Someone else holds it.
    Busy(JobRow),
    /// It failed on every allowed attempt: no more work is spent on it.
    Poisoned(JobRow),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    #[error("DynamoDB {operation} on table {table} failed: {message}")]
    Service {
        operation: &'static str,
        table: String,
        message: String,
        kind: crate::error::ErrorKind,
    },
    #[error("job row {job_key} in table {table} is malformed: {problem}")]
    MalformedRow {
        table: String,
        job_key: String,
        problem: String,
    },
    /// An item was contended: nothing was written. Retried in-process with
    /// jittered backoff ([`RetryPolicy`]) before it is reported.
    #[error("DynamoDB {operation} on table {table} was refused: {contention}")]
    Contended {
        operation: &'static str,
        table: String,
        contention: Contention,
    },
}

/// Why DynamoDB refused a call for contention. The SDK's standard retry
/// strategy retries neither a transaction cancelled for a conflict nor
/// (past its own attempts) a throttle; mediaonce does, in-process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// A transaction was cancelled with `TransactionConflict` (another
    /// transaction, or a write, was on one of its items), or a write met
    /// `TransactionConflictException` (its item was in a transaction).
    TransactionConflict,
    /// Throttled: the item's partition was past its throughput (about
    /// 1,000 write units a second per item), or the table's.
    Throttled,
}

impl std::fmt::Display for Contention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Contention::TransactionConflict => {
                "TransactionConflict (an item was in another transaction)"
            }
            Contention::Throttled => "throttled (an item or the table was past its throughput)",
        })
    }
}

impl Contention {
    /// The contention an error code names, if any (a transaction's
    /// cancellation reason, or a call's error code). Pure.
    pub fn of_code(code: &str) -> Option<Contention> {
        match code {
            "TransactionConflict" | "TransactionConflictException" => {
                Some(Contention::TransactionConflict)
            }
            "ThrottlingError"
            | "ThrottlingException"
            | "ProvisionedThroughputExceeded"
            | "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded" => Some(Contention::Throttled),
            _ => None,
        }
    }
}

/// How a contended call is retried in-process: up to `attempts` calls in
/// all, waiting a random time in `[0, min(cap, base × 2^n))` before the
/// n-th retry ("full jitter": contenders spread out instead of colliding
/// again in step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub base_ms: u64,
    pub cap_ms: u64,
}

impl Default for RetryPolicy {
    /// 8 calls, 20 ms doubling to 1 s: at most about 2.5 s of waiting, a
    /// fraction of a message's visibility timeout.
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            base_ms: 20,
            cap_ms: 1_000,
        }
    }
}

impl RetryPolicy {
    /// The same number of calls with no waiting (tests, the simulator's
    /// virtual time).
    pub fn immediate() -> Self {
        RetryPolicy {
            base_ms: 0,
            cap_ms: 0,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry `n` (1 for the first), drawn from `rng`.
    pub fn delay(&self, n: u32, rng: &Mutex<fastrand::Rng>) -> std::time::Duration {
        let ceiling = self
            .base_ms
            .saturating_mul(1u64 << n.min(20))
            .min(self.cap_ms);
        std::time::Duration::from_millis(if ceiling == 0 {
            0
        } else {
            rng.lock()
                .unwrap_or_else(|p| p.into_inner())
                .u64(0..ceiling)
        })
    }
}

/// Contended calls retried so far (the `DynamoDbRetries` of a batch).
#[derive(Debug, Default)]
pub struct Retries {
    pub conflicts: AtomicU64,
    pub throttles: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// Another worker took the job over: this one's result is not recorded.
    #[error("lost the lease on job {0}: another worker owns it now")]
    LostLease(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("there is no job {0}")]
    NotFound(String),
    #[error("job {job_key} is {status}: only a failed or poisoned job (or one whose lease has passed) can be retried")]
    NotFailed {
        job_key: String,
        status: &'static str,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// What a conditional write did.
// A row travels by value once per call and is then read: boxing it would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditional<T> {
    /// The condition held and the write happened.
    Applied(T),
    /// The condition failed; the row as it was, when the table said.
    Rejected(Option<JobRow>),
}

/// The table of job rows: one method per DynamoDB call, each atomic.
#[async_trait::async_trait]
pub trait LedgerTable: Send + Sync + std::fmt::Debug {
    /// The table's name, for messages.
    fn name(&self) -> &str;

    /// GetItem with a consistent read.
    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError>;

    /// PutItem conditioned on `attribute_not_exists(job_key)`.
    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError>;

    /// UpdateItem taking the job over: `running`, the request's owner, lease
    /// and now, attempts + 1, `ref_items` (a job never done has no
    /// references from before them), no `free_mark` or `released_at_ms`
    /// (a run is not due for collection; its finish marks it; the row's
    /// `output_prefix` is kept);
    /// conditioned on `owner` and `status` being those of `seen`. Applied:
    /// the attempts after the update.
    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError>;

    /// UpdateItem finishing a claim as `done` (removing `error`; marking it
    /// for the sweep: `free_mark` the claim's owner, `released_at_ms` now,
    /// see DESIGN.md) or `failed`
    /// (with `error`, failures + 1, and `permanent` when it is), conditioned
    /// on `owner = claim.owner AND status = running`.
    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError>;

    /// DeleteItem releasing a claim that must leave nothing behind (its
    /// input changed under it), conditioned on `owner = claim.owner AND
    /// status = running`.
    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError>;

    /// UpdateItem setting attempts and failures to 0 and removing
    /// `permanent`, conditioned on `status = failed`, or `running` with a
    /// lease that passed at `now_ms` (a job poisoned by its runs). Applied:
    /// the row as it was.
    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError>;

    /// GetItem of an object version's hash cache row (an eventually
    /// consistent read: a miss only costs a read of the object): the SHA-256
    /// mediaonce computed from its bytes, if any.
    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError>;

    /// PutItem of an object version's hash cache row, unconditional: the
    /// same version's bytes always hash the same.
    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError>;

    /// DeleteItem of an object version's hash cache row (its bytes were
    /// found to hash otherwise).
    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError>;

    /// GetItem (consistent) of a version's references row.
    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError>;

    /// TransactWriteItems applying `change`: the version row as
    /// `change.next` (conditioned on `gen` = `change.seen_gen`, or on no
    /// row), a reference item put for each added job and deleted for each
    /// removed one (conditioned on `attribute_exists` when `change.exact`).
    /// No job row is in it. All or nothing.
    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError>;

    /// UpdateItem moving a job to `collecting` (the request's owner and
    /// lease; `collected_from` its status until then, kept when a stopped
    /// collection is taken over), conditioned on a `done` row with `ref_items`, a `free_mark`
    /// and `released_at_ms` at or before the request's cut-off, or on a
    /// `collecting` row whose lease has passed (a collection that stopped),
    /// or an abandoned run ([`collectable`]). Applied: the row as it became.
    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError>;

    /// UpdateItem giving a collection up because the job is referenced:
    /// back to `back` (the status it had when the collection began,
    /// [`JobRow::kept_status`]), `collected_from` removed, the lease ended
    /// now, and `free_mark` removed when
    /// `clear_mark` names it (conditioned on `collecting` by `owner`, and
    /// on `free_mark = clear_mark` when given: a newer release's mark is
    /// never removed).
    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError>;

    /// UpdateItem recording that a collection begins deleting the job's
    /// outputs (`deletes_started_at_ms` = now), conditioned on `collecting`
    /// by `owner`.
    async fn start_deletes(
        &self,
        job_key: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError>;

    /// UpdateItem marking a job its release may have left unreferenced:
    /// `free_mark` = `nonce`, `released_at_ms` = now, conditioned on the
    /// row existing (a job collected already has nothing to mark).
    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError>;

    /// One Query page (consistent) of a job's reference items in `shard`:
    /// their version row keys and names, at most `limit`, from `from` (the last
    /// page's `next`).
    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<RefHolder>, Option<String>), LedgerError>;

    /// DeleteItem of a collected row, conditioned on `collecting` by `owner`.
    async fn end_collect(&self, job_key: &str, owner: &str)
        -> Result<Conditional<()>, LedgerError>;

    /// After a failed collection, conditioned on `collecting` by
    /// `request.owner`: the lease ends now (a claim may take the job over
    /// at once and run it again), `collect_failures` goes up by one, and no
    /// collection starts before `request.retry_at_ms`.
    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError>;

    /// One Scan page of the rows due for collection (as [`begin_collect`]'s
    /// condition says, at `due`), from `from` (the last page's `next`).
    ///
    /// [`begin_collect`]: LedgerTable::begin_collect
    async fn scan_collectable(
        &self,
        due: &CollectDue,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError>;

    /// One Scan page of the `done` rows whose count is not known complete
    /// ([`unsealed`]), from `from` (the last page's `next`).
    async fn scan_unsealed(
        &self,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError>;

    /// UpdateItem declaring a done row from before reference items
    /// complete (every bucket was rebuilt into items): `ref_items`, and a
    /// mark (`free_mark` a fresh nonce, `released_at_ms` now) so that the
    /// sweep looks at its references, conditioned on `done` and no
    /// `ref_items`.
    async fn seal_refs(&self, row: &JobRow, now_ms: u64) -> Result<Conditional<()>, LedgerError>;

    /// UpdateItem recording the execution that runs the claim's split
    /// (its ARN, the lease), conditioned on the claim's owner and
    /// `running`.
    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError>;

    /// BatchWriteItem of reference items held by `holder` (not a version:
    /// a split job's `split#<key>`), put for `add` and deleted for
    /// `remove`, unconditional, 25 at a time, each batch's unprocessed
    /// items sent again.
    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError>;
}

/// What a reference transaction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefWrite {
    Applied,
    /// Nothing was written. `version`: `Some` when the version row was not
    /// as read, with the row as it is (`None`: there is none). `missing`:
    /// removed jobs whose reference item did not exist (a mismatch).
    Cancelled {
        version: Option<Option<VersionRefs>>,
        missing: Vec<String>,
    },
}

/// The claim ledger: the claim algorithm over a [`LedgerTable`].
#[derive(Debug, Clone)]
pub struct Ledger {
    table: Arc<dyn LedgerTable>,
    /// Calls made to the table (each method of [`LedgerTable`] is one
    /// DynamoDB call): the `DynamoDbCalls` metric.
    calls: Arc<AtomicU64>,
    retry: RetryPolicy,
    retries: Arc<Retries>,
    /// The backoff's jitter.
    rng: Arc<Mutex<fastrand::Rng>>,
}

impl LedgerError {
    /// What kind of failure: `Transient` is worth retrying; a malformed row
    /// is `Other`.
    pub fn kind(&self) -> crate::error::ErrorKind {
        match self {
            LedgerError::Service { kind, .. } => *kind,
            LedgerError::MalformedRow { .. } => crate::error::ErrorKind::Other,
            LedgerError::Contended { .. } => crate::error::ErrorKind::Transient,
        }
    }
}

impl Ledger {
    pub fn new(table: impl LedgerTable + 'static) -> Self {
        Ledger {
            table: Arc::new(table),
            calls: Arc::default(),
            retry: RetryPolicy::default(),
            retries: Arc::default(),
            rng: Arc::new(Mutex::new(fastrand::Rng::new())),
        }
    }

    /// The same ledger drawing its backoff's jitter from `seed`.
    pub fn seeded(mut self, seed: u64) -> Self {
        self.rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
        self
    }

    /// The same ledger retrying contended calls as `retry` says.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// How contended calls are retried.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Contended calls retried through this ledger (and its clones).
    pub fn retries(&self) -> (u64, u64) {
        (
            self.retries.conflicts.load(Ordering::Relaxed),
            self.retries.throttles.load(Ordering::Relaxed),
        )
    }

    /// Runs `call` (one table call, made through [`Ledger::call`] so it is
    /// counted) until it is not contended, or the policy's attempts are
    /// spent: the last error then.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LedgerError>>,
    {
        let mut tries = 1;
        loop {
            match call().await {
                Err(LedgerError::Contended { contention, .. }) if tries < self.retry.attempts => {
                    let counter = match contention {
                        Contention::TransactionConflict => &self.retries.conflicts,
                        Contention::Throttled => &self.retries.throttles,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let wait = self.retry.delay(tries, &self.rng);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// The table, for one call (counted).
    fn call(&self) -> &dyn LedgerTable {
        self.calls.fetch_add(1, Ordering::Relaxed);
        &*self.table
    }

    /// Table calls made through this ledger (and its clones) so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The ledger in a DynamoDB table, its references in `<table>-refs`.
    pub fn dynamodb(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Ledger::new(dynamodb::DynamoDbTable::new(client, table))
    }

    /// The ledger in a DynamoDB table, its references in `refs_table`.
    pub fn dynamodb_with_refs(
        client: aws_sdk_dynamodb::Client,
        table: impl Into<String>,
        refs_table: impl Into<String>,
    ) -> Self {
        Ledger::new(dynamodb::DynamoDbTable::with_refs_table(
            client, table, refs_table,
        ))
    }

    pub fn table(&self) -> &str {
        self.table.name()
    }

    /// Checks at start-up that the table exists and this role can read it,
    /// so a misconfiguration fails the init instead of every message.
    pub async fn check_table(&self) -> Result<(), LedgerError> {
        self.call().get("mediaonce-startup-check").await.map(|_| ())
    }

    /// Checks at start-up that the references table exists and this role
    /// can read it (one Query): a deployment that created only the claim
    /// table would otherwise fail every job's reference transaction with
    /// an error that names no table.
    pub async fn check_refs_table(&self) -> Result<(), LedgerError> {
        self.call()
            .query_refs("mediaonce-startup-check", 0, Some(1), None)
            .await
            .map(|_| ())
    }

    /// Reads a row with a consistent read.
    pub async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        self.retrying(|| self.call().get(job_key)).await
    }

    /// The SHA-256 mediaonce computed from an object version's bytes, if it
    /// has (the hash cache shares the claim table; see [`crate::identity`]).
    pub async fn cached_input_hash(
        &self,
        version: &ObjectVersion,
    ) -> Result<Option<String>, LedgerError> {
        self.call().get_input_hash(version).await
    }

    /// Remembers the SHA-256 computed from an object version's bytes.
    pub async fn cache_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.call()
            .put_input_hash(version, input_hash, now_ms)
            .await
    }

    /// Forgets an object version's cached hash.
    pub async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.call().forget_input_hash(version).await
    }

    /// A version's references row.
    pub async fn version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.retrying(|| self.call().get_version_refs(version))
            .await
    }

    /// Records the execution that runs the claim's split
    /// ([`ExecutionRecord`]).
    pub async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.retrying(|| self.call().record_execution(job_key, record, now_ms))
            .await
    }

    /// References `jobs` from `holder` (a split job's chunks).
    pub async fn hold(
        &self,
        holder: &str,
        jobs: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.retrying(|| self.call().write_holder_refs(holder, jobs, &[], now_ms))
            .await
    }

    /// Deletes `holder`'s references to `jobs`, each job marked first (as
    /// a version's release marks its jobs): the sweep then reads their
    /// references.
    pub async fn release_held(
        &self,
        holder: &str,
        jobs: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        // Fresh per release (DESIGN.md, "Marks"): two releases in one
        // millisecond must not share a mark a collector may clear.
        let nonce = format!("{holder}/{}", uuid::Uuid::new_v4());
        for job_key in jobs {
            self.mark_released(job_key, &nonce, now_ms).await?;
        }
        self.retrying(|| self.call().write_holder_refs(holder, &[], jobs, now_ms))
            .await
    }

    /// Applies a change to a version's references (one transaction).
    pub async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        self.retrying(|| self.call().change_refs(version, change, now_ms))
            .await
    }

    /// Claims a job: a consistent read, and the row decides (a takeover is
    /// one update); a put for a new key (its failed condition returns the
    /// row that beat it, which decides).
    pub async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, LedgerError> {
        let row = JobRow::claimed(request);
        // A consistent read first: a done job (a popular content's, read
        // thousands of times a second) is reused without a write to its
        // item. It also is the read that follows the caller's reference
        // (DESIGN.md, "References").
        if let Some(existing) = self.get(&request.job_key).await? {
            return self.judged(request, existing).await;
        }
        // Twice at most: a row deleted between the failed put and the read
        // (a released claim) means the key is free again, so claim anew.
        let mut tries = 0;
        let existing = loop {
            tries += 1;
            match self.retrying(|| self.call().put_new(&row)).await? {
                Conditional::Applied(()) => {
                    return Ok(ClaimOutcome::Run(claim_of(
                        request,
                        1,
                        &request.output_prefix,
                    )))
                }
                Conditional::Rejected(Some(existing)) => break existing,
                // Some DynamoDB implementations return no item with the failure.
                Conditional::Rejected(None) => match self.get(&request.job_key).await? {
                    Some(existing) => break existing,
                    None if tries < 2 => continue,
                    // Gone twice over: the key is contended; the message
                    // comes back.
                    None => return Ok(ClaimOutcome::Busy(row)),
                },
            }
        };
        self.judged(request, existing).await
    }

    /// What an existing row means for a claim: reuse, busy, poisoned, or a
    /// takeover.
    async fn judged(
        &self,
        request: &ClaimRequest,
        existing: JobRow,
    ) -> Result<ClaimOutcome, LedgerError> {
        match judge(&existing, request.now_ms, request.max_attempts) {
            Verdict::Done => Ok(ClaimOutcome::Done(existing)),
            Verdict::Busy => Ok(ClaimOutcome::Busy(existing)),
            Verdict::Poisoned => Ok(ClaimOutcome::Poisoned(existing)),
            Verdict::TakeOver => self.take_over(request, &existing).await,
        }
    }

    /// Takes over a failed job or an expired lease, conditioned on the row
    /// being exactly as read (same owner and status). Losing the race is
    /// busy or done, never a second run.
    async fn take_over(
        &self,
        request: &ClaimRequest,
        seen: &JobRow,
    ) -> Result<ClaimOutcome, LedgerError> {
        Ok(
            match self
                .retrying(|| self.call().take_over(seen, request))
                .await?
            {
                Conditional::Applied(attempt) => ClaimOutcome::Run(Claim {
                    superseded: seen.execution.clone(),
                    ..claim_of(request, attempt, &seen.output_prefix)
                }),
                Conditional::Rejected(Some(winner)) if winner.status == JobStatus::Done => {
                    ClaimOutcome::Done(winner)
                }
                Conditional::Rejected(Some(winner)) => ClaimOutcome::Busy(winner),
                Conditional::Rejected(None) => ClaimOutcome::Busy(seen.clone()),
            },
        )
    }

    /// Takes over a job whose split's execution has closed (or never
    /// started) while its row still runs and its lease holds: the claimant
    /// read `seen` and asked Step Functions. Conditioned on the row as
    /// read, as any takeover; the run is counted.
    pub async fn take_over_closed(
        &self,
        request: &ClaimRequest,
        seen: &JobRow,
    ) -> Result<ClaimOutcome, LedgerError> {
        self.take_over(request, seen).await
    }

    /// Makes a failed (or poisoned) job claimable again: its attempts and
    /// failures go back to 0 and a permanent failure is forgotten, so it
    /// gets `max_attempts` more. Returns the row as it was,
    /// error included, for the caller to log.
    pub async fn retry(&self, job_key: &str, now_ms: u64) -> Result<JobRow, RetryError> {
        let seen = match self.call().reset_attempts(job_key, now_ms).await? {
            Conditional::Applied(was) => return Ok(was),
            Conditional::Rejected(Some(row)) => Some(row),
            Conditional::Rejected(None) => self.call().get(job_key).await?,
        };
        Err(match seen {
            Some(row) => RetryError::NotFailed {
                job_key: job_key.to_string(),
                status: row.status.as_str(),
            },
            None => RetryError::NotFound(job_key.to_string()),
        })
    }

    /// Marks a claimed job done. Rejected when the claim was taken over.
    pub async fn finish_done(&self, claim: &Claim, now_ms: u64) -> Result<(), FinishError> {
        self.finish(claim, Finish::Done, now_ms).await
    }

    /// Marks a claimed job failed with its error (cut to 2,000 characters),
    /// to be retried while the caps allow.
    pub async fn finish_failed(
        &self,
        claim: &Claim,
        error: &str,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        self.finish_failure(claim, error, false, now_ms).await
    }

    /// Marks a claimed job failed for good: it is poisoned at once.
    pub async fn finish_permanent(
        &self,
        claim: &Claim,
        error: &str,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        self.finish_failure(claim, error, true, now_ms).await
    }

    /// Marks a claimed job failed for good though its input is not at
    /// fault: poisoned by its failures set to `failures` (the cap), not
    /// permanent ([`Finish::Spent`]).
    pub async fn finish_spent(
        &self,
        claim: &Claim,
        error: &str,
        failures: u64,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        let error = truncate_chars(error, MAX_ERROR_CHARS);
        let finish = Finish::Spent {
            error: &error,
            failures,
        };
        self.finish(claim, finish, now_ms).await
    }

    async fn finish_failure(
        &self,
        claim: &Claim,
        error: &str,
        permanent: bool,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        let error = truncate_chars(error, MAX_ERROR_CHARS);
        let finish = Finish::Failed {
            error: &error,
            permanent,
        };
        self.finish(claim, finish, now_ms).await
    }

    /// Gives a claim up as if it had never been made: the row is deleted,
    /// unless another worker has taken the job over meanwhile (then its row
    /// stands, and this is `LostLease`).
    pub async fn release(&self, claim: &Claim) -> Result<(), FinishError> {
        match self.retrying(|| self.call().release(claim)).await? {
            Conditional::Applied(()) => Ok(()),
            Conditional::Rejected(_) => Err(FinishError::LostLease(claim.job_key.clone())),
        }
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        match self
            .retrying(|| self.call().finish(claim, finish, now_ms))
            .await?
        {
            Conditional::Applied(()) => Ok(()),
            Conditional::Rejected(_) => Err(FinishError::LostLease(claim.job_key.clone())),
        }
    }
}

fn claim_of(request: &ClaimRequest, attempt: u64, output_prefix: &str) -> Claim {
    Claim {
        job_key: request.job_key.clone(),
        owner: request.owner.clone(),
        attempt,
        lease_until_ms: request.lease_until_ms,
        output_prefix: output_prefix.to_string(),
        superseded: None,
    }
}

/// The first `max` characters of `text`.
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
