//! The explorer's invariants, over a snapshot of the world: the job rows,
//! the output bucket and the live input objects. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::key::sha256_hex;
use crate::ledger::{judge, JobRow, JobStatus, Verdict};
use crate::step::{Manifest, MANIFEST_NAME};

/// The output prefix of every job in the explorer's world.
pub const OUTPUT_PREFIX: &str = "derived/";

/// A live input object, as the world holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveObject {
    /// Its name: the key, or `key@version` in a versioned bucket.
    pub key: String,
    /// The version S3 holds: key, version id, ETag.
    pub object: (String, Option<String>, String),
    /// The jobs its bytes key to under the recipes in force: the root
    /// recipe's, then the chained one's (keyed by the SHA-256 of the
    /// root's output).
    pub jobs: Vec<String>,
    /// A create of these bytes was acknowledged since they were written:
    /// from then on their jobs' outputs are promised (the chained job's,
    /// its reference written before the create is acknowledged, from the
    /// moment it is `done`).
    pub promised: bool,
    /// A message of it was acknowledged with no job waiting on a split:
    /// its walk got past the root, and its chained job is referenced.
    pub walked: bool,
    /// Its chained job was seen `done` since it was promised.
    pub chained_done: bool,
    /// A message of it reached the dead-letter queue by the explorer's
    /// faults (its receives spent on crashes and injected failures): its
    /// pipeline may stop where that left it, until an operator redrives.
    pub dead_lettered: bool,
    /// A create of it was sent under the configuration in force (its
    /// upload, or a backfill): its pipeline under it must end.
    pub configured: bool,
    /// The content its bytes are (the world's own numbering).
    pub content: u32,
}

/// The keys whose uploads keyed a job.
pub type KeyedFrom = std::collections::BTreeSet<String>;

/// The world, as the invariants read it.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub rows: &'a [JobRow],
    /// The output bucket: key → bytes.
    pub outputs: &'a BTreeMap<String, Vec<u8>>,
    pub live: &'a [LiveObject],
    /// Every job key the world's uploads keyed, and from what.
    pub keyed: &'a BTreeMap<String, KeyedFrom>,
    /// The failures after which a job is poisoned (failed for good).
    pub max_attempts: u64,
    /// Every completion event published: its detail.
    pub events: &'a [Value],
}

/// An invariant broken: its name and what was found.
pub type Broken = (&'static str, String);

/// After every step:
/// 2. a row `done` has its manifest, and every file it lists exists with
///    its size and SHA-256;
/// 1. no output of a job is deleted while a live version whose create was
///    acknowledged keys to it: its root job's row exists (and its chained
///    job's, once done), neither is deleting, and when done each has its
///    files (2).
pub fn every_step(s: &Snapshot<'_>) -> Result<(), Broken> {
    for row in s.rows.iter().filter(|r| r.status == JobStatus::Done) {
        files_of(s, &row.job_key).map_err(|e| ("a done job has its files", e))?;
    }
    let rows: BTreeMap<&str, &JobRow> = s.rows.iter().map(|r| (r.job_key.as_str(), r)).collect();
    for live in s.live.iter().filter(|l| l.promised || l.chained_done) {
        for (stage, job) in live.jobs.iter().enumerate() {
            // The root job is promised with the create, and its row must
            // be there. The chained one is referenced before the create is
            // acknowledged (unless the root waits on a split: then before
            // the split's hand-on is), so none of its files may go; its
            // row must be there once it was seen done (or, the same bytes
            // again, its promise carried over).
            let (promised, must_exist) = if stage == 0 {
                (live.promised, true)
            } else {
                (
                    live.promised && live.walked || live.chained_done,
                    live.chained_done,
                )
            };
            if !promised {
                continue;
            }
            let broken = |what: String| {
                Err((
                    "no output a live version was promised is deleted",
                    format!("{} (job {job}, stage {stage}): {what}", live.key),
                ))
            };
            match rows.get(job.as_str()) {
                None if must_exist => return broken("its job has no row".into()),
                Some(row) if row.deletes_started_at_ms.is_some() => {
                    return broken(format!(
                        "its job is {} with deletes started",
                        row.status.as_str()
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// At quiescence (every message handled, the clock past every lease and
/// grace, the sweep run):
/// 4a. no row is left `collecting`;
/// 4b. every live version's pipeline is `done` (with its files, as 2
///     says), or stops at a job failed for good (its input at fault, or
///     its caps spent), unless a message of it was dead-lettered by the
///     explorer's faults (then it stays as that left it: a redrive is the
///     operator's);
/// 4c. nothing leaks: every row is the job of an upload to a key that is
///     live (a version keeps the jobs of bytes not proven other than its
///     own, a leak bounded by its life: DESIGN.md, "References"; once the
///     key is gone, so must they be) or poisoned (kept on purpose), and
///     every output belongs to a row.
pub fn at_quiescence(s: &Snapshot<'_>) -> Result<(), Broken> {
    every_step(s)?;
    // A job of a live version's bytes must be done (below); one a version
    // only keeps (bytes not proven other) or whose message a dead letter
    // stopped may be left as its last run left it, and is collected once
    // its versions go. A collection never stops for good.
    if let Some(row) = s.rows.iter().find(|r| r.status == JobStatus::Collecting) {
        return Err((
            "nothing is left collecting",
            format!("job {} is {}", row.job_key, row.status.as_str()),
        ));
    }
    let rows: BTreeMap<&str, &JobRow> = s.rows.iter().map(|r| (r.job_key.as_str(), r)).collect();
    for live in s.live.iter().filter(|l| l.configured && !l.dead_lettered) {
        // A pipeline ends at its first job failed for good: the jobs after
        // it are never keyed.
        for job in &live.jobs {
            match rows.get(job.as_str()) {
                Some(row) if row.status == JobStatus::Done => {}
                Some(row) if poisoned(s, row) => break,
                other => {
                    return Err((
                        "every live version's pipeline is done or failed for good",
                        format!(
                            "{} has its job {job} {}",
                            live.key,
                            other.map_or("missing", |r| r.status.as_str())
                        ),
                    ))
                }
            }
        }
    }
    let wanted = |job: &str| {
        s.keyed
            .get(job)
            .is_some_and(|keys| s.live.iter().any(|l| keys.contains(&l.key)))
    };
    // A poisoned row is kept on purpose once its versions are gone: it
    // stops a re-upload of the same bytes from running again (DESIGN.md,
    // "Collection"); so is a done row from before reference items until
    // `refs seal` says every version using it has one ("Rows older than
    // reference items").
    if let Some(row) = s
        .rows
        .iter()
        .find(|r| !wanted(&r.job_key) && !poisoned(s, r) && r.ref_items)
    {
        return Err((
            "nothing leaks",
            format!(
                "job {} ({}) is of no bytes a live version holds (keyed from {:?})",
                row.job_key,
                row.status.as_str(),
                s.keyed.get(&row.job_key)
            ),
        ));
    }
    completion_events(s)?;
    if let Some(key) = s.outputs.keys().find(|key| {
        let job = key
            .strip_prefix(OUTPUT_PREFIX)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default();
        !rows.contains_key(job)
    }) {
        return Err(("nothing leaks", format!("output {key} belongs to no job")));
    }
    Ok(())
}

/// 4d. every live version whose pipeline is done has its completion
///     event, `succeeded`, listing its jobs; and an event's id is stable:
///     every event of one version, ETag and outcome has the same id
///     (a redelivery publishes the same event again, which an app
///     deduplicates by it).
fn completion_events(s: &Snapshot<'_>) -> Result<(), Broken> {
    let mut ids: BTreeMap<String, &str> = BTreeMap::new();
    for event in s.events {
        let mut jobs: Vec<String> = event["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|j| format!("{}:{}", j["jobKey"], j["status"]))
            .collect();
        jobs.sort();
        let what = format!(
            "{} {} {} {}",
            event["key"],
            event["versionId"],
            event["eTag"],
            jobs.join(",")
        );
        let id = event["eventId"].as_str().unwrap_or_default();
        if let Some(seen) = ids.insert(what.clone(), id) {
            if seen != id {
                return Err((
                    "a completion event's id is stable",
                    format!("{what} was published as {seen} and as {id}"),
                ));
            }
        }
    }
    let rows: BTreeMap<&str, &JobRow> = s.rows.iter().map(|r| (r.job_key.as_str(), r)).collect();
    for live in s.live.iter().filter(|l| l.configured && !l.dead_lettered) {
        let done = live.jobs.iter().all(|job| {
            rows.get(job.as_str())
                .is_some_and(|r| r.status == JobStatus::Done)
        });
        if !done {
            continue;
        }
        let (key, version, etag) = &live.object;
        let announced = s.events.iter().any(|event| {
            event["key"].as_str() == Some(key.as_str())
                && event["versionId"].as_str() == version.as_deref()
                && event["eTag"].as_str() == Some(etag.as_str())
                && event["status"] == "succeeded"
                && live.jobs.iter().all(|job| {
                    event["jobs"]
                        .as_array()
                        .is_some_and(|jobs| jobs.iter().any(|j| j["jobKey"] == job.as_str()))
                })
        });
        if !announced {
            return Err((
                "every ended pipeline is announced",
                format!(
                    "{} is done with no completion event listing its jobs",
                    live.key
                ),
            ));
        }
    }
    Ok(())
}

/// A job failed for good (its input at fault, or its caps of failures or
/// runs spent), as a claim judges it once every lease has passed.
fn poisoned(s: &Snapshot<'_>, row: &JobRow) -> bool {
    judge(row, u64::MAX, s.max_attempts) == Verdict::Poisoned
}

/// The files of a done job: its manifest, then each file it lists, with
/// its size and SHA-256.
fn files_of(s: &Snapshot<'_>, job_key: &str) -> Result<(), String> {
    let prefix = format!("{OUTPUT_PREFIX}{job_key}/");
    let manifest = s
        .outputs
        .get(&format!("{prefix}{MANIFEST_NAME}"))
        .ok_or_else(|| format!("job {job_key} is done with no manifest"))?;
    let manifest: Manifest = serde_json::from_slice(manifest)
        .map_err(|e| format!("job {job_key}'s manifest does not parse: {e}"))?;
    for file in &manifest.outputs {
        let bytes = s
            .outputs
            .get(&format!("{prefix}{}", file.name))
            .ok_or_else(|| format!("job {job_key} is done without {}", file.name))?;
        if bytes.len() as u64 != file.size || sha256_hex(bytes) != file.sha256 {
            return Err(format!(
                "job {job_key}'s {} is not what its manifest says",
                file.name
            ));
        }
    }
    Ok(())
}
