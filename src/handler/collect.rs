//! Collection: a job no object version references any more, once its grace
//! has passed, loses its outputs and then its row. DESIGN.md ("Collection")
//! has the argument that no referenced prefix is ever deleted.
//!
//! 1. The row moves `done` → `collecting` in one conditional write: marked
//!    by a release (or its finish) at or before the cut-off.
//! 2. Its reference items are read, one consistent Query per shard. Any
//!    found: the row goes back to `done` (its mark cleared when it is
//!    older than [`MARK_SETTLE_MS`] and still the one seen). An adder
//!    writes its reference and then reads the row: if this read missed
//!    the reference, the adder's read came after step 1 and saw
//!    `collecting` (busy). DESIGN.md, "The collector and the adder".
//! 3. `deletes_started_at_ms` is recorded: from then on the outputs are
//!    partial, and no later collection gives the row back as `done`.
//! 4. Every object under the row's output prefix is deleted, a page at a
//!    time (ListObjectsV2, DeleteObjects), while the collector's lease
//!    lasts.
//! 5. The row is deleted, conditioned on still being this collection's.
//!
//! A collection that stops anywhere leaves a `collecting` row whose lease
//! passes: the next collection (or a claim, which runs the job again from
//! nothing) takes it over. A collection that fails (a prefix that cannot
//! be listed or deleted: permissions, Object Lock, a missing bucket) ends
//! its lease at once and backs the job off (`collect_retry_at_ms`, doubling
//! from an hour to a week), and the sweep goes on to the next job: one job
//! never stops the rest.
//!
//! Abandoned rows are collected the same way: a `running` row whose lease
//! ended a grace ago, or a `failed` one (not poisoned) untouched for a
//! grace: no message came back for them, because their object is gone.

use std::time::Duration;

use super::references::MARK_SETTLE_MS;
use super::App;
use crate::config::split_s3_location;
use crate::ledger::{CollectDue, CollectRequest, Conditional, DeferCollect, JobRow};
use crate::executions::ExecutionStatus;
use crate::references::HOLD_START_MS;

/// How long a collection may take before another may take it over.
pub const COLLECT_LEASE: Duration = Duration::from_secs(300);
/// No page of deletes starts with less than this left of the lease.
const LEASE_MARGIN: Duration = Duration::from_secs(30);
/// A page (its listing and its DeleteObjects, the SDK's retries included)
/// is abandoned after this, shorter than [`LEASE_MARGIN`]: no delete of
/// this collection is still in flight when its lease ends and a claim may
/// take the row over and write the job's outputs again. (A check of the
/// lease before the page alone would not do: a DeleteObjects that stalls
/// past the lease would delete the new run's outputs.)
const PAGE_TIMEOUT: Duration = Duration::from_secs(20);
/// A job whose collection failed is not collected again for this long,
/// doubled at each failure in a row, up to [`MAX_BACK_OFF`].
pub const FIRST_BACK_OFF: Duration = Duration::from_secs(3600);
pub const MAX_BACK_OFF: Duration = Duration::from_secs(7 * 24 * 3600);

/// What collecting a job came to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Collected {
    pub job_key: String,
    /// The objects deleted (or, in a dry run, that would be).
    pub deleted: Vec<String>,
    /// `collected`, `dry-run`, or why not (`not due: ...`).
    pub outcome: String,
}

/// A collection that failed: the job and why. The sweep goes on past it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CollectionFailure {
    pub job_key: String,
    pub error: String,
}

/// What one sweep came to: every job collected (or, in a dry run, that
/// would be), and every one whose collection failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Sweep {
    pub collected: Vec<Collected>,
    pub failures: Vec<CollectionFailure>,
}

impl Sweep {
    /// Adds one job's collection; a failure is logged at error with its
    /// cause (the job is backed off already) and listed.
    pub fn record(&mut self, job_key: &str, result: Result<Collected, String>) {
        match result {
            Ok(collected) => self.collected.push(collected),
            Err(error) => {
                tracing::error!(
                    job_key,
                    error = %error,
                    "collection failed; the job is backed off and the sweep goes on"
                );
                self.failures.push(CollectionFailure {
                    job_key: job_key.to_string(),
                    error,
                });
            }
        }
    }

    /// The objects deleted (or that would be).
    pub fn objects(&self) -> usize {
        self.collected.iter().map(|c| c.deleted.len()).sum()
    }
}

/// How long a job waits after its `failures`-th failed collection in a row
/// (counting from 1).
pub fn back_off(failures: u64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16) as u32;
    FIRST_BACK_OFF.saturating_mul(1 << doublings).min(MAX_BACK_OFF)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl App {
    /// Collects `job_key` if it is due now. `Err` when a call fails: the
    /// collection's lease ends at once and the job is backed off
    /// (`defer_collection`); a collector that dies instead leaves the row
    /// `collecting` until its lease passes, and it is then taken over.
    pub async fn collect(&self, job_key: &str) -> Result<Collected, String> {
        let now = self.now_ms();
        let owner = self.owner_token("collector");
        let lease_until_ms = now + millis(COLLECT_LEASE);
        let request = CollectRequest {
            job_key: job_key.to_string(),
            owner: owner.clone(),
            lease_until_ms,
            due: self.collect_due_at(now),
        };
        let row = match self.ledger.begin_collect(&request).await {
            Ok(Conditional::Applied(row)) => row,
            Ok(Conditional::Rejected(row)) => {
                return Ok(Collected {
                    job_key: job_key.to_string(),
                    deleted: Vec::new(),
                    outcome: format!("not due: {}", why_not(row.as_ref())),
                })
            }
            Err(err) => return Err(err.to_string()),
        };
        if let Some(kept) = self.keep_if_referenced(&row, &owner).await? {
            return Ok(kept);
        }
        match self.start_deleting(&row, &owner).await {
            Ok(()) => {}
            Err(error) => {
                self.defer_collection(&row, &owner).await;
                return Err(error);
            }
        }
        match self.delete_outputs(&row, lease_until_ms).await {
            Ok(deleted) => self.end_collection(&row, &owner, deleted).await,
            Err(error) => {
                self.defer_collection(&row, &owner).await;
                Err(error)
            }
        }
    }

    /// Whether anything references the job: a version, or a split's hold
    /// whose execution may still need the chunk. A hold whose execution
    /// has closed (its end released the hold, or will not need it: a
    /// closed execution sends no task), or has not started
    /// [`HOLD_START_MS`] after the hold was written (its claimant died
    /// between holding and starting it, and nothing would ever release
    /// it), is no reference: deleted here. Found by the explorer: such a
    /// hold, its claim taken over by a claimant that died before
    /// releasing it, kept its chunk's row and files for good. Without a
    /// state machine to ask, every hold is kept.
    async fn referenced(&self, job_key: &str) -> Result<bool, String> {
        let first = self
            .ledger
            .first_reference(job_key)
            .await
            .map_err(|e| e.to_string())?;
        match first {
            None => return Ok(false),
            Some(holder) if holder.hold_of().is_none() => return Ok(true),
            Some(_) => {}
        }
        // A hold came first: every reference read, each hold judged.
        let holders = self
            .ledger
            .holders(job_key)
            .await
            .map_err(|e| e.to_string())?;
        let mut dead = Vec::new();
        for holder in holders {
            let Some(execution) = holder.hold_of() else {
                return Ok(true);
            };
            if self.hold_is_live(execution, holder.created_at_ms).await? {
                return Ok(true);
            }
            dead.push(holder.version_row);
        }
        for holder in dead {
            tracing::info!(job_key, holder, "a dead split's hold dropped");
            self.ledger
                .drop_hold(&holder, job_key, self.now_ms())
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(false)
    }

    /// Whether the hold of execution `name`, written at `created_at_ms`,
    /// may still protect a chunk its execution needs.
    async fn hold_is_live(&self, name: &str, created_at_ms: Option<u64>) -> Result<bool, String> {
        let Some((machine, executions)) = self.split_engine() else {
            return Ok(true);
        };
        let arn = crate::executions::execution_arn(machine, name);
        let status = executions
            .describe_execution(&arn)
            .await
            .map_err(|e| format!("describing {arn}: {e}"))?;
        Ok(match status {
            Some(ExecutionStatus::Running) => true,
            Some(_) => false,
            None => created_at_ms.is_none_or(|at| at.saturating_add(HOLD_START_MS) > self.now_ms()),
        })
    }

    /// Step 2: for a row whose deletes never started, reads its
    /// references. `None`: there are none, delete. `Some`: referenced,
    /// given back in the status it had when the collection began
    /// ([`JobRow::kept_status`]: `done` only if it was). `Err`: the read
    /// failed; the row is given back the same way (nothing was deleted)
    /// and the failure counted.
    ///
    /// An abandoned row (no mark: `running` past its lease or `failed`,
    /// for a grace) is read too: its object is usually gone, but a live
    /// version whose message was dead-lettered leaves its job so, and the
    /// outputs its earlier run made are still that version's. (Found by
    /// the explorer: a versioned bucket's older version, its job's
    /// collection stopped, the claim that took the row over failing.)
    async fn keep_if_referenced(
        &self,
        row: &JobRow,
        owner: &str,
    ) -> Result<Option<Collected>, String> {
        if row.deletes_started_at_ms.is_some() {
            return Ok(None);
        }
        let job_key = row.job_key.as_str();
        let referenced = self.referenced(job_key).await;
        let now = self.now_ms();
        // A mark newer than the settle time may precede a release still on
        // its way to delete the item this read saw: kept, so the next
        // sweep looks again.
        let settled = row
            .released_at_ms
            .is_some_and(|at| at.saturating_add(MARK_SETTLE_MS) <= now);
        let clear = match referenced {
            Ok(false) => return Ok(None),
            Ok(true) if settled => row.free_mark.as_deref(),
            _ => None,
        };
        // Best effort: if this write fails, the lease passes and a claim
        // or the next collection takes the row over.
        // Given back in the status it had: only a row that was `done` is
        // `done` again (a failed or abandoned run's partial outputs are
        // never handed out).
        let back = row.kept_status();
        if let Err(err) = self
            .ledger
            .keep_collected(job_key, owner, back, clear, now)
            .await
        {
            tracing::warn!(job_key, error = %err, "a referenced job could not be given back as done; its lease passes");
        }
        match referenced {
            Ok(_) => Ok(Some(Collected {
                job_key: job_key.to_string(),
                deleted: Vec::new(),
                outcome: "referenced: kept".into(),
            })),
            Err(err) => Err(format!(
                "collecting {job_key}: reading its references failed: {err}"
            )),
        }
    }

    /// Step 3: records that deletes start (conditioned on still owning the
    /// collection).
    async fn start_deleting(&self, row: &JobRow, owner: &str) -> Result<(), String> {
        if row.deletes_started_at_ms.is_some() {
            return Ok(());
        }
        match self
            .ledger
            .start_deletes(&row.job_key, owner, self.now_ms())
            .await
        {
            Ok(Conditional::Applied(())) => Ok(()),
            Ok(Conditional::Rejected(now)) => Err(format!(
                "collecting {}: the row changed under the collection ({})",
                row.job_key,
                why_not(now.as_ref())
            )),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Deletes every object under the row's output prefix, a page at a
    /// time, while the collector's lease lasts.
    async fn delete_outputs(&self, row: &JobRow, lease_until_ms: u64) -> Result<Vec<String>, String> {
        let job_key = &row.job_key;
        let (bucket, prefix) = prefix_of(row)?;
        let mut deleted = Vec::new();
        loop {
            // Never past the lease: a collection taken over must not delete
            // what the next run writes.
            if self.now_ms() + millis(LEASE_MARGIN) >= lease_until_ms {
                return Err(format!(
                    "collecting {job_key}: the lease ran short after {} objects; \
                     the next collection finishes it",
                    deleted.len()
                ));
            }
            let page = async {
                let (keys, _) = self
                    .store
                    .list_page(bucket, prefix, None)
                    .await
                    .map_err(|e| format!("collecting {job_key}: listing {prefix}: {e}"))?;
                if !keys.is_empty() {
                    self.store.delete_keys(bucket, &keys).await.map_err(|e| {
                        format!("collecting {job_key}: deleting under {prefix}: {e}")
                    })?;
                }
                Ok::<_, String>(keys)
            };
            let keys = tokio::time::timeout(PAGE_TIMEOUT, page)
                .await
                .map_err(|_| {
                    format!(
                        "collecting {job_key}: a page of deletes under {prefix} took more than \
                         {} s: abandoned before the lease ends",
                        PAGE_TIMEOUT.as_secs()
                    )
                })??;
            if keys.is_empty() {
                return Ok(deleted);
            }
            deleted.extend(keys);
        }
    }

    /// Deletes the collected row, conditioned on the collection still
    /// being this one.
    async fn end_collection(
        &self,
        row: &JobRow,
        owner: &str,
        deleted: Vec<String>,
    ) -> Result<Collected, String> {
        let job_key = row.job_key.as_str();
        match self.ledger.end_collect(job_key, owner).await {
            Ok(Conditional::Applied(())) => {
                tracing::info!(job_key, objects = deleted.len(), "collected");
                Ok(Collected {
                    job_key: job_key.to_string(),
                    deleted,
                    outcome: "collected".into(),
                })
            }
            Ok(Conditional::Rejected(row)) => Err(format!(
                "collecting {job_key}: the row changed under the collection ({})",
                why_not(row.as_ref())
            )),
            Err(err) => Err(err.to_string()),
        }
    }

    /// After a failed collection: its lease ends now (a claim may run the
    /// job again at once) and the job is backed off. Best effort: if this
    /// write fails too, the lease passes by itself and the next sweep
    /// retries without waiting.
    async fn defer_collection(&self, row: &JobRow, owner: &str) {
        let now_ms = self.now_ms();
        let wait = back_off(row.collect_failures + 1);
        let request = DeferCollect {
            job_key: row.job_key.clone(),
            owner: owner.to_string(),
            now_ms,
            retry_at_ms: now_ms + millis(wait),
        };
        match self.ledger.defer_collect(&request).await {
            Ok(Conditional::Applied(())) => {}
            Ok(Conditional::Rejected(row)) => tracing::warn!(
                job_key = %request.job_key,
                row = %why_not(row.as_ref()),
                "a failed collection's row changed before it was backed off"
            ),
            Err(err) => tracing::warn!(
                job_key = %request.job_key,
                error = %err,
                "a failed collection could not be backed off; its lease passes by itself"
            ),
        }
    }

    /// What is due at `now_ms`, with this configuration's grace and caps.
    fn collect_due_at(&self, now_ms: u64) -> CollectDue {
        CollectDue {
            before_ms: now_ms.saturating_sub(millis(self.config.gc_grace)),
            now_ms,
            max_attempts: self.config.max_attempts,
        }
    }

    /// Every job due for collection now; with `dry_run`, what would be
    /// deleted, touching nothing. A job whose collection fails is logged
    /// with its cause, backed off, and listed in the sweep's failures; the
    /// sweep goes on. `Err` only when the due jobs cannot be listed.
    pub async fn collect_due(&self, dry_run: bool) -> Result<Sweep, String> {
        let due = self
            .ledger
            .collectable(&self.collect_due_at(self.now_ms()))
            .await
            .map_err(|e| e.to_string())?;
        let mut sweep = Sweep::default();
        for row in due {
            let result = if dry_run {
                self.would_delete(&row).await
            } else {
                self.collect(&row.job_key).await
            };
            sweep.record(&row.job_key, result);
        }
        Ok(sweep)
    }

    /// What collecting `row` would delete, touching nothing.
    async fn would_delete(&self, row: &JobRow) -> Result<Collected, String> {
        let (bucket, prefix) = prefix_of(row)?;
        let mut keys = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let (page, next) = self
                .store
                .list_page(bucket, prefix, from.as_deref())
                .await
                .map_err(|e| format!("listing {prefix}: {e}"))?;
            keys.extend(page);
            match next {
                Some(next) => from = Some(next),
                None => break,
            }
        }
        Ok(Collected {
            job_key: row.job_key.clone(),
            deleted: keys,
            outcome: "dry-run".into(),
        })
    }
}

/// The bucket and key prefix a row's outputs are under, refused unless it
/// ends with the job's own key: collection never deletes anything else.
fn prefix_of(row: &JobRow) -> Result<(&str, &str), String> {
    let own = format!("{}/", row.job_key);
    match split_s3_location(&row.output_prefix) {
        Some((bucket, prefix)) if prefix.ends_with(&own) => Ok((bucket, prefix)),
        _ => Err(format!(
            "job {}: its output_prefix {:?} is not an s3://bucket/.../<job key>/ location: not collected",
            row.job_key, row.output_prefix
        )),
    }
}

fn why_not(row: Option<&JobRow>) -> String {
    match row {
        None => "no such job".into(),
        Some(row) => format!(
            "{}{}, marked {:?} at {:?}",
            row.status.as_str(),
            if row.ref_items { "" } else { " (from before reference items: never collected until `mediaonce refs seal`)" },
            row.free_mark,
            row.released_at_ms
        ),
    }
}

/// With no grace (`MEDIAONCE_GC_GRACE_SECS=0`), the jobs a release freed
/// are collected at once; otherwise the sweep (`mediaonce gc`, or the
/// scheduled event) collects them when their grace has passed. A failed
/// collection is logged, backed off and counted (`CollectionFailures`):
/// the sweep finishes it.
pub(super) async fn collect_now(app: &App, released: &[String]) {
    if !app.config.gc_grace.is_zero() {
        return;
    }
    let mut sweep = Sweep::default();
    for job_key in released {
        let result = app.collect(job_key).await;
        if let Ok(collected) = &result {
            tracing::info!(job_key, outcome = collected.outcome.as_str(), objects = collected.deleted.len(), "collection");
        }
        sweep.record(job_key, result);
    }
    if !sweep.failures.is_empty() {
        app.write_sweep_metrics(&sweep);
    }
}
