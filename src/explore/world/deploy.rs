//! The deployed configuration, and the changes an operator makes to it
//! between invocations: a recipe's version bumped, a chained recipe
//! added. Invocations already running keep the configuration they began
//! with (a Lambda version finishes what it started); every later one
//! reads the new. After a change the operator runs `mediaonce backfill`
//! (README, "Changing a recipe"): a create for every key's current object,
//! as ListObjectsV2 lists it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::super::gated::{GatedBus, GatedExecutions, GatedQueue};
use super::super::probe::{output_of, ExploreProbe, SkewedClock};
use super::super::video::{ExploreChunk, ExplorePackage, FIRST_SEGMENT};
use super::{World, BUCKET, OUT};
use crate::bus::{Bus, RecordingBus};
use crate::config::Config;
use crate::event::created_notification;
use crate::executions::InMemoryExecutions;
use crate::faults::FaultPlan;
use crate::handler::App;
use crate::key::{job_key, sha256_hex};
use crate::ledger::faults::FaultyTable;
use crate::ledger::memory::InMemoryTable;
use crate::ledger::{Ledger, RetryPolicy};
use crate::queue::{Queue, RecordingQueue};
use crate::simulate::machine::MACHINE_ARN;
use crate::steps::StepRegistry;
use crate::store::faults::FaultyObjects;
use crate::store::memory::InMemoryObjects;
use crate::store::ObjectStore;

use super::super::check::OUTPUT_PREFIX;

/// The bus completion events go to.
const EVENT_BUS: &str = "explored";

/// The recipes deployed: the root probe's version, and the chained one's
/// if there is one; `generation` counts the deployments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Deployment {
    pub root_version: u64,
    pub chained_version: Option<u64>,
    pub generation: u64,
    /// The root recipe is `hls-package`, whose long inputs split.
    pub split: bool,
    /// Edits of the root recipe's params (same name, same version).
    pub root_edits: u64,
}

impl Deployment {
    fn recipes(&self) -> Value {
        let edited = |mut params: Value, field: &str, value: Value| {
            if self.root_edits > 0 {
                params[field] = value;
            }
            params
        };
        let (root, file) = if self.split {
            let params = serde_json::json!({"ladder": [144]});
            let segment = 4 + self.root_edits;
            (
                serde_json::json!({"name": "probe", "step": "hls-package",
                    "version": self.root_version,
                    "params": edited(params, "segment", segment.into())}),
                FIRST_SEGMENT,
            )
        } else {
            let params = serde_json::json!({});
            (
                serde_json::json!({"name": "probe", "step": "explore-probe",
                    "version": self.root_version,
                    "params": edited(params, "edit", self.root_edits.into())}),
                "out.bin",
            )
        };
        let mut recipes = vec![root];
        if let Some(version) = self.chained_version {
            recipes.push(
                serde_json::json!({"name": "probe-next", "step": "explore-probe",
                "version": version, "params": {},
                "input": {"recipe": "probe", "file": file}}),
            );
        }
        Value::Array(recipes)
    }
}

/// What every deployment's app is built over: the world's clients, clock
/// and step.
pub(super) struct Parts {
    pub table: Arc<InMemoryTable>,
    pub objects: Arc<InMemoryObjects>,
    pub queue: Arc<RecordingQueue>,
    pub bus: Arc<RecordingBus>,
    pub plan: Arc<FaultPlan>,
    pub clock: SkewedClock,
    pub probe: ExploreProbe,
    /// Step Functions.
    pub executions: Arc<InMemoryExecutions>,
    pub gc_grace_secs: u64,
    /// `MEDIAONCE_RELEASE_ON_DELETE_MARKER=true`.
    pub release_on_marker: bool,
    pub by_content: bool,
    pub seed: u64,
}

impl Parts {
    /// The app of `deployment`. Its seed differs by generation, so that
    /// no two deployments' workers draw the same owner tokens.
    pub fn app(&self, deployment: &Deployment) -> App {
        let mut steps = StepRegistry::builtin();
        steps.register(self.probe.clone());
        if deployment.split {
            steps.register(ExplorePackage {
                probe: self.probe.clone(),
            });
            steps.register(ExploreChunk {
                probe: self.probe.clone(),
            });
        }
        let mut vars: BTreeMap<&str, String> = BTreeMap::from([
            ("MEDIAONCE_TABLE", "jobs".to_string()),
            ("MEDIAONCE_OUTPUT_BUCKET", OUT.to_string()),
            ("MEDIAONCE_OUTPUT_PREFIX", OUTPUT_PREFIX.to_string()),
            ("MEDIAONCE_RECIPES", deployment.recipes().to_string()),
            ("MEDIAONCE_METRICS", "off".to_string()),
            ("MEDIAONCE_CONCURRENCY", "2".to_string()),
            ("MEDIAONCE_GC_GRACE_SECS", self.gc_grace_secs.to_string()),
            ("MEDIAONCE_EVENT_BUS", EVENT_BUS.to_string()),
            // Keyed by content always, or as `auto` keys them.
            (
                "MEDIAONCE_IDENTITY",
                if self.by_content { "content" } else { "auto" }.to_string(),
            ),
        ]);
        if deployment.split {
            vars.insert("MEDIAONCE_SPLIT_MACHINE_ARN", MACHINE_ARN.to_string());
        }
        if self.release_on_marker {
            vars.insert("MEDIAONCE_RELEASE_ON_DELETE_MARKER", "true".to_string());
        }
        let config = Config::from_lookup(|name| vars.get(name).cloned(), &steps)
            .expect("the explorer's configuration");
        let app = App::new(
            config,
            Ledger::new(FaultyTable::over(self.table.clone(), self.plan.clone()))
                .with_retry(RetryPolicy::immediate()),
            ObjectStore::new(FaultyObjects::new(self.objects.clone(), self.plan.clone())),
            Queue::new(GatedQueue {
                inner: self.queue.clone(),
                plan: self.plan.clone(),
            }),
        )
        .with_bus(Bus::new(GatedBus {
            inner: self.bus.clone(),
            plan: self.plan.clone(),
        }))
        .with_clock(self.clock.clone())
        .with_seed(
            self.seed
                .wrapping_add(deployment.generation.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        );
        if deployment.split {
            app.with_executions(Arc::new(GatedExecutions {
                inner: self.executions.clone(),
                plan: self.plan.clone(),
            }))
        } else {
            app
        }
    }
}

/// The jobs of bytes under recipes whose hashes are `(root, chained)`.
fn jobs_under(
    (root, chained): (String, Option<String>),
    input_hash: &str,
    bytes: &[u8],
) -> Vec<String> {
    let mut jobs = vec![job_key(input_hash, &root)];
    if let Some(chained) = chained {
        jobs.push(job_key(&sha256_hex(&output_of(bytes)), &chained));
    }
    jobs
}

/// The recipes' hashes an app runs: the root's, and the chained one's.
pub(super) fn recipe_hashes(app: &App) -> (String, Option<String>) {
    let recipes = &app.config.recipes;
    (
        recipes[0].recipe_hash.clone(),
        recipes.get(1).map(|r| r.recipe_hash.clone()),
    )
}

impl World {
    /// The recipes' hashes under the deployed configuration.
    pub(super) fn recipe_hashes(&self) -> (String, Option<String>) {
        recipe_hashes(&self.app)
    }

    /// The jobs bytes keyed by `input_hash` (with `bytes`) key to under the
    /// deployed configuration: the root's, then the chained one's, keyed
    /// by the SHA-256 of the root's output.
    pub(super) fn jobs_of(&self, input_hash: &str, bytes: &[u8]) -> Vec<String> {
        jobs_under(self.recipe_hashes(), input_hash, bytes)
    }

    /// The jobs they key to under any configuration deployed so far: an
    /// invocation that began under an earlier one keys what it reads by
    /// that one's recipes.
    pub(super) fn jobs_ever(&self, input_hash: &str, bytes: &[u8]) -> Vec<String> {
        self.deployed
            .iter()
            .flat_map(|hashes| jobs_under(hashes.clone(), input_hash, bytes))
            .collect()
    }

    /// An operator's change: a recipe's version bumped, or a chained
    /// recipe added; then `backfill`. What was promised under the old
    /// configuration is not under the new one: its jobs are the old
    /// recipes', which a version keeps (its references of the same bytes
    /// only grow) until it goes.
    pub(super) fn change_configuration(&mut self) {
        let mut next = self.deployment.clone();
        next.generation += 1;
        let what = match (next.chained_version, self.rng.u32(0..3)) {
            (None, 0) => {
                next.chained_version = Some(1);
                "a chained recipe added"
            }
            (Some(version), 0) => {
                next.chained_version = Some(version + 1);
                "the chained recipe's version bumped"
            }
            // Drawn apart, so that a world's other choices stay the
            // ones its seed made before edits were explored.
            _ if self.edits.bool() => {
                next.root_edits += 1;
                "the root recipe's params edited (its version kept)"
            }
            _ => {
                next.root_version += 1;
                "the root recipe's version bumped"
            }
        };
        self.app = Arc::new(self.parts.app(&next));
        self.deployment = next;
        let hashes = self.recipe_hashes();
        self.deployed.push(hashes);
        self.act(
            "configure",
            0,
            format!("configuration {}: {what}", self.deployment.generation),
        );
        let names: Vec<String> = self.inputs.keys().cloned().collect();
        for name in names {
            let object = &self.inputs[&name];
            let bytes = object.bytes();
            let jobs = self.jobs_of(&object.input_hash, &bytes);
            for job in self.jobs_ever(&object.input_hash, &bytes) {
                self.keyed
                    .entry(job.clone())
                    .or_default()
                    .insert(name.clone());
            }
            let object = self.inputs.get_mut(&name).expect("listed");
            object.jobs = jobs;
            object.promised = false;
            object.walked = false;
            object.chained_done = false;
            object.configured = false;
            object.generation = self.deployment.generation;
        }
        self.backfill();
    }

    /// `mediaonce backfill`: a create for every key's current object, as
    /// ListObjectsV2 lists it (no version id). An older version of a
    /// versioned key is not backfilled: it keeps its jobs of the old
    /// recipes.
    fn backfill(&mut self) {
        let keys = self.parts.objects.keys(BUCKET, "");
        self.act("backfill", 0, format!("backfill of {} keys", keys.len()));
        for key in keys {
            let Some(name) = self.current_of(&key) else {
                continue;
            };
            let object = &self.inputs[&name];
            let body = created_notification(
                BUCKET,
                &key,
                None,
                Some(&object.etag),
                Some(object.bytes().len() as u64),
            );
            let listed = self.inputs.get_mut(&name).expect("listed");
            listed.configured = true;
            listed.backfilled = self.bucket == super::Bucket::Versioned;
            self.enqueue(body, 0);
        }
    }
}
