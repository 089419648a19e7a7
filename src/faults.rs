//! Failure injection: a plan of which calls fail, shared by the
//! failure-injecting ledger table ([`crate::ledger::faults::FaultyTable`])
//! and object client ([`crate::store::faults::FaultyObjects`]).
//!
//! A fault stands for what a caller sees when the SDK's retries are
//! exhausted: throttling, a 5xx, SlowDown, a dropped connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A call that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Ledger: GetItem.
    GetRow,
    /// Ledger: the claim's PutItem.
    PutRow,
    /// Ledger: the takeover's UpdateItem.
    TakeOver,
    /// Ledger: the finish's UpdateItem.
    Finish,
    /// Ledger: the retry's UpdateItem.
    ResetAttempts,
    /// Ledger: the release's DeleteItem.
    Release,
    /// Hash cache: GetItem.
    GetInputHash,
    /// Hash cache: PutItem.
    PutInputHash,
    /// References: the version row's GetItem.
    GetRefs,
    /// References: the TransactWriteItems.
    ChangeRefs,
    /// Collection: the UpdateItem to `collecting`.
    BeginCollect,
    /// Collection: the row's DeleteItem.
    EndCollect,
    /// Collection: a failed collection's back-off UpdateItem.
    DeferCollect,
    /// Collection: the UpdateItem giving up a collection (referenced).
    KeepCollected,
    /// Collection: the UpdateItem recording that deletes start.
    StartDeletes,
    /// References: a release's mark on the job (UpdateItem).
    MarkReleased,
    /// References: a Query of a job's reference items.
    QueryRefs,
    /// References: a seal's UpdateItem.
    SealRefs,
    /// UpdateItem recording a split's execution.
    RecordExecution,
    /// BatchWriteItem of a split's holds on its chunks.
    WriteHolderRefs,
    /// Objects: ListObjectsV2.
    ListObjects,
    /// Objects: DeleteObjects.
    DeleteObjects,
    /// Objects: HeadObject.
    HeadObject,
    /// Objects: GetObject.
    GetObject,
    /// Objects: PutObject.
    PutObject,
    /// Objects: CopyObject.
    CopyObject,
    /// SQS: SendMessage (a hand-on).
    SendMessage,
    /// SQS: ChangeMessageVisibility (the busy delay).
    ChangeVisibility,
    /// EventBridge: PutEvents (a completion event).
    PutEvents,
    /// Step Functions: StartExecution.
    StartExecution,
    /// Step Functions: DescribeExecution.
    DescribeExecution,
    /// Step Functions: SendTaskSuccess or SendTaskFailure.
    SendTaskAnswer,
    /// Step Functions: SendTaskHeartbeat.
    SendTaskHeartbeat,
}

impl Call {
    /// A DynamoDB call (the ledger's, the hash cache's, the references'):
    /// one DynamoDB may refuse under load.
    pub fn is_dynamodb(self) -> bool {
        !matches!(
            self,
            Call::ListObjects
                | Call::DeleteObjects
                | Call::HeadObject
                | Call::GetObject
                | Call::PutObject
                | Call::CopyObject
                | Call::SendMessage
                | Call::ChangeVisibility
                | Call::PutEvents
                | Call::StartExecution
                | Call::DescribeExecution
                | Call::SendTaskAnswer
                | Call::SendTaskHeartbeat
        )
    }
}

#[derive(Debug)]
struct Rule {
    call: Call,
    /// Only calls whose key (job key or object key) ends with this.
    key_suffix: Option<String>,
    /// Matching calls to let through first.
    skip: usize,
    /// Matching calls to fail after that.
    times: usize,
    error: String,
}

/// An object replaced by another writer just before a call reaches it.
#[derive(Debug)]
struct Overwrite {
    call: Call,
    key_suffix: String,
    /// Matching calls to let through first.
    skip: usize,
    /// The new bytes; taken when the overwrite happens.
    bytes: Option<Vec<u8>>,
}

tokio::task_local! {
    /// The actor a task runs for, when the explorer's scheduler runs it
    /// ([`crate::explore`]): its gate tells calls apart by it.
    pub static ACTOR: u64;
}

/// `future`, run for the same actor as the calling task: a task spawned
/// by an actor (a batch's message lanes) is part of it. Outside the
/// explorer, `future` unchanged.
pub fn for_same_actor<F: std::future::Future>(
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    match ACTOR.try_with(|actor| *actor) {
        Ok(actor) => futures::future::Either::Left(ACTOR.scope(actor, future)),
        Err(_) => futures::future::Either::Right(future),
    }
}

/// Where a caller waits before each call: the explorer's scheduler
/// ([`crate::explore`]) holds every call there until it chooses it.
#[async_trait::async_trait]
pub trait CallGate: Send + Sync + std::fmt::Debug {
    /// Returns when `call` (on `key`) may go ahead: `None`, or the error
    /// the service answers it with instead (a throttle or a transaction
    /// conflict, by its code: the call has no effect).
    async fn pass(&self, call: Call, key: &str) -> Option<String>;
}

/// Which calls fail, and how often. Rules are checked in the order they were
/// added; a rule is spent when it has failed its `times` calls. Overwrites
/// model another writer racing the worker: an object replaced between two
/// of its calls. A gate, when set, holds every call until it lets it go.
#[derive(Debug, Default)]
pub struct FaultPlan {
    rules: Mutex<Vec<Rule>>,
    overwrites: Mutex<Vec<Overwrite>>,
    injected: AtomicUsize,
    gate: Option<std::sync::Arc<dyn CallGate>>,
}

impl FaultPlan {
    pub fn new() -> Self {
        FaultPlan::default()
    }

    /// A plan whose every call first waits at `gate`.
    pub fn gated(gate: std::sync::Arc<dyn CallGate>) -> Self {
        FaultPlan {
            gate: Some(gate),
            ..FaultPlan::default()
        }
    }

    /// Waits at the gate, if there is one, before `call` on `key`; the
    /// error the gate answers the call with instead, if it does.
    pub async fn pass(&self, call: Call, key: &str) -> Option<String> {
        match &self.gate {
            Some(gate) => gate.pass(call, key).await,
            None => None,
        }
    }

    /// Fails the next `times` calls of `call` with `error`.
    pub fn fail(&self, call: Call, times: usize, error: &str) -> &Self {
        self.add(call, None, 0, times, error)
    }

    /// Lets `skip` calls of `call` through, then fails `times` of them.
    pub fn fail_after(&self, call: Call, skip: usize, times: usize, error: &str) -> &Self {
        self.add(call, None, skip, times, error)
    }

    /// Fails the next `times` calls of `call` whose key ends with `key_suffix`.
    pub fn fail_key(&self, call: Call, key_suffix: &str, times: usize, error: &str) -> &Self {
        self.add(call, Some(key_suffix.to_string()), 0, times, error)
    }

    fn add(
        &self,
        call: Call,
        key_suffix: Option<String>,
        skip: usize,
        times: usize,
        error: &str,
    ) -> &Self {
        self.rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Rule {
                call,
                key_suffix,
                skip,
                times,
                error: error.to_string(),
            });
        self
    }

    /// Whether this call fails: the injected error, or `None` to go ahead.
    pub fn check(&self, call: Call, key: &str) -> Option<String> {
        let mut rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        let rule = rules.iter_mut().find(|rule| {
            rule.times > 0
                && rule.call == call
                && rule.key_suffix.as_deref().is_none_or(|s| key.ends_with(s))
        })?;
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        rule.times -= 1;
        self.injected.fetch_add(1, Ordering::SeqCst);
        Some(format!("injected fault: {}", rule.error))
    }

    /// Replaces the object whose key ends with `key_suffix` with `bytes`
    /// just before the call of `call` that follows `skip` matching ones
    /// (`GetObject` with skip 0: between the HEAD and the first read).
    pub fn overwrite_before(
        &self,
        call: Call,
        key_suffix: &str,
        skip: usize,
        bytes: &[u8],
    ) -> &Self {
        self.overwrites
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Overwrite {
                call,
                key_suffix: key_suffix.to_string(),
                skip,
                bytes: Some(bytes.to_vec()),
            });
        self
    }

    /// The bytes to write over `key` before this call, if one is due.
    pub fn overwrite_due(&self, call: Call, key: &str) -> Option<Vec<u8>> {
        let mut overwrites = self.overwrites.lock().unwrap_or_else(|p| p.into_inner());
        let overwrite = overwrites
            .iter_mut()
            .find(|o| o.bytes.is_some() && o.call == call && key.ends_with(&o.key_suffix))?;
        if overwrite.skip > 0 {
            overwrite.skip -= 1;
            return None;
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        overwrite.bytes.take()
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fail_the_named_calls_then_are_spent() {
        let plan = FaultPlan::new();
        plan.fail(Call::Finish, 2, "ThrottlingException");
        assert_eq!(plan.check(Call::PutRow, "k"), None);
        assert!(plan
            .check(Call::Finish, "k")
            .unwrap()
            .contains("ThrottlingException"));
        assert!(plan.check(Call::Finish, "k").is_some());
        assert_eq!(plan.check(Call::Finish, "k"), None);
        assert_eq!(plan.injected(), 2);
    }

    #[test]
    fn skip_and_key_suffix_select_calls() {
        let plan = FaultPlan::new();
        plan.fail_after(Call::PutObject, 1, 1, "SlowDown");
        plan.fail_key(Call::GetObject, ".png", 1, "InternalError");
        assert_eq!(plan.check(Call::PutObject, "a"), None);
        assert!(plan.check(Call::PutObject, "b").is_some());
        assert_eq!(plan.check(Call::GetObject, "a.jpg"), None);
        assert!(plan.check(Call::GetObject, "a.png").is_some());
    }

    #[test]
    fn an_overwrite_happens_once_before_the_chosen_call() {
        let plan = FaultPlan::new();
        plan.overwrite_before(Call::GetObject, "clip.mp4", 1, b"new");
        assert_eq!(plan.overwrite_due(Call::HeadObject, "in/clip.mp4"), None);
        assert_eq!(plan.overwrite_due(Call::GetObject, "in/clip.mp4"), None);
        assert_eq!(plan.overwrite_due(Call::GetObject, "in/other.mp4"), None);
        assert_eq!(
            plan.overwrite_due(Call::GetObject, "in/clip.mp4")
                .as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(plan.overwrite_due(Call::GetObject, "in/clip.mp4"), None);
    }
}
