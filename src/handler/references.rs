//! A hint's references ([`crate::references`]): every create, delete,
//! `reprocess`, `backfill` or `refs rebuild` entry brings one object
//! version's row in line with what S3 holds now. Read the row, HEAD the
//! version, write the row conditioned on the `gen` read; a cancelled write
//! reads and HEADs again, so no write rests on a HEAD older than the row
//! it replaces.

use std::collections::BTreeSet;

use super::App;
use crate::fingerprint::ObjectHead;
use crate::ledger::{JobStatus, RefWrite};
use crate::references::{reconcile, Keyed, Seen, VersionName, VersionRefs};
use crate::store::{KeyEntry, ObjectRef};

/// Transactions tried before giving up (the message comes back): each
/// retry follows a write by a concurrent hint of the same version.
const ATTEMPTS: usize = 5;

/// What a hint came to.
#[derive(Debug, Default)]
pub(super) struct Reconciled {
    /// Jobs whose count this hint lowered (candidates for collection).
    pub released: Vec<String>,
    /// Why the hint's keyed bytes are not the version's (gone, or other
    /// bytes now): none of its jobs is referenced by the version.
    pub stale: Option<&'static str>,
    /// Ready jobs that could not be referenced, with why (no longer done:
    /// collected meanwhile). Their messages must come back to run them.
    pub refused: Vec<(String, String)>,
}

/// Where a hint starts.
#[derive(Debug, Clone)]
pub(super) enum Start {
    /// Knowing nothing: read the row, then HEAD.
    Unknown,
    /// What the hint's own HEAD saw. It serves only a first write
    /// conditioned on there being no row (most versions are new: one
    /// call), since a HEAD made before a row was read cannot vouch for
    /// replacing that row.
    Headed(Seen),
    /// The row, read already: HEAD, then write.
    Read(Option<VersionRefs>),
}

/// Reconciles `version`'s row with S3 for one hint. `keyed`: a create's
/// bytes and jobs (`None` for a delete).
pub(super) async fn reconcile_version(
    app: &App,
    version: &VersionName,
    keyed: Option<Keyed>,
    start: Start,
) -> Result<Reconciled, String> {
    let mut keyed = keyed;
    let (mut optimistic, mut read) = match start {
        Start::Unknown => (None, None),
        Start::Headed(seen) => (Some(seen), None),
        Start::Read(row) => (None, Some(row)),
    };
    let mut result = Reconciled::default();
    // Jobs done before references were counted: adopted (counted from 1,
    // partial until `mediaonce refs seal`).
    let mut uncounted: BTreeSet<String> = BTreeSet::new();
    // Jobs a release would lower that have nothing to release.
    let mut skipped: BTreeSet<String> = BTreeSet::new();
    for _ in 0..ATTEMPTS {
        let (row, seen) = match (read.take(), optimistic.take()) {
            (None, Some(seen)) => (None, seen),
            (read, _) => {
                let row = match read {
                    Some(row) => row,
                    None => app
                        .ledger
                        .version_refs(version)
                        .await
                        .map_err(|e| format!("reading the references of {version} failed: {e}"))?,
                };
                (row, seen_now(app, version).await?)
            }
        };
        let plan = reconcile(version, row.as_ref(), &seen, keyed.as_ref());
        result.stale = plan.stale;
        let Some(mut change) = plan.change else {
            return Ok(result);
        };
        for job_key in &uncounted {
            change.count_as(job_key, false);
        }
        change.remove.retain(|job_key| !skipped.contains(job_key));
        match app.ledger.change_refs(version, &change, app.now_ms()).await {
            Ok(RefWrite::Applied) => {
                if !(change.add.is_empty() && change.adopt.is_empty() && change.remove.is_empty()) {
                    tracing::info!(
                        version = %version,
                        added = ?change.add,
                        adopted = ?change.adopt,
                        removed = ?change.remove,
                        "references reconciled with S3"
                    );
                }
                result.released = change.remove;
                return Ok(result);
            }
            Ok(RefWrite::Cancelled {
                version: seen_row,
                refused,
            }) => {
                // The row as it is now (or as read, when only a job
                // refused); either way S3 is asked again.
                read = Some(seen_row.unwrap_or(row));
                for (job_key, job) in refused {
                    if change.remove.contains(&job_key) {
                        tracing::error!(version = %version, job_key, "a job the version referenced has no references to release: left as it is");
                        skipped.insert(job_key);
                        continue;
                    }
                    match job {
                        Some(job) if job.status == JobStatus::Done => {
                            // Counted or not, as the row is now.
                            if job.refs.is_none() {
                                uncounted.insert(job_key);
                            } else {
                                uncounted.remove(&job_key);
                            }
                        }
                        job => {
                            let state = job.map_or("gone", |j| j.status.as_str());
                            if let Some(keyed) = keyed.as_mut() {
                                keyed.ready.remove(&job_key);
                            }
                            uncounted.remove(&job_key);
                            result.refused.push((
                                job_key,
                                format!(
                                    "its outputs cannot be referenced: the job is {state} \
                                     (collected meanwhile); the message comes back and runs it"
                                ),
                            ));
                        }
                    }
                }
            }
            Err(err) => return Err(format!("recording the references of {version} failed: {err}")),
        }
    }
    Err(format!(
        "recording the references of {version} failed: its row kept changing"
    ))
}

/// What S3 holds at `version` now. The `null` version is headed as the
/// null version: a plain HEAD names the key's current version, which in
/// a versioned bucket may be another. Under
/// `MEDIAONCE_RELEASE_ON_DELETE_MARKER`, a version a newer delete marker
/// hides is gone.
async fn seen_now(app: &App, version: &VersionName) -> Result<Seen, String> {
    let Some(head) = head_version(app, version).await? else {
        return Ok(Seen::Gone);
    };
    if app.config.release_on_delete_marker {
        let history = app
            .store
            .history_of(&version.bucket, &version.key)
            .await
            .map_err(|e| e.to_string())?;
        if hidden_by_marker(version.version_id.as_deref(), &history) {
            return Ok(Seen::Gone);
        }
    }
    Ok(Seen::Holds { etag: head.etag })
}

/// HeadObject of exactly `version`; `None` when it does not exist. The
/// `null` version is headed as such: a plain HEAD names the key's current
/// version, which in a versioned bucket may be another one, and then the
/// null version is headed by its id, `null`.
pub(super) async fn head_version(
    app: &App,
    version: &VersionName,
) -> Result<Option<ObjectHead>, String> {
    let mut object = ObjectRef {
        bucket: version.bucket.clone(),
        key: version.key.clone(),
        version_id: version.version_id.clone(),
        if_match: None,
    };
    let head = app.store.head(&object).await.map_err(|e| e.to_string())?;
    if !(version.is_unversioned() && head.as_ref().is_some_and(|h| h.version_id.is_some())) {
        return Ok(head);
    }
    object.version_id = Some("null".into());
    let head = app.store.head(&object).await.map_err(|e| e.to_string())?;
    Ok(head.map(|head| ObjectHead {
        version_id: None,
        ..head
    }))
}

/// Whether a delete marker hides the version `version_id` of a key whose
/// entries are `history`: the key's current entry is a marker, or a
/// marker was written after the version. S3 lists `LastModified` in whole
/// seconds: a marker of the same second as the version hides it only when
/// it is the current entry (otherwise nothing says which came first, and
/// the version is kept: a leak until it is deleted, never a loss). Pure.
pub(super) fn hidden_by_marker(version_id: Option<&str>, history: &[KeyEntry]) -> bool {
    if history.iter().any(|e| e.delete_marker && e.is_latest) {
        return true;
    }
    let Some(written) = history
        .iter()
        .find(|e| !e.delete_marker && e.version_id.as_deref() == version_id)
    else {
        return false;
    };
    history.iter().any(|e| {
        e.delete_marker
            && matches!((e.last_modified_ms, written.last_modified_ms), (Some(m), Some(v)) if m > v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, marker: bool, latest: bool, at: i64) -> KeyEntry {
        KeyEntry {
            key: "k".into(),
            version_id: Some(id.into()),
            delete_marker: marker,
            is_latest: latest,
            last_modified_ms: Some(at),
        }
    }

    #[test]
    fn a_marker_hides_the_versions_before_it_not_after() {
        // v1, then a marker, then v2 (finding 5: v2's create not handled yet).
        let history = [
            entry("v2", false, true, 3_000),
            entry("m", true, false, 2_000),
            entry("v1", false, false, 1_000),
        ];
        assert!(hidden_by_marker(Some("v1"), &history));
        assert!(!hidden_by_marker(Some("v2"), &history));
        // The marker is the key's current entry: everything is hidden.
        let deleted = [entry("m", true, true, 2_000), entry("v1", false, false, 2_000)];
        assert!(hidden_by_marker(Some("v1"), &deleted));
        // The same second and not current: kept.
        let tie = [
            entry("v2", false, true, 2_000),
            entry("m", true, false, 2_000),
            entry("v1", false, false, 2_000),
        ];
        assert!(!hidden_by_marker(Some("v1"), &tie));
        assert!(!hidden_by_marker(Some("v1"), &[entry("v1", false, true, 1)]));
    }
}
