//! References: which object versions use which jobs' outputs. Pure: the
//! rules; the DynamoDB calls are [`crate::ledger`]'s, the handler's use is
//! `handler/references.rs`. DESIGN.md ("References") has the items, the
//! transitions and the safety argument.
//!
//! Each object version (bucket, key, version id or `null`) has one row in
//! the claim table listing the job keys it references; each job row counts
//! the versions referencing it (`refs`). A change to a version's row and
//! the counts it moves is one transaction, so `refs` is what the rows say.
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

/// A version row as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionRefs {
    pub job_keys: BTreeSet<String>,
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

/// What S3 holds at an object version now, as a HEAD (and, for a delete
/// marker's rule, the key's listing) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No such version (any more), or one a newer delete marker hides
    /// under `MEDIAONCE_RELEASE_ON_DELETE_MARKER`.
    Gone,
    /// The version exists and holds the bytes with this ETag (unquoted).
    Holds { etag: String },
}

/// What a create's hint knows: the bytes it keyed and their jobs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keyed {
    /// The ETag of the bytes keyed (unquoted).
    pub etag: String,
    /// Every job the recipes that apply to those bytes key: the version's
    /// wanted set, whatever happened to each job in this delivery.
    pub wanted: BTreeSet<String>,
    /// The wanted jobs known done in this delivery (ran or reused): the
    /// ones it may add. A wanted job that is not ready is kept if counted
    /// already, and added by a later hint once it is done.
    pub ready: BTreeSet<String>,
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
/// - Gone: every counted job is released and the row is a tombstone
///   (written even when there was no row, so that a write planned on an
///   older HEAD, conditioned on no row, fails and looks again).
/// - Holds the keyed bytes: the row counts `(counted ∩ wanted) ∪ (ready ∩
///   wanted)`: a counted job stays while its bytes are there, whether or
///   not it ran this time; a job of other bytes is released.
/// - Holds other bytes than the ones keyed (or the hint keyed none): the
///   row is left alone when its ETag is the one S3 holds; otherwise its
///   jobs belong to bytes that are not there, and are released (the
///   holder's own create adds its jobs). A row without an ETag is left
///   alone: nothing says which bytes it counts. With no row, a delete's
///   hint writes nothing: the create that put the bytes back has a hint
///   of its own.
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
    let empty = VersionRefs::default();
    let row = current.unwrap_or(&empty);
    let counted = if row.deleted {
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
        (Seen::Holds { etag }, Some(keyed)) if *etag == keyed.etag => {
            let job_keys = counted
                .iter()
                .chain(keyed.ready.iter())
                .filter(|job| keyed.wanted.contains(*job))
                .cloned()
                .collect();
            let next = VersionRefs {
                job_keys,
                etag: Some(etag.clone()),
                ..VersionRefs::default()
            };
            (next, None)
        }
        (Seen::Holds { etag }, keyed) => {
            let stale = keyed.map(|_| "the version holds other bytes now");
            let holds_counted = row.etag.as_deref().is_none_or(|counted| counted == etag);
            if row.deleted || holds_counted {
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
    let add: Vec<String> = next.job_keys.difference(&counted).cloned().collect();
    let remove: Vec<String> = counted.difference(&next.job_keys).cloned().collect();
    if current.is_none() && keyed.is_none() && !next.deleted {
        // A delete's hint finding the version there and no row: a later
        // create put it back, and that create's own hint writes the row.
        return Plan {
            change: None,
            stale,
        };
    }
    let unchanged = current.is_some()
        && add.is_empty()
        && remove.is_empty()
        && next.etag == row.etag
        && next.deleted == row.deleted;
    let change = (!unchanged || version.is_unversioned()).then(|| RefChange {
        seen_gen: current.map(|r| r.gen),
        next: VersionRefs {
            gen: row.gen + 1,
            ..next
        },
        add,
        adopt: Vec::new(),
        remove,
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

    fn row(job_keys: &[&str], etag: &str, gen: u64) -> VersionRefs {
        VersionRefs {
            job_keys: keys(job_keys),
            etag: Some(etag.into()),
            gen,
            deleted: false,
        }
    }

    fn holds(etag: &str) -> Seen {
        Seen::Holds { etag: etag.into() }
    }

    fn keyed(etag: &str, wanted: &[&str], ready: &[&str]) -> Keyed {
        Keyed {
            etag: etag.into(),
            wanted: keys(wanted),
            ready: keys(ready),
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
    fn a_first_create_adds_its_ready_jobs_once() {
        let hint = keyed("e", &["J1", "J2"], &["J1", "J2"]);
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
        let more = keyed("e", &["J1", "J2", "J3"], &["J3"]);
        let plan = reconcile(&versioned(), Some(&now), &holds("e"), Some(&more));
        assert_eq!(moves(&plan), (vec!["J3".into()], vec![]));
        assert_eq!(plan.change.unwrap().seen_gen, Some(1));
    }

    #[test]
    fn a_counted_job_stays_while_its_bytes_do_whatever_this_delivery_did() {
        // Finding 2: the same bytes uploaded again while J2's claim was
        // throttled (not ready this time).
        let now = row(&["J1", "J2"], "e", 4);
        let hint = keyed("e", &["J1", "J2"], &["J1"]);
        let plan = reconcile(&unversioned(), Some(&now), &holds("e"), Some(&hint));
        let change = plan.change.unwrap();
        assert!(change.add.is_empty() && change.remove.is_empty());
        assert_eq!(change.next.job_keys, keys(&["J1", "J2"]));
        // The null version's row is written anyway: gen moves on.
        assert_eq!((change.seen_gen, change.next.gen), (Some(4), 5));
    }

    #[test]
    fn an_overwrite_releases_the_old_bytes_jobs() {
        let old = row(&["OLD", "SHARED"], "a", 1);
        let hint = keyed("b", &["NEW", "SHARED"], &["NEW", "SHARED"]);
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
        let hint = keyed("a", &["A"], &["A"]);
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
        let hint = keyed("e", &["J1"], &["J1"]);
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
        let hint = keyed("e", &["J"], &["J"]);
        let plan = reconcile(&unversioned(), Some(&tomb), &holds("e"), Some(&hint));
        assert_eq!(moves(&plan), (vec!["J".into()], vec![]));
        assert!(!plan.change.unwrap().next.deleted);
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
                            let k =
                                bytes.map(|e| keyed(e, &[&format!("J-{e}")], &[&format!("J-{e}")]));
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
