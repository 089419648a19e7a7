//! The explorer's step and its workers' clocks: `explore-probe` reads its
//! input and writes one file, a function of those bytes alone, and checks,
//! as it starts, that its job's row holds its claim (invariant 3);
//! [`SkewedClock`] gives each actor its own clock, the explorer's time
//! plus that actor's skew.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use super::sched::ACTOR;
use crate::lease::Clock;
use crate::ledger::memory::InMemoryTable;
use crate::ledger::{JobStatus, LedgerTable};
use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};

/// The explorer's time (epoch ms, moved only by the explorer) and each
/// actor's skew from it: a worker reads its own clock, as Lambda hosts do,
/// and leases compare it with times other workers' clocks wrote
/// (DESIGN.md, "Clock skew").
#[derive(Debug, Clone, Default)]
pub struct SkewedClock {
    pub time: Arc<AtomicU64>,
    skews: Arc<Mutex<BTreeMap<u64, i64>>>,
}

impl SkewedClock {
    pub fn new(start_ms: u64) -> SkewedClock {
        SkewedClock {
            time: Arc::new(AtomicU64::new(start_ms)),
            skews: Arc::default(),
        }
    }

    /// The explorer's time, no actor's.
    pub fn true_ms(&self) -> u64 {
        self.time.load(Ordering::Relaxed)
    }

    pub fn set_skew(&self, actor: u64, skew_ms: i64) {
        self.skews
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(actor, skew_ms);
    }

    pub fn skew_of(&self, actor: u64) -> i64 {
        self.skews
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&actor)
            .copied()
            .unwrap_or(0)
    }

    /// `actor`'s clock.
    pub fn of(&self, actor: u64) -> u64 {
        self.true_ms().saturating_add_signed(self.skew_of(actor))
    }
}

impl Clock for SkewedClock {
    /// The clock of the actor whose task reads it.
    fn now_ms(&self) -> u64 {
        self.of(ACTOR.try_with(|a| *a).unwrap_or(0))
    }
}

/// What the probe writes for `input`: a function of its bytes alone, as a
/// shared output must be, so that the same bytes keyed twice (by two
/// ETags) lead to one chained job.
pub fn output_of(input: &[u8]) -> Vec<u8> {
    format!("probed {}", crate::key::sha256_hex(input)).into_bytes()
}

/// What an injected failure says (the explorer counts the receives that
/// met one against its fault budget).
pub const INJECTED_FAILURE: &str = "an injected transient failure";

/// `explore-probe`: a step that writes one file named by its job, and
/// checks, as it starts, that its job's row holds a live claim (no step
/// runs for a job another owner holds, or nobody does). One run in eight
/// fails, as a throttled PUT or a killed encoder would (retryable).
/// Runs in progress, by job: (run, the lease its row had as it began).
pub type RunsByJob = BTreeMap<String, Vec<(u64, u64)>>;

#[derive(Clone)]
pub struct ExploreProbe {
    pub table: Arc<InMemoryTable>,
    pub clock: SkewedClock,
    pub broken: Arc<Mutex<Vec<String>>>,
    pub rng: Arc<Mutex<fastrand::Rng>>,
    /// Runs in progress, by job: each one's lease as its run began.
    pub running: Arc<Mutex<RunsByJob>>,
    pub runs: Arc<AtomicU64>,
}

impl ExploreProbe {
    fn broke(&self, what: String) {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }
}

#[async_trait::async_trait]
impl Step for ExploreProbe {
    type Params = ();

    fn name(&self) -> &'static str {
        "explore-probe"
    }

    fn params(&self, _params: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    fn input_use(&self, _params: &()) -> InputUse {
        InputUse::Ranges
    }

    async fn run(
        &self,
        _params: &(),
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let _run = self.begin(context).await?;
        let input = context.input.read_range(0..context.input.head.size).await?;
        outputs
            .put_bytes("out.bin", "application/octet-stream", output_of(&input))
            .await
    }
}

/// A run in progress ([`ExploreProbe::begin`]): registered under its job
/// until dropped, which ends it whichever way the run returns.
pub struct Run {
    id: u64,
    job_key: String,
    running: Arc<Mutex<RunsByJob>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(others) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.job_key)
        {
            others.retain(|(id, _)| *id != self.id);
        }
    }
}

impl ExploreProbe {
    /// A run of `context`'s job begins: whether its row holds its claim,
    /// and whether another run holds the job under a live lease, noted as
    /// broken; the run registered while the [`Run`] lives. One run in
    /// eight meets an injected failure, as a throttled PUT or a killed
    /// encoder would (retryable): then it ends at once.
    pub async fn begin(&self, context: &StepContext<'_>) -> Result<Run, StepError> {
        let now = self.clock.true_ms();
        // The claimant took the job over by its own clock: a lease it saw
        // passed may still hold by the explorer's, when its clock is ahead
        // by more than the margin (DESIGN.md, "Clock skew": duplicate work,
        // allowed). A run that began while another's lease held by the
        // claimant's own clock is two owners at once.
        let own_clock = self.clock.now_ms();
        let row = self.table.get(context.job_key).await.ok().flatten();
        let id = self.runs.fetch_add(1, Ordering::Relaxed);
        let lease = row.as_ref().map_or(0, |r| r.lease_until_ms);
        let overlap = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let others = running.entry(context.job_key.to_string()).or_default();
            let overlap = others
                .iter()
                .find(|(_, until)| *until > own_clock)
                .map(|(_, until)| *until);
            others.push((id, lease));
            overlap
        };
        if let Some(until) = overlap {
            self.broke(format!(
                "job {} began a run at {own_clock} (its worker's clock) while another's \
                 lease held it until {until}",
                context.job_key
            ));
        }
        // A lease ends at its invocation's deadline plus the margin, and
        // the explorer stops an invocation at its deadline: a run's own
        // lease holds by the explorer's clock whatever its worker's says.
        let held = row
            .as_ref()
            .is_some_and(|r| r.status == JobStatus::Running && r.lease_until_ms > now);
        if !held {
            self.broke(format!(
                "job {} ran while its row was {}",
                context.job_key,
                row.map_or("gone".into(), |r| format!(
                    "{} until {}",
                    r.status.as_str(),
                    r.lease_until_ms
                ))
            ));
        }
        let run = Run {
            id,
            job_key: context.job_key.to_string(),
            running: self.running.clone(),
        };
        if self.rng.lock().unwrap_or_else(|p| p.into_inner()).u32(0..8) == 0 {
            drop(run);
            return Err(StepError::Failed(INJECTED_FAILURE.into()));
        }
        Ok(run)
    }
}
