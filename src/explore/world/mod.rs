//! The explored world: the real handler and sweep over the in-memory
//! ledger and objects, behind the gate of [`super::sched`]; users, SQS and
//! the clock as the explorer's own actions. One step is one choice:
//! release one held call, start an invocation, let a user upload or
//! delete, start a sweep, crash an actor, or move the clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use super::check;
use super::probe::{ExploreProbe, SkewedClock, INJECTED_FAILURE};
use super::sched::{Scheduler, ACTOR};
use crate::executions::InMemoryExecutions;
use crate::faults::{Call, FaultPlan};
use crate::handler::{App, BatchReport};
use crate::ledger::memory::InMemoryTable;

use crate::queue::RecordingQueue;
use crate::simulate::machine::SimMachine;
use crate::store::memory::InMemoryObjects;

mod deploy;
mod legacy;
mod observe;
mod sqs;
mod states;
mod users;

use sqs::Message;

use deploy::Deployment;

const BUCKET: &str = "in";
const OUT: &str = "out";
const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:explored";
/// The template's default function timeout, and its queue's visibility
/// (6×) and receives before the dead-letter queue.
const FUNCTION_TIMEOUT_MS: u64 = 120_000;
const VISIBILITY_MS: u64 = 720_000;
const MAX_RECEIVES: u32 = 5;
/// How long a `refs rebuild` may run before the explorer stops it.
const REBUILD_MS: u64 = 900_000;
const START_MS: u64 = 1_800_000_000_000;
/// The skew DESIGN.md allows between any two workers' clocks: the lease
/// margin (`MEDIAONCE_LEASE_MARGIN_SECS`' default).
const SKEW_MS: i64 = 10_000;
/// Mixed into the seed for the draws of a split world, of edits, of an
/// encrypted bucket, of markers that release, and of a legacy table.
const SPLIT_DRAW: u64 = 0x5b11_7000;
const EDIT_DRAW: u64 = 0xed17_0000;
const KMS_DRAW: u64 = 0x0c5e_0000;
const MARKER_DRAW: u64 = 0x3a2c_0000;
const LEGACY_DRAW: u64 = 0x1e6a_0000;
/// How many of an actor's last actions a report shows.
const LAST_ACTIONS: usize = 8;

/// What to explore.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExploreOptions {
    pub seed: u64,
    /// Steps before quiescence.
    pub steps: u64,
    /// Object keys the users write to.
    pub keys: u32,
    /// Distinct contents they upload (fewer than keys: shared bytes).
    pub contents: u32,
    /// The collection grace, in seconds (0: at once).
    pub gc_grace_secs: u64,
    /// The input bucket's versioning. `None`: the seed chooses.
    pub bucket: Option<Bucket>,
    /// Jobs keyed by content always (`MEDIAONCE_IDENTITY=content`), or as
    /// `auto` keys them (an upload without S3's SHA-256 by its version
    /// and ETag, so the same bytes uploaded in parts key another job).
    /// `None`: the seed chooses.
    pub by_content: Option<bool>,
    /// A chained recipe after the root one (a pipeline of two jobs, the
    /// second keyed by the SHA-256 of the first's output). `None`: the
    /// seed chooses.
    pub chained: Option<bool>,
    /// Quiescence begins with the users deleting every key, so that
    /// nothing may be left (no live version keeps a leak). `None`: the
    /// seed chooses.
    pub teardown: Option<bool>,
    /// Some workers' clocks ahead by more than the skew DESIGN.md allows
    /// (they take jobs over while their holders run: duplicate work, never
    /// a wrong output). Otherwise every clock is within it. `None`: the
    /// seed chooses.
    pub skew_beyond_margin: Option<bool>,
    /// DynamoDB under load: one ledger call in ten answered with a
    /// throttle or a transaction conflict instead (no effect; the ledger
    /// retries it, and gives up after its attempts). `None`: the seed
    /// chooses.
    pub contention: Option<bool>,
    /// Workers crash three times as often. `None`: the seed chooses.
    pub crashy: Option<bool>,
    /// The root recipe is `hls-package`, whose long inputs split into
    /// chunk jobs run by a Step Functions execution (its state machine
    /// modelled, an actor of its own). `None`: the seed chooses.
    pub split: Option<bool>,
    /// The input bucket encrypts with SSE-KMS by default: every upload's
    /// ETag is not its bytes' MD5, another for every upload of the same
    /// bytes. `None`: the seed chooses.
    pub kms: Option<bool>,
    /// A versioned bucket's delete markers release the versions they hide
    /// (`MEDIAONCE_RELEASE_ON_DELETE_MARKER=true`): those versions are no
    /// longer promised anything, though S3 keeps them. `None`: the seed
    /// chooses (in a versioned bucket).
    pub release_on_marker: Option<bool>,
    /// The table is from before reference items: objects and done rows an
    /// older mediaonce left, and the operator's migration (`refs rebuild`,
    /// then `refs seal`). `None`: the seed chooses.
    pub legacy: Option<bool>,
}

impl Default for ExploreOptions {
    fn default() -> Self {
        ExploreOptions {
            seed: 1,
            steps: 400,
            keys: 4,
            contents: 3,
            gc_grace_secs: 0,
            bucket: None,
            by_content: None,
            chained: None,
            teardown: None,
            skew_beyond_margin: None,
            contention: None,
            crashy: None,
            split: None,
            kms: None,
            release_on_marker: None,
            legacy: None,
        }
    }
}

/// An input bucket's versioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bucket {
    /// A delete removes the object; each object is its key's null version.
    Unversioned,
    /// Versioning suspended: a delete removes the null version for good
    /// and puts a null delete marker.
    Suspended,
    /// Every put a version of its own; a delete puts a delete marker and
    /// keeps every version (nothing is released:
    /// `MEDIAONCE_RELEASE_ON_DELETE_MARKER` is off, its default); a version
    /// goes only by a DELETE naming it or a lifecycle expiration.
    Versioned,
}

impl Bucket {
    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Unversioned => "unversioned",
            Bucket::Suspended => "suspended",
            Bucket::Versioned => "versioned",
        }
    }
}

/// An invariant broken, and where.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// The step after which it was found (`steps` + n: in quiescence).
    pub step: u64,
    pub invariant: &'static str,
    pub detail: String,
    /// Each actor's last actions (0: the users, SQS and the clock).
    pub last_actions: BTreeMap<u64, Vec<String>>,
}

/// What a run came to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExploreReport {
    pub options: ExploreOptions,
    /// What the seed chose of what the options left open.
    pub world: BTreeMap<&'static str, bool>,
    /// Steps taken, quiescence's included.
    pub steps: u64,
    /// Steps by kind of action.
    pub actions: BTreeMap<&'static str, u64>,
    pub dead_letters: u64,
    /// Of those, the ones whose receives were spent by the explorer's
    /// faults (three or more of the five crashed or met an injected step
    /// failure, or at least one did and every other found its job busy,
    /// often held by a worker that crashed): the fault budget spent, not
    /// the handler's doing; and the ones whose job is poisoned (failed its
    /// cap of runs: what the dead-letter queue is for). Contention alone
    /// never dead-letters a message.
    pub dead_letters_by_faults: u64,
    pub dead_letters_poisoned: u64,
    /// A digest of every action taken: the same seed, the same digest.
    pub trace: String,
    /// Every action, `step actor: what`, in order.
    #[serde(skip)]
    pub log: Vec<String>,
    pub violation: Option<Violation>,
}

/// An input object as the users left it.
#[derive(Debug, Clone)]
struct Object {
    /// Its key, and its version id in a versioned bucket.
    key: String,
    version: Option<String>,
    /// The hash the handler keys its bytes by.
    input_hash: String,
    /// A create of it was sent under the configuration deployed (its
    /// upload, or a backfill since): its pipeline must end. An older
    /// version a backfill does not list keeps its old recipes' jobs.
    configured: bool,
    /// The deployment its jobs were keyed under.
    generation: u64,
    /// The jobs its bytes key to, as the handler keys them: the root
    /// recipe's, then the chained one's.
    jobs: Vec<String>,
    content: u32,
    etag: String,
    /// When it was written (the explorer's action count).
    written: u64,
    promised: bool,
    /// A message of it was acknowledged with no job of it waiting on a
    /// split: its walk got past its root job, so its chained job is
    /// referenced (a create acknowledged while its root job is split
    /// references the chained job only when the split's end hands it on).
    walked: bool,
    /// Its chained job was seen `done` since it was promised.
    chained_done: bool,
    /// A message of it reached the dead-letter queue by the explorer's
    /// faults: its pipeline may stop where that left it (a redrive is the
    /// operator's), and its jobs' rows with it.
    dead_lettered: bool,
    /// Configured by a backfill's create, which names the key, not the
    /// version: in a versioned bucket it applies to this version only
    /// while it is current (a newer version or marker first, and the
    /// create is the newer one's, or skipped).
    backfilled: bool,
    /// A delete marker hides it, and markers release what they hide: it
    /// is gone to mediaonce, though S3 keeps it (no create of it is a
    /// promise again).
    hidden: bool,
}

enum Running {
    /// An invocation, when it started (the explorer's action count: every
    /// call it makes comes after what was written before), and the
    /// configuration it runs (the deployment's generation).
    Invocation(JoinHandle<BatchReport>, u64, u64),
    /// A sweep or a `refs rebuild`: what it returns the invariants read
    /// from the world.
    Task(JoinHandle<()>),
}

struct World {
    options: ExploreOptions,
    rng: fastrand::Rng,
    sched: Arc<Scheduler>,
    app: Arc<App>,
    /// The configuration deployed, and what every deployment's app is
    /// built over: the world's clients, clock and step.
    deployment: Deployment,
    parts: deploy::Parts,
    /// Every deployment's recipe hashes (root, chained), in order.
    deployed: Vec<(String, Option<String>)>,
    bucket: Bucket,
    teardown: bool,
    skew_beyond_margin: bool,
    contention: bool,
    crashy: bool,
    /// Step Functions' executions of the split, moved on as the
    /// definition says (a split world's).
    machine: Option<SimMachine>,
    /// The executions whose end the explorer has seen.
    closed: BTreeSet<String>,
    /// Draws whether a configuration change edits the root recipe or
    /// bumps its version.
    edits: fastrand::Rng,
    /// A table from before reference items, and whether its migration
    /// has completed.
    legacy: bool,
    sealed: legacy::Sealed,
    broken: Arc<Mutex<Vec<String>>>,
    messages: Vec<Message>,
    /// The live input objects, by name: the key, or in a versioned bucket
    /// `key@version`.
    inputs: BTreeMap<String, Object>,
    /// Every job key an upload keyed, and from what.
    keyed: BTreeMap<String, check::KeyedFrom>,
    actors: BTreeMap<u64, Running>,
    /// Each running actor's invocation deadline: Lambda stops it there.
    deadlines: BTreeMap<u64, u64>,
    next_actor: u64,
    next_message: u64,
    receipts: u64,
    report: ExploreReport,
    last: BTreeMap<u64, VecDeque<String>>,
    digest: u64,
}

/// Runs `options.steps` steps, then quiescence, checking the invariants
/// after each; the report says what happened and what broke.
pub async fn explore(options: ExploreOptions) -> ExploreReport {
    let mut world = World::new(options);
    if world.legacy {
        world.seed_legacy();
    }
    let steps = world.options.steps;
    for _ in 0..steps {
        world.step().await;
        if let Some(violation) = world.check(world.report.steps, false) {
            world.report.violation = Some(violation);
            return world.finish();
        }
    }
    let violation = world.quiesce().await;
    world.report.violation = violation;
    world.finish()
}

impl World {
    fn new(options: ExploreOptions) -> World {
        let mut rng = fastrand::Rng::with_seed(options.seed);
        let bucket = options.bucket.unwrap_or_else(|| {
            [Bucket::Unversioned, Bucket::Suspended, Bucket::Versioned][rng.usize(0..3)]
        });
        let by_content = options.by_content.unwrap_or_else(|| rng.bool());
        let chained = options.chained.unwrap_or_else(|| rng.u32(0..3) > 0);
        let teardown = options.teardown.unwrap_or_else(|| rng.bool());
        let skew_beyond_margin = options
            .skew_beyond_margin
            .unwrap_or_else(|| rng.u32(0..3) == 0);
        let contention = options.contention.unwrap_or_else(|| rng.bool());
        let crashy = options.crashy.unwrap_or_else(|| rng.bool());
        // Drawn apart, so that a world without splits is the one its seed
        // made before splits were explored.
        let split = options
            .split
            .unwrap_or_else(|| fastrand::Rng::with_seed(options.seed ^ SPLIT_DRAW).u32(0..3) == 0);
        let kms = options
            .kms
            .unwrap_or_else(|| fastrand::Rng::with_seed(options.seed ^ KMS_DRAW).u32(0..4) == 0);
        let release_on_marker = bucket == Bucket::Versioned
            && options
                .release_on_marker
                .unwrap_or_else(|| fastrand::Rng::with_seed(options.seed ^ MARKER_DRAW).bool());
        let legacy = options
            .legacy
            .unwrap_or_else(|| fastrand::Rng::with_seed(options.seed ^ LEGACY_DRAW).u32(0..4) == 0);
        let clock = SkewedClock::new(START_MS);
        let sched = Arc::new(Scheduler::default());
        let table = Arc::new(InMemoryTable::new("jobs"));
        let objects = InMemoryObjects::new();
        if bucket == Bucket::Versioned {
            objects.enable_versioning(BUCKET);
        }
        if kms {
            objects.encrypt_with_kms(BUCKET);
        }
        let queue = Arc::new(RecordingQueue::default());
        let broken = Arc::new(Mutex::new(Vec::new()));
        let probe = ExploreProbe {
            table: table.clone(),
            clock: clock.clone(),
            broken: broken.clone(),
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(options.seed ^ 0x9e37))),
            running: Arc::default(),
            runs: Arc::default(),
        };
        let parts = deploy::Parts {
            table: table.clone(),
            objects: objects.clone(),
            queue: queue.clone(),
            bus: Arc::default(),
            plan: Arc::new(FaultPlan::gated(sched.clone())),
            clock: clock.clone(),
            probe,
            executions: Arc::new(InMemoryExecutions::timed({
                let clock = clock.clone();
                move || clock.true_ms()
            })),
            gc_grace_secs: options.gc_grace_secs,
            release_on_marker,
            by_content,
            seed: options.seed,
        };
        let deployment = Deployment {
            root_version: 1,
            chained_version: chained.then_some(1),
            generation: 0,
            split,
            root_edits: 0,
        };
        let machine = split.then(|| SimMachine::new(parts.executions.clone()));
        let app = parts.app(&deployment);
        let deployed = vec![deploy::recipe_hashes(&app)];
        World {
            rng,
            bucket,
            teardown,
            skew_beyond_margin,
            contention,
            crashy,
            machine,
            closed: BTreeSet::new(),
            edits: fastrand::Rng::with_seed(options.seed ^ EDIT_DRAW),
            legacy,
            sealed: Arc::default(),
            deployment,
            parts,
            deployed,
            report: ExploreReport {
                options: options.clone(),
                world: BTreeMap::from([
                    ("suspended", bucket == Bucket::Suspended),
                    ("versioned", bucket == Bucket::Versioned),
                    ("by_content", by_content),
                    ("chained", chained),
                    ("teardown", teardown),
                    ("skew_beyond_margin", skew_beyond_margin),
                    ("contention", contention),
                    ("crashy", crashy),
                    ("split", split),
                    ("kms", kms),
                    ("release_on_marker", release_on_marker),
                    ("legacy", legacy),
                ]),
                steps: 0,
                actions: BTreeMap::new(),
                dead_letters: 0,
                dead_letters_by_faults: 0,
                dead_letters_poisoned: 0,
                trace: String::new(),
                log: Vec::new(),
                violation: None,
            },
            options,
            sched,
            app: Arc::new(app),
            broken,
            messages: Vec::new(),
            inputs: BTreeMap::new(),
            keyed: BTreeMap::new(),
            actors: BTreeMap::new(),
            deadlines: BTreeMap::new(),
            next_actor: 0,
            next_message: 0,
            receipts: 0,
            last: BTreeMap::new(),
            digest: 0xcbf2_9ce4_8422_2325,
        }
    }

    /// Whether DynamoDB, under load, answers a ledger call with a
    /// contention error instead: its code.
    fn refusal(&mut self, call: Call) -> Option<&'static str> {
        let ledger = call.is_dynamodb();
        if !self.contention || !ledger || self.rng.u32(0..10) != 0 {
            return None;
        }
        // Reads are throttled; a write may also meet a transaction holding
        // its item.
        let write = !matches!(
            call,
            Call::GetRow | Call::GetInputHash | Call::GetRefs | Call::QueryRefs
        );
        Some(if write && self.rng.bool() {
            "TransactionConflictException"
        } else {
            "ThrottlingException"
        })
    }

    /// A new worker's clock: within the skew DESIGN.md allows of the
    /// explorer's, or, in a world that goes beyond it, one worker in four
    /// ahead by up to half a function timeout (further, and it would see
    /// its invocation's deadline passed before it began).
    fn skew(&mut self, actor: u64) -> i64 {
        let skew = if self.skew_beyond_margin && self.rng.u32(0..4) == 0 {
            self.rng.i64(SKEW_MS..FUNCTION_TIMEOUT_MS as i64 / 2)
        } else {
            // Each within half of it of the explorer's time: any two
            // within it of each other.
            self.rng.i64(-SKEW_MS / 2..=SKEW_MS / 2)
        };
        self.parts.clock.set_skew(actor, skew);
        skew
    }

    fn now(&self) -> u64 {
        self.parts.clock.true_ms()
    }

    /// Records an action of `actor` (0: the explorer's own).
    fn act(&mut self, kind: &'static str, actor: u64, what: String) {
        *self.report.actions.entry(kind).or_default() += 1;
        self.report.steps += 1;
        for byte in what.bytes().chain([b'\n']) {
            self.digest = (self.digest ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        self.report
            .log
            .push(format!("{} {actor}: {what}", self.report.steps));
        let last = self.last.entry(actor).or_default();
        if last.len() == LAST_ACTIONS {
            last.pop_front();
        }
        last.push_back(what);
    }

    /// One step: a choice among what can happen now.
    async fn step(&mut self) {
        self.settle().await;
        let held = self.sched.held();
        let visible = self
            .messages
            .iter()
            .filter(|m| m.holder.is_none() && m.visible_at <= self.now())
            .count();
        // Weights: held calls most, so that runs make progress. Crashes,
        // as the seed chose: as often as sweeps (stopped collections,
        // takeovers, abandoned rows), or a third as often (most work gets
        // somewhere, promised outputs and chained jobs, before the next).
        let crash = if self.crashy { 3 } else { 1 };
        let states = if self.machine.is_some() { 3 } else { 0 };
        let migration = if self.unsealed() { 2 } else { 0 };
        let choices: [(u32, u8); 8] = [
            (if held.is_empty() { 0 } else { 36 }, 0),
            (if visible > 0 { 9 } else { 0 }, 1),
            (8, 2),
            (3, 3),
            (if self.actors.is_empty() { 0 } else { crash }, 4),
            (3, 5),
            (states, 6),
            (migration, 7),
        ];
        let total: u32 = choices.iter().map(|(w, _)| w).sum();
        let mut pick = self.rng.u32(0..total);
        let choice = choices
            .iter()
            .find(|(w, _)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map_or(2, |(_, c)| *c);
        match choice {
            0 => {
                let (ticket, actor, call, key) = held[self.rng.usize(0..held.len())].clone();
                match self.refusal(call) {
                    Some(code) => {
                        self.sched.refuse(ticket, code);
                        self.act("refuse", actor, format!("{call:?} {key}: {code}"));
                    }
                    None => {
                        self.sched.release(ticket);
                        self.act("release", actor, format!("{call:?} {key}"));
                    }
                }
            }
            1 => self.invoke(),
            2 => self.user(),
            3 if self.rng.u32(0..3) == 0 => self.rebuild(),
            3 if self.deployment.generation < 3 && self.rng.u32(0..12) == 0 => {
                self.change_configuration()
            }
            3 => self.sweep(),
            4 => {
                let actors: Vec<u64> = self.actors.keys().copied().collect();
                let actor = actors[self.rng.usize(0..actors.len())];
                self.crash(actor);
            }
            5 => {
                let jump = [1_000, 30_000, 300_000, VISIBILITY_MS, 3_600_000][self.rng.usize(0..5)];
                self.advance(jump);
            }
            6 => {
                if !self.states() {
                    self.act("states", 0, "step functions: nothing moves".into());
                }
            }
            _ => self.migrate(),
        }
        self.settle().await;
    }

    /// Lets the runtime run until every actor waits at the gate or is
    /// done; finished actors' results applied, the handler's sends queued.
    async fn settle(&mut self) {
        loop {
            let before = self.sched.arrived();
            for _ in 0..64 {
                tokio::task::yield_now().await;
            }
            let finished: Vec<u64> = self
                .actors
                .iter()
                .filter(|(_, a)| match a {
                    Running::Invocation(h, ..) => h.is_finished(),
                    Running::Task(h) => h.is_finished(),
                })
                .map(|(id, _)| *id)
                .collect();
            for id in &finished {
                self.deadlines.remove(id);
                match self.actors.remove(id) {
                    Some(Running::Invocation(handle, started, generation)) => {
                        if let Ok(report) = handle.await {
                            self.invoked(*id, (started, generation), &report);
                        }
                    }
                    Some(Running::Task(handle)) => {
                        let _ = handle.await;
                    }
                    None => {}
                }
            }
            for (_, body) in self.parts.queue.take_sent() {
                self.enqueue(body, 0);
            }
            if finished.is_empty() && self.sched.arrived() == before {
                return;
            }
        }
    }

    /// Starts an actor that is not an invocation (a sweep, a rebuild) with
    /// a clock of its own, stopped after `runs_ms`: `make` says what it is
    /// and does, from the world once its clock is drawn.
    fn start_task<F>(
        &mut self,
        kind: &'static str,
        runs_ms: u64,
        make: impl FnOnce(&mut World) -> (String, F),
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.next_actor += 1;
        let actor = self.next_actor;
        let skew = self.skew(actor);
        let (what, work) = make(self);
        let handle = tokio::spawn(ACTOR.scope(actor, work));
        self.actors.insert(actor, Running::Task(handle));
        self.deadlines.insert(actor, self.now() + runs_ms);
        self.act(kind, actor, format!("{what}, clock {skew:+} ms"));
    }

    fn sweep(&mut self) {
        self.start_task("sweep", FUNCTION_TIMEOUT_MS, |world| {
            let app = world.app.clone();
            let work = async move {
                let _ = app.collect_due(false).await;
            };
            ("sweep".to_string(), work)
        });
    }

    /// `mediaonce refs rebuild` of one key, outside Lambda: it walks the
    /// key's versions and brings each one's references in line with S3.
    /// A process outside Lambda marks a release again once its monotonic
    /// clock says ten minutes passed (`REMARK_AFTER`), which the explorer's
    /// clock jumps cannot move: the explorer stops it at fifteen minutes,
    /// inside the mark's settle time, the case that argument covers.
    fn rebuild(&mut self) {
        self.start_task("rebuild", REBUILD_MS, |world| {
            let key = format!("k{}", world.rng.u32(0..world.options.keys));
            let app = world.app.clone();
            let prefix = key.clone();
            let work = async move {
                let _ = app.rebuild_refs(BUCKET, &prefix, false, |_| {}).await;
            };
            (format!("refs rebuild {key}"), work)
        });
    }

    /// The clock moves on by `ms`; an invocation whose deadline passes is
    /// stopped there, as Lambda stops it (no run outlives its lease).
    fn advance(&mut self, ms: u64) {
        self.parts
            .clock
            .time
            .fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
        self.act("clock", 0, format!("clock +{ms} ms"));
        let now = self.now();
        let timed_out: Vec<u64> = self
            .deadlines
            .iter()
            .filter(|(actor, deadline)| **deadline <= now && self.actors.contains_key(actor))
            .map(|(actor, _)| *actor)
            .collect();
        for actor in timed_out {
            self.crash(actor);
        }
    }

    /// The actor's process dies at its next call: no call of it goes ahead;
    /// its messages come back after their visibility.
    fn crash(&mut self, actor: u64) {
        self.sched.crash(actor);
        self.actors.remove(&actor);
        self.deadlines.remove(&actor);
        for message in &mut self.messages {
            if message.holder.as_ref().is_some_and(|(a, _)| *a == actor) {
                message.holder = None;
                message.faults += 1;
            }
        }
        self.act("crash", actor, "crashed".into());
    }

    /// Every held call let go and every message handled (the clock moved
    /// to each one's visibility), then past every lease and grace, two
    /// sweeps; the invariants checked after each step and at the end.
    async fn quiesce(&mut self) -> Option<Violation> {
        if self.teardown {
            self.teardown();
        }
        for _ in 0..100_000 {
            self.settle().await;
            let held = self.sched.held();
            if !held.is_empty() {
                let (ticket, actor, call, key) = held[self.rng.usize(0..held.len())].clone();
                self.sched.release(ticket);
                self.act("release", actor, format!("{call:?} {key}"));
            } else if !self.actors.is_empty() {
                // Waiting on nothing the explorer holds: stuck.
                let actors: Vec<u64> = self.actors.keys().copied().collect();
                for actor in actors {
                    self.crash(actor);
                }
            } else if self
                .messages
                .iter()
                .any(|m| m.holder.is_none() && m.visible_at <= self.now())
            {
                self.invoke();
            } else if self.states() {
                // Answers and timeouts moved an execution on.
            } else if let Some(next) = self.messages.iter().map(|m| m.visible_at).min() {
                self.advance(next.saturating_sub(self.now()));
            } else if let Some(next) = self.machine.as_ref().and_then(SimMachine::next_timeout) {
                // A task whose message is gone (dead-lettered) times out.
                self.advance(next.saturating_sub(self.now()).max(1));
            } else if self.unsealed() {
                // The operator completes the upgrade.
                self.migrate();
            } else if self.report.actions.get("final sweep").copied().unwrap_or(0) < 2 {
                // Past every lease (a split's job is held for its
                // execution's whole time), mark and grace: what nothing
                // uses goes.
                let grace = self.options.gc_grace_secs * 1_000;
                let lease = self
                    .parts
                    .table
                    .job_rows()
                    .iter()
                    .map(|r| r.lease_until_ms)
                    .max();
                let past_leases = lease.map_or(0, |at| at.saturating_sub(self.now()) + grace + 1);
                let jump = (grace + 3_600_000).max(past_leases);
                self.advance(jump);
                *self.report.actions.entry("final sweep").or_default() += 1;
                self.sweep();
            } else {
                break;
            }
            if let Some(violation) = self.check(self.report.steps, false) {
                return Some(violation);
            }
        }
        self.settle().await;
        let dead = self.report.dead_letters
            - self.report.dead_letters_by_faults
            - self.report.dead_letters_poisoned;
        if dead > 0 {
            return Some(Violation {
                step: self.report.steps,
                invariant: "nothing is dead-lettered but by faults or poison",
                detail: format!(
                    "{dead} messages reached the dead-letter queue, their jobs not poisoned, \
                     fewer than 3 of their 5 receives ended in a crash or an injected failure"
                ),
                last_actions: BTreeMap::new(),
            });
        }
        self.check(self.report.steps, true)
    }

    fn finish(self) -> ExploreReport {
        let mut report = self.report;
        report.trace = format!("{:016x}", self.digest);
        report
    }
}
