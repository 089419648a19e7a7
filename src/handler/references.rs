//! A record's references ([`crate::references`]): after a create's jobs, the
//! object version is recorded as referencing each job that ran or was
//! reused; a removal releases what the version referenced. Each change is
//! one transaction, replanned from the row DynamoDB returns when another
//! event changed it first.

use std::collections::BTreeSet;

use super::{App, JobReport, Outcome};
use crate::ledger::{JobStatus, RefWrite};
use crate::references::{on_create, on_delete, VersionName, VersionRefs};

/// Transactions tried before giving up (the message comes back): each
/// retry follows a change by a concurrent event of the same version.
const ATTEMPTS: usize = 5;

/// Records `version` as referencing the jobs of `reports` that ran or were
/// reused. A job that cannot gain a reference because it is no longer done
/// (its outputs were collected meanwhile) becomes `busy`: its message
/// comes back and runs it again. A failure to record fails the jobs (the
/// message comes back), since an unrecorded reference would let their
/// outputs be collected under a live object.
pub(super) async fn record_create(
    app: &App,
    version: &VersionName,
    sequencer: Option<&str>,
    etag: &str,
    reports: &mut [JobReport],
) {
    let mut wanted: BTreeSet<String> = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ran | Outcome::Reused) && !r.job_key.is_empty())
        .map(|r| r.job_key.clone())
        .collect();
    if wanted.is_empty() {
        return;
    }
    // Most versions are new: try without reading the row first; a refusal
    // returns it.
    let mut current: Option<VersionRefs> = None;
    // Jobs done before references were counted: adopted (counted from 1,
    // partial until `mediaonce refs seal`).
    let mut uncounted: BTreeSet<String> = BTreeSet::new();
    // Jobs an overwrite would release that have nothing to release.
    let mut skipped: BTreeSet<String> = BTreeSet::new();
    for _ in 0..ATTEMPTS {
        let Some(mut change) = on_create(version, current.as_ref(), &wanted, sequencer, Some(etag))
        else {
            return;
        };
        for job_key in &uncounted {
            change.count_as(job_key, false);
        }
        change.remove.retain(|job_key| !skipped.contains(job_key));
        match app.ledger.change_refs(version, &change, app.now_ms()).await {
            Ok(RefWrite::Applied) => {
                tracing::info!(
                    version = %version,
                    added = ?change.add,
                    adopted = ?change.adopt,
                    removed = ?change.remove,
                    "references recorded"
                );
                return;
            }
            Ok(RefWrite::Cancelled {
                version: seen,
                refused,
            }) => {
                if let Some(seen) = seen {
                    current = seen;
                }
                for (job_key, row) in refused {
                    if change.remove.contains(&job_key) {
                        tracing::error!(version = %version, job_key, "a job the version referenced has no references to release: left as it is");
                        skipped.insert(job_key);
                        continue;
                    }
                    match row {
                        Some(row) if row.status == JobStatus::Done => {
                            // Counted or not, as the row is now.
                            if row.refs.is_none() {
                                uncounted.insert(job_key);
                            } else {
                                uncounted.remove(&job_key);
                            }
                        }
                        row => {
                            wanted.remove(&job_key);
                            uncounted.remove(&job_key);
                            let state = row.map_or("gone", |r| r.status.as_str());
                            for report in reports.iter_mut().filter(|r| r.job_key == job_key) {
                                report.outcome = Outcome::Busy;
                                report.reason = Some(format!(
                                    "its outputs cannot be referenced: the job is {state} \
                                     (collected meanwhile); the message comes back and runs it"
                                ));
                            }
                        }
                    }
                }
            }
            Err(err) => return fail(reports, &format!("recording the object's references failed: {err}")),
        }
    }
    fail(
        reports,
        "recording the object's references failed: its row kept changing",
    );
}

/// For a version that was seen before (its hash came from the cache): the
/// references written first, conditioned on every job being done. When
/// that holds (a redelivery, the common case for a cached hash), every job
/// is reused for one call and no claim; `None` sends the record down the
/// claim path.
pub(super) async fn reuse_if_referenced(
    app: &App,
    version: &VersionName,
    job_keys: &BTreeSet<String>,
    sequencer: Option<&str>,
    etag: &str,
) -> bool {
    let mut current: Option<VersionRefs> = None;
    for _ in 0..2 {
        let Some(change) = on_create(version, current.as_ref(), job_keys, sequencer, Some(etag))
        else {
            // Already references every job (each was done when referenced,
            // and a referenced job is never collected).
            return current.is_some_and(|row| !row.deleted);
        };
        match app.ledger.change_refs(version, &change, app.now_ms()).await {
            Ok(RefWrite::Applied) => return true,
            Ok(RefWrite::Cancelled {
                version: Some(seen),
                refused,
            }) if refused.is_empty() => current = seen,
            Ok(_) | Err(_) => return false,
        }
    }
    false
}

fn fail(reports: &mut [JobReport], reason: &str) {
    for report in reports
        .iter_mut()
        .filter(|r| matches!(r.outcome, Outcome::Ran | Outcome::Reused))
    {
        report.outcome = Outcome::Failed;
        report.reason = Some(reason.to_string());
    }
}

/// Releases what `version` referenced (its permanent delete, at
/// `sequencer`), leaving a tombstone. Returns the jobs released.
pub(super) async fn release(
    app: &App,
    version: &VersionName,
    sequencer: Option<&str>,
) -> Result<Vec<String>, String> {
    let mut current = app
        .ledger
        .version_refs(version)
        .await
        .map_err(|e| format!("reading the references of {version} failed: {e}"))?;
    let mut skipped: BTreeSet<String> = BTreeSet::new();
    for _ in 0..ATTEMPTS {
        let Some(mut change) = on_delete(current.as_ref(), sequencer) else {
            return Ok(Vec::new());
        };
        change.remove.retain(|key| !skipped.contains(key));
        match app.ledger.change_refs(version, &change, app.now_ms()).await {
            Ok(RefWrite::Applied) => return Ok(change.remove),
            Ok(RefWrite::Cancelled {
                version: seen,
                refused,
            }) => {
                if let Some(seen) = seen {
                    current = seen;
                }
                for (job_key, row) in refused {
                    tracing::error!(
                        version = %version,
                        job_key,
                        refs = ?row.and_then(|r| r.refs),
                        "a referenced job has no references to release: left as it is"
                    );
                    skipped.insert(job_key);
                }
            }
            Err(err) => return Err(format!("releasing the references of {version} failed: {err}")),
        }
    }
    Err(format!(
        "releasing the references of {version} failed: its row kept changing"
    ))
}

/// Releases the references of every version of `marker`'s key that still
/// exists (a delete marker, with `MEDIAONCE_RELEASE_ON_DELETE_MARKER`).
pub(super) async fn release_every_version(
    app: &App,
    marker: &VersionName,
    sequencer: Option<&str>,
) -> Result<Vec<String>, String> {
    let versions = app
        .store
        .versions_of(&marker.bucket, &marker.key)
        .await
        .map_err(|e| e.to_string())?;
    let mut released = Vec::new();
    for version_id in versions {
        let version = VersionName {
            version_id,
            ..marker.clone()
        };
        released.extend(release(app, &version, sequencer).await?);
    }
    Ok(released)
}
