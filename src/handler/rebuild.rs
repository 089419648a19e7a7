//! References that were never recorded: the objects already in a bucket
//! when references began to be counted (`mediaonce refs rebuild`), and the
//! declaration that every place has been rebuilt (`mediaonce refs seal`).
//!
//! A job done before reference items has no `ref_items` and is never
//! collected: versions that were never listed may reference it. A rebuild
//! brings every listed version's references over to items (and records
//! the versions never recorded). `seal` is the operator's word that every
//! bucket and prefix the function's objects live in has been rebuilt: each
//! older done row gets `ref_items` and a mark, and the sweep reads its
//! references after the grace. DESIGN.md ("References": "Rows older than
//! reference items") has the argument.

use std::collections::BTreeSet;

use super::chain::chained_input;
use super::identify::identify;
use super::job::BatchJobs;
use super::references::{bytes_of, head_version, reconcile_version, Start};
use super::{App, JobReport, Outcome};
use crate::config::{split_s3_location, RecipeRule};
use crate::fingerprint::{s3_checksum, version_etag, Fingerprint, FingerprintSource, ObjectHead};
use crate::identity::IdentityMode;
use crate::key::job_key;
use crate::ledger::{Conditional, JobRow, JobStatus};
use crate::references::{Keyed, Seen, VersionName};

/// What a rebuild did for one object version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RebuiltVersion {
    /// `s3://bucket/key`.
    pub object: String,
    pub version_id: Option<String>,
    /// The done jobs the version references (now, or after a dry run).
    /// Its jobs not done are referenced too, and listed in `not_done`.
    pub referenced: Vec<String>,
    /// The matching recipes' jobs that are not done, and why: referenced
    /// all the same, they run on the next event, `mediaonce reprocess` or
    /// `mediaonce backfill`.
    pub not_done: Vec<NotReferenced>,
    /// Why the version could not be rebuilt (it stays as it was).
    pub error: Option<String>,
}

/// A job a version's recipe keys that is not done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NotReferenced {
    pub job_key: String,
    pub reason: String,
}

impl NotReferenced {
    /// A job the version keys whose row (`None`: none) is not done.
    fn keyed(job_key: String, row: Option<JobRow>) -> NotReferenced {
        NotReferenced {
            job_key,
            reason: match row {
                Some(row) => format!("the job is {}", row.status.as_str()),
                None => "the job has no row: it never ran (or was collected)".into(),
            },
        }
    }
}

/// A rebuild's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildSummary {
    pub versions: u64,
    pub references: u64,
    pub not_done: u64,
    pub errors: u64,
}

/// What `seal` did to one row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SealedRow {
    pub job_key: String,
    /// `false`: the row changed between the Scan and the seal (it is no
    /// longer done, or was sealed meanwhile).
    pub sealed: bool,
}

impl App {
    /// Records the references of every version (not delete markers) under
    /// `bucket`/`prefix` to the done jobs of its matching recipes, all
    /// pages, calling `on_version` for each. Idempotent: a version already
    /// referencing its jobs changes nothing. `dry_run`: nothing written.
    pub async fn rebuild_refs(
        &self,
        bucket: &str,
        prefix: &str,
        dry_run: bool,
        mut on_version: impl FnMut(&RebuiltVersion),
    ) -> Result<RebuildSummary, String> {
        let mut summary = RebuildSummary::default();
        let mut from = None;
        loop {
            let page = self
                .store
                .versions_page(bucket, prefix, from.as_ref())
                .await
                .map_err(|e| e.to_string())?;
            for (key, version_id) in page.versions {
                let version = VersionName {
                    bucket: bucket.to_string(),
                    key,
                    version_id,
                };
                let Some(rebuilt) = self.rebuild_version(&version, dry_run).await else {
                    continue;
                };
                summary.versions += 1;
                summary.references += rebuilt.referenced.len() as u64;
                summary.not_done += rebuilt.not_done.len() as u64;
                summary.errors += u64::from(rebuilt.error.is_some());
                on_version(&rebuilt);
            }
            match page.next {
                Some(next) => from = Some(next),
                None => return Ok(summary),
            }
        }
    }

    /// One version's references. `None` when it matches no recipe or no
    /// longer exists.
    async fn rebuild_version(&self, version: &VersionName, dry_run: bool) -> Option<RebuiltVersion> {
        let rules: Vec<&RecipeRule> = self.config.recipes_for(&version.key);
        if rules.is_empty() {
            return None;
        }
        let mut rebuilt = RebuiltVersion {
            object: format!("s3://{}/{}", version.bucket, version.key),
            version_id: version.version_id.clone(),
            referenced: Vec::new(),
            not_done: Vec::new(),
            error: None,
        };
        // The null version as itself, not whatever version is current.
        let head = match head_version(self, version).await {
            Ok(Some(head)) => head,
            Ok(None) => return None,
            Err(err) => {
                rebuilt.error = Some(err);
                return Some(rebuilt);
            }
        };
        let (reports, wanted, fingerprint) = match self.done_jobs(&head, &rules, &mut rebuilt).await {
            Ok(found) => found,
            Err(reason) => {
                rebuilt.error = Some(reason);
                return Some(rebuilt);
            }
        };
        if !dry_run {
            // The SHA-256 that keyed the jobs is recorded, as a create's
            // is: with only an ETag that is not an MD5 (a multipart
            // upload), nothing would prove the row's earlier bytes other,
            // and their jobs would be kept under this ETag for the
            // version's life.
            let bytes = bytes_of(&head, Some(&fingerprint));
            let headed = Start::Headed(Seen::Holds(bytes.clone()));
            let keyed = Keyed { bytes, wanted };
            match reconcile_version(self, version, Some(keyed), headed).await {
                Ok(done) => {
                    if let Some(stale) = done.stale {
                        rebuilt.error = Some(format!(
                            "{stale} than when it was listed: nothing referenced (its own event records it)"
                        ));
                        return Some(rebuilt);
                    }
                }
                Err(err) => {
                    rebuilt.error = Some(err.to_string());
                    return Some(rebuilt);
                }
            }
        }
        if dry_run {
            rebuilt
                .referenced
                .extend(reports.into_iter().map(|report| report.job_key));
            return Some(rebuilt);
        }
        // Each job read again after its reference was written, as every
        // adder does (DESIGN.md, "The collector and the adder"): the read
        // before it chose the key, but a sweep may have collected the job
        // since, seeing no reference yet. Only a job read `done` after the
        // reference is one no collector deletes.
        for report in reports {
            match self.ledger.get(&report.job_key).await {
                Ok(Some(row)) if row.status == JobStatus::Done => {
                    rebuilt.referenced.push(report.job_key)
                }
                Ok(row) => rebuilt.not_done.push(NotReferenced {
                    job_key: report.job_key,
                    reason: match row {
                        Some(row) => format!(
                            "the job is {} (it changed while the rebuild referenced it)",
                            row.status.as_str()
                        ),
                        None => format!(
                            "the job was collected while the rebuild referenced it: \
                             referenced all the same; `mediaonce reprocess s3://{}/{}{}` runs \
                             it again (the version's own event may never come: that is why \
                             one rebuilds)",
                            version.bucket,
                            version.key,
                            version
                                .version_id
                                .as_deref()
                                .map(|id| format!(" --version-id {id}"))
                                .unwrap_or_default()
                        ),
                    },
                }),
                Err(err) => {
                    rebuilt.error = Some(format!(
                        "reading job {} after referencing it: {err}",
                        report.job_key
                    ));
                    return Some(rebuilt);
                }
            }
        }
        Some(rebuilt)
    }

    /// The version's done jobs, one per recipe, as reports to reference
    /// (read again after the reference is written: this read only chooses
    /// the key), the jobs it wants, and the input hash this configuration
    /// keys it by; the others go to `rebuilt.not_done`. A job is the one this
    /// configuration keys, or, when that one is not done, the one the
    /// version was keyed by before content identity (S3's SHA-256, else
    /// version and ETag): rows older than the count were keyed so.
    async fn done_jobs(
        &self,
        head: &ObjectHead,
        rules: &[&RecipeRule],
        rebuilt: &mut RebuiltVersion,
    ) -> Result<(Vec<JobReport>, BTreeSet<String>, Fingerprint), String> {
        let identified = identify(self, &BatchJobs::default(), head.clone(), rules)
            .await
            .map_err(|(_, reason)| reason)?;
        let mut input_hashes = vec![identified.fingerprint.clone()];
        if self.config.identity != IdentityMode::Checksum {
            let before = s3_checksum(head).unwrap_or_else(|| version_etag(head));
            if before.input_hash != identified.fingerprint.input_hash {
                input_hashes.push(before);
            }
        }
        let mut reports = Vec::new();
        // Per recipe, the job the version wants: the done one, else this
        // configuration's key.
        let mut wanted = BTreeSet::new();
        let mut done_roots: Vec<(&RecipeRule, JobRow)> = Vec::new();
        for rule in rules {
            let mut first: Option<(String, Option<JobRow>)> = None;
            let mut done: Option<(JobRow, FingerprintSource)> = None;
            for fingerprint in &input_hashes {
                let key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
                let row = self.ledger.get(&key).await.map_err(|e| e.to_string())?;
                match row {
                    Some(row) if row.status == JobStatus::Done => {
                        done = Some((row, fingerprint.source));
                        break;
                    }
                    row => {
                        first.get_or_insert((key, row));
                    }
                }
            }
            match (done, first) {
                (Some((row, source)), _) => {
                    wanted.insert(row.job_key.clone());
                    reports.push(reused(rule, &row, source));
                    done_roots.push((*rule, row));
                }
                (None, Some((job_key, row))) => {
                    wanted.insert(job_key.clone());
                    rebuilt.not_done.push(NotReferenced::keyed(job_key, row))
                }
                (None, None) => {}
            }
        }
        self.done_downstream(done_roots, &mut reports, &mut wanted, rebuilt)
            .await?;
        Ok((reports, wanted, identified.fingerprint))
    }

    /// The jobs chained to `done` ones, level by level, keyed as a walk of
    /// the pipeline keys them: by the SHA-256 the upstream manifest records
    /// for their input file. A version references its whole pipeline. A
    /// rebuild that referenced only the roots left a sealed row's chained
    /// jobs unreferenced, and the sweep collected them while the version
    /// lived (found by the explorer: a table from before reference items,
    /// a chained recipe). A job not done is referenced too and listed, as
    /// a root is; an upstream without its manifest or the file names no
    /// job.
    async fn done_downstream(
        &self,
        mut done: Vec<(&RecipeRule, JobRow)>,
        reports: &mut Vec<JobReport>,
        wanted: &mut BTreeSet<String>,
        rebuilt: &mut RebuiltVersion,
    ) -> Result<(), String> {
        while let Some((upstream, row)) = done.pop() {
            let children = self.config.chained_to(upstream);
            if children.is_empty() {
                continue;
            }
            let Some((bucket, prefix)) = split_s3_location(&row.output_prefix) else {
                continue;
            };
            let Some(manifest) = self.manifest_under(bucket, prefix).await? else {
                continue;
            };
            for rule in children {
                let Some((_, key)) = chained_input(rule, &manifest) else {
                    continue;
                };
                wanted.insert(key.clone());
                match self.ledger.get(&key).await.map_err(|e| e.to_string())? {
                    Some(row) if row.status == JobStatus::Done => {
                        reports.push(reused(rule, &row, FingerprintSource::UpstreamManifest));
                        done.push((rule, row));
                    }
                    row => rebuilt.not_done.push(NotReferenced::keyed(key, row)),
                }
            }
        }
        Ok(())
    }

    /// Declares every done row from before reference items complete: the
    /// operator's word that every place the function's objects live in has
    /// been rebuilt ([`App::rebuild_refs`]). Each gets `ref_items` and a
    /// mark, so the sweep reads its references after the grace.
    /// `dry_run`: only lists them.
    pub async fn seal_refs(&self, dry_run: bool) -> Result<Vec<SealedRow>, String> {
        let rows = self.ledger.unsealed().await.map_err(|e| e.to_string())?;
        let mut sealed = Vec::with_capacity(rows.len());
        for row in rows {
            let applied = if dry_run {
                true
            } else {
                match self.ledger.seal_refs(&row, self.now_ms()).await {
                    Ok(Conditional::Applied(())) => true,
                    Ok(Conditional::Rejected(_)) => false,
                    Err(err) => return Err(err.to_string()),
                }
            };
            sealed.push(SealedRow {
                job_key: row.job_key,
                sealed: applied,
            });
        }
        Ok(sealed)
    }
}

/// A done job a rebuild references, as its report says.
fn reused(rule: &RecipeRule, row: &JobRow, source: FingerprintSource) -> JobReport {
    JobReport {
        job_key: row.job_key.clone(),
        recipe: rule.name.clone(),
        step: rule.recipe.step.clone(),
        version: rule.recipe.version,
        outcome: Outcome::Reused,
        attempt: row.attempts,
        duration_ms: 0,
        reason: None,
        busy_until_ms: None,
        input_hash_source: Some(source),
        outputs: Some(row.output_prefix.clone()),
    }
}
