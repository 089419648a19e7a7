//! The world as the invariants read it ([`super::super::check`]): a
//! snapshot of its rows, outputs and live objects, checked after every
//! step and at quiescence.

use std::collections::BTreeMap;

use serde_json::Value;

use super::super::check::{self, LiveObject, Snapshot};
use super::{Violation, World, OUT};
use crate::ledger::JobStatus;

impl World {
    /// A promised object's chained job, once `done` and its walk past the
    /// root, is promised too.
    pub(super) fn observe(&mut self, rows: &[crate::ledger::JobRow]) {
        for object in self.inputs.values_mut() {
            if object.promised && object.walked && !object.chained_done && object.configured {
                if let Some(chained) = object.jobs.get(1) {
                    object.chained_done = rows
                        .iter()
                        .any(|r| &r.job_key == chained && r.status == JobStatus::Done);
                }
            }
        }
    }

    /// The world as the invariants read it: its rows, outputs and live
    /// objects, each promised chained job noted first (`observe`).
    pub(super) fn snapshot(
        &mut self,
    ) -> (
        Vec<crate::ledger::JobRow>,
        BTreeMap<String, Vec<u8>>,
        Vec<LiveObject>,
    ) {
        let rows = self.parts.table.job_rows();
        self.observe(&rows);
        let outputs: BTreeMap<String, Vec<u8>> = self
            .parts
            .objects
            .keys(OUT, "")
            .into_iter()
            .filter_map(|key| Some((key.clone(), self.parts.objects.bytes(OUT, &key)?)))
            .collect();
        let live = self
            .inputs
            .iter()
            .map(|(key, object)| LiveObject {
                key: key.clone(),
                object: (
                    object.key.clone(),
                    object.version.clone(),
                    object.etag.clone(),
                ),
                jobs: object.jobs.clone(),
                promised: object.promised,
                walked: object.walked,
                chained_done: object.chained_done,
                dead_lettered: object.dead_lettered,
                configured: object.configured,
                content: object.content,
            })
            .collect();
        (rows, outputs, live)
    }

    pub(super) fn check(&mut self, step: u64, quiescent: bool) -> Option<Violation> {
        let (rows, outputs, live) = self.snapshot();
        let events: Vec<Value> = if quiescent {
            self.parts
                .bus
                .events()
                .iter()
                .map(|e| serde_json::from_str(&e.detail).unwrap_or_default())
                .collect()
        } else {
            Vec::new()
        };
        let snapshot = Snapshot {
            rows: &rows,
            outputs: &outputs,
            live: &live,
            keyed: &self.keyed,
            max_attempts: self.app.config.max_attempts,
            events: &events,
        };
        let broken = self
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .cloned()
            .map(|detail| ("no step runs without its claim", detail));
        let result = match broken {
            Some(broken) => Err(broken),
            None if quiescent => check::at_quiescence(&snapshot),
            None => check::every_step(&snapshot),
        };
        result.err().map(|(invariant, mut detail)| {
            // What still references a job the check names.
            let holders: Vec<String> = self
                .parts
                .table
                .reference_items()
                .into_iter()
                .filter(|(job, _)| detail.contains(job.as_str()))
                .map(|(job, holder)| format!("{}… by {holder}", &job[..8]))
                .collect();
            if !holders.is_empty() {
                detail = format!("{detail}; referenced: {}", holders.join(", "));
            }
            Violation {
                step,
                invariant,
                detail,
                last_actions: self
                    .last
                    .iter()
                    .map(|(actor, actions)| (*actor, actions.iter().cloned().collect()))
                    .collect(),
            }
        })
    }
}
