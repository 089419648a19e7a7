//! A chunk message ([`ChunkHandOn`]): one span of an `hls-package` job run
//! as a job of its own (`steps::hls::chunk_job`), claimed like any job.
//!
//! Nothing in the message is taken on trust: the recipe must be one of
//! this configuration's `hls-package` recipes, the input hash must be one
//! S3 or mediaonce computed for the version as it is now (its full-object
//! SHA-256 checksum, or the hash cache), the parent key must follow from
//! both, and the step checks the span against the input's own plan. A
//! message that fails those is refused with the reason (it comes back and
//! is dead-lettered: it is not ours to drop); a version that changed or
//! went is skipped (its own event runs what it needs).
//!
//! A chunk that ended (done, or failed for good) settles its parent
//! ([`super::join::settle_parent`]): the last to finish joins them.


use super::job::{BatchJobs, JobRun};
use super::join::settle_parent;
use super::{App, Invocation, JobReport, MessageReport, Outcome};
use crate::config::RecipeRule;
use crate::fingerprint::{s3_checksum, version_etag, Fingerprint, FingerprintSource};
use crate::identity::ObjectVersion;
use crate::key::job_key;
use crate::ledger::JobStatus;
use crate::pipeline::message::ChunkHandOn;
use crate::steps::hls::chunk_job::{ChunkParams, CHUNK_STEP};
use crate::store::ObjectRef;

/// Runs a chunk message's job; its report, or why the message must come
/// back.
pub(super) async fn process_chunk(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    (message_id, queue_url): (String, Option<&str>),
    chunk: &ChunkHandOn,
) -> MessageReport {
    let (jobs, error) = match chunk_job(app, batch, invocation, chunk).await {
        Ok((report, package)) => {
            // A chunk done or failed for good; or skipped for a parent
            // whose split is over but still on its row.
            let ended = matches!(
                report.outcome,
                Outcome::Ran
                    | Outcome::Reused
                    | Outcome::Poisoned
                    | Outcome::Unprocessable
                    | Outcome::Skipped
            );
            let settled = match package {
                Some(package) if ended => {
                    settle_parent(app, invocation, queue_url, package, &chunk.parent).await
                }
                _ => Ok("the chunk has not ended"),
            };
            match settled {
                Ok(what) => {
                    tracing::info!(message_id, parent = chunk.parent, index = chunk.index, settled = what, "chunk settled");
                    (vec![report], None)
                }
                Err(error) => {
                    tracing::warn!(message_id, parent = chunk.parent, index = chunk.index, error, "settling the chunk's parent failed: the message comes back");
                    (vec![report], Some(error))
                }
            }
        }
        Err(error) => {
            tracing::error!(message_id, error, "chunk message refused");
            (Vec::new(), Some(error))
        }
    };
    MessageReport {
        message_id,
        jobs,
        error,
    }
}

/// The chunk's job report, and its package recipe when its parent is to
/// be settled after it (not for a version that changed or went).
async fn chunk_job<'a>(
    app: &'a App,
    batch: &BatchJobs,
    invocation: &Invocation,
    chunk: &ChunkHandOn,
) -> Result<(JobReport, Option<&'a RecipeRule>), String> {
    let package = app
        .config
        .recipes
        .iter()
        .find(|rule| rule.name == chunk.recipe && rule.recipe.step == "hls-package")
        .ok_or_else(|| {
            format!(
                "chunk message for recipe {:?}: this configuration has no hls-package recipe of that name",
                chunk.recipe
            )
        })?;
    let parent = job_key(&chunk.input_hash, &package.recipe_hash);
    if parent != chunk.parent {
        return Err(format!(
            "chunk message's parent {} is not the key of its input hash and recipe {:?} ({parent})",
            chunk.parent, chunk.recipe
        ));
    }
    let object = ObjectRef {
        bucket: chunk.bucket.clone(),
        key: chunk.key.clone(),
        version_id: chunk.version_id.clone(),
        if_match: Some(chunk.etag.clone()),
    };
    let head = match app.store.head(&object).await {
        Ok(Some(head)) if head.etag.trim_matches('"') == chunk.etag => head,
        Ok(_) => {
            let reason =
                format!("{object} is gone or holds other bytes: its own event runs what it needs");
            return Ok((skipped(package, &chunk.parent, reason), None));
        }
        Err(err) => return Err(err.to_string()),
    };
    let fingerprint = trusted_hash(app, &head, &chunk.input_hash).await?;
    if fingerprint.input_hash != chunk.input_hash {
        return Err(format!(
            "chunk message's inputHash {} is not {object}'s ({}, {})",
            chunk.input_hash,
            fingerprint.input_hash,
            fingerprint.source.as_str()
        ));
    }
    // Only a split that is on: a message sent again after its parent was
    // joined (or collected) encodes nothing. A parent ended with its split
    // still on it is settled: its end is handed on again.
    let row = app.ledger.get(&parent).await.map_err(|e| e.to_string())?;
    let split_on = row
        .as_ref()
        .is_some_and(|row| row.status == JobStatus::Running && row.split.is_some());
    if !split_on {
        let settle = row.is_some_and(|row| row.split.is_some());
        let reason = "its parent is not split now (joined, failed or gone): nothing to run".into();
        return Ok((skipped(package, &chunk.parent, reason), settle.then_some(package)));
    }
    let rule = chunk_rule(app, package, chunk)?;
    let key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
    let bytes = app.object_bytes(head, &[rule.step.input_use()]);
    let run = JobRun {
        app,
        invocation,
        rule: &rule,
        job_key: &key,
        bytes: &bytes,
        fingerprint: &fingerprint,
        // A chunk is never split again.
        queue_url: None,
    };
    Ok((run.run_in(batch, &[]).await, Some(package)))
}

/// The input hash of a version that S3 or mediaonce computed: S3's
/// full-object SHA-256, else its version-and-ETag key when the message
/// names that (its parent was keyed so: derived from the HEAD, not taken
/// from the message), else the hash cache's.
pub(super) async fn trusted_hash(
    app: &App,
    head: &crate::fingerprint::ObjectHead,
    claimed: &str,
) -> Result<Fingerprint, String> {
    if let Some(checksum) = s3_checksum(head) {
        return Ok(checksum);
    }
    let named = version_etag(head);
    if named.input_hash == claimed {
        return Ok(named);
    }
    match app
        .ledger
        .cached_input_hash(&ObjectVersion::of(head))
        .await
        .map_err(|e| e.to_string())?
    {
        Some(input_hash) => Ok(Fingerprint {
            input_hash,
            source: FingerprintSource::Cached,
        }),
        None => Err(format!(
            "s3://{}/{} has no SHA-256 that S3 or mediaonce computed, nor is the message's its \
             version and ETag: a chunk's input hash is not taken from its message",
            head.bucket, head.key
        )),
    }
}

/// The chunk's recipe, bound to the `hls-chunk` step.
fn chunk_rule(app: &App, package: &RecipeRule, chunk: &ChunkHandOn) -> Result<RecipeRule, String> {
    let step = app
        .config
        .chunk_step
        .as_ref()
        .ok_or_else(|| format!("no {CHUNK_STEP} step is registered to run chunk messages"))?;
    let recipe = ChunkParams::recipe(&package.recipe, chunk.index, chunk.start_ms, chunk.end_ms);
    let step = step.bind(&recipe.params)?;
    Ok(RecipeRule {
        index: package.index,
        name: format!("{}#chunk-{}", package.name, chunk.index),
        input: None,
        named: true,
        recipe_hash: recipe.hash(),
        recipe,
        key_match: package.key_match.clone(),
        step,
    })
}

/// A chunk whose input is no longer the message's: nothing runs.
fn skipped(package: &RecipeRule, parent: &str, reason: String) -> JobReport {
    JobReport {
        job_key: String::new(),
        recipe: package.name.clone(),
        step: CHUNK_STEP.to_string(),
        version: package.recipe.version,
        outcome: Outcome::Skipped,
        attempt: 0,
        duration_ms: 0,
        reason: Some(format!("chunk of {parent}: {reason}")),
        busy_until_ms: None,
        input_hash_source: None,
        outputs: None,
    }
}
