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

use std::sync::Arc;

use crate::identity::ObjectVersion;
use crate::lease::is_live;
use crate::references::{RefChange, VersionName, VersionRefs};

pub mod dynamodb;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod faults;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod memory;

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
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "running" => Some(JobStatus::Running),
            "done" => Some(JobStatus::Done),
            "failed" => Some(JobStatus::Failed),
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
    /// The object versions referencing the job's outputs; `None` on rows
    /// written before references were counted (never collected).
    pub refs: Option<u64>,
    /// When the last release lowered `refs` (epoch ms).
    pub released_at_ms: Option<u64>,
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
    /// and now, attempts + 1, `refs` 0 when the row has none (a job never
    /// done has no references; the row's `output_prefix` is kept);
    /// conditioned on `owner` and `status` being those of `seen`. Applied:
    /// the attempts after the update.
    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError>;

    /// UpdateItem finishing a claim as `done` (removing `error`) or `failed`
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
    /// `change.next` (conditioned on `gen` = `change.seen_gen`, or on no row),
    /// `refs` + 1 on each added job (conditioned on `status = done` and a
    /// counted `refs`), `refs` − 1 and `released_at_ms` on each removed one
    /// (conditioned on `refs > 0`). All or nothing.
    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError>;
}

/// What a reference transaction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefWrite {
    Applied,
    /// Nothing was written. `version`: `Some` when the version row was not
    /// as read, with the row as it is (`None`: there is none). `refused`:
    /// the jobs whose condition failed, with their row (`None`: no row).
    Cancelled {
        version: Option<Option<VersionRefs>>,
        refused: Vec<(String, Option<JobRow>)>,
    },
}

/// The claim ledger: the claim algorithm over a [`LedgerTable`].
#[derive(Debug, Clone)]
pub struct Ledger {
    table: Arc<dyn LedgerTable>,
}

impl LedgerError {
    /// What kind of failure: `Transient` is worth retrying; a malformed row
    /// is `Other`.
    pub fn kind(&self) -> crate::error::ErrorKind {
        match self {
            LedgerError::Service { kind, .. } => *kind,
            LedgerError::MalformedRow { .. } => crate::error::ErrorKind::Other,
        }
    }
}

impl Ledger {
    pub fn new(table: impl LedgerTable + 'static) -> Self {
        Ledger {
            table: Arc::new(table),
        }
    }

    /// The ledger in a DynamoDB table.
    pub fn dynamodb(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Ledger::new(dynamodb::DynamoDbTable::new(client, table))
    }

    pub fn table(&self) -> &str {
        self.table.name()
    }

    /// Checks at start-up that the table exists and this role can read it,
    /// so a misconfiguration fails the init instead of every message.
    pub async fn check_table(&self) -> Result<(), LedgerError> {
        self.table.get("mediaonce-startup-check").await.map(|_| ())
    }

    /// Reads a row with a consistent read.
    pub async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        self.table.get(job_key).await
    }

    /// The SHA-256 mediaonce computed from an object version's bytes, if it
    /// has (the hash cache shares the claim table; see [`crate::identity`]).
    pub async fn cached_input_hash(
        &self,
        version: &ObjectVersion,
    ) -> Result<Option<String>, LedgerError> {
        self.table.get_input_hash(version).await
    }

    /// Remembers the SHA-256 computed from an object version's bytes.
    pub async fn cache_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.table.put_input_hash(version, input_hash, now_ms).await
    }

    /// Forgets an object version's cached hash.
    pub async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.table.forget_input_hash(version).await
    }

    /// A version's references row.
    pub async fn version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.table.get_version_refs(version).await
    }

    /// Applies a change to a version's references (one transaction).
    pub async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        self.table.change_refs(version, change, now_ms).await
    }

    /// Claims a job: one put for a new key; for an existing one, the row
    /// returned with the failed condition decides, and a takeover is one
    /// more update.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, LedgerError> {
        let row = JobRow {
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
            // Counted from the start: the first reference makes it 1.
            refs: Some(0),
            released_at_ms: None,
        };
        // Twice at most: a row deleted between the failed put and the read
        // (a released claim) means the key is free again, so claim anew.
        let mut tries = 0;
        let existing = loop {
            tries += 1;
            match self.table.put_new(&row).await? {
                Conditional::Applied(()) => {
                    return Ok(ClaimOutcome::Run(claim_of(
                        request,
                        1,
                        &request.output_prefix,
                    )))
                }
                Conditional::Rejected(Some(existing)) => break existing,
                // Some DynamoDB implementations return no item with the failure.
                Conditional::Rejected(None) => match self.table.get(&request.job_key).await? {
                    Some(existing) => break existing,
                    None if tries < 2 => continue,
                    // Gone twice over: the key is contended; the message
                    // comes back.
                    None => return Ok(ClaimOutcome::Busy(row)),
                },
            }
        };
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
        Ok(match self.table.take_over(seen, request).await? {
            Conditional::Applied(attempt) => {
                ClaimOutcome::Run(claim_of(request, attempt, &seen.output_prefix))
            }
            Conditional::Rejected(Some(winner)) if winner.status == JobStatus::Done => {
                ClaimOutcome::Done(winner)
            }
            Conditional::Rejected(Some(winner)) => ClaimOutcome::Busy(winner),
            Conditional::Rejected(None) => ClaimOutcome::Busy(seen.clone()),
        })
    }

    /// Makes a failed (or poisoned) job claimable again: its attempts and
    /// failures go back to 0 and a permanent failure is forgotten, so it
    /// gets `max_attempts` more. Returns the row as it was,
    /// error included, for the caller to log.
    pub async fn retry(&self, job_key: &str, now_ms: u64) -> Result<JobRow, RetryError> {
        let seen = match self.table.reset_attempts(job_key, now_ms).await? {
            Conditional::Applied(was) => return Ok(was),
            Conditional::Rejected(Some(row)) => Some(row),
            Conditional::Rejected(None) => self.table.get(job_key).await?,
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
        match self.table.release(claim).await? {
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
        match self.table.finish(claim, finish, now_ms).await? {
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
mod tests {
    use super::*;

    fn row(status: JobStatus, lease_until_ms: u64) -> JobRow {
        JobRow {
            job_key: "k".into(),
            step: "probe".into(),
            input_hash: "i".into(),
            status,
            lease_until_ms,
            attempts: 1,
            owner: "o".into(),
            output_prefix: "derived/k/".into(),
            error: None,
            updated_at_ms: 1,
            failures: 0,
            permanent: false,
            refs: None,
            released_at_ms: None,
        }
    }

    #[test]
    fn verdicts_follow_the_state_machine() {
        assert_eq!(judge(&row(JobStatus::Done, 0), 10, 3), Verdict::Done);
        assert_eq!(
            judge(&row(JobStatus::Failed, u64::MAX), 10, 3),
            Verdict::TakeOver
        );
        assert_eq!(judge(&row(JobStatus::Running, 11), 10, 3), Verdict::Busy);
        assert_eq!(
            judge(&row(JobStatus::Running, 10), 10, 3),
            Verdict::TakeOver
        );
        let mut at_cap = row(JobStatus::Failed, 0);
        (at_cap.attempts, at_cap.failures) = (3, 3);
        assert_eq!(judge(&at_cap, 10, 3), Verdict::Poisoned);
        assert_eq!(judge(&at_cap, 10, 4), Verdict::TakeOver);
        // Takeovers of expired leases are not failures: two of them and one
        // failure leave the job two failures from the cap.
        let mut slow_neighbours = row(JobStatus::Failed, 0);
        (slow_neighbours.attempts, slow_neighbours.failures) = (3, 1);
        assert_eq!(judge(&slow_neighbours, 10, 3), Verdict::TakeOver);
        // A running row at the failures cap is still busy or taken over.
        at_cap.status = JobStatus::Running;
        assert_eq!(judge(&at_cap, 10, 3), Verdict::TakeOver);
        // An input that kills its worker every time: after max_runs runs
        // whose leases all passed, poisoned rather than taken over again.
        let mut killer = row(JobStatus::Running, 10);
        killer.attempts = max_runs(3);
        assert_eq!(judge(&killer, 10, 3), Verdict::Poisoned);
        assert_eq!(judge(&killer, 9, 3), Verdict::Busy);
        killer.attempts -= 1;
        assert_eq!(judge(&killer, 10, 3), Verdict::TakeOver);
        // A permanent failure is poisoned at once.
        let mut permanent = row(JobStatus::Failed, 0);
        (permanent.failures, permanent.permanent) = (1, true);
        assert_eq!(judge(&permanent, 10, 3), Verdict::Poisoned);
        assert!(poison_reason(&permanent).starts_with("failed permanently"));
        assert!(poison_reason(&killer).contains("runs never finished"));
    }

    #[test]
    fn errors_are_cut_on_character_boundaries() {
        assert_eq!(truncate_chars("ééé", 2), "éé");
        assert_eq!(truncate_chars("ab", 5), "ab");
        assert_eq!(
            truncate_chars(&"x".repeat(3000), MAX_ERROR_CHARS).len(),
            2000
        );
    }

    fn request(owner: &str, now_ms: u64) -> ClaimRequest {
        ClaimRequest {
            job_key: "k".into(),
            step: "probe".into(),
            input_hash: "i".into(),
            output_prefix: "s3://out/derived/k/".into(),
            owner: owner.into(),
            lease_until_ms: now_ms + 1_000,
            now_ms,
            max_attempts: 2,
        }
    }

    fn run(outcome: ClaimOutcome) -> Claim {
        match outcome {
            ClaimOutcome::Run(claim) => claim,
            other => panic!("expected to run: {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_claim_algorithm_on_the_in_memory_table() {
        let ledger = Ledger::new(memory::InMemoryTable::new("jobs"));
        let a = run(ledger.claim(&request("A", 0)).await.unwrap());
        assert_eq!(a.attempt, 1);
        assert!(matches!(
            ledger.claim(&request("B", 500)).await.unwrap(),
            ClaimOutcome::Busy(_)
        ));
        // A's lease (1,000) has passed at 1,000: B takes over, A is fenced off.
        let b = run(ledger.claim(&request("B", 1_000)).await.unwrap());
        assert_eq!(b.attempt, 2);
        assert!(matches!(
            ledger.finish_done(&a, 1_001).await,
            Err(FinishError::LostLease(_))
        ));
        ledger.finish_failed(&b, "boom", 1_002).await.unwrap();
        // One failure (A's expired lease was none): C takes over and fails.
        let c = run(ledger.claim(&request("C", 1_500)).await.unwrap());
        assert_eq!(c.attempt, 3);
        ledger.finish_failed(&c, "boom again", 1_502).await.unwrap();
        // Two failures, the cap is 2: poisoned until retried.
        assert!(matches!(
            ledger.claim(&request("D", 2_000)).await.unwrap(),
            ClaimOutcome::Poisoned(_)
        ));
        let was = ledger.retry("k", 2_001).await.unwrap();
        assert_eq!(
            (was.attempts, was.failures, was.error.as_deref()),
            (3, 2, Some("boom again"))
        );
        let c = run(ledger.claim(&request("C", 2_002)).await.unwrap());
        assert_eq!(c.attempt, 1);
        ledger.finish_done(&c, 2_003).await.unwrap();
        assert!(matches!(
            ledger.claim(&request("D", 3_000)).await.unwrap(),
            ClaimOutcome::Done(_)
        ));
        assert!(matches!(
            ledger.retry("k", 3_001).await,
            Err(RetryError::NotFailed { status: "done", .. })
        ));
        assert!(matches!(
            ledger.retry("nope", 3_001).await,
            Err(RetryError::NotFound(_))
        ));
    }

    /// A table whose first put finds a row that is deleted before it can
    /// be read (a claim released in between), as a real table can.
    #[derive(Debug)]
    struct DeletedInBetween {
        inner: memory::InMemoryTable,
        puts: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl LedgerTable for DeletedInBetween {
        fn name(&self) -> &str {
            self.inner.name()
        }
        async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
            self.inner.get(job_key).await
        }
        async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
            if self.puts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return Ok(Conditional::Rejected(None));
            }
            self.inner.put_new(row).await
        }
        async fn take_over(
            &self,
            seen: &JobRow,
            request: &ClaimRequest,
        ) -> Result<Conditional<u64>, LedgerError> {
            self.inner.take_over(seen, request).await
        }
        async fn finish(
            &self,
            claim: &Claim,
            finish: Finish<'_>,
            now_ms: u64,
        ) -> Result<Conditional<()>, LedgerError> {
            self.inner.finish(claim, finish, now_ms).await
        }
        async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
            self.inner.release(claim).await
        }
        async fn reset_attempts(
            &self,
            job_key: &str,
            now_ms: u64,
        ) -> Result<Conditional<JobRow>, LedgerError> {
            self.inner.reset_attempts(job_key, now_ms).await
        }
        async fn get_input_hash(
            &self,
            version: &ObjectVersion,
        ) -> Result<Option<String>, LedgerError> {
            self.inner.get_input_hash(version).await
        }
        async fn put_input_hash(
            &self,
            version: &ObjectVersion,
            input_hash: &str,
            now_ms: u64,
        ) -> Result<(), LedgerError> {
            self.inner.put_input_hash(version, input_hash, now_ms).await
        }
        async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
            self.inner.forget_input_hash(version).await
        }
        async fn get_version_refs(
            &self,
            version: &VersionName,
        ) -> Result<Option<VersionRefs>, LedgerError> {
            self.inner.get_version_refs(version).await
        }
        async fn change_refs(
            &self,
            version: &VersionName,
            change: &RefChange,
            now_ms: u64,
        ) -> Result<RefWrite, LedgerError> {
            self.inner.change_refs(version, change, now_ms).await
        }
    }

    #[tokio::test]
    async fn a_row_gone_between_the_put_and_the_read_is_claimed_anew() {
        let ledger = Ledger::new(DeletedInBetween {
            inner: memory::InMemoryTable::new("t"),
            puts: Default::default(),
        });
        let claim = run(ledger.claim(&request("me/1", 1_000)).await.unwrap());
        assert_eq!((claim.owner.as_str(), claim.attempt), ("me/1", 1));
        assert_eq!(ledger.get("k").await.unwrap().unwrap().owner, "me/1");
    }

    #[tokio::test]
    async fn injected_faults_surface_as_ledger_errors() {
        let plan = std::sync::Arc::new(crate::faults::FaultPlan::new());
        plan.fail(
            crate::faults::Call::PutRow,
            1,
            "ProvisionedThroughputExceededException",
        );
        let ledger = Ledger::new(faults::FaultyTable::new(
            memory::InMemoryTable::new("jobs"),
            plan.clone(),
        ));
        let err = ledger.claim(&request("A", 0)).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("PutItem on table jobs failed: injected fault"),
            "{err}"
        );
        run(ledger.claim(&request("A", 0)).await.unwrap());
        assert_eq!(plan.injected(), 1);
    }
}
