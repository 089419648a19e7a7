//! The claim algorithm on the in-memory table.
use super::*;

fn row(status: JobStatus, lease_until_ms: u64) -> JobRow {
    JobRow {
        execution: None,
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
        ref_items: true,
        free_mark: None,
        released_at_ms: None,
        deletes_started_at_ms: None,
        collect_failures: 0,
        collect_retry_at_ms: None,
        collected_from: None,
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
    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
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
    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        self.inner.begin_collect(request).await
    }
    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
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
        self.inner.start_deletes(job_key, owner, now_ms).await
    }
    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.inner.mark_released(job_key, nonce, now_ms).await
    }
    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        self.inner.query_refs(job_key, shard, limit, from).await
    }
    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        self.inner.end_collect(job_key, owner).await
    }
    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
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
        self.inner.seal_refs(row, now_ms).await
    }
    async fn record_execution(
        &self,
        job_key: &str,
        record: super::ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        self.inner.record_execution(job_key, record, now_ms).await
    }
    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.inner
            .write_holder_refs(holder, add, remove, now_ms)
            .await
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
    plan.fail(crate::faults::Call::PutRow, 1, "InternalServerError");
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

/// A done job, for references.
fn done_counted(job_key: &str) -> JobRow {
    JobRow {
        job_key: job_key.into(),
        ..row(JobStatus::Done, 0)
    }
}

fn version_named(key: &str) -> crate::references::VersionName {
    crate::references::VersionName {
        bucket: "in".into(),
        key: key.into(),
        version_id: Some("v1".into()),
    }
}

fn adding(job_key: &str) -> crate::references::RefChange {
    crate::references::RefChange {
        seen_gen: None,
        next: crate::references::VersionRefs {
            job_keys: [job_key.to_string()].into(),
            etag: Some("e".into()),
            sha256: None,
            etag_md5: true,
            crc64nvme: None,
            gen: 1,
            deleted: false,
            ref_items: true,
        },
        add: vec![job_key.to_string()],
        remove: Vec::new(),
        exact: true,
    }
}

#[tokio::test]
async fn contended_calls_are_retried_then_reported() {
    let memory = memory::InMemoryTable::new("t");
    memory.insert(done_counted("j"));
    let plan = Arc::new(crate::faults::FaultPlan::new());
    plan.fail(
        crate::faults::Call::ChangeRefs,
        3,
        "TransactionConflict: another transaction",
    );
    plan.fail(crate::faults::Call::PutRow, 2, "ThrottlingException: rate");
    let ledger = Ledger::new(faults::FaultyTable::new(memory, plan.clone()))
        .with_retry(RetryPolicy::immediate());
    let version = version_named("a");
    assert_eq!(
        ledger.change_refs(&version, &adding("j"), 1).await.unwrap(),
        RefWrite::Applied
    );
    assert_eq!(ledger.retries(), (3, 0));
    assert_eq!(
        ledger.references("j").await.unwrap(),
        vec![version.row_key()]
    );
    // Past the policy's attempts, the contention is reported.
    plan.fail(
        crate::faults::Call::ChangeRefs,
        RetryPolicy::default().attempts as usize,
        "TransactionConflict: another transaction",
    );
    let err = ledger
        .change_refs(&version_named("b"), &adding("j"), 2)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::Contended {
                contention: Contention::TransactionConflict,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.kind(), crate::error::ErrorKind::Transient);
    assert_eq!(ledger.retries(), (3 + 7, 0));
}

/// Four hundred versions referencing one job at once (a popular content):
/// each transaction holds only its own version row and reference item
/// (DynamoDB's model in `contention`: 25 ms held, 1,000 write units a
/// second per partition key, the job's items spread over 16 partitions),
/// so none conflicts, none is throttled, and every reference is there.
/// The same version written twice at once still conflicts, and is retried.
#[tokio::test(start_paused = true)]
async fn concurrent_references_to_one_job_touch_no_common_item() {
    let memory = memory::InMemoryTable::new("t");
    memory.insert(done_counted("hot"));
    let table = contention::ContendedTable::new(memory);
    let ledger = Ledger::new(table.clone()).seeded(7);
    let tasks: Vec<_> = (0..400)
        .map(|n| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                ledger
                    .change_refs(&version_named(&format!("k{n}")), &adding("hot"), 1)
                    .await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), RefWrite::Applied);
    }
    assert_eq!(ledger.references("hot").await.unwrap().len(), 400);
    assert_eq!(table.refusals(), contention::Refusals::default());
    assert_eq!(ledger.retries(), (0, 0));
    // One version, two writers at once: the second conflicts and retries
    // (its condition then fails: the first wrote the row).
    let same = version_named("same");
    let change = adding("hot");
    let (a, b) = tokio::join!(
        ledger.change_refs(&same, &change, 2),
        ledger.change_refs(&same, &change, 2)
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    assert!(outcomes.contains(&RefWrite::Applied), "{outcomes:?}");
    assert!(table.refusals().conflicts > 0);
}

/// Past 1,000 write units a second on one item, writes are throttled (a
/// refused conditional put is charged too), and the next second admits
/// them again.
#[tokio::test(start_paused = true)]
async fn an_item_past_its_throughput_is_throttled_until_the_next_second() {
    let memory = memory::InMemoryTable::new("t");
    memory.insert(done_counted("hot"));
    let table = contention::ContendedTable::with_limits(memory, 25, 1_000.0);
    let mut refused = 0;
    for _ in 0..1_200 {
        match table.put_new(&done_counted("hot")).await {
            Ok(Conditional::Rejected(Some(_))) => {}
            Err(LedgerError::Contended {
                contention: Contention::Throttled,
                ..
            }) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(refused, 200);
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    assert!(matches!(
        table.put_new(&done_counted("hot")).await,
        Ok(Conditional::Rejected(Some(_)))
    ));
    assert_eq!(table.refusals().throttles, 200);
}

#[test]
fn contention_is_told_by_its_codes() {
    for (code, contention) in [
        ("TransactionConflict", Some(Contention::TransactionConflict)),
        (
            "TransactionConflictException",
            Some(Contention::TransactionConflict),
        ),
        ("ThrottlingError", Some(Contention::Throttled)),
        ("ProvisionedThroughputExceeded", Some(Contention::Throttled)),
        (
            "ProvisionedThroughputExceededException",
            Some(Contention::Throttled),
        ),
        ("ThrottlingException", Some(Contention::Throttled)),
        ("ConditionalCheckFailed", None),
        ("None", None),
        ("ValidationError", None),
    ] {
        assert_eq!(Contention::of_code(code), contention, "{code}");
    }
}
