//! A table from before reference items (`--legacy`; DESIGN.md, "Rows
//! older than reference items"): the world begins with an object on every
//! key that an older mediaonce handled, their jobs `done` rows without
//! `ref_items`, and no version rows or reference items (versions from
//! before references); and one job whose only object was deleted then.
//! The operator upgrades as README says: `refs rebuild` of the bucket,
//! then `refs seal` (the migration, an actor of its own; one that crashes
//! or is stopped is run again). Until the seal no such row may be
//! collected; after it, what no version uses goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Object, World, BUCKET, OUT, REBUILD_MS, START_MS};
use crate::key::sha256_hex;
use crate::ledger::{ClaimRequest, JobRow, JobStatus};
use crate::step::{Manifest, OutputFile, MANIFEST_NAME};

use super::super::check::OUTPUT_PREFIX;
use super::super::probe::output_of;
use super::super::video::FIRST_SEGMENT;

impl World {
    /// What the older mediaonce left: an object on every key (content
    /// `k % contents`, with S3's SHA-256, so keyed the same by either
    /// identity), its pipeline's jobs done; and the done job of a content
    /// no key holds any more.
    pub(super) fn seed_legacy(&mut self) {
        for k in 0..self.options.keys {
            let key = format!("k{k}");
            let content = k % self.options.contents;
            let bytes = super::users::content_bytes(content);
            let etag = self.parts.objects.insert(BUCKET, &key, &bytes, true);
            let version = self.parts.objects.current_version(BUCKET, &key);
            let name = match &version {
                Some(version) => format!("{key}@{version}"),
                None => key.clone(),
            };
            let input_hash = sha256_hex(&bytes);
            let jobs = self.jobs_of(&input_hash, &bytes);
            for job in &jobs {
                self.keyed
                    .entry(job.clone())
                    .or_default()
                    .insert(name.clone());
            }
            self.legacy_jobs(&bytes);
            self.inputs.insert(
                name,
                Object {
                    key,
                    version,
                    input_hash,
                    // Its create was handled, and announced, before: a
                    // backfill lists it again.
                    configured: false,
                    generation: 0,
                    jobs,
                    content,
                    etag: etag.trim_matches('"').to_string(),
                    written: 0,
                    // The older mediaonce acknowledged its create.
                    promised: true,
                    walked: true,
                    chained_done: true,
                    dead_lettered: false,
                    backfilled: false,
                    hidden: false,
                },
            );
        }
        self.legacy_jobs(&super::users::content_bytes(self.options.contents));
        self.act(
            "legacy",
            0,
            format!(
                "an older mediaonce's table: {} objects, {} done rows without reference items",
                self.inputs.len(),
                self.parts.table.job_rows().len()
            ),
        );
    }

    /// The done rows and files of `bytes`' pipeline, as the older
    /// mediaonce left them: the root job, then the chained one's.
    fn legacy_jobs(&mut self, bytes: &[u8]) {
        let root_file = if self.deployment.split {
            FIRST_SEGMENT
        } else {
            "out.bin"
        };
        let mut input = bytes.to_vec();
        for (stage, job) in self
            .jobs_of(&sha256_hex(bytes), bytes)
            .into_iter()
            .enumerate()
        {
            let output = output_of(&input);
            let file = if stage == 0 { root_file } else { "out.bin" };
            self.legacy_job(&job, stage, &sha256_hex(&input), file, &output);
            input = output;
        }
    }

    fn legacy_job(&mut self, job: &str, stage: usize, input_hash: &str, file: &str, output: &[u8]) {
        if self.parts.table.job_rows().iter().any(|r| r.job_key == job) {
            return;
        }
        let rule = &self.app.config.recipes[stage];
        let prefix = format!("{OUTPUT_PREFIX}{job}/");
        self.parts
            .objects
            .insert(OUT, &format!("{prefix}{file}"), output, false);
        let manifest = Manifest {
            job_key: job.to_string(),
            input_hash: input_hash.to_string(),
            recipe: rule.recipe.to_value(),
            outputs: vec![OutputFile {
                name: file.to_string(),
                size: output.len() as u64,
                sha256: sha256_hex(output),
            }],
        };
        let manifest = serde_json::to_vec(&manifest).expect("a manifest serializes");
        self.parts
            .objects
            .insert(OUT, &format!("{prefix}{MANIFEST_NAME}"), &manifest, false);
        let claimed = JobRow::claimed(&ClaimRequest {
            job_key: job.to_string(),
            step: rule.recipe.step.clone(),
            input_hash: input_hash.to_string(),
            output_prefix: self.app.config.output_location(job),
            owner: "an-older-mediaonce".into(),
            lease_until_ms: START_MS - 1,
            now_ms: START_MS - 3_600_000,
            max_attempts: self.app.config.max_attempts,
        });
        self.parts.table.insert(JobRow {
            status: JobStatus::Done,
            // Before reference items: who uses it is not known.
            ref_items: false,
            ..claimed
        });
    }

    /// The migration: `refs rebuild` of the bucket, then `refs seal`.
    pub(super) fn migrate(&mut self) {
        let sealed = self.sealed.clone();
        self.start_task("migrate", REBUILD_MS, move |world| {
            let app = world.app.clone();
            let work = async move {
                if app.rebuild_refs(BUCKET, "", false, |_| {}).await.is_ok()
                    && app.seal_refs(false).await.is_ok()
                {
                    sealed.store(true, Ordering::Relaxed);
                }
            };
            (
                "refs rebuild of the bucket, then refs seal".to_string(),
                work,
            )
        });
    }

    /// A legacy world whose migration has not completed yet.
    pub(super) fn unsealed(&self) -> bool {
        self.legacy && !self.sealed.load(Ordering::Relaxed)
    }
}

/// Whether the migration has completed (its seal returned).
pub(super) type Sealed = Arc<AtomicBool>;
