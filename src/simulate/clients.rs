//! The simulation's clients: the in-memory table and store, each counting
//! its calls (the queue is [`crate::queue::RecordingQueue`]), and a table on which a worker can die before it
//! finishes (the row keeps its lease, as a real crash leaves it). Each can
//! also take a latency per call, as a network would (`bench/handler.sh`).

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;

use crate::fingerprint::ObjectHead;
use crate::identity::ObjectVersion;
use crate::ledger::memory::InMemoryTable;
use crate::ledger::{
    Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, DeferCollect, ExecutionRecord,
    Finish, JobRow, LedgerError, LedgerTable, RefWrite,
};
use crate::references::{RefChange, VersionName, VersionRefs};
use crate::store::memory::InMemoryObjects;
use crate::store::{
    DeleteError, GetError, HeadError, ListError, ObjectClient, ObjectHeaders, ObjectRef, PutError,
    VersionsPage,
};

/// Calls and capacity units by call, as DynamoDB on-demand would bill them
/// (items under 1 KB: a write 1 unit, a consistent read 1, an eventually
/// consistent read 0.5, each item of a transaction twice).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TableUse {
    pub calls: BTreeMap<&'static str, u64>,
    pub write_units: f64,
    pub read_units: f64,
}

impl TableUse {
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }
}

/// The claim table: in memory, counted, and dying before a finish for the
/// jobs in `crash_before_finish`.
#[derive(Debug)]
pub struct SimTable {
    inner: InMemoryTable,
    /// Waited before each call (none by default).
    pub latency: Duration,
    pub usage: Arc<Mutex<TableUse>>,
    /// Jobs whose worker dies at the finish (shared with the step).
    pub crash_before_finish: Arc<Mutex<HashSet<String>>>,
}

impl Default for SimTable {
    fn default() -> Self {
        SimTable::new()
    }
}

impl SimTable {
    pub fn new() -> Self {
        SimTable {
            inner: InMemoryTable::new("simulated"),
            latency: Duration::ZERO,
            usage: Arc::default(),
            crash_before_finish: Arc::default(),
        }
    }

    /// Counts a call, after its latency.
    async fn count(&self, call: &'static str, write_units: f64, read_units: f64) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        *usage.calls.entry(call).or_default() += 1;
        usage.write_units += write_units;
        usage.read_units += read_units;
    }
}

/// A worker that died: its call never returns an answer.
fn died(call: &'static str) -> LedgerError {
    LedgerError::Service {
        operation: call,
        table: "simulated".into(),
        message: "the worker died".into(),
        kind: crate::error::ErrorKind::Transient,
    }
}

#[async_trait::async_trait]
impl LedgerTable for SimTable {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        self.count("GetItem (job)", 0.0, 1.0).await;
        self.inner.get(job_key).await
    }
    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        self.count("PutItem (claim)", 1.0, 0.0).await;
        self.inner.put_new(row).await
    }
    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        self.count("UpdateItem (takeover)", 1.0, 0.0).await;
        self.inner.take_over(seen, request).await
    }
    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let crashed = self
            .crash_before_finish
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&claim.job_key);
        if crashed {
            return Err(died("UpdateItem"));
        }
        self.count("UpdateItem (finish)", 1.0, 0.0).await;
        self.inner.finish(claim, finish, now_ms).await
    }
    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        self.count("DeleteItem (release)", 1.0, 0.0).await;
        self.inner.release(claim).await
    }
    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.count("UpdateItem (retry)", 1.0, 0.0).await;
        self.inner.reset_attempts(job_key, now_ms).await
    }
    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        self.count("GetItem (hash cache)", 0.0, 0.5).await;
        self.inner.get_input_hash(version).await
    }
    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.count("PutItem (hash cache)", 1.0, 0.0).await;
        self.inner.put_input_hash(version, input_hash, now_ms).await
    }
    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.count("DeleteItem (hash cache)", 1.0, 0.0).await;
        self.inner.forget_input_hash(version).await
    }
    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        self.count("GetItem (references)", 0.0, 1.0).await;
        self.inner.get_version_refs(version).await
    }
    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        let items = 1 + change.add.len() + change.remove.len();
        self.count("TransactWriteItems (references)", 2.0 * items as f64, 0.0)
            .await;
        self.inner.change_refs(version, change, now_ms).await
    }
    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.count("UpdateItem (collect)", 1.0, 0.0).await;
        self.inner.begin_collect(request).await
    }
    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: crate::ledger::JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.count("UpdateItem (referenced: kept)", 1.0, 0.0).await;
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
        self.count("UpdateItem (deletes start)", 1.0, 0.0).await;
        self.inner.start_deletes(job_key, owner, now_ms).await
    }
    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.count("UpdateItem (release mark)", 1.0, 0.0).await;
        self.inner.mark_released(job_key, nonce, now_ms).await
    }
    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        self.count("Query (references)", 0.0, 1.0).await;
        self.inner.query_refs(job_key, shard, limit, from).await
    }
    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.count("DeleteItem (collected)", 1.0, 0.0).await;
        self.inner.end_collect(job_key, owner).await
    }
    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        self.count("UpdateItem (collection failed)", 1.0, 0.0).await;
        self.inner.defer_collect(request).await
    }
    async fn scan_collectable(
        &self,
        due: &CollectDue,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        self.count("Scan (sweep)", 0.0, 1.0).await;
        self.inner.scan_collectable(due, from).await
    }
    async fn scan_unsealed(
        &self,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        self.count("Scan (seal)", 0.0, 1.0).await;
        self.inner.scan_unsealed(from).await
    }
    async fn seal_refs(&self, row: &JobRow, now_ms: u64) -> Result<Conditional<()>, LedgerError> {
        self.count("UpdateItem (seal)", 1.0, 0.0).await;
        self.inner.seal_refs(row, now_ms).await
    }
    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.count("UpdateItem (execution)", 1.0, 0.0).await;
        self.inner.record_execution(job_key, record, now_ms).await
    }
    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        let items = (add.len() + remove.len()) as f64;
        self.count("BatchWriteItem (holds)", items, 0.0).await;
        self.inner
            .write_holder_refs(holder, add, remove, now_ms)
            .await
    }
}

/// The buckets: in memory, each request counted.
#[derive(Debug)]
pub struct SimObjects {
    pub inner: Arc<InMemoryObjects>,
    /// Waited before a HEAD, and before a GET.
    pub head_latency: Duration,
    pub get_latency: Duration,
    pub requests: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Default for SimObjects {
    fn default() -> Self {
        SimObjects::new()
    }
}

impl SimObjects {
    pub fn new() -> Self {
        SimObjects {
            inner: InMemoryObjects::new(),
            head_latency: Duration::ZERO,
            get_latency: Duration::ZERO,
            requests: Arc::default(),
        }
    }

    async fn count(&self, request: &'static str) {
        let latency = match request {
            "HEAD" => self.head_latency,
            "GET" => self.get_latency,
            _ => Duration::ZERO,
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        *self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(request)
            .or_default() += 1;
    }
}

#[async_trait::async_trait]
impl ObjectClient for SimObjects {
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        self.count("HEAD").await;
        self.inner.head_object(object).await
    }
    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.count("GET").await;
        self.inner.get_object(object).await
    }
    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        self.count("GET").await;
        self.inner.get_object_range(object, range).await
    }
    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError> {
        self.count("PUT").await;
        self.inner
            .put_object(bucket, key, headers, body, checksum_sha256)
            .await
    }
    async fn copy_object(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        self.count("COPY").await;
        self.inner.copy_object(from, bucket, key, headers).await
    }
    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError> {
        self.count("LIST").await;
        self.inner.list_objects(bucket, prefix, from).await
    }
    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        self.count("DELETE").await;
        self.inner.delete_objects(bucket, keys).await
    }
    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
        self.count("LIST").await;
        self.inner.list_object_versions(bucket, prefix, from).await
    }
}
