//! A ledger table that fails the calls a [`FaultPlan`] names, and passes
//! the others to the table it wraps.

use std::sync::Arc;

use super::{
    Claim, ClaimRequest, Conditional, Contention, Finish, JobRow, LedgerError, LedgerTable,
};
use crate::faults::{Call, FaultPlan};
use crate::identity::ObjectVersion;
use crate::references::{RefChange, VersionName, VersionRefs};

use super::{CollectDue, CollectRequest, DeferCollect, RefWrite};

#[derive(Debug, Clone)]
pub struct FaultyTable {
    inner: Arc<dyn LedgerTable>,
    plan: Arc<FaultPlan>,
}

impl FaultyTable {
    pub fn new(inner: impl LedgerTable + 'static, plan: Arc<FaultPlan>) -> Self {
        FaultyTable {
            inner: Arc::new(inner),
            plan,
        }
    }

    fn check(&self, call: Call, operation: &'static str, job_key: &str) -> Result<(), LedgerError> {
        match self.plan.check(call, job_key) {
            // A planned error named for a contention code is that
            // contention (retried in-process, as DynamoDB's would be).
            Some(message) if contention(&message).is_some() => Err(LedgerError::Contended {
                operation,
                table: self.inner.name().to_string(),
                contention: contention(&message).unwrap_or(Contention::Throttled),
            }),
            Some(message) => Err(LedgerError::Service {
                operation,
                table: self.inner.name().to_string(),
                message,
                // It stands for a throttle or a 5xx after the SDK's retries.
                kind: crate::error::ErrorKind::Transient,
            }),
            None => Ok(()),
        }
    }
}

/// The contention a planned error names (`TransactionConflict`,
/// `ThrottlingException`, ... as a word of it), if any.
fn contention(message: &str) -> Option<Contention> {
    message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find_map(Contention::of_code)
}

#[async_trait::async_trait]
impl LedgerTable for FaultyTable {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        self.check(Call::GetRow, "GetItem", job_key)?;
        self.inner.get(job_key).await
    }

    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::PutRow, "PutItem", &row.job_key)?;
        self.inner.put_new(row).await
    }

    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        self.check(Call::TakeOver, "UpdateItem", &request.job_key)?;
        self.inner.take_over(seen, request).await
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::Finish, "UpdateItem", &claim.job_key)?;
        self.inner.finish(claim, finish, now_ms).await
    }

    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::Release, "DeleteItem", &claim.job_key)?;
        self.inner.release(claim).await
    }

    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.check(Call::ResetAttempts, "UpdateItem", job_key)?;
        self.inner.reset_attempts(job_key, now_ms).await
    }

    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        self.check(Call::GetInputHash, "GetItem", &version.key)?;
        self.inner.get_input_hash(version).await
    }

    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.check(Call::PutInputHash, "PutItem", &version.key)?;
        self.inner.put_input_hash(version, input_hash, now_ms).await
    }

    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.inner.forget_input_hash(version).await
    }

    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.check(Call::GetRefs, "GetItem", &version.key)?;
        self.inner.get_version_refs(version).await
    }

    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        self.check(Call::ChangeRefs, "TransactWriteItems", &version.key)?;
        self.inner.change_refs(version, change, now_ms).await
    }

    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.check(Call::BeginCollect, "UpdateItem", &request.job_key)?;
        self.inner.begin_collect(request).await
    }

    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::EndCollect, "DeleteItem", job_key)?;
        self.inner.end_collect(job_key, owner).await
    }

    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::DeferCollect, "UpdateItem", &request.job_key)?;
        self.inner.defer_collect(request).await
    }

    async fn scan_collectable(
        &self,
        due: &CollectDue,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        self.inner.scan_collectable(due, from).await
    }

    async fn scan_unsealed(
        &self,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        self.inner.scan_unsealed(from).await
    }

    async fn seal_refs(&self, row: &JobRow, now_ms: u64) -> Result<Conditional<()>, LedgerError> {
        self.check(Call::SealRefs, "UpdateItem", &row.job_key)?;
        self.inner.seal_refs(row, now_ms).await
    }
}
