//! A ledger table with DynamoDB's contention: wraps another table (the
//! in-memory one) and refuses calls as DynamoDB would under load, which no
//! emulator does (moto serialises every call behind one lock).
//!
//! - **Transaction conflicts.** A transaction holds its items for
//!   `transaction_ms` (DynamoDB's take a few tens of milliseconds). Another
//!   transaction touching any of them meanwhile is cancelled with
//!   `TransactionConflict`, and a plain write to one of them fails with
//!   `TransactionConflictException` (DynamoDB's documented behaviour;
//!   reads see the last committed item and never conflict).
//! - **Throttling.** Each partition key takes at most `item_write_units`
//!   write units per second (DynamoDB's partition limit, about 1,000: one
//!   item never spreads over partitions; a reference item's partition is
//!   its `<job>#<shard>`, shared by the shard's items). A write costs 1
//!   unit, charged even when its condition fails; an item in a
//!   transaction costs 2. Consistent reads (a GetItem, a Query page) take
//!   1 read unit each, at most 3,000 a second per partition key.
//!
//! Time is tokio's: with time paused (tests), waits and backoff cost
//! nothing and the contention is the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{
    Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, Contention, DeferCollect,
    ExecutionRecord, Finish, JobRow, LedgerError, LedgerTable, RefWrite,
};
use crate::identity::ObjectVersion;
use crate::references::{partition_of, RefChange, RefItem, VersionName, VersionRefs};

/// Calls refused so far, by why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refusals {
    pub conflicts: u64,
    pub throttles: u64,
}

#[derive(Debug, Default)]
struct Load {
    /// Items held by a transaction in flight (how many hold each).
    held: HashMap<String, u32>,
    /// Write units charged so far (all items).
    charged: f64,
    /// Per partition key: the second (since start) and the write units it
    /// took in it.
    units: HashMap<String, (u64, f64)>,
    /// Per partition key: the second and the read units it took in it.
    read_units: HashMap<String, (u64, f64)>,
    refusals: Refusals,
}

/// Clones share the load (one table, several ledgers).
#[derive(Debug, Clone)]
pub struct ContendedTable {
    inner: Arc<dyn LedgerTable>,
    transaction_ms: u64,
    item_write_units: f64,
    started: tokio::time::Instant,
    load: Arc<Mutex<Load>>,
}

impl ContendedTable {
    /// DynamoDB's limits: transactions held 25 ms, 1,000 units an item.
    pub fn new(inner: impl LedgerTable + 'static) -> Self {
        ContendedTable::with_limits(inner, 25, 1_000.0)
    }

    pub fn with_limits(
        inner: impl LedgerTable + 'static,
        transaction_ms: u64,
        item_write_units: f64,
    ) -> Self {
        ContendedTable {
            inner: Arc::new(inner),
            transaction_ms,
            item_write_units,
            started: tokio::time::Instant::now(),
            load: Arc::default(),
        }
    }

    /// Write units charged so far, as DynamoDB would bill them.
    pub fn write_units(&self) -> f64 {
        self.load().charged
    }

    pub fn refusals(&self) -> Refusals {
        self.load().refusals
    }

    fn load(&self) -> std::sync::MutexGuard<'_, Load> {
        self.load.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse(
        &self,
        load: &mut Load,
        operation: &'static str,
        contention: Contention,
    ) -> LedgerError {
        match contention {
            Contention::TransactionConflict => load.refusals.conflicts += 1,
            Contention::Throttled => load.refusals.throttles += 1,
        }
        LedgerError::Contended {
            operation,
            table: self.inner.name().to_string(),
            contention,
        }
    }

    /// Charges `units` to each item's partition, or refuses the call
    /// (nothing charged) when an item is held by a transaction or a
    /// partition is past its throughput. `items`: (item, partition key).
    fn admit(
        &self,
        load: &mut Load,
        operation: &'static str,
        items: &[(String, String)],
        units: f64,
    ) -> Result<(), LedgerError> {
        if items.iter().any(|(item, _)| load.held.contains_key(item)) {
            return Err(self.refuse(load, operation, Contention::TransactionConflict));
        }
        let second = self.started.elapsed().as_secs();
        // Units per partition in this call (a transaction may put several
        // items in one partition).
        let mut asked: HashMap<&str, f64> = HashMap::new();
        for (_, partition) in items {
            *asked.entry(partition).or_default() += units;
        }
        if Self::over(&load.units, &asked, second, self.item_write_units) {
            return Err(self.refuse(load, operation, Contention::Throttled));
        }
        Self::charge(&mut load.units, &asked, second);
        load.charged += units * items.len() as f64;
        Ok(())
    }

    fn over(
        used: &HashMap<String, (u64, f64)>,
        asked: &HashMap<&str, f64>,
        second: u64,
        limit: f64,
    ) -> bool {
        asked
            .iter()
            .any(|(partition, units)| match used.get(*partition) {
                Some((at, used)) if *at == second => used + units > limit,
                _ => *units > limit,
            })
    }

    fn charge(used: &mut HashMap<String, (u64, f64)>, asked: &HashMap<&str, f64>, second: u64) {
        for (partition, units) in asked {
            let entry = used.entry(partition.to_string()).or_insert((second, 0.0));
            if entry.0 != second {
                *entry = (second, 0.0);
            }
            entry.1 += units;
        }
    }

    /// A plain write of one item (its own partition).
    fn write(&self, operation: &'static str, item: &str) -> Result<(), LedgerError> {
        let mut load = self.load();
        self.admit(
            &mut load,
            operation,
            &[(item.to_string(), item.to_string())],
            1.0,
        )
    }

    /// A consistent read of one partition key: 1 read unit, at most 3,000
    /// a second.
    fn read(&self, operation: &'static str, partition: &str) -> Result<(), LedgerError> {
        let mut load = self.load();
        let second = self.started.elapsed().as_secs();
        let asked = HashMap::from([(partition, 1.0)]);
        if Self::over(
            &load.read_units,
            &asked,
            second,
            3.0 * self.item_write_units,
        ) {
            return Err(self.refuse(&mut load, operation, Contention::Throttled));
        }
        Self::charge(&mut load.read_units, &asked, second);
        Ok(())
    }
}

#[async_trait::async_trait]
impl LedgerTable for ContendedTable {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        self.read("GetItem", job_key)?;
        self.inner.get(job_key).await
    }

    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        self.write("PutItem", &row.job_key)?;
        self.inner.put_new(row).await
    }

    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        self.write("UpdateItem", &request.job_key)?;
        self.inner.take_over(seen, request).await
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.write("UpdateItem", &claim.job_key)?;
        self.inner.finish(claim, finish, now_ms).await
    }

    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        self.write("DeleteItem", &claim.job_key)?;
        self.inner.release(claim).await
    }

    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.write("UpdateItem", job_key)?;
        self.inner.reset_attempts(job_key, now_ms).await
    }

    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        self.inner.get_input_hash(version).await
    }

    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.write("PutItem", &version.row_key())?;
        self.inner.put_input_hash(version, input_hash, now_ms).await
    }

    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.write("DeleteItem", &version.row_key())?;
        self.inner.forget_input_hash(version).await
    }

    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.read("GetItem", &version.row_key())?;
        self.inner.get_version_refs(version).await
    }

    /// Holds its items for `transaction_ms`, then applies.
    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        let row_key = version.row_key();
        let items: Vec<(String, String)> = std::iter::once((row_key.clone(), row_key.clone()))
            .chain(change.add.iter().chain(&change.remove).map(|job_key| {
                let item = RefItem {
                    job_key: job_key.clone(),
                    version_row: row_key.clone(),
                };
                let partition = item.partition();
                (format!("{partition}/{row_key}"), partition)
            }))
            .collect();
        {
            let mut load = self.load();
            self.admit(&mut load, "TransactWriteItems", &items, 2.0)?;
            for (item, _) in &items {
                *load.held.entry(item.clone()).or_default() += 1;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(self.transaction_ms)).await;
        let result = self.inner.change_refs(version, change, now_ms).await;
        let mut load = self.load();
        for (item, _) in &items {
            if let Some(count) = load.held.get_mut(item) {
                *count -= 1;
                if *count == 0 {
                    load.held.remove(item);
                }
            }
        }
        result
    }

    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.write("UpdateItem", &request.job_key)?;
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
        self.write("UpdateItem", job_key)?;
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
        self.write("UpdateItem", job_key)?;
        self.inner.start_deletes(job_key, owner, now_ms).await
    }

    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.write("UpdateItem", job_key)?;
        self.inner.mark_released(job_key, nonce, now_ms).await
    }

    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        self.read("Query", &partition_of(job_key, shard))?;
        self.inner.query_refs(job_key, shard, limit, from).await
    }

    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.write("DeleteItem", job_key)?;
        self.inner.end_collect(job_key, owner).await
    }

    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        self.write("UpdateItem", &request.job_key)?;
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
        self.write("UpdateItem", &row.job_key)?;
        self.inner.seal_refs(row, now_ms).await
    }

    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.write("UpdateItem", job_key)?;
        self.inner.record_execution(job_key, record, now_ms).await
    }

    /// Each item a write of its own partition, as BatchWriteItem's are
    /// (not a transaction: nothing is held).
    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        for job_key in add.iter().chain(remove) {
            let item = RefItem {
                job_key: job_key.clone(),
                version_row: holder.to_string(),
            };
            self.write("BatchWriteItem", &item.partition())?;
        }
        self.inner
            .write_holder_refs(holder, add, remove, now_ms)
            .await
    }
}
