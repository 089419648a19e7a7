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
//! - **Throttling.** Each item takes at most `item_write_units` write
//!   units per second (DynamoDB's partition limit, about 1,000: one item
//!   never spreads over partitions). A write costs 1 unit, charged even
//!   when its condition fails; an item in a transaction costs 2.
//!
//! Time is tokio's: with time paused (tests), waits and backoff cost
//! nothing and the contention is the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{
    Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, Contention, DeferCollect, Finish,
    JobRow, LedgerError, LedgerTable, RefWrite,
};
use crate::identity::ObjectVersion;
use crate::references::{RefChange, VersionName, VersionRefs};

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
    /// Per item: the second (since start) and the units it took in it.
    units: HashMap<String, (u64, f64)>,
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

    /// Charges `units` to each item, or refuses the call (nothing
    /// charged) when one is held by a transaction or past its throughput.
    fn admit(
        &self,
        load: &mut Load,
        operation: &'static str,
        items: &[String],
        units: f64,
    ) -> Result<(), LedgerError> {
        if items.iter().any(|item| load.held.contains_key(item)) {
            return Err(self.refuse(load, operation, Contention::TransactionConflict));
        }
        let second = self.started.elapsed().as_secs();
        let over = items.iter().any(|item| match load.units.get(item) {
            Some((at, used)) if *at == second => used + units > self.item_write_units,
            _ => units > self.item_write_units,
        });
        if over {
            return Err(self.refuse(load, operation, Contention::Throttled));
        }
        for item in items {
            let entry = load.units.entry(item.clone()).or_insert((second, 0.0));
            if entry.0 != second {
                *entry = (second, 0.0);
            }
            entry.1 += units;
            load.charged += units;
        }
        Ok(())
    }

    /// A plain write of one item.
    fn write(&self, operation: &'static str, item: &str) -> Result<(), LedgerError> {
        let mut load = self.load();
        self.admit(&mut load, operation, &[item.to_string()], 1.0)
    }
}

#[async_trait::async_trait]
impl LedgerTable for ContendedTable {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
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
        self.inner.get_version_refs(version).await
    }

    /// Holds its items for `transaction_ms`, then applies.
    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        let items: Vec<String> = std::iter::once(version.row_key())
            .chain(change.add.iter().cloned())
            .chain(change.adopt.iter().cloned())
            .chain(change.remove.iter().cloned())
            .collect();
        {
            let mut load = self.load();
            self.admit(&mut load, "TransactWriteItems", &items, 2.0)?;
            for item in &items {
                *load.held.entry(item.clone()).or_default() += 1;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(self.transaction_ms)).await;
        let result = self.inner.change_refs(version, change, now_ms).await;
        let mut load = self.load();
        for item in &items {
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
}
