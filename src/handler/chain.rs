//! A version's pipeline past its root jobs ([`crate::pipeline`]): when an
//! upstream job is done (ran or reused), the jobs chained to it are keyed
//! by the SHA-256 its manifest records for their input file, referenced by
//! the version, and run here when the deadline leaves them their time, or
//! handed on to the job queue in one hand-on message otherwise. A job
//! whose upstream failed for good, or wrote no such file, fails for good
//! itself (`poisoned`, no job key).
//!
//! Nothing is lost to a crash: the upload's message is acknowledged only
//! once every job of the pipeline is done, permanently failed, or handed
//! on (the hand-on message sent), and its redelivery walks the graph
//! again, reusing what is done.
//!
//! Hand-ons never multiply: a walk only asks for its hand-on
//! ([`PendingHandOn`]); the message's handler sends it when the message
//! is acknowledged, and otherwise reports those jobs deferred (the
//! message comes back and its redelivery walks again). So each message
//! leads to at most one hand-on, and a pipeline's hand-ons are a chain,
//! bounded by [`MAX_HAND_ONS`].

use std::collections::HashMap;
use std::sync::Arc;

use super::job::{BatchJobs, JobRun};
use super::references::{bytes_of, reconcile_version, Start};
use super::{App, Invocation, JobReport, Outcome, StartCheck};
use crate::config::RecipeRule;
use crate::fingerprint::{s3_checksum, Fingerprint, FingerprintSource, ObjectHead};
use crate::key::job_key;
use crate::pipeline::message::MAX_HAND_ONS;
use crate::pipeline::HandOn;
use crate::references::{Keyed, VersionName};
use crate::step::{Manifest, ObjectBytes, OutputFile};
use crate::store::ObjectRef;

/// The upstream files a reason names when a chained job's file is not
/// among them.
const NAMED_FILES: usize = 10;

/// One upload version's pipeline, walked past its roots.
pub(super) struct Downstream<'a> {
    pub app: &'a App,
    pub batch: &'a BatchJobs,
    pub invocation: &'a Invocation,
    pub version: &'a VersionName,
    /// The upload as headed: its ETag conditions the references; a
    /// hand-on message names it.
    pub head: &'a ObjectHead,
    /// The job queue (the one the upload's message came from), where a
    /// hand-on message goes.
    pub queue_url: Option<&'a str>,
    /// The hand-ons of this version's pipeline so far (0: the walk of an
    /// S3 notification).
    pub hand_ons: u32,
}

/// A hand-on a walk asks for: sent if, and only if, the message that
/// walked is acknowledged.
#[derive(Debug, Clone)]
pub(super) struct PendingHandOn {
    pub queue_url: String,
    pub message: HandOn,
}

/// A chained job, keyed: its recipe, and the upstream file it reads.
struct Chained<'a> {
    rule: &'a RecipeRule,
    job_key: String,
    input: ObjectRef,
    /// The file's SHA-256 and size, as the upstream manifest records them.
    sha256: String,
    size: u64,
}

impl<'a> Downstream<'a> {
    /// Runs (or hands on) every job downstream of `done`, the version's
    /// root jobs as reported; returns their reports, level by level, and
    /// the hand-on they ask for (its jobs reported `handed-on`).
    pub async fn run(
        &self,
        roots: Vec<(&'a RecipeRule, JobReport)>,
    ) -> (Vec<JobReport>, Option<PendingHandOn>) {
        let mut reports = Vec::new();
        let mut handed_on: Vec<(&'a RecipeRule, String)> = Vec::new();
        let mut level = roots;
        while !level.is_empty() {
            let (chained, mut unrunnable) = self.key_level(&level).await;
            reports.append(&mut unrunnable);
            if chained.is_empty() {
                break;
            }
            let wanted = chained.iter().map(|c| c.job_key.clone()).collect();
            let keyed = Keyed {
                bytes: bytes_of(self.head, None),
                wanted,
            };
            let added = match reconcile_version(self.app, self.version, Some(keyed), Start::Unknown)
                .await
            {
                Ok(done) if done.stale.is_none() => done.added,
                Ok(done) => {
                    let reason = format!(
                        "{}: its outputs are not referenced by this version",
                        done.stale.unwrap_or_default()
                    );
                    reports.extend(chained.iter().map(|c| c.unclaimed(Outcome::Skipped, &reason)));
                    break;
                }
                Err(err) => {
                    let outcome = if err.contended {
                        Outcome::Busy
                    } else {
                        Outcome::Failed
                    };
                    reports.extend(chained.iter().map(|c| c.unclaimed(outcome, &err.message)));
                    break;
                }
            };
            let mut next = Vec::new();
            let mut inputs: HashMap<String, Arc<ObjectBytes>> = HashMap::new();
            for job in &chained {
                // A job no invocation can start is refused by its run.
                let margin = self.app.start_margin(job.rule);
                if let StartCheck::Later(_) = self.app.start_check(self.invocation, margin) {
                    handed_on.push((job.rule, job.job_key.clone()));
                    continue;
                }
                let done = self.run_one(job, &added, &mut inputs).await;
                reports.push(done.clone());
                next.push((job.rule, done));
            }
            level = next;
        }
        if handed_on.is_empty() {
            return (reports, None);
        }
        let (mut later, pending) = self.hand_on(&handed_on);
        reports.append(&mut later);
        (reports, pending)
    }

    /// The jobs chained to the done jobs of `level`, keyed by their
    /// upstream manifests; and the reports of those that cannot run (an
    /// upstream failed for good, a manifest without their file).
    async fn key_level(
        &self,
        level: &[(&'a RecipeRule, JobReport)],
    ) -> (Vec<Chained<'a>>, Vec<JobReport>) {
        let config: &'a crate::config::Config = &self.app.config;
        let mut chained = Vec::new();
        let mut unrunnable = Vec::new();
        for (upstream, done) in level {
            let children = config.chained_to(upstream);
            if children.is_empty() {
                continue;
            }
            let mut none_runs = |outcome, reason: String| {
                unrunnable.extend(
                    children
                        .iter()
                        .map(|rule| unclaimed(rule, None, outcome, reason.clone())),
                );
            };
            let outputs = match (done.outcome, &done.outputs) {
                (Outcome::Ran | Outcome::Reused, Some(outputs)) => outputs,
                (outcome @ (Outcome::Poisoned | Outcome::Unprocessable), _) => {
                    let reason = format!("upstream recipe {} failed for good", upstream.name);
                    none_runs(outcome, reason);
                    continue;
                }
                // Not done yet: its own report brings the message back.
                _ => continue,
            };
            let Some((bucket, prefix)) = crate::config::split_s3_location(outputs) else {
                let reason = format!(
                    "upstream job {}'s outputs {outputs:?} are not an s3://bucket/prefix/ location",
                    done.job_key
                );
                none_runs(Outcome::Failed, reason);
                continue;
            };
            let manifest = match self.app.manifest_under(bucket, prefix).await {
                Ok(Some(manifest)) => manifest,
                Ok(None) => {
                    let reason = format!("upstream job {}'s manifest is missing", done.job_key);
                    none_runs(Outcome::Failed, reason);
                    continue;
                }
                Err(err) => {
                    none_runs(Outcome::Failed, err);
                    continue;
                }
            };
            for rule in children {
                let Some((file, job_key)) = chained_input(rule, &manifest) else {
                    let file_name = &rule.input.as_ref().expect("a chained recipe").file;
                    // A package writes thousands of files: a few name the rest.
                    let names: Vec<&str> = manifest
                        .outputs
                        .iter()
                        .take(NAMED_FILES)
                        .map(|f| f.name.as_str())
                        .collect();
                    let more = manifest.outputs.len().saturating_sub(NAMED_FILES);
                    let reason = format!(
                        "upstream recipe {} wrote no {file_name} (it wrote {}{})",
                        upstream.name,
                        names.join(", "),
                        if more > 0 { format!(" and {more} more") } else { String::new() }
                    );
                    unrunnable.push(unclaimed(rule, None, Outcome::Poisoned, reason));
                    continue;
                };
                chained.push(Chained {
                    rule,
                    job_key,
                    input: ObjectRef {
                        bucket: bucket.to_string(),
                        key: format!("{prefix}{}", file.name),
                        version_id: None,
                        if_match: None,
                    },
                    sha256: file.sha256.clone(),
                    size: file.size,
                });
            }
        }
        (chained, unrunnable)
    }

    /// Claims and runs one chained job on its upstream file, whose bytes
    /// are checked against the manifest's SHA-256 when the step reads them.
    async fn run_one(
        &self,
        job: &Chained<'_>,
        added: &[String],
        inputs: &mut HashMap<String, Arc<ObjectBytes>>,
    ) -> JobReport {
        let app = self.app;
        let fingerprint = Fingerprint {
            input_hash: job.sha256.clone(),
            source: FingerprintSource::UpstreamManifest,
        };
        let bytes = match inputs.get(&job.input.to_string()) {
            Some(bytes) => bytes.clone(),
            None => {
                let head = match app.store.head(&job.input).await {
                    Ok(Some(head)) => head,
                    Ok(None) => {
                        let reason = format!("the upstream output {} is gone", job.input);
                        return job.unclaimed(Outcome::Failed, &reason);
                    }
                    Err(err) => return job.unclaimed(Outcome::Failed, &err.to_string()),
                };
                // Every read is pinned to this head's ETag, so the bytes
                // the step reads (whole, or by ranges, unhashed) are the
                // ones it describes: they must be the manifest's.
                if let Some(reason) = job.not_its_bytes(&head) {
                    return job.unclaimed(Outcome::Failed, &reason);
                }
                let bytes = app.object_bytes(head, &[job.rule.step.input_use()]);
                inputs.insert(job.input.to_string(), bytes.clone());
                bytes
            }
        };
        let run = JobRun {
            app,
            invocation: self.invocation,
            rule: job.rule,
            job_key: &job.job_key,
            bytes: &bytes,
            fingerprint: &fingerprint,
            // Never split: its input is an upstream job's output, not an
            // upload a chunk message could name and its waiters walk from.
            queue_url: None,
        };
        run.run_in(self.batch, added).await
    }

    /// One hand-on message for the jobs with no time left here, asked
    /// for (their reports say `handed-on`); or none: with no queue to hand
    /// on to they are deferred (the message comes back), and at
    /// [`MAX_HAND_ONS`] refused for good (`poisoned`: the failure event
    /// ends the pipeline).
    fn hand_on(&self, jobs: &[(&RecipeRule, String)]) -> (Vec<JobReport>, Option<PendingHandOn>) {
        let reports = |outcome, reason: String| {
            jobs.iter()
                .map(|(rule, job_key)| unclaimed(rule, Some(job_key.as_str()), outcome, reason.clone()))
                .collect()
        };
        let Some(queue_url) = self.queue_url else {
            let reason = "no time left in this invocation, and the message came from no SQS \
                          queue to hand on to";
            return (reports(Outcome::Deferred, reason.into()), None);
        };
        if self.hand_ons >= MAX_HAND_ONS {
            // Refused for good, not deferred: the pipeline ends with its
            // failure event, and the message goes to the dead-letter queue.
            let reason = format!(
                "no time left in this invocation, and this version's pipeline was handed on \
                 {} times already without getting it: not run (mediaonce retry runs it again)",
                self.hand_ons
            );
            return (reports(Outcome::Poisoned, reason), None);
        }
        let message = HandOn::new(
            &self.version.bucket,
            &self.version.key,
            self.version.version_id.as_deref(),
            &self.head.etag,
            self.head.size,
            jobs.iter().map(|(rule, _)| rule.name.clone()).collect(),
            self.hand_ons + 1,
        );
        let reason = "no time left in this invocation: handed on to the job queue".to_string();
        let pending = PendingHandOn {
            queue_url: queue_url.to_string(),
            message,
        };
        (reports(Outcome::HandedOn, reason), Some(pending))
    }
}

impl Chained<'_> {
    /// Why the upstream output `head` found is not the file the manifest
    /// names, if it is not: its size differs, or the SHA-256 S3 keeps for
    /// it (every output is written with its own) is another. An output
    /// written before outputs carried one is checked by its size alone.
    fn not_its_bytes(&self, head: &ObjectHead) -> Option<String> {
        let kept = s3_checksum(head).map(|fingerprint| fingerprint.input_hash);
        let size_differs = head.size != self.size;
        let hash_differs = kept.as_ref().is_some_and(|kept| *kept != self.sha256);
        (size_differs || hash_differs).then(|| {
            format!(
                "the upstream output {} is not the file its manifest names ({} bytes, SHA-256 \
                 {}): S3 has {} bytes{}; it was changed after its job wrote it, and no job \
                 reads it",
                self.input,
                self.size,
                self.sha256,
                head.size,
                kept.map(|k| format!(", SHA-256 {k}")).unwrap_or_default()
            )
        })
    }

    /// This job reported without a claim.
    fn unclaimed(&self, outcome: Outcome, reason: &str) -> JobReport {
        unclaimed(self.rule, Some(&self.job_key), outcome, reason.to_string())
    }
}

/// The upstream file chained recipe `rule` reads, as `manifest` records
/// it, and the job it keys: a chained job is keyed by its input file's
/// SHA-256 (a pipeline's walk, and `refs rebuild`, key it so). `None`
/// when the upstream wrote no such file, or `rule` is not chained.
pub(super) fn chained_input<'m>(
    rule: &RecipeRule,
    manifest: &'m Manifest,
) -> Option<(&'m OutputFile, String)> {
    let name = &rule.input.as_ref()?.file;
    let file = manifest.outputs.iter().find(|f| &f.name == name)?;
    Some((file, job_key(&file.sha256, &rule.recipe_hash)))
}

/// A chained job reported without a claim: keyed (its input hash is the
/// upstream manifest's), or not (its upstream gave it no input).
fn unclaimed(rule: &RecipeRule, job_key: Option<&str>, outcome: Outcome, reason: String) -> JobReport {
    JobReport {
        job_key: job_key.unwrap_or_default().to_string(),
        recipe: rule.name.clone(),
        step: rule.recipe.step.clone(),
        version: rule.recipe.version,
        outcome,
        attempt: 0,
        duration_ms: 0,
        reason: Some(reason),
        busy_until_ms: None,
        input_hash_source: job_key.map(|_| FingerprintSource::UpstreamManifest),
        outputs: None,
    }
}
