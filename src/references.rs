//! References: which object versions use which jobs' outputs. Pure: the
//! rules; the DynamoDB calls are [`crate::ledger`]'s, the handler's use is
//! `handler/references.rs`. DESIGN.md ("References") has the items, the
//! transitions and the safety argument.
//!
//! Each object version (bucket, key, version id or `null`) has one row in
//! the claim table listing the job keys it references, and one reference
//! item per job in the references table ([`RefItem`]). A change to a
//! version's row and its reference items is one transaction that no other
//! version shares, so no job's item is written by a reference: a content
//! uploaded thousands of times a second makes no hot item.
//! Every event (and every `reprocess`, `backfill` or `refs rebuild`
//! entry) is only a hint: its handler reads the row, asks S3 what the
//! version holds *now*, and writes the row conditioned on what it read,
//! looking again when the condition fails ([`reconcile`]). S3 is strongly
//! consistent, so whatever order the hints come in, the last one handled
//! after the last change sees the final state. Sequencers decide nothing.

use std::collections::BTreeSet;

use crate::key::sha256_hex;

/// The prefix of a version row's partition key; a job key is 64 hex
/// digits, a hash cache row starts `input-hash#`.
pub const VERSION_ROW_PREFIX: &str = "version#";

/// How long a deleted version's tombstone is kept: longer than SQS keeps a
/// message (14 days at most). Nothing depends on it being there (a
/// version that is gone stays gone, and a hint for it finds so in S3); it
/// saves a late hint's write.
pub const TOMBSTONE_SECS: u64 = 15 * 24 * 3600;

/// Attribute names of a version row (besides `job_key`).
pub mod attr {
    pub const BUCKET: &str = "bucket";
    pub const OBJECT_KEY: &str = "object_key";
    pub const VERSION_ID: &str = "version_id";
    /// SS: the job keys this version references (absent when none).
    pub const JOB_KEYS: &str = "job_keys";
    /// S: written by versions before issue 24 (the last event's
    /// sequencer); removed by the next write, never read.
    pub const SEQUENCER: &str = "sequencer";
    /// S: the ETag of the bytes the references belong to.
    pub const ETAG: &str = "etag";
    /// S: the SHA-256 (hex) of the bytes the references belong to, when S3
    /// stored a full-object checksum or mediaonce computed it.
    pub const SHA256: &str = "sha256";
    /// BOOL: the row's ETag is the MD5 of its bytes (a single-part upload,
    /// not under SSE-KMS or SSE-C): another such ETag proves other bytes.
    pub const ETAG_MD5: &str = "etag_md5";
    /// S: the CRC64NVME (base64) S3 stored for the bytes (it adds one to
    /// every upload that carries no other checksum): another proves other
    /// bytes, the same proves nothing.
    pub const CRC64NVME: &str = "crc64nvme";
    /// N: bumped by every change; a change is conditioned on the one read.
    pub const GEN: &str = "gen";
    /// BOOL: the version was deleted (a tombstone).
    pub const DELETED: &str = "deleted";
    /// N: epoch seconds after which DynamoDB's TTL removes a tombstone.
    pub const EXPIRES_AT: &str = "expires_at";
    /// BOOL. On a version row: its jobs have their reference items (a row
    /// written before them has its counts on the job rows instead). On a
    /// job row: every version referencing the job has a reference item
    /// (rows claimed since; `mediaonce refs seal` sets it on older rows);
    /// a job row without it is never collected.
    pub const REF_ITEMS: &str = "ref_items";
    /// Job rows: N, epoch ms of the last mark ([`FREE_MARK`]).
    pub const RELEASED_AT_MS: &str = "released_at_ms";
    /// Job rows: S, a nonce written by every release of the job (and by
    /// its finish): the sweep's sign that nothing may reference it now.
    pub const FREE_MARK: &str = "free_mark";
    /// Job rows written before reference items: N, the versions counted.
    /// Never read.
    pub const REFS: &str = "refs";
    /// Job rows written before reference items: BOOL. Never read.
    pub const REFS_PARTIAL: &str = "refs_partial";
}

/// Attribute names of a reference item, in the references table.
pub mod ref_item_attr {
    /// S, partition key: `<job key>#<shard>` ([`super::RefItem::partition`]).
    pub const JOB_SHARD: &str = "job_shard";
    /// S, sort key: the version row's key.
    pub const VERSION: &str = "version";
    /// S: the job key, readable.
    pub const JOB_KEY: &str = "job_key";
    /// S: the version's bucket, key and version id (no version id for
    /// S3's `null` version): what a split job's end hands on, and where
    /// its chunks find the bytes. Absent on items written before them and
    /// on a holder's.
    pub const BUCKET: &str = "bucket";
    pub const OBJECT_KEY: &str = "object_key";
    pub const VERSION_ID: &str = "version_id";
    /// N: epoch ms of the write.
    pub const CREATED_AT_MS: &str = "created_at_ms";
}

/// A job's reference items are spread over this many partitions, so that
/// a popular content's references (thousands a second) stay inside each
/// partition's write throughput; a collector reads them all (one
/// consistent Query each).
pub const REF_SHARDS: u8 = 16;

/// One reference item as a job's Query finds it: its version row's key,
/// and the version's name (`None` on an item written before names were,
/// and on a holder's: the row key is a hash, so only the item names the
/// version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefHolder {
    pub version_row: String,
    pub version: Option<VersionName>,
    /// When the item was written (epoch ms; `None` on an item that does
    /// not say).
    pub created_at_ms: Option<u64>,
}

/// The row key a split's execution holds its chunks under:
/// `split#<execution name>` (DESIGN.md, "Chunked HLS").
pub const HOLDER_PREFIX: &str = "split#";

/// A claimant holds its chunks, then starts its execution, in one
/// invocation: a hold this old whose execution does not exist will never
/// have one (its claimant died between the two). An hour: past any
/// invocation (15 minutes) and any skew between clocks.
pub const HOLD_START_MS: u64 = 3_600_000;

impl RefHolder {
    /// The execution name of a split's hold; `None` for a version's
    /// reference.
    pub fn hold_of(&self) -> Option<&str> {
        self.version_row.strip_prefix(HOLDER_PREFIX)
    }
}

/// One (job, version) reference: an item of its own in the references
/// table, written and deleted with its version's row.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RefItem {
    pub job_key: String,
    /// The version row's key ([`VersionName::row_key`]).
    pub version_row: String,
}

impl RefItem {
    /// The item's shard: the first byte of the SHA-256 of its version row
    /// key, modulo [`REF_SHARDS`] (stable across builds and languages).
    pub fn shard(&self) -> u8 {
        shard_of(&self.version_row)
    }

    /// The item's partition key, `<job key>#<shard>`.
    pub fn partition(&self) -> String {
        partition_of(&self.job_key, self.shard())
    }
}

/// The shard of a version row key's reference items. Pure.
pub fn shard_of(version_row: &str) -> u8 {
    let digest = crate::key::sha256_hex(version_row.as_bytes());
    u8::from_str_radix(&digest[..2], 16).unwrap_or(0) % REF_SHARDS
}

/// The partition key of a job's reference items in `shard`. Pure.
pub fn partition_of(job_key: &str, shard: u8) -> String {
    format!("{job_key}#{shard}")
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
    /// The version a head names (S3's `null` version as `None`, however
    /// it was headed).
    pub fn of_head(head: &crate::fingerprint::ObjectHead) -> Self {
        VersionName {
            bucket: head.bucket.clone(),
            key: head.key.clone(),
            version_id: head.version_name().map(str::to_string),
        }
    }

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

/// A version row as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionRefs {
    pub job_keys: BTreeSet<String>,
    /// The ETag of the bytes whose jobs are referenced (unquoted).
    pub etag: Option<String>,
    /// Their SHA-256 (hex), when known ([`BytesId::sha256`]).
    pub sha256: Option<String>,
    /// The ETag is their MD5 ([`BytesId::etag_md5`]).
    pub etag_md5: bool,
    /// Their CRC64NVME ([`BytesId::crc64nvme`]).
    pub crc64nvme: Option<String>,
    pub gen: u64,
    pub deleted: bool,
    /// Its jobs have reference items (false on a row written before them).
    pub ref_items: bool,
}

/// A change to one version's references: the row as it must become, and
/// the reference items it puts and deletes. Applied as one transaction,
/// conditioned on the row's `gen` as read (or its absence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefChange {
    /// The row's `gen` as read; `None`: the row must not exist yet.
    pub seen_gen: Option<u64>,
    pub next: VersionRefs,
    /// Jobs gaining this version: their reference items are put.
    pub add: Vec<String>,
    /// Jobs losing it: their reference items are deleted (conditioned on
    /// existing when `exact`), after each job is marked ([`attr::FREE_MARK`]).
    pub remove: Vec<String>,
    /// The row as read had reference items: each deleted one must exist
    /// (a missing one is a mismatch, reported). A row from before them
    /// has none: its kept jobs are all in `add`.
    pub exact: bool,
}

/// What S3 holds at an object version now, as a HEAD (and, for a delete
/// marker's rule, the key's listing) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No such version (any more), or one a newer delete marker hides
    /// under `MEDIAONCE_RELEASE_ON_DELETE_MARKER`.
    Gone,
    /// The version exists and holds these bytes.
    Holds(BytesId),
}

/// What names the bytes a version holds, as far as S3 and mediaonce can
/// tell. An ETag is not the bytes' identity: the same bytes get another
/// ETag under a multipart upload, SSE-KMS or SSE-C, so two ETags that
/// differ prove other bytes only when both are MD5s of the bytes. A
/// SHA-256 (S3's full-object checksum, or one mediaonce computed: never a
/// declared one) is the identity, when both sides have one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BytesId {
    /// The ETag (unquoted).
    pub etag: String,
    /// The content's SHA-256, hex.
    pub sha256: Option<String>,
    /// The ETag is the MD5 of the bytes: a single-part upload, not under
    /// SSE-KMS or SSE-C (S3 documents these as the ETags that are).
    pub etag_md5: bool,
    /// The full-object CRC64NVME S3 stored (base64): S3 adds one to every
    /// upload that carries no other checksum, multipart and encrypted ones
    /// included. Two that differ prove other bytes; equal ones prove
    /// nothing (a CRC is not collision-resistant).
    pub crc64nvme: Option<String>,
}

impl BytesId {
    /// Whether these are the same bytes as `other`: `Some` when something
    /// proves it either way, `None` when nothing does (two ETags that
    /// differ, one of them not an MD5, no SHA-256 and no CRC64NVME on both
    /// sides). Pure.
    pub fn same_as(&self, other: &BytesId) -> Option<bool> {
        if let (Some(mine), Some(theirs)) = (&self.sha256, &other.sha256) {
            return Some(mine == theirs);
        }
        if matches!((&self.crc64nvme, &other.crc64nvme), (Some(a), Some(b)) if a != b) {
            return Some(false);
        }
        if self.etag == other.etag {
            return Some(true);
        }
        (self.etag_md5 && other.etag_md5).then_some(false)
    }
}

impl VersionRefs {
    /// The bytes whose jobs the row references; `None` when it says not.
    pub fn bytes(&self) -> Option<BytesId> {
        self.etag.as_ref().map(|etag| BytesId {
            etag: etag.clone(),
            sha256: self.sha256.clone(),
            etag_md5: self.etag_md5,
            crc64nvme: self.crc64nvme.clone(),
        })
    }
}

/// What a create's hint knows: the bytes it keyed and their jobs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keyed {
    /// The bytes keyed.
    pub bytes: BytesId,
    /// Every job the recipes that apply to those bytes key: the version's
    /// references, referenced before any of them is claimed or reused.
    pub wanted: BTreeSet<String>,
}

/// What a hint found and what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The write, conditioned on the row as read. `None`: nothing to write.
    pub change: Option<RefChange>,
    /// Why the hint's keyed bytes are not the version's now (it is gone,
    /// or holds other bytes): its jobs are not referenced by it.
    pub stale: Option<&'static str>,
}

/// Brings a version's row in line with what S3 holds now (`seen`, headed
/// after `current` was read). `keyed`: a create's bytes and jobs; `None`
/// for a delete (or any hint that keyed nothing). Pure.
///
/// - Gone: every referenced job is released and the row is a tombstone
///   (written even when there was no row, so that a write planned on an
///   older HEAD, conditioned on no row, fails and looks again).
/// - Holds the keyed bytes: the row references every wanted job, whatever
///   happened to each in this delivery, and keeps every job it referenced
///   for these bytes already (a pipeline's chained jobs, a recipe since
///   removed: freed with the version); a job of other bytes is released.
/// - Holds other bytes than the ones keyed (or the hint keyed none): the
///   row is left alone when its ETag is the one S3 holds; otherwise its
///   jobs belong to bytes that are not there, and are released (the
///   holder's own create adds its jobs). A row without an ETag is left
///   alone: nothing says which bytes it references. With no row, a
///   delete's hint writes nothing: the create that put the bytes back has
///   a hint of its own.
///
/// A row written before reference items (`ref_items` false) is brought
/// over by its next write: every job it keeps gets its item.
///
/// The null version's bytes can come back after they went (a re-upload of
/// an unversioned key), so its row is always written, `gen` bumped even
/// when nothing else changes: a write planned on an older HEAD, that read
/// the same `gen`, then fails and looks again. A versioned version only
/// ever goes from held to gone, so an unchanged row needs no write.
pub fn reconcile(
    version: &VersionName,
    current: Option<&VersionRefs>,
    seen: &Seen,
    keyed: Option<&Keyed>,
) -> Plan {
    let empty = VersionRefs {
        ref_items: true,
        ..VersionRefs::default()
    };
    let row = current.unwrap_or(&empty);
    let referenced = if row.deleted {
        BTreeSet::new()
    } else {
        row.job_keys.clone()
    };
    let (next, stale) = match (seen, keyed) {
        (Seen::Gone, keyed) => (
            VersionRefs {
                deleted: true,
                ..VersionRefs::default()
            },
            keyed.map(|_| "the version is gone"),
        ),
        (Seen::Holds(held), Some(keyed)) if held.same_as(&keyed.bytes) == Some(true) => {
            // References of the same bytes only grow: a pipeline's chained
            // jobs are added as their upstream jobs finish, and a later
            // hint that keys only the first stage must not release them.
            // So do those of bytes not proven other: the same bytes
            // uploaded again with another ETag (multipart, SSE-KMS, SSE-C)
            // keep their chained jobs; a leak bounded by the version's
            // life when they were other bytes after all, never a loss.
            let mut job_keys = keyed.wanted.clone();
            let other_bytes = row.bytes().and_then(|was| was.same_as(&keyed.bytes));
            if other_bytes != Some(false) {
                job_keys.extend(referenced.iter().cloned());
            }
            // What is known of the bytes now: the hint's, with a SHA-256
            // from S3's HEAD, or from the row when it names these bytes.
            let known = |id: Option<BytesId>| id.and_then(|id| id.sha256);
            let same_row = row.bytes().filter(|_| other_bytes == Some(true));
            let bytes = BytesId {
                sha256: keyed
                    .bytes
                    .sha256
                    .clone()
                    .or_else(|| held.sha256.clone())
                    .or_else(|| known(same_row)),
                crc64nvme: keyed
                    .bytes
                    .crc64nvme
                    .clone()
                    .or_else(|| held.crc64nvme.clone()),
                ..keyed.bytes.clone()
            };
            (
                VersionRefs {
                    job_keys,
                    etag: Some(bytes.etag),
                    sha256: bytes.sha256,
                    etag_md5: bytes.etag_md5,
                    crc64nvme: bytes.crc64nvme,
                    ..VersionRefs::default()
                },
                None,
            )
        }
        (Seen::Holds(held), keyed) => {
            let stale = keyed.map(|_| "the version holds other bytes now");
            // Released only when the row's bytes are proven not there.
            let holds_referenced = row
                .bytes()
                .is_none_or(|was| was.same_as(held) != Some(false));
            if row.deleted || holds_referenced {
                (
                    VersionRefs {
                        gen: 0,
                        ..row.clone()
                    },
                    stale,
                )
            } else {
                (VersionRefs::default(), stale)
            }
        }
    };
    // A row from before reference items has none: every job it keeps is
    // put (a put of an item that exists changes nothing).
    let add: Vec<String> = if row.ref_items {
        next.job_keys.difference(&referenced).cloned().collect()
    } else {
        next.job_keys.iter().cloned().collect()
    };
    let remove: Vec<String> = referenced.difference(&next.job_keys).cloned().collect();
    if current.is_none() && keyed.is_none() && !next.deleted {
        return Plan {
            change: None,
            stale,
        };
    }
    let unchanged = current.is_some()
        && row.ref_items
        && add.is_empty()
        && remove.is_empty()
        && next.etag == row.etag
        && next.sha256 == row.sha256
        && next.etag_md5 == row.etag_md5
        && next.crc64nvme == row.crc64nvme
        && next.deleted == row.deleted;
    let change = (!unchanged || version.is_unversioned()).then(|| RefChange {
        seen_gen: current.map(|r| r.gen),
        next: VersionRefs {
            gen: row.gen + 1,
            ref_items: true,
            ..next
        },
        add,
        remove,
        exact: row.ref_items,
    });
    Plan { change, stale }
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

    /// Bytes named by an ETag that is their MD5 (a single-part upload).
    fn md5(etag: &str) -> BytesId {
        BytesId {
            etag: etag.into(),
            sha256: None,
            etag_md5: true,
            crc64nvme: None,
        }
    }

    fn row(job_keys: &[&str], etag: &str, gen: u64) -> VersionRefs {
        VersionRefs {
            job_keys: keys(job_keys),
            etag: Some(etag.into()),
            sha256: None,
            etag_md5: true,
            crc64nvme: None,
            gen,
            deleted: false,
            ref_items: true,
        }
    }

    fn holds(etag: &str) -> Seen {
        Seen::Holds(md5(etag))
    }

    fn keyed(etag: &str, wanted: &[&str]) -> Keyed {
        Keyed {
            bytes: md5(etag),
            wanted: keys(wanted),
        }
    }

    fn moves(plan: &Plan) -> (Vec<String>, Vec<String>) {
        let change = plan.change.as_ref().expect("a write");
        (change.add.clone(), change.remove.clone())
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
    fn a_first_create_adds_its_jobs_once() {
        let hint = keyed("e", &["J1", "J2"]);
        let plan = reconcile(&versioned(), None, &holds("e"), Some(&hint));
        assert_eq!(plan.stale, None);
        let change = plan.change.clone().unwrap();
        assert_eq!((change.seen_gen, change.next.gen), (None, 1));
        assert_eq!(moves(&plan), (vec!["J1".into(), "J2".into()], vec![]));
        // Handled again: nothing to write (a versioned version's bytes
        // never change).
        let now = change.next;
        let again = reconcile(&versioned(), Some(&now), &holds("e"), Some(&hint));
        assert_eq!(again.change, None);
        // A recipe added since: only its job.
        let more = keyed("e", &["J1", "J2", "J3"]);
        let plan = reconcile(&versioned(), Some(&now), &holds("e"), Some(&more));
        assert_eq!(moves(&plan), (vec!["J3".into()], vec![]));
        assert_eq!(plan.change.unwrap().seen_gen, Some(1));
    }

    #[test]
    fn every_wanted_job_stays_while_its_bytes_do() {
        // Finding 2: the same bytes uploaded again; whatever happens to J2's
        // claim this time, the version references both.
        let now = row(&["J1", "J2"], "e", 4);
        let hint = keyed("e", &["J1", "J2"]);
        let plan = reconcile(&unversioned(), Some(&now), &holds("e"), Some(&hint));
        let change = plan.change.unwrap();
        assert!(change.add.is_empty() && change.remove.is_empty());
        assert_eq!(change.next.job_keys, keys(&["J1", "J2"]));
        // The null version's row is written anyway: gen moves on.
        assert_eq!((change.seen_gen, change.next.gen), (Some(4), 5));
    }

    #[test]
    fn a_hint_of_the_same_bytes_keeps_what_they_referenced() {
        // A pipeline's chained job (C) was added after its upstream (J1)
        // finished; a redelivery keys only J1 first: C stays.
        let now = row(&["J1", "C"], "e", 2);
        let hint = keyed("e", &["J1"]);
        let plan = reconcile(&versioned(), Some(&now), &holds("e"), Some(&hint));
        assert_eq!(plan.change, None, "nothing to write");
        let plan = reconcile(&unversioned(), Some(&now), &holds("e"), Some(&hint));
        let change = plan.change.unwrap();
        assert!(change.add.is_empty() && change.remove.is_empty());
        assert_eq!(change.next.job_keys, keys(&["C", "J1"]));
        // The next stage adds to it.
        let hint = keyed("e", &["J1", "C2"]);
        let plan = reconcile(&versioned(), Some(&now), &holds("e"), Some(&hint));
        assert_eq!(moves(&plan), (vec!["C2".into()], vec![]));
    }

    #[test]
    fn bytes_are_the_same_by_sha256_else_by_etag_and_other_only_by_md5s() {
        let multipart = |etag: &str, sha256: Option<&str>| BytesId {
            etag: etag.into(),
            sha256: sha256.map(str::to_string),
            etag_md5: false,
            crc64nvme: None,
        };
        assert_eq!(md5("a").same_as(&md5("a")), Some(true));
        assert_eq!(md5("a").same_as(&md5("b")), Some(false));
        // Another ETag that is not an MD5 proves nothing...
        assert_eq!(md5("a").same_as(&multipart("b-2", None)), None);
        // ...a SHA-256 on both sides does, either way, over the ETags.
        let hashed = |id: BytesId, sha: &str| BytesId {
            sha256: Some(sha.into()),
            ..id
        };
        assert_eq!(
            hashed(md5("a"), "s").same_as(&multipart("b-2", Some("s"))),
            Some(true)
        );
        assert_eq!(
            hashed(md5("a"), "s").same_as(&hashed(md5("a"), "t")),
            Some(false)
        );
        // S3's CRC64NVMEs: other ones prove other bytes, equal ones nothing.
        let crc = |id: BytesId, crc: &str| BytesId {
            crc64nvme: Some(crc.into()),
            ..id
        };
        let (a, b) = (multipart("a-2", None), multipart("b-3", None));
        assert_eq!(
            crc(a.clone(), "c1").same_as(&crc(b.clone(), "c2")),
            Some(false)
        );
        assert_eq!(crc(a, "c1").same_as(&crc(b, "c1")), None);
    }

    #[test]
    fn bytes_not_proven_other_keep_their_jobs() {
        // The same bytes uploaded again in parts: another ETag, no hash.
        let reupload = BytesId {
            etag: "m-2".into(),
            sha256: None,
            etag_md5: false,
            crc64nvme: None,
        };
        let now = row(&["J1", "C"], "e", 2);
        let hint = Keyed {
            bytes: reupload.clone(),
            wanted: keys(&["J1"]),
        };
        let seen = Seen::Holds(reupload.clone());
        let plan = reconcile(&unversioned(), Some(&now), &seen, Some(&hint));
        let change = plan.change.unwrap();
        assert!(change.remove.is_empty(), "{change:?}");
        assert_eq!(change.next.job_keys, keys(&["C", "J1"]));
        assert_eq!(change.next.etag.as_deref(), Some("m-2"));
        // A delete's hint (or a stale create's) finding them leaves the row.
        let plan = reconcile(&unversioned(), Some(&now), &seen, None);
        assert!(plan.change.unwrap().remove.is_empty());
        // Proven other by SHA-256s: released.
        let hashed_row = VersionRefs {
            sha256: Some("s1".into()),
            ..now.clone()
        };
        let other = Seen::Holds(BytesId {
            sha256: Some("s2".into()),
            ..reupload
        });
        let plan = reconcile(&unversioned(), Some(&hashed_row), &other, None);
        assert_eq!(moves(&plan), (vec![], vec!["C".into(), "J1".into()]));
    }

    #[test]
    fn an_overwrite_releases_the_old_bytes_jobs() {
        let old = row(&["OLD", "SHARED"], "a", 1);
        let hint = keyed("b", &["NEW", "SHARED"]);
        let plan = reconcile(&unversioned(), Some(&old), &holds("b"), Some(&hint));
        assert_eq!(moves(&plan), (vec!["NEW".into()], vec!["OLD".into()]));
        let next = plan.change.unwrap().next;
        assert_eq!(next.job_keys, keys(&["NEW", "SHARED"]));
        assert_eq!(next.etag.as_deref(), Some("b"));
    }

    #[test]
    fn a_hint_whose_bytes_were_replaced_adds_nothing() {
        // Finding 1: a rebuild keyed A, the key holds B now and B's create
        // was recorded: the row stays B's.
        let b_row = row(&["B"], "b", 2);
        let hint = keyed("a", &["A"]);
        let plan = reconcile(&unversioned(), Some(&b_row), &holds("b"), Some(&hint));
        assert!(plan.stale.is_some());
        let change = plan.change.unwrap();
        assert!(change.add.is_empty() && change.remove.is_empty());
        assert_eq!(change.next.job_keys, keys(&["B"]));
        // B's create not recorded yet, the row still A's: A's jobs go (the
        // bytes are not there), B's own create adds B's.
        let a_row = row(&["A"], "a", 2);
        let plan = reconcile(&unversioned(), Some(&a_row), &holds("b"), Some(&hint));
        assert_eq!(moves(&plan), (vec![], vec!["A".into()]));
        assert_eq!(plan.change.unwrap().next.etag, None);
    }

    #[test]
    fn a_version_that_is_gone_releases_everything_and_leaves_a_tombstone() {
        let live = row(&["J1", "J2"], "e", 3);
        let plan = reconcile(&versioned(), Some(&live), &Seen::Gone, None);
        assert_eq!(plan.stale, None);
        assert_eq!(moves(&plan), (vec![], vec!["J1".into(), "J2".into()]));
        let tomb = plan.change.unwrap().next;
        assert!(tomb.deleted && tomb.job_keys.is_empty());
        // Handled again: nothing.
        assert_eq!(
            reconcile(&versioned(), Some(&tomb), &Seen::Gone, None).change,
            None
        );
        // A create handled after its version went: stale, nothing added.
        let hint = keyed("e", &["J1"]);
        let late = reconcile(&versioned(), Some(&tomb), &Seen::Gone, Some(&hint));
        assert_eq!(late.stale, Some("the version is gone"));
        assert_eq!(late.change, None);
    }

    #[test]
    fn gone_with_no_row_still_writes_a_tombstone() {
        // So that a create planned on an older HEAD (conditioned on no
        // row) fails and looks again.
        let plan = reconcile(&versioned(), None, &Seen::Gone, None);
        let change = plan.change.unwrap();
        assert_eq!(change.seen_gen, None);
        assert!(change.next.deleted && change.add.is_empty() && change.remove.is_empty());
    }

    #[test]
    fn an_unversioned_key_put_deleted_and_put_again_keeps_its_jobs() {
        // LocalStack repeats one sequencer: the delete is handled after the
        // second put. S3 holds the bytes: nothing is released.
        let now = row(&["J"], "e", 1);
        let plan = reconcile(&unversioned(), Some(&now), &holds("e"), None);
        let change = plan.change.unwrap();
        assert!(change.remove.is_empty());
        assert_eq!(change.next.job_keys, keys(&["J"]));
        // The delete handled before the second put: a tombstone; then the
        // second put's create revives the row.
        let tomb = reconcile(&unversioned(), Some(&now), &Seen::Gone, None)
            .change
            .unwrap()
            .next;
        let hint = keyed("e", &["J"]);
        let plan = reconcile(&unversioned(), Some(&tomb), &holds("e"), Some(&hint));
        assert_eq!(moves(&plan), (vec!["J".into()], vec![]));
        assert!(!plan.change.unwrap().next.deleted);
    }

    #[test]
    fn a_row_from_before_reference_items_is_brought_over_by_its_next_write() {
        let legacy = VersionRefs {
            ref_items: false,
            ..row(&["J1", "J2"], "e", 3)
        };
        // Its bytes still there: every kept job gets its item, nothing to
        // delete exactly.
        let hint = keyed("e", &["J1", "J2"]);
        let plan = reconcile(&versioned(), Some(&legacy), &holds("e"), Some(&hint));
        let change = plan.change.unwrap();
        assert_eq!(change.add, vec!["J1".to_string(), "J2".to_string()]);
        assert!(change.remove.is_empty() && !change.exact && change.next.ref_items);
        // Gone: its jobs are released, their items deleted if any.
        let plan = reconcile(&versioned(), Some(&legacy), &Seen::Gone, None);
        let change = plan.change.unwrap();
        assert_eq!(change.remove.len(), 2);
        assert!(change.add.is_empty() && !change.exact);
        // A row with items deletes exactly.
        let plan = reconcile(&versioned(), Some(&row(&["J"], "e", 1)), &Seen::Gone, None);
        assert!(plan.change.unwrap().exact);
    }

    #[test]
    fn reference_items_spread_over_the_shards_stably() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let item = RefItem {
                job_key: "J".into(),
                version_row: VersionName {
                    version_id: Some(format!("v{i}")),
                    ..versioned()
                }
                .row_key(),
            };
            assert!(item.shard() < REF_SHARDS);
            assert_eq!(item.partition(), format!("J#{}", item.shard()));
            seen.insert(item.shard());
        }
        assert_eq!(seen.len(), usize::from(REF_SHARDS));
        // Stable: the first byte of the SHA-256 of the row key, modulo 16.
        assert_eq!(shard_of("version#abc"), {
            let digest = sha256_hex(b"version#abc");
            u8::from_str_radix(&digest[..2], 16).unwrap() % REF_SHARDS
        });
    }

    #[test]
    fn a_row_without_an_etag_is_never_released_on_a_guess() {
        let legacy = VersionRefs {
            etag: None,
            ..row(&["J"], "", 1)
        };
        let plan = reconcile(&versioned(), Some(&legacy), &holds("e"), None);
        assert_eq!(plan.change, None);
    }

    /// Every order of a hint's read, HEAD and write against S3 changes:
    /// the last hint to write after the final change leaves the row as S3
    /// is. A small model: one null version whose bytes go a → b → a (or
    /// gone), two hints interleaving their steps; a write applies only if
    /// the row's gen is the one read, else the hint starts over.
    #[test]
    fn interleaved_hints_end_where_s3_is() {
        #[derive(Clone, Copy, Debug)]
        enum S {
            Holds(&'static str),
            Gone,
        }
        fn seen(s: S) -> Seen {
            match s {
                S::Holds(e) => holds(e),
                S::Gone => Seen::Gone,
            }
        }
        let jobs = |e: &str| keys(&[&format!("J-{e}")]);
        let histories: [&[S]; 4] = [
            &[S::Holds("a"), S::Holds("b"), S::Holds("a")],
            &[S::Holds("a"), S::Gone, S::Holds("a")],
            &[S::Holds("a"), S::Holds("b"), S::Gone],
            &[S::Holds("a"), S::Gone, S::Holds("b")],
        ];
        for history in histories {
            // Each change has a hint; a hint's steps: read, head, write.
            // Enumerate interleavings by a seeded shuffle of step order.
            for seed in 0..300u64 {
                let mut rng = fastrand::Rng::with_seed(seed);
                let mut row: Option<VersionRefs> = None;
                let mut s3 = 0usize; // index into history
                                     // A hint: the change it follows, its stage and what it saw.
                struct Hint {
                    after: usize,
                    read: Option<Option<VersionRefs>>,
                    head: Option<S>,
                    done: bool,
                }
                let mut hints: Vec<Hint> = (0..history.len())
                    .map(|after| Hint {
                        after,
                        read: None,
                        head: None,
                        done: false,
                    })
                    .collect();
                let mut steps = 0;
                while hints.iter().any(|h| !h.done) {
                    steps += 1;
                    assert!(steps < 10_000, "no end");
                    // Either S3 moves on, or a hint whose change happened steps.
                    let ready: Vec<usize> = (0..hints.len())
                        .filter(|&i| !hints[i].done && hints[i].after <= s3)
                        .collect();
                    if s3 + 1 < history.len() && (ready.is_empty() || rng.u8(..4) == 0) {
                        s3 += 1;
                        continue;
                    }
                    let hint = &mut hints[ready[rng.usize(..ready.len())]];
                    match (&hint.read, hint.head) {
                        (None, _) => hint.read = Some(row.clone()),
                        (Some(_), None) => hint.head = Some(history[s3]),
                        (Some(read), Some(head)) => {
                            let bytes = match history[hint.after] {
                                S::Holds(e) => Some(e),
                                S::Gone => None,
                            };
                            let k = bytes.map(|e| keyed(e, &[&format!("J-{e}")]));
                            let plan =
                                reconcile(&unversioned(), read.as_ref(), &seen(head), k.as_ref());
                            match plan.change {
                                None => hint.done = true,
                                Some(change) => {
                                    if change.seen_gen == row.as_ref().map(|r| r.gen) {
                                        row = Some(change.next);
                                        hint.done = true;
                                    } else {
                                        hint.read = None;
                                        hint.head = None;
                                    }
                                }
                            }
                        }
                    }
                }
                let row = row.expect("a row");
                match history[history.len() - 1] {
                    S::Holds(e) => {
                        assert_eq!(row.job_keys, jobs(e), "{history:?} seed {seed}: {row:?}");
                        assert!(!row.deleted);
                    }
                    S::Gone => {
                        assert!(row.job_keys.is_empty() && row.deleted, "{history:?} {seed}")
                    }
                }
            }
        }
    }
}
