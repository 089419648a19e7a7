//! A hint's references ([`crate::references`]): every create, delete,
//! `reprocess`, `backfill` or `refs rebuild` entry brings one object
//! version's row in line with what S3 holds now. Read the row, HEAD the
//! version, write the row conditioned on the `gen` read; a cancelled write
//! reads and HEADs again, so no write rests on a HEAD older than the row
//! it replaces.

use std::collections::BTreeSet;
use std::time::Instant;

use super::App;
use crate::fingerprint::{s3_checksum, Fingerprint, ObjectHead};
use crate::ledger::RefWrite;
use crate::references::{reconcile, BytesId, Keyed, Seen, VersionName, VersionRefs};
use crate::store::{KeyEntry, ObjectRef};

/// Transactions tried before giving up (the message comes back): each
/// retry follows a write by a concurrent hint of the same version, after
/// a jittered wait (the ledger's retry policy), so that hints of one
/// version in flight at once (duplicates, a reprocess) spread out.
const ATTEMPTS: u32 = 8;

/// A release marks its jobs before it deletes their reference items, and
/// the collector clears a mark only once it is older than this: a mark and
/// its deletes must come within it. A Lambda invocation lasts 15 minutes
/// at most; a process outside Lambda (`mediaonce refs rebuild`) marks
/// again before a transaction when [`REMARK_AFTER`] has passed.
pub const MARK_SETTLE_MS: u64 = 16 * 60 * 1000;

/// Marks older than this (by the process's monotonic clock) are written
/// again before the transaction they precede.
const REMARK_AFTER: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// What a hint came to.
#[derive(Debug, Default)]
pub(super) struct Reconciled {
    /// Jobs this hint released (candidates for collection).
    pub released: Vec<String>,
    /// Jobs this hint added a reference to.
    pub added: Vec<String>,
    /// Why the hint's keyed bytes are not the version's now (it is gone,
    /// or holds other bytes): none of its jobs is referenced by it.
    pub stale: Option<&'static str>,
}

/// Why a hint could not be reconciled.
#[derive(Debug)]
pub(super) struct ReconcileError {
    pub message: String,
    /// Other hints of the version kept writing its row first: nothing is
    /// wrong, the message comes back (busy) and reconciles then.
    pub contended: bool,
}

impl From<String> for ReconcileError {
    fn from(message: String) -> Self {
        ReconcileError {
            message,
            contended: false,
        }
    }
}

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
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
}

/// Reconciles `version`'s row with S3 for one hint. `keyed`: a create's
/// bytes and jobs (`None` for a delete).
///
/// A release marks each job it releases (a fresh nonce) before the
/// transaction deletes the job's reference item: a collector that sees
/// the item before it goes may clear only an older mark, never this one
/// (DESIGN.md, "The collector and the adder").
pub(super) async fn reconcile_version(
    app: &App,
    version: &VersionName,
    keyed: Option<Keyed>,
    start: Start,
) -> Result<Reconciled, ReconcileError> {
    let mut optimistic = match start {
        Start::Unknown => None,
        Start::Headed(seen) => Some(seen),
    };
    let mut read: Option<Option<VersionRefs>> = None;
    let mut result = Reconciled::default();
    // Jobs whose reference item was found missing: nothing to delete.
    let mut missing: BTreeSet<String> = BTreeSet::new();
    // Jobs marked, and when.
    let mut marked: Vec<(String, Instant)> = Vec::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 1 {
            let wait = app.ledger.retry_policy().delay(attempt - 1, &app.rng);
            // A zero wait is no sleep: a timer, even an elapsed one, fires
            // when the runtime's driver next turns, which the explorer's
            // scheduler cannot choose (DESIGN.md, "The explorer").
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
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
        change.remove.retain(|job_key| !missing.contains(job_key));
        for job_key in &change.remove {
            let fresh = marked
                .iter()
                .any(|(job, at)| job == job_key && at.elapsed() < REMARK_AFTER);
            if !fresh {
                mark(app, job_key).await?;
                marked.push((job_key.clone(), Instant::now()));
            }
        }
        match app.ledger.change_refs(version, &change, app.now_ms()).await {
            Ok(RefWrite::Applied) => {
                if !(change.add.is_empty() && change.remove.is_empty()) {
                    tracing::info!(
                        version = %version,
                        added = ?change.add,
                        removed = ?change.remove,
                        "references reconciled with S3"
                    );
                }
                result.released = change.remove;
                result.added = change.add;
                return Ok(result);
            }
            Ok(RefWrite::Cancelled {
                version: seen_row,
                missing: gone,
            }) => {
                // The row as it is now (or as read, when only an item was
                // missing); either way S3 is asked again.
                read = Some(seen_row.unwrap_or(row));
                for job_key in gone {
                    tracing::error!(
                        version = %version,
                        job_key,
                        "reference mismatch: the version's row lists a job whose reference item is missing; nothing to delete"
                    );
                    missing.insert(job_key);
                }
            }
            Err(err) => {
                return Err(format!("recording the references of {version} failed: {err}").into())
            }
        }
    }
    Err(ReconcileError {
        message: format!(
            "other hints of {version} kept writing its references first ({ATTEMPTS} tries): \
             it comes back and reconciles then"
        ),
        contended: true,
    })
}

/// Marks `job_key` as maybe unreferenced, with a fresh nonce. A job whose
/// row is gone (collected already) has nothing to mark.
async fn mark(app: &App, job_key: &str) -> Result<(), String> {
    let nonce = app.owner_token("release");
    app.ledger
        .mark_released(job_key, &nonce, app.now_ms())
        .await
        .map(|_| ())
        .map_err(|e| format!("marking job {job_key} released failed: {e}"))
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
    Ok(Seen::Holds(bytes_of(&head, None)))
}

/// What names the bytes `head` found: its ETag, whether that is their
/// MD5, and their SHA-256 when the job was keyed by one (`keyed`: a
/// content hash S3 or mediaonce computed) or S3 stored a full-object one.
pub(super) fn bytes_of(head: &ObjectHead, keyed: Option<&Fingerprint>) -> BytesId {
    // A cached hash counts: mediaonce computed it from this very version
    // (its row names the version id, ETag, size and CRC64NVME), and a
    // redelivery whose hash comes from the cache must record what the
    // first delivery would have (the soak found rows left without a proof,
    // and the jobs of bytes since overwritten kept, when it did not). It
    // is wrong only where the cache is (DESIGN, "Content identity": an
    // MD5 and CRC64 collision of an unversioned overwrite).
    let sha256 = keyed
        .filter(|fingerprint| fingerprint.source.is_content())
        .map(|fingerprint| fingerprint.input_hash.clone())
        .or_else(|| s3_checksum(head).map(|fingerprint| fingerprint.input_hash));
    BytesId {
        etag: head.etag.clone(),
        sha256,
        etag_md5: head.etag_md5,
        crc64nvme: head.checksum_crc64nvme.clone(),
    }
}

/// HeadObject of exactly `version`; `None` when it does not exist. The
/// `null` version is headed as such: a plain HEAD names the key's current
/// version, which in a versioned bucket may be another one (or nothing,
/// under a delete marker), and then the null version is headed by its id.
pub(super) async fn head_version(
    app: &App,
    version: &VersionName,
) -> Result<Option<ObjectHead>, String> {
    let object = ObjectRef {
        bucket: version.bucket.clone(),
        key: version.key.clone(),
        version_id: version.version_id.clone(),
        if_match: None,
    };
    let head = app.store.head(&object).await.map_err(|e| e.to_string())?;
    // A plain HEAD answers for the null version when it finds no version
    // id. It finds another version when versioning came after the null
    // one, and nothing when a delete marker is current: then only a HEAD
    // of `null` itself says whether the null version exists.
    let current_is_null = head.as_ref().is_some_and(|h| h.version_id.is_none());
    if !version.is_unversioned() || current_is_null {
        return Ok(head);
    }
    head_null_version(app, &object).await
}

/// HeadObject of `object`'s key at `versionId=null`: S3's null version
/// itself, whichever version is current. The head keeps the id `null`, so
/// reads through it stay pinned to that version.
pub(super) async fn head_null_version(
    app: &App,
    object: &ObjectRef,
) -> Result<Option<ObjectHead>, String> {
    let null = ObjectRef {
        version_id: Some("null".into()),
        if_match: None,
        ..object.clone()
    };
    let head = app.store.head(&null).await.map_err(|e| e.to_string())?;
    Ok(head.map(|head| ObjectHead {
        version_id: Some("null".into()),
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
