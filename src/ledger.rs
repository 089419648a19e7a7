//! The claim ledger: one DynamoDB row per job key, claimed before any work.
//!
//! See DESIGN.md for the state machine. In short: a conditional PutItem
//! creates the row (`running`, attempts 1); if a row exists, its state
//! decides: `done` is reused, a live `running` lease is busy, and a `failed`
//! row or an expired lease is taken over by one UpdateItem conditioned on the
//! owner just read. Finishing is conditioned on still being the owner.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use crate::lease::is_live;

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
}

/// Stored errors are cut to this many characters.
pub const MAX_ERROR_CHARS: usize = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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

    fn parse(text: &str) -> Option<Self> {
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
}

type Item = HashMap<String, AttributeValue>;

impl JobRow {
    /// Reads a row, naming the attribute that is missing or malformed.
    pub fn from_item(item: &Item) -> Result<Self, String> {
        let string = |name: &str| -> Result<String, String> {
            match item.get(name) {
                Some(AttributeValue::S(s)) => Ok(s.clone()),
                Some(_) => Err(format!("attribute {name} is not a string")),
                None => Err(format!("attribute {name} is missing")),
            }
        };
        let number = |name: &str| -> Result<u64, String> {
            match item.get(name) {
                Some(AttributeValue::N(n)) => n
                    .parse()
                    .map_err(|_| format!("attribute {name} is not a non-negative integer: {n}")),
                Some(_) => Err(format!("attribute {name} is not a number")),
                None => Err(format!("attribute {name} is missing")),
            }
        };
        let status_text = string(attr::STATUS)?;
        Ok(JobRow {
            job_key: string(attr::JOB_KEY)?,
            step: string(attr::STEP)?,
            input_hash: string(attr::INPUT_HASH)?,
            status: JobStatus::parse(&status_text)
                .ok_or_else(|| format!("attribute status has unknown value {status_text:?}"))?,
            lease_until_ms: number(attr::LEASE_UNTIL_MS)?,
            attempts: number(attr::ATTEMPTS)?,
            owner: string(attr::OWNER)?,
            output_prefix: string(attr::OUTPUT_PREFIX)?,
            error: string(attr::ERROR).ok(),
            updated_at_ms: number(attr::UPDATED_AT_MS)?,
        })
    }

    pub fn to_item(&self) -> Item {
        let mut item = Item::from([
            (attr::JOB_KEY.into(), s(&self.job_key)),
            (attr::STEP.into(), s(&self.step)),
            (attr::INPUT_HASH.into(), s(&self.input_hash)),
            (attr::STATUS.into(), s(self.status.as_str())),
            (attr::LEASE_UNTIL_MS.into(), n(self.lease_until_ms)),
            (attr::ATTEMPTS.into(), n(self.attempts)),
            (attr::OWNER.into(), s(&self.owner)),
            (attr::OUTPUT_PREFIX.into(), s(&self.output_prefix)),
            (attr::UPDATED_AT_MS.into(), n(self.updated_at_ms)),
        ]);
        if let Some(error) = &self.error {
            item.insert(attr::ERROR.into(), s(error));
        }
        item
    }
}

fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_string())
}

fn n(number: u64) -> AttributeValue {
    AttributeValue::N(number.to_string())
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
    /// Failed `max_attempts` times: run no more (its message goes to the DLQ).
    Poisoned,
}

pub fn judge(row: &JobRow, now_ms: u64, max_attempts: u64) -> Verdict {
    match row.status {
        JobStatus::Done => Verdict::Done,
        JobStatus::Failed if row.attempts >= max_attempts => Verdict::Poisoned,
        JobStatus::Failed => Verdict::TakeOver,
        JobStatus::Running if is_live(row.lease_until_ms, now_ms) => Verdict::Busy,
        JobStatus::Running => Verdict::TakeOver,
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
pub enum LedgerError {
    #[error("DynamoDB {operation} on table {table} failed: {message}")]
    Service {
        operation: &'static str,
        table: String,
        message: String,
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
    #[error("job {job_key} is {status}: only a failed or poisoned job can be retried")]
    NotFailed {
        job_key: String,
        status: &'static str,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The DynamoDB claim ledger.
#[derive(Debug, Clone)]
pub struct Ledger {
    client: Client,
    table: String,
}

impl Ledger {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Ledger {
            client,
            table: table.into(),
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn service_error<E>(&self, operation: &'static str, err: SdkError<E>) -> LedgerError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        LedgerError::Service {
            operation,
            table: self.table.clone(),
            message: crate::aws::describe_error(&err),
        }
    }

    fn malformed(&self, job_key: &str, problem: String) -> LedgerError {
        LedgerError::MalformedRow {
            table: self.table.clone(),
            job_key: job_key.to_string(),
            problem,
        }
    }

    /// Checks at start-up that the table exists and this role can read it,
    /// so a misconfiguration fails the init instead of every message.
    pub async fn check_table(&self) -> Result<(), LedgerError> {
        self.client
            .get_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s("mediaonce-startup-check"))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.service_error("GetItem", e))
    }

    /// Reads a row with a consistent read.
    pub async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.service_error("GetItem", e))?;
        output
            .item()
            .map(|item| JobRow::from_item(item).map_err(|p| self.malformed(job_key, p)))
            .transpose()
    }

    /// Claims a job: one PutItem for a new key; for an existing one, the
    /// row returned with the failed condition decides, and a takeover is one
    /// more UpdateItem.
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
        };
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(row.to_item()))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", attr::JOB_KEY)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let existing = match put {
            Ok(_) => return Ok(ClaimOutcome::Run(claim_of(request, 1))),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    failed.item().cloned()
                }
                _ => return Err(self.service_error("PutItem", err)),
            },
        };
        let existing = match existing {
            Some(item) => {
                JobRow::from_item(&item).map_err(|p| self.malformed(&request.job_key, p))?
            }
            // Some DynamoDB implementations return no item with the failure.
            None => match self.get(&request.job_key).await? {
                Some(row) => row,
                // Deleted between the two calls: treat as busy, the message comes back.
                None => return Ok(ClaimOutcome::Busy(row)),
            },
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
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&request.job_key))
            .update_expression(
                "SET #status = :running, #owner = :owner, #lease = :lease, #attempts = #attempts + :one, \
                 #updated = :now, #step = :step, #input = :input, #prefix = :prefix",
            )
            .condition_expression("#owner = :seen_owner AND #status = :seen_status")
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_names("#attempts", attr::ATTEMPTS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#step", attr::STEP)
            .expression_attribute_names("#input", attr::INPUT_HASH)
            .expression_attribute_names("#prefix", attr::OUTPUT_PREFIX)
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .expression_attribute_values(":owner", s(&request.owner))
            .expression_attribute_values(":lease", n(request.lease_until_ms))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(request.now_ms))
            .expression_attribute_values(":step", s(&request.step))
            .expression_attribute_values(":input", s(&request.input_hash))
            .expression_attribute_values(":prefix", s(&request.output_prefix))
            .expression_attribute_values(":seen_owner", s(&seen.owner))
            .expression_attribute_values(":seen_status", s(seen.status.as_str()))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match update {
            Ok(output) => {
                let attempt = match output.attributes().and_then(|a| a.get(attr::ATTEMPTS)) {
                    Some(AttributeValue::N(n)) => n.parse().unwrap_or(seen.attempts + 1),
                    _ => seen.attempts + 1,
                };
                Ok(ClaimOutcome::Run(claim_of(request, attempt)))
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let winner = match failed.item() {
                        Some(item) => Some(
                            JobRow::from_item(item)
                                .map_err(|p| self.malformed(&request.job_key, p))?,
                        ),
                        None => None,
                    };
                    Ok(match winner {
                        Some(row) if row.status == JobStatus::Done => ClaimOutcome::Done(row),
                        Some(row) => ClaimOutcome::Busy(row),
                        None => ClaimOutcome::Busy(seen.clone()),
                    })
                }
                _ => Err(self.service_error("UpdateItem", err)),
            },
        }
    }

    /// Makes a failed (or poisoned) job claimable again: its attempts go
    /// back to 0, so it gets `max_attempts` more. Returns the row as it was,
    /// error included, for the caller to log.
    pub async fn retry(&self, job_key: &str, now_ms: u64) -> Result<JobRow, RetryError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .update_expression("SET #attempts = :zero, #updated = :now")
            .condition_expression("#status = :failed")
            .expression_attribute_names("#attempts", attr::ATTEMPTS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":failed", s(JobStatus::Failed.as_str()))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let item = match update {
            Ok(output) => output.attributes,
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let row = match failed.item() {
                        Some(item) => {
                            Some(JobRow::from_item(item).map_err(|p| self.malformed(job_key, p))?)
                        }
                        None => self.get(job_key).await?,
                    };
                    return Err(match row {
                        Some(row) => RetryError::NotFailed {
                            job_key: job_key.to_string(),
                            status: row.status.as_str(),
                        },
                        None => RetryError::NotFound(job_key.to_string()),
                    });
                }
                _ => return Err(self.service_error("UpdateItem", err).into()),
            },
        };
        let item = item.ok_or_else(|| RetryError::NotFound(job_key.to_string()))?;
        Ok(JobRow::from_item(&item).map_err(|p| self.malformed(job_key, p))?)
    }

    /// Marks a claimed job done. Rejected when the claim was taken over.
    pub async fn finish_done(&self, claim: &Claim, now_ms: u64) -> Result<(), FinishError> {
        self.finish(claim, JobStatus::Done, None, now_ms).await
    }

    /// Marks a claimed job failed with its error (cut to 2,000 characters).
    pub async fn finish_failed(
        &self,
        claim: &Claim,
        error: &str,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        self.finish(claim, JobStatus::Failed, Some(error), now_ms)
            .await
    }

    async fn finish(
        &self,
        claim: &Claim,
        status: JobStatus,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), FinishError> {
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&claim.job_key))
            .condition_expression("#owner = :me AND #status = :running")
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#error", attr::ERROR)
            .expression_attribute_values(":me", s(&claim.owner))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .expression_attribute_values(":status", s(status.as_str()))
            .expression_attribute_values(":now", n(now_ms));
        update = match error {
            Some(error) => update
                .update_expression("SET #status = :status, #updated = :now, #error = :error")
                .expression_attribute_values(":error", s(&truncate_chars(error, MAX_ERROR_CHARS))),
            None => {
                update.update_expression("SET #status = :status, #updated = :now REMOVE #error")
            }
        };
        match update.send().await {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(FinishError::LostLease(claim.job_key.clone()))
            }
            Err(err) => Err(self.service_error("UpdateItem", err).into()),
        }
    }
}

fn claim_of(request: &ClaimRequest, attempt: u64) -> Claim {
    Claim {
        job_key: request.job_key.clone(),
        owner: request.owner.clone(),
        attempt,
        lease_until_ms: request.lease_until_ms,
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
        at_cap.attempts = 3;
        assert_eq!(judge(&at_cap, 10, 3), Verdict::Poisoned);
        assert_eq!(judge(&at_cap, 10, 4), Verdict::TakeOver);
        // The cap is about failures: a running row at the cap is still busy or taken over.
        at_cap.status = JobStatus::Running;
        assert_eq!(judge(&at_cap, 10, 3), Verdict::TakeOver);
    }

    #[test]
    fn rows_round_trip_through_items() {
        let mut original = row(JobStatus::Failed, 42);
        original.error = Some("boom".into());
        assert_eq!(JobRow::from_item(&original.to_item()), Ok(original));
    }

    #[test]
    fn malformed_rows_name_the_attribute() {
        let mut item = row(JobStatus::Done, 1).to_item();
        item.remove(attr::OWNER);
        assert_eq!(
            JobRow::from_item(&item),
            Err("attribute owner is missing".into())
        );
        item.insert(attr::OWNER.into(), s("o"));
        item.insert(attr::STATUS.into(), s("paused"));
        assert!(JobRow::from_item(&item).unwrap_err().contains("paused"));
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
}
