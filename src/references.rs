//! References: which object versions use which jobs' outputs. Pure: the
//! rules; the DynamoDB calls are [`crate::ledger`]'s, the handler's use is
//! `handler/references.rs`. DESIGN.md ("References") has the items, the
//! transitions and the safety argument.
//!
//! Each object version (bucket, key, version id or `null`) has one row in
//! the claim table listing the job keys it references; each job row counts
//! the versions referencing it (`refs`). A change to a version's row and
//! the counts it moves is one transaction, so `refs` is exact. Events of
//! one key may arrive out of order: the row keeps the sequencer of the
//! last event applied, and a deleted version keeps a tombstone (expiring
//! by TTL) so that a create older than its delete leaves nothing behind.

use std::collections::BTreeSet;

use crate::event::sequencer_order;
use crate::key::sha256_hex;

/// The prefix of a version row's partition key; a job key is 64 hex
/// digits, a hash cache row starts `input-hash#`.
pub const VERSION_ROW_PREFIX: &str = "version#";

/// How long a deleted version's tombstone is kept: longer than SQS keeps a
/// message (14 days at most), so no create event can arrive after it.
pub const TOMBSTONE_SECS: u64 = 15 * 24 * 3600;

/// Attribute names of a version row (besides `job_key`).
pub mod attr {
    pub const BUCKET: &str = "bucket";
    pub const OBJECT_KEY: &str = "object_key";
    pub const VERSION_ID: &str = "version_id";
    /// SS: the job keys this version references (absent when none).
    pub const JOB_KEYS: &str = "job_keys";
    /// S: the sequencer of the last event applied, normalised.
    pub const SEQUENCER: &str = "sequencer";
    /// S: the ETag of the bytes the references belong to.
    pub const ETAG: &str = "etag";
    /// N: bumped by every change; a change is conditioned on the one read.
    pub const GEN: &str = "gen";
    /// BOOL: the version was deleted (a tombstone).
    pub const DELETED: &str = "deleted";
    /// N: epoch seconds after which DynamoDB's TTL removes a tombstone.
    pub const EXPIRES_AT: &str = "expires_at";
    /// Job rows: N, epoch ms of the last release that lowered `refs`.
    pub const RELEASED_AT_MS: &str = "released_at_ms";
    /// Job rows: N, the versions referencing the job.
    pub const REFS: &str = "refs";
    /// Job rows: BOOL, `refs` counts only the versions seen since the row
    /// was adopted (it was done before references were counted): never
    /// collected until `mediaonce refs seal` declares the count complete.
    pub const REFS_PARTIAL: &str = "refs_partial";
}

/// One object version, by name (not by bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionName {
    pub bucket: String,
    pub key: String,
    /// `None` in an unversioned bucket (S3's `null` version).
    pub version_id: Option<String>,
}

impl VersionName {
    /// The version row's partition key.
    pub fn row_key(&self) -> String {
        let text = format!(
            "{}\n{}\n{}",
            self.bucket,
            self.version_id.as_deref().unwrap_or("null"),
            self.key
        );
        format!("{VERSION_ROW_PREFIX}{}", sha256_hex(text.as_bytes()))
    }

    /// Whether S3's `null` version: overwritten in place by a new upload.
    pub fn is_unversioned(&self) -> bool {
        self.version_id.is_none()
    }
}

impl std::fmt::Display for VersionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "s3://{}/{}?versionId={}",
            self.bucket,
            self.key,
            self.version_id.as_deref().unwrap_or("null")
        )
    }
}

/// A sequencer in a form whose string order is S3's order: leading zeros
/// dropped, upper case, left-padded to 32 digits (S3's are 18). Longer
/// ones keep their length, and order after every padded one.
pub fn normalised_sequencer(sequencer: &str) -> String {
    let digits = sequencer
        .trim()
        .trim_start_matches('0')
        .to_ascii_uppercase();
    format!("{digits:0>32}")
}

/// A version row as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionRefs {
    pub job_keys: BTreeSet<String>,
    /// Normalised ([`normalised_sequencer`]); `None` when no event carried one.
    pub sequencer: Option<String>,
    /// The ETag of the bytes whose jobs are referenced (unquoted).
    pub etag: Option<String>,
    pub gen: u64,
    pub deleted: bool,
}

/// A change to one version's references: the row as it must become, and
/// the job counts it moves. Applied as one transaction, conditioned on
/// the row's `gen` as read (or its absence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefChange {
    /// The row's `gen` as read; `None`: the row must not exist yet.
    pub seen_gen: Option<u64>,
    pub next: VersionRefs,
    /// Jobs gaining this version: `refs` + 1, only if `done` and counted.
    pub add: Vec<String>,
    /// Jobs gaining this version that were done before references were
    /// counted (no `refs`): `refs` = 1 and `refs_partial`, only if `done`
    /// and still uncounted.
    pub adopt: Vec<String>,
    /// Jobs losing it: `refs` − 1 and `released_at_ms` set.
    pub remove: Vec<String>,
}

impl RefChange {
    /// `job_key` moved between `add` and `adopt`, as its row turned out:
    /// `counted` says whether it has `refs`. `false` when it is in neither.
    pub fn count_as(&mut self, job_key: &str, counted: bool) -> bool {
        let (from, to) = if counted {
            (&mut self.adopt, &mut self.add)
        } else {
            (&mut self.add, &mut self.adopt)
        };
        let Some(at) = from.iter().position(|k| k == job_key) else {
            return false;
        };
        to.push(from.remove(at));
        true
    }
}

/// Whether `a` is later than `b` (both normalised or absent: unknown is
/// never later).
fn later(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => sequencer_order(a, b) == std::cmp::Ordering::Greater,
        _ => false,
    }
}

/// The later of two sequencers.
fn latest(a: Option<&String>, b: Option<&String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) if sequencer_order(a, b) == std::cmp::Ordering::Less => Some(b.clone()),
        (Some(a), _) => Some(a.clone()),
        (None, b) => b.cloned(),
    }
}

/// What a create of `version` (sequencer `sequencer`, bytes with ETag
/// `etag`), whose jobs `wanted` ran or were reused, does to its row
/// `current`. `None`: nothing.
///
/// - A version deleted by a later event (or, unversioned, overwritten by a
///   later create) keeps its row: this create is stale.
/// - Otherwise the wanted jobs are added. In an unversioned bucket a later
///   create is an overwrite: the jobs of the old bytes that are not wanted
///   now are removed. A create whose ETag differs from the row's, with no
///   sequencer saying it is older, is a later one too: the handler keys
///   only the bytes the key holds when it is handled (a create whose
///   bytes were replaced since is skipped before this).
pub fn on_create(
    version: &VersionName,
    current: Option<&VersionRefs>,
    wanted: &BTreeSet<String>,
    sequencer: Option<&str>,
    etag: Option<&str>,
) -> Option<RefChange> {
    let sequencer = sequencer.map(normalised_sequencer);
    let empty = VersionRefs::default();
    let row = current.unwrap_or(&empty);
    let newer_than_row = later(sequencer.as_deref(), row.sequencer.as_deref());
    let older_than_row = later(row.sequencer.as_deref(), sequencer.as_deref());
    if current.is_some() && row.deleted {
        // A tombstone: only a later create (an unversioned key uploaded
        // again after its delete) revives the row.
        if !(newer_than_row && version.is_unversioned()) {
            return None;
        }
    }
    if version.is_unversioned() && older_than_row {
        // Its bytes were overwritten since: they are not what the key holds.
        return None;
    }
    let other_bytes = match (etag, row.etag.as_deref()) {
        (Some(new), Some(old)) => new != old,
        _ => false,
    };
    let overwrite = version.is_unversioned() && (newer_than_row || other_bytes || row.deleted);
    let kept: BTreeSet<String> = if row.deleted {
        BTreeSet::new()
    } else {
        row.job_keys.clone()
    };
    let add: Vec<String> = wanted.difference(&kept).cloned().collect();
    let remove: Vec<String> = if overwrite {
        kept.difference(wanted).cloned().collect()
    } else {
        Vec::new()
    };
    let next_sequencer = latest(sequencer.as_ref(), row.sequencer.as_ref());
    let next_etag = etag.map(str::to_string).or_else(|| row.etag.clone());
    if add.is_empty()
        && remove.is_empty()
        && next_sequencer == row.sequencer
        && next_etag == row.etag
        && !row.deleted
    {
        return None;
    }
    let mut job_keys = kept;
    job_keys.extend(add.iter().cloned());
    for gone in &remove {
        job_keys.remove(gone);
    }
    Some(RefChange {
        seen_gen: current.map(|r| r.gen),
        next: VersionRefs {
            job_keys,
            sequencer: next_sequencer,
            etag: next_etag,
            gen: row.gen + 1,
            deleted: false,
        },
        add,
        adopt: Vec::new(),
        remove,
    })
}

/// What a permanent delete of `version` (sequencer `sequencer`) does to its
/// row `current`: every reference released and a tombstone left. `None`:
/// nothing (already deleted by this or a later event, or the row was made
/// by a later create).
pub fn on_delete(current: Option<&VersionRefs>, sequencer: Option<&str>) -> Option<RefChange> {
    let sequencer = sequencer.map(normalised_sequencer);
    let empty = VersionRefs::default();
    let row = current.unwrap_or(&empty);
    if later(row.sequencer.as_deref(), sequencer.as_deref()) {
        return None;
    }
    if row.deleted && !later(sequencer.as_deref(), row.sequencer.as_deref()) {
        return None;
    }
    Some(RefChange {
        seen_gen: current.map(|r| r.gen),
        next: VersionRefs {
            job_keys: BTreeSet::new(),
            sequencer: latest(sequencer.as_ref(), row.sequencer.as_ref()),
            etag: None,
            gen: row.gen + 1,
            deleted: true,
        },
        add: Vec::new(),
        adopt: Vec::new(),
        remove: row.job_keys.iter().cloned().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|k| k.to_string()).collect()
    }

    fn versioned() -> VersionName {
        VersionName {
            bucket: "in".into(),
            key: "a.jpg".into(),
            version_id: Some("v1".into()),
        }
    }

    fn unversioned() -> VersionName {
        VersionName {
            version_id: None,
            ..versioned()
        }
    }

    fn row(job_keys: &[&str], sequencer: &str, gen: u64, deleted: bool) -> VersionRefs {
        VersionRefs {
            job_keys: keys(job_keys),
            sequencer: Some(normalised_sequencer(sequencer)),
            etag: None,
            gen,
            deleted,
        }
    }

    #[test]
    fn sequencers_normalise_to_their_order() {
        let a = normalised_sequencer("0055AED6DCD90281E5");
        let b = normalised_sequencer("55aed6dcd90281e6");
        assert_eq!(a.len(), 32);
        assert!(a < b);
        assert_eq!(a, normalised_sequencer("55AED6DCD90281E5"));
    }

    #[test]
    fn rows_are_named_by_version_and_never_meet_job_keys() {
        let a = versioned().row_key();
        assert!(a.starts_with(VERSION_ROW_PREFIX));
        assert_ne!(a, unversioned().row_key());
        assert_ne!(
            a,
            VersionName {
                key: "b.jpg".into(),
                ..versioned()
            }
            .row_key()
        );
    }

    #[test]
    fn a_first_create_adds_every_job_once() {
        let change = on_create(&versioned(), None, &keys(&["J1", "J2"]), Some("10"), None).unwrap();
        assert_eq!(change.seen_gen, None);
        assert_eq!(change.add, ["J1", "J2"]);
        assert!(change.remove.is_empty());
        assert_eq!(change.next.gen, 1);
        // Delivered again: nothing.
        let now = change.next;
        assert_eq!(
            on_create(
                &versioned(),
                Some(&now),
                &keys(&["J1", "J2"]),
                Some("10"),
                None
            ),
            None
        );
        // A recipe added since: only its job.
        let more = on_create(
            &versioned(),
            Some(&now),
            &keys(&["J1", "J3"]),
            Some("10"),
            None,
        )
        .unwrap();
        assert_eq!((more.add, more.remove), (vec!["J3".to_string()], vec![]));
        assert_eq!(more.seen_gen, Some(1));
    }

    #[test]
    fn an_unversioned_overwrite_releases_the_old_bytes_jobs() {
        let old = row(&["OLD"], "10", 1, false);
        let change = on_create(
            &unversioned(),
            Some(&old),
            &keys(&["NEW"]),
            Some("20"),
            None,
        )
        .unwrap();
        assert_eq!(
            (change.add, change.remove),
            (vec!["NEW".to_string()], vec!["OLD".to_string()])
        );
        assert_eq!(change.next.job_keys, keys(&["NEW"]));
        // The old create arriving after the overwrite changes nothing.
        let now = row(&["NEW"], "20", 2, false);
        assert_eq!(
            on_create(
                &unversioned(),
                Some(&now),
                &keys(&["OLD"]),
                Some("10"),
                None
            ),
            None
        );
        // A versioned row is never overwritten: same version, same bytes.
        let v = on_create(&versioned(), Some(&old), &keys(&["NEW"]), Some("20"), None).unwrap();
        assert!(v.remove.is_empty());
    }

    #[test]
    fn a_delete_releases_everything_once_and_leaves_a_tombstone() {
        let live = row(&["J1", "J2"], "10", 3, false);
        let change = on_delete(Some(&live), Some("20")).unwrap();
        assert_eq!(change.remove, ["J1", "J2"]);
        assert!(change.next.deleted && change.next.job_keys.is_empty());
        assert_eq!(change.seen_gen, Some(3));
        let tomb = change.next;
        // Redelivered: nothing.
        assert_eq!(on_delete(Some(&tomb), Some("20")), None);
        // An older delete: nothing.
        assert_eq!(on_delete(Some(&live), Some("05")), None);
    }

    #[test]
    fn a_create_older_than_its_delete_leaves_nothing() {
        // The delete arrives first: a tombstone with no references.
        let change = on_delete(None, Some("20")).unwrap();
        assert!(change.remove.is_empty());
        let tomb = change.next;
        assert_eq!(
            on_create(&versioned(), Some(&tomb), &keys(&["J"]), Some("10"), None),
            None
        );
        assert_eq!(
            on_create(&unversioned(), Some(&tomb), &keys(&["J"]), Some("10"), None),
            None
        );
        // Unversioned, uploaded again after the delete: a live row again.
        let again =
            on_create(&unversioned(), Some(&tomb), &keys(&["J"]), Some("30"), None).unwrap();
        assert_eq!(again.add, ["J"]);
        assert!(!again.next.deleted);
        // A versioned version never comes back.
        assert_eq!(
            on_create(&versioned(), Some(&tomb), &keys(&["J"]), Some("30"), None),
            None
        );
    }

    #[test]
    fn other_bytes_without_a_later_sequencer_are_an_overwrite() {
        // Emulators and some S3-compatible stores repeat one sequencer.
        let old = VersionRefs {
            etag: Some("aaa".into()),
            ..row(&["OLD"], "10", 1, false)
        };
        let change = on_create(
            &unversioned(),
            Some(&old),
            &keys(&["NEW"]),
            Some("10"),
            Some("bbb"),
        )
        .unwrap();
        assert_eq!(
            (change.add, change.remove),
            (vec!["NEW".to_string()], vec!["OLD".to_string()])
        );
        assert_eq!(change.next.etag.as_deref(), Some("bbb"));
        // The same bytes again: nothing.
        let same = on_create(
            &unversioned(),
            Some(&old),
            &keys(&["OLD"]),
            Some("10"),
            Some("aaa"),
        );
        assert_eq!(same, None);
        // An older sequencer still loses, whatever its ETag.
        let late = on_create(
            &unversioned(),
            Some(&old),
            &keys(&["NEW"]),
            Some("05"),
            Some("bbb"),
        );
        assert_eq!(late, None);
    }

    #[test]
    fn events_without_sequencers_still_apply_once() {
        let change = on_create(&versioned(), None, &keys(&["J"]), None, None).unwrap();
        let now = change.next;
        assert_eq!(
            on_create(&versioned(), Some(&now), &keys(&["J"]), None, None),
            None
        );
        let gone = on_delete(Some(&now), None).unwrap();
        assert_eq!(gone.remove, ["J"]);
        assert_eq!(on_delete(Some(&gone.next), None), None);
    }
}
