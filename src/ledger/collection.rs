//! Collection's side of the ledger: when a row is due, the collector's
//! writes (begin, keep, start deletes, end, back off), the marks releases
//! leave, and the reads of a job's reference items. DESIGN.md
//! ("Collection", "The collector and the adder") has the argument; the
//! collector itself is `handler::collect`.

use super::{judge, Conditional, JobRow, JobStatus, Ledger, LedgerError, Verdict};
use crate::lease::is_live;

impl JobRow {
    /// The status a collection that finds this `collecting` row referenced
    /// gives it back in: the one it had when the collection began. Only a
    /// row that was `done` is `done` again: a `failed` or abandoned
    /// `running` row a release marked holds partial outputs at most, and
    /// given back `done` it would be reused, without files, by every later
    /// upload of its bytes. A row whose status then is not known (a
    /// collection begun before `collected_from` was written) is given back
    /// `failed`, retryable: the next message runs it again, a waste at
    /// most. Pure.
    pub fn kept_status(&self) -> JobStatus {
        match self.collected_from {
            Some(status @ (JobStatus::Done | JobStatus::Running | JobStatus::Failed)) => status,
            Some(JobStatus::Collecting) | None => JobStatus::Failed,
        }
    }
}

/// Whether a done row's references are not known to be items: it was
/// done before reference items. Pure; as `scan_unsealed`'s filter.
pub fn unsealed(row: &JobRow) -> bool {
    row.status == JobStatus::Done && !row.ref_items
}

/// The mark `mediaonce refs seal` writes on a row it declares complete.
pub fn seal_mark(job_key: &str, now_ms: u64) -> String {
    format!("seal/{now_ms}/{job_key}")
}

/// When a row is due for collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectDue {
    /// Now less the grace: a row is due when it has had no reference (or,
    /// abandoned, no owner) since at or before this.
    pub before_ms: u64,
    pub now_ms: u64,
    /// The configuration's failures cap: a poisoned row is never due (it
    /// is what stops a re-upload of its content from running again).
    pub max_attempts: u64,
}

/// Whether a row is due for collection: as `begin_collect`'s condition. Pure.
///
/// - `done`, its references all items, and marked by a release (or its
///   finish) at or before the cut-off: its references are read then;
/// - `collecting` whose collector's lease has passed (a collection that
///   stopped);
/// - abandoned: `running` (not poisoned) whose lease ended by the
///   cut-off, or `failed`
///   (not poisoned) and untouched since it: no message came back for it
///   in a whole grace, because its object is gone. Its outputs are partial
///   at most; a later upload of the same bytes runs it from nothing.
pub fn collectable(row: &JobRow, due: &CollectDue) -> bool {
    if row.collect_retry_at_ms.is_some_and(|at| at > due.now_ms) {
        return false;
    }
    let poisoned = judge(row, due.now_ms, due.max_attempts) == Verdict::Poisoned;
    match row.status {
        JobStatus::Done => {
            row.ref_items
                && row.free_mark.is_some()
                && row.released_at_ms.is_some_and(|at| at <= due.before_ms)
        }
        JobStatus::Collecting => !is_live(row.lease_until_ms, due.now_ms),
        JobStatus::Running => !poisoned && row.lease_until_ms <= due.before_ms,
        JobStatus::Failed => !poisoned && row.updated_at_ms <= due.before_ms,
    }
}

/// A collector's claim on a job nothing references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectRequest {
    pub job_key: String,
    /// The collector's fencing token.
    pub owner: String,
    pub lease_until_ms: u64,
    pub due: CollectDue,
}

/// A failed collection's back-off ([`LedgerTable::defer_collect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferCollect {
    pub job_key: String,
    /// The collector's fencing token.
    pub owner: String,
    pub now_ms: u64,
    pub retry_at_ms: u64,
}

impl Ledger {
    /// Moves a job nothing references to `collecting`.
    pub async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.retrying(|| self.call().begin_collect(request)).await
    }

    /// Gives a collection up: the job is referenced, and goes back to
    /// `back`, the status it had when the collection began. Its mark is removed
    /// only when `clear_mark` names it still (a release since marked it
    /// anew, and that mark stays for the next sweep).
    pub async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        if clear_mark.is_some() {
            let cleared = self
                .retrying(|| {
                    self.call()
                        .keep_collected(job_key, owner, back, clear_mark, now_ms)
                })
                .await?;
            match cleared {
                Conditional::Rejected(Some(row))
                    if row.status == JobStatus::Collecting && row.owner == owner => {}
                other => return Ok(other),
            }
        }
        self.retrying(|| {
            self.call()
                .keep_collected(job_key, owner, back, None, now_ms)
        })
        .await
    }

    /// Records that a collection begins deleting the job's outputs.
    pub async fn start_deletes(
        &self,
        job_key: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.retrying(|| self.call().start_deletes(job_key, owner, now_ms))
            .await
    }

    /// Marks a job its release may have left unreferenced (a fresh nonce):
    /// written before the release's reference items are deleted.
    pub async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.retrying(|| self.call().mark_released(job_key, nonce, now_ms))
            .await
    }

    /// The first reference of `job_key` found (a version's, or a split's
    /// hold): one consistent Query per shard, one item each, stopping at
    /// the first found. One after another
    /// on purpose: a sweep is not waited on, and a job still referenced
    /// (the usual answer) stops at its first shard found, where sixteen
    /// concurrent Queries would pay for all sixteen.
    pub async fn first_reference(
        &self,
        job_key: &str,
    ) -> Result<Option<crate::references::RefHolder>, LedgerError> {
        for shard in 0..crate::references::REF_SHARDS {
            let (page, _) = self
                .retrying(|| self.call().query_refs(job_key, shard, Some(1), None))
                .await?;
            if let Some(first) = page.into_iter().next() {
                return Ok(Some(first));
            }
        }
        Ok(None)
    }

    /// Deletes `holder`'s reference to `job_key`, marking nothing: a hold
    /// the collector found dead ([`crate::references::HOLD_START_MS`]).
    pub async fn drop_hold(
        &self,
        holder: &str,
        job_key: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        let jobs = [job_key.to_string()];
        self.retrying(|| self.call().write_holder_refs(holder, &[], &jobs, now_ms))
            .await
    }

    /// The version rows referencing `job_key` (every shard, every page).
    pub async fn references(&self, job_key: &str) -> Result<Vec<String>, LedgerError> {
        let mut found: Vec<String> = self
            .holders(job_key)
            .await?
            .into_iter()
            .map(|holder| holder.version_row)
            .collect();
        found.sort();
        Ok(found)
    }

    /// Every reference item of `job_key` (every shard, every page): the
    /// versions that use the job, and its holders.
    pub async fn holders(
        &self,
        job_key: &str,
    ) -> Result<Vec<crate::references::RefHolder>, LedgerError> {
        let mut found = Vec::new();
        for shard in 0..crate::references::REF_SHARDS {
            let mut from: Option<String> = None;
            loop {
                let (page, next) = self
                    .retrying(|| {
                        self.call()
                            .query_refs(job_key, shard, None, from.as_deref())
                    })
                    .await?;
                found.extend(page);
                match next {
                    Some(next) => from = Some(next),
                    None => break,
                }
            }
        }
        Ok(found)
    }

    /// Deletes a collected row.
    pub async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.retrying(|| self.call().end_collect(job_key, owner))
            .await
    }

    /// Backs a failed collection off.
    pub async fn defer_collect(
        &self,
        request: &DeferCollect,
    ) -> Result<Conditional<()>, LedgerError> {
        self.retrying(|| self.call().defer_collect(request)).await
    }

    /// Every row due for collection (all Scan pages).
    pub async fn collectable(&self, due: &CollectDue) -> Result<Vec<JobRow>, LedgerError> {
        let mut rows = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let (page, next) = self.call().scan_collectable(due, from.as_deref()).await?;
            rows.extend(page);
            match next {
                Some(next) => from = Some(next),
                None => return Ok(rows),
            }
        }
    }

    /// Every done row whose count is not known complete (all Scan pages).
    pub async fn unsealed(&self) -> Result<Vec<JobRow>, LedgerError> {
        let mut rows = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let (page, next) = self.call().scan_unsealed(from.as_deref()).await?;
            rows.extend(page);
            match next {
                Some(next) => from = Some(next),
                None => return Ok(rows),
            }
        }
    }

    /// Declares `row`'s count complete (see [`LedgerTable::seal_refs`]).
    pub async fn seal_refs(
        &self,
        row: &JobRow,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.call().seal_refs(row, now_ms).await
    }
}
