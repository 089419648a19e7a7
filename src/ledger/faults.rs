//! A ledger table that fails the calls a [`FaultPlan`] names, and passes
//! the others to the table it wraps. It can also hold one call at its
//! start until a test lets it go ([`FaultyTable::pause_before`]), which
//! puts another worker's calls exactly between two of this one's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use super::{
    Claim, ClaimRequest, Conditional, Contention, Finish, JobRow, LedgerError, LedgerTable,
};
use crate::faults::{Call, FaultPlan};
use crate::identity::ObjectVersion;
use crate::references::{RefChange, VersionName, VersionRefs};

use super::{CollectDue, CollectRequest, DeferCollect, ExecutionRecord, RefWrite};

#[derive(Debug, Clone)]
pub struct FaultyTable {
    inner: Arc<dyn LedgerTable>,
    plan: Arc<FaultPlan>,
    pause: Option<(Call, Arc<Pause>)>,
}

/// The first call of one kind, held before it reaches the table.
#[derive(Debug, Default)]
pub struct Pause {
    reached: Notify,
    resume: Notify,
    /// Which call of the kind is held (0: the first; `usize::MAX`: none
    /// until [`Pause::hold_next`]).
    nth: AtomicUsize,
    seen: AtomicUsize,
}

impl Pause {
    /// Waits until the held call has arrived.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the held call go on to the table.
    pub fn resume(&self) {
        self.resume.notify_one();
    }

    /// Holds the next call of the kind from now on, whichever it is: a
    /// test sets its scene up with the calls passing, then arms the pause.
    pub fn hold_next(&self) {
        self.nth
            .store(self.seen.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

impl FaultyTable {
    pub fn new(inner: impl LedgerTable + 'static, plan: Arc<FaultPlan>) -> Self {
        FaultyTable::over(Arc::new(inner), plan)
    }

    /// The same over a table the caller keeps a handle on too.
    pub fn over(inner: Arc<dyn LedgerTable>, plan: Arc<FaultPlan>) -> Self {
        FaultyTable {
            inner,
            plan,
            pause: None,
        }
    }

    /// Holds the `nth` call of that kind (0: the first) until
    /// [`Pause::resume`]; the others pass.
    pub fn pause_before(mut self, call: Call, nth: usize) -> (Self, Arc<Pause>) {
        let pause = Arc::new(Pause {
            nth: AtomicUsize::new(nth),
            ..Pause::default()
        });
        self.pause = Some((call, pause.clone()));
        (self, pause)
    }

    /// Waits at a pause, then fails the call if the plan says so.
    async fn enter(
        &self,
        call: Call,
        operation: &'static str,
        job_key: &str,
    ) -> Result<(), LedgerError> {
        let refused = self.plan.pass(call, job_key).await;
        if let Some((held, pause)) = &self.pause {
            if *held == call
                && pause.seen.fetch_add(1, Ordering::SeqCst) == pause.nth.load(Ordering::SeqCst)
            {
                pause.reached.notify_one();
                pause.resume.notified().await;
            }
        }
        match refused.or_else(|| self.plan.check(call, job_key)) {
            Some(message) => Err(self.error(operation, message)),
            None => Ok(()),
        }
    }

    /// The error a planned (or gated) `message` stands for: one named for
    /// a contention code is that contention (retried in-process, as
    /// DynamoDB's would be); any other stands for a throttle or a 5xx after
    /// the SDK's retries.
    fn error(&self, operation: &'static str, message: String) -> LedgerError {
        let table = self.inner.name().to_string();
        match contention(&message) {
            Some(contention) => LedgerError::Contended {
                operation,
                table,
                contention,
            },
            None => LedgerError::Service {
                operation,
                table,
                message,
                kind: crate::error::ErrorKind::Transient,
            },
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
        self.enter(Call::GetRow, "GetItem", job_key).await?;
        self.inner.get(job_key).await
    }

    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::PutRow, "PutItem", &row.job_key).await?;
        self.inner.put_new(row).await
    }

    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        self.enter(Call::TakeOver, "UpdateItem", &request.job_key)
            .await?;
        self.inner.take_over(seen, request).await
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::Finish, "UpdateItem", &claim.job_key)
            .await?;
        self.inner.finish(claim, finish, now_ms).await
    }

    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::Release, "DeleteItem", &claim.job_key)
            .await?;
        self.inner.release(claim).await
    }

    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.enter(Call::ResetAttempts, "UpdateItem", job_key)
            .await?;
        self.inner.reset_attempts(job_key, now_ms).await
    }

    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        self.enter(Call::GetInputHash, "GetItem", &version.key)
            .await?;
        self.inner.get_input_hash(version).await
    }

    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.enter(Call::PutInputHash, "PutItem", &version.key)
            .await?;
        self.inner.put_input_hash(version, input_hash, now_ms).await
    }

    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.inner.forget_input_hash(version).await
    }

    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.enter(Call::GetRefs, "GetItem", &version.key).await?;
        self.inner.get_version_refs(version).await
    }

    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        self.enter(Call::ChangeRefs, "TransactWriteItems", &version.key)
            .await?;
        self.inner.change_refs(version, change, now_ms).await
    }

    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.enter(Call::BeginCollect, "UpdateItem", &request.job_key)
            .await?;
        self.inner.begin_collect(request).await
    }

    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: super::JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::KeepCollected, "UpdateItem", job_key)
            .await?;
        self.inner
            .keep_collected(job_key, owner, back, clear_mark, now_ms)
            .await
    }

    async fn start_deletes(
        &self,
        job_key: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::StartDeletes, "UpdateItem", job_key)
            .await?;
        self.inner.start_deletes(job_key, owner, now_ms).await
    }

    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::MarkReleased, "UpdateItem", job_key)
            .await?;
        self.inner.mark_released(job_key, nonce, now_ms).await
    }

    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        self.enter(Call::QueryRefs, "Query", job_key).await?;
        self.inner.query_refs(job_key, shard, limit, from).await
    }

    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::EndCollect, "DeleteItem", job_key).await?;
        self.inner.end_collect(job_key, owner).await
    }

    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::DeferCollect, "UpdateItem", &request.job_key)
            .await?;
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
        self.enter(Call::SealRefs, "UpdateItem", &row.job_key)
            .await?;
        self.inner.seal_refs(row, now_ms).await
    }

    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.enter(Call::RecordExecution, "UpdateItem", job_key)
            .await?;
        self.inner.record_execution(job_key, record, now_ms).await
    }

    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.enter(Call::WriteHolderRefs, "BatchWriteItem", holder)
            .await?;
        self.inner
            .write_holder_refs(holder, add, remove, now_ms)
            .await
    }
}
