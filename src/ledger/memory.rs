//! Job rows in memory, with the same conditional semantics as the DynamoDB
//! table: each call is atomic under one lock. For unit tests and tools; it
//! is not shared between processes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{
    Claim, ClaimRequest, Conditional, Finish, JobRow, JobStatus, LedgerError, LedgerTable,
};
use crate::identity::ObjectVersion;
use crate::references::{RefChange, RefHolder, VersionName, VersionRefs};

use super::{
    collectable, unsealed, CollectDue, CollectRequest, DeferCollect, ExecutionRecord, RefWrite,
};

#[derive(Debug, Default)]
pub struct InMemoryTable {
    name: String,
    rows: Mutex<HashMap<String, JobRow>>,
    /// Hash cache rows: the version and its hash, by row key.
    hashes: Mutex<HashMap<String, (ObjectVersion, String)>>,
    /// Version rows (references), by row key. Locked after `rows`.
    versions: Mutex<HashMap<String, VersionRefs>>,
    /// The references table: (job key, version row key). Locked after
    /// `versions`.
    /// Reference items: (job, row key) → when written.
    refs: Mutex<BTreeMap<(String, String), u64>>,
    /// The version each version row key names, as its reference items
    /// carry it.
    names: Mutex<HashMap<String, VersionName>>,
}

impl InMemoryTable {
    pub fn new(name: impl Into<String>) -> Self {
        InMemoryTable {
            name: name.into(),
            rows: Mutex::default(),
            hashes: Mutex::default(),
            versions: Mutex::default(),
            refs: Mutex::default(),
            names: Mutex::default(),
        }
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, HashMap<String, JobRow>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hashes(&self) -> std::sync::MutexGuard<'_, HashMap<String, (ObjectVersion, String)>> {
        self.hashes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, VersionRefs>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refs(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), u64>> {
        self.refs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, VersionName>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every reference item: (job key, version row key).
    pub fn reference_items(&self) -> Vec<(String, String)> {
        self.refs().keys().cloned().collect()
    }

    /// Every version row, by row key.
    pub fn version_rows(&self) -> Vec<(String, VersionRefs)> {
        let mut rows: Vec<_> = self
            .versions()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Every job row, as it is now.
    pub fn job_rows(&self) -> Vec<JobRow> {
        self.rows().values().cloned().collect()
    }

    /// Writes a row unconditionally (seeding a test).
    pub fn insert(&self, row: JobRow) {
        self.rows().insert(row.job_key.clone(), row);
    }
}

#[async_trait::async_trait]
impl LedgerTable for InMemoryTable {
    fn name(&self) -> &str {
        &self.name
    }

    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        Ok(self.rows().get(job_key).cloned())
    }

    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        if let Some(existing) = rows.get(&row.job_key) {
            return Ok(Conditional::Rejected(Some(existing.clone())));
        }
        rows.insert(row.job_key.clone(), row.clone());
        Ok(Conditional::Applied(()))
    }

    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(&request.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.owner != seen.owner || row.status != seen.status {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.status = JobStatus::Running;
        row.owner = request.owner.clone();
        row.lease_until_ms = request.lease_until_ms;
        row.attempts += 1;
        row.updated_at_ms = request.now_ms;
        row.step = request.step.clone();
        row.input_hash = request.input_hash.clone();
        // A job that was never done has no references from before items.
        row.ref_items = true;
        // A run from nothing (a stopped collection's row): not due until
        // its finish marks it.
        row.free_mark = None;
        row.released_at_ms = None;
        row.deletes_started_at_ms = None;
        row.collected_from = None;
        row.execution = None;
        Ok(Conditional::Applied(row.attempts))
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(&claim.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.owner != claim.owner || row.status != JobStatus::Running {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.updated_at_ms = now_ms;
        row.collected_from = None;
        match finish {
            Finish::Done => {
                row.status = JobStatus::Done;
                row.error = None;
                row.free_mark = Some(claim.owner.clone());
                row.released_at_ms = Some(now_ms);
            }
            Finish::Failed { error, permanent } => {
                row.status = JobStatus::Failed;
                row.error = Some(error.to_string());
                row.failures += 1;
                row.permanent |= permanent;
            }
            Finish::Spent { error, failures } => {
                row.status = JobStatus::Failed;
                row.error = Some(error.to_string());
                row.failures = failures;
            }
        }
        Ok(Conditional::Applied(()))
    }

    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get(&claim.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.owner != claim.owner || row.status != JobStatus::Running {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        rows.remove(&claim.job_key);
        Ok(Conditional::Applied(()))
    }

    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        let expired = row.status == JobStatus::Running && row.lease_until_ms <= now_ms;
        if row.status != JobStatus::Failed && !expired {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        let was = row.clone();
        row.attempts = 0;
        row.failures = 0;
        row.permanent = false;
        row.updated_at_ms = now_ms;
        Ok(Conditional::Applied(was))
    }

    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        Ok(self
            .hashes()
            .get(&version.row_key())
            .filter(|(stored, _)| stored == version)
            .map(|(_, hash)| hash.clone()))
    }

    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        _now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.hashes()
            .insert(version.row_key(), (version.clone(), input_hash.to_string()));
        Ok(())
    }

    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.hashes().remove(&version.row_key());
        Ok(())
    }

    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        Ok(self.versions().get(&version.row_key()).cloned())
    }

    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        // Both locks for the whole transaction, `versions` first as
        // everywhere.
        let mut versions = self.versions();
        let mut refs = self.refs();
        let row_key = version.row_key();
        let current = versions.get(&row_key);
        let version_holds = match change.seen_gen {
            None => current.is_none(),
            Some(gen) => current.is_some_and(|row| row.gen == gen),
        };
        let missing: Vec<String> = if change.exact {
            change
                .remove
                .iter()
                .filter(|job| !refs.contains_key(&((*job).clone(), row_key.clone())))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        if !version_holds || !missing.is_empty() {
            return Ok(RefWrite::Cancelled {
                version: (!version_holds).then(|| current.cloned()),
                missing,
            });
        }
        versions.insert(row_key.clone(), change.next.clone());
        if !change.add.is_empty() {
            self.names().insert(row_key.clone(), version.clone());
        }
        for job_key in &change.add {
            refs.insert((job_key.clone(), row_key.clone()), now_ms);
        }
        for job_key in &change.remove {
            refs.remove(&(job_key.clone(), row_key.clone()));
        }
        Ok(RefWrite::Applied)
    }

    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        let mark_holds = clear_mark.is_none_or(|mark| row.free_mark.as_deref() == Some(mark));
        if row.status != JobStatus::Collecting || row.owner != owner || !mark_holds {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.status = back;
        row.collected_from = None;
        row.lease_until_ms = now_ms;
        row.updated_at_ms = now_ms;
        if clear_mark.is_some() {
            row.free_mark = None;
        }
        Ok(Conditional::Applied(()))
    }

    async fn start_deletes(
        &self,
        job_key: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.status != JobStatus::Collecting || row.owner != owner {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.deletes_started_at_ms = Some(now_ms);
        row.updated_at_ms = now_ms;
        Ok(Conditional::Applied(()))
    }

    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        row.free_mark = Some(nonce.to_string());
        row.released_at_ms = Some(now_ms);
        Ok(Conditional::Applied(()))
    }

    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        _from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        let names = self.names();
        let found: Vec<RefHolder> = self
            .refs()
            .iter()
            .filter(|((job, version), _)| {
                job == job_key && crate::references::shard_of(version) == shard
            })
            .map(|((_, version), at)| RefHolder {
                version_row: version.clone(),
                version: names.get(version).cloned(),
                created_at_ms: Some(*at),
            })
            .take(limit.map_or(usize::MAX, |l| l as usize))
            .collect();
        Ok((found, None))
    }

    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(&request.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if !collectable(row, &request.due) {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        // As DynamoDB's `if_not_exists(collected_from, status)`: a stopped
        // collection taken over keeps the status the first one saw.
        row.collected_from = row.collected_from.or(Some(row.status));
        row.status = JobStatus::Collecting;
        row.owner = request.owner.clone();
        row.lease_until_ms = request.lease_until_ms;
        row.updated_at_ms = request.due.now_ms;
        Ok(Conditional::Applied(row.clone()))
    }

    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.status != JobStatus::Collecting || row.owner != owner {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        rows.remove(job_key);
        Ok(Conditional::Applied(()))
    }

    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(&request.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.status != JobStatus::Collecting || row.owner != request.owner {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.lease_until_ms = request.now_ms;
        row.updated_at_ms = request.now_ms;
        row.collect_failures += 1;
        row.collect_retry_at_ms = Some(request.retry_at_ms);
        Ok(Conditional::Applied(()))
    }

    async fn scan_collectable(
        &self,
        due: &CollectDue,
        _from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        let mut due: Vec<JobRow> = self
            .rows()
            .values()
            .filter(|row| collectable(row, due))
            .cloned()
            .collect();
        due.sort_by(|a, b| a.job_key.cmp(&b.job_key));
        Ok((due, None))
    }

    async fn scan_unsealed(
        &self,
        _from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        let mut found: Vec<JobRow> = self
            .rows()
            .values()
            .filter(|row| unsealed(row))
            .cloned()
            .collect();
        found.sort_by(|a, b| a.job_key.cmp(&b.job_key));
        Ok((found, None))
    }

    async fn seal_refs(&self, seen: &JobRow, now_ms: u64) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(&seen.job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.status != JobStatus::Done || row.ref_items {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.ref_items = true;
        row.free_mark = Some(super::seal_mark(&seen.job_key, now_ms));
        row.released_at_ms = Some(now_ms);
        Ok(Conditional::Applied(()))
    }

    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get_mut(job_key) else {
            return Ok(Conditional::Rejected(None));
        };
        if row.status != JobStatus::Running || row.owner != record.owner {
            return Ok(Conditional::Rejected(Some(row.clone())));
        }
        row.execution = Some(record.execution.to_string());
        row.lease_until_ms = record.lease_until_ms;
        row.updated_at_ms = now_ms;
        Ok(Conditional::Applied(()))
    }

    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        let mut refs = self.refs();
        for job_key in add {
            refs.insert((job_key.clone(), holder.to_string()), now_ms);
        }
        for job_key in remove {
            refs.remove(&(job_key.clone(), holder.to_string()));
        }
        Ok(())
    }
}
