//! A chunk task: the span's chunk job, claimed and run like any job
//! (content-keyed: a chunk done before answers at once), reading the
//! bytes from any live version that holds them.

use super::{errors, Answer};
use crate::config::RecipeRule;
use crate::fingerprint::{s3_checksum, version_etag, Fingerprint, FingerprintSource, ObjectHead};
use crate::handler::job::{BatchJobs, JobRun};
use crate::handler::{App, Invocation, JobReport, Outcome};
use crate::identity::ObjectVersion;
use crate::key::{job_key, Recipe};
use crate::pipeline::split::{Span, SplitTask};
use crate::steps::hls::chunk_job::{ChunkParams, CHUNK_STEP};
use crate::store::ObjectRef;

pub(super) enum ChunkRun {
    /// The chunk ended for this task: its report and the answer.
    Answer(JobReport, Answer),
    /// Busy or deferred: the message comes back, the task waits.
    ComesBack(JobReport),
}

/// A chunk task: the span's chunk job, claimed and run like any job.
pub(super) async fn run_chunk(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    task: &SplitTask,
    package: &Recipe,
) -> Result<ChunkRun, String> {
    let span = task.span.ok_or("a chunk task without its span")?;
    let rule = chunk_rule(app, &task.job.recipe_name, package, span)?;
    let Some((head, fingerprint)) = locate_input(app, task).await? else {
        let report = chunk_report(&rule, Outcome::Skipped, "no live version holds the input");
        let cause = format!(
            "chunk {} of {}: no version that references the job holds its bytes any more",
            span.index, task.job.key
        );
        return Ok(ChunkRun::Answer(report, Err((errors::INPUT_GONE, cause))));
    };
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
    let report = run.run_in(batch, &[]).await;
    let reason = report.reason.clone().unwrap_or_default();
    let cause = |what: &str| format!("chunk {} ({} ms on, job {key}) {what}: {reason}", span.index, span.start_ms);
    let answer = match report.outcome {
        Outcome::Ran | Outcome::Reused => Ok(()),
        Outcome::Busy | Outcome::Deferred => return Ok(ChunkRun::ComesBack(report)),
        Outcome::Unprocessable => Err((errors::UNPROCESSABLE, cause("cannot be processed"))),
        Outcome::Poisoned => Err((errors::POISONED, cause("spent its runs"))),
        _ => Err((errors::TRANSIENT, cause("failed"))),
    };
    // The message is done either way: the execution carries the chunk on
    // (a failure is retried by the definition, with a new message).
    let report = match answer {
        Ok(()) => report,
        Err(_) => JobReport {
            outcome: Outcome::Waiting,
            reason: Some(format!("{}: {reason}; its execution is told", report.outcome.as_str())),
            ..report
        },
    };
    Ok(ChunkRun::Answer(report, answer))
}

/// A version holding the job's input bytes, and their hash as S3 or
/// mediaonce computed it: the execution's own location while it holds
/// them, else any other version that references the job (the claimant's
/// upload may be gone while another upload of the bytes is not).
async fn locate_input(
    app: &App,
    task: &SplitTask,
) -> Result<Option<(ObjectHead, Fingerprint)>, String> {
    let wanted = &task.job.input_hash;
    for location in &task.job.locations {
        let object = ObjectRef {
            bucket: location.bucket.clone(),
            key: location.key.clone(),
            version_id: location.version_id.clone(),
            if_match: Some(location.etag.clone()),
        };
        if let Some(found) = holds(app, &object, wanted).await? {
            return Ok(Some(found));
        }
    }
    let holders = app
        .ledger
        .holders(&task.job.key)
        .await
        .map_err(|e| e.to_string())?;
    for version in holders.into_iter().filter_map(|holder| holder.version) {
        let object = ObjectRef {
            bucket: version.bucket,
            key: version.key,
            version_id: version.version_id,
            if_match: None,
        };
        if let Some(found) = holds(app, &object, wanted).await? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// `object`'s head and hash when it exists and its trusted hash is
/// `wanted`.
async fn holds(
    app: &App,
    object: &ObjectRef,
    wanted: &str,
) -> Result<Option<(ObjectHead, Fingerprint)>, String> {
    let Some(head) = app.store.head(object).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    if object
        .if_match
        .as_deref()
        .is_some_and(|etag| head.etag.trim_matches('"') != etag)
    {
        return Ok(None);
    }
    Ok(match trusted_hash(app, &head, wanted).await {
        Ok(fingerprint) if fingerprint.input_hash == wanted => Some((head, fingerprint)),
        // Other bytes, or bytes whose hash nobody computed: not these.
        _ => None,
    })
}

/// The chunk's recipe, from the package recipe as claimed, bound to the
/// `hls-chunk` step.
fn chunk_rule(app: &App, name: &str, package: &Recipe, span: Span) -> Result<RecipeRule, String> {
    let step = app
        .config
        .chunk_step
        .as_ref()
        .ok_or_else(|| format!("no {CHUNK_STEP} step is registered to run chunk tasks"))?;
    let recipe = ChunkParams::recipe(package, span.index, span.start_ms, span.end_ms);
    let step = step.bind(&recipe.params)?;
    Ok(RecipeRule {
        index: 0,
        name: format!("{name}#chunk-{}", span.index),
        input: None,
        named: true,
        recipe_hash: recipe.hash(),
        recipe,
        key_match: Default::default(),
        step,
    })
}

fn chunk_report(rule: &RecipeRule, outcome: Outcome, reason: &str) -> JobReport {
    JobReport {
        job_key: String::new(),
        recipe: rule.name.clone(),
        step: CHUNK_STEP.to_string(),
        version: rule.recipe.version,
        outcome,
        attempt: 0,
        duration_ms: 0,
        reason: Some(reason.to_string()),
        busy_until_ms: None,
        input_hash_source: None,
        outputs: None,
    }
}


/// The input hash of a version that S3 or mediaonce computed: S3's
/// full-object SHA-256, else its version-and-ETag key when the message
/// names that (its parent was keyed so: derived from the HEAD, not taken
/// from the message), else the hash cache's.
async fn trusted_hash(
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

