//! The join task: every chunk done, their segments copied into the job's
//! package, its playlists and manifest written from their measurements
//! (what one run of the whole input writes), the job finished.

use futures::{StreamExt, TryStreamExt};

use super::{claim_of, errors, is_own, Answer};
use crate::config::split_s3_location;
use crate::handler::job::execution::chunk_keys;
use crate::handler::job::finish;
use crate::handler::App;
use crate::key::Recipe;
use crate::ledger::{FinishError, JobRow, JobStatus};
use crate::pipeline::split::SplitTask;
use crate::step::{content_type, JobOutputs, Manifest, StepError};
use crate::steps::hls::chunk_job::{ChunkSegments, SEGMENTS_FILE};
use crate::steps::hls::join::{plan_join, ChunkOutputs};
use crate::steps::hls::HlsParams;

/// Chunk rows read at once by a join.
const READS_AT_ONCE: usize = 16;

/// The join task: every chunk done, their segments copied into the
/// package, its playlists and manifest written, the job finished.
pub(super) async fn join(app: &App, task: &SplitTask) -> Result<Answer, String> {
    let row = match app.ledger.get(&task.job.key).await.map_err(|e| e.to_string())? {
        Some(row) if is_own(&row, &task.execution) => row,
        // Done already: this join's, before its answer was lost.
        Some(row) if row.status == JobStatus::Done => return Ok(Ok(())),
        _ => {
            let cause = format!("job {} is no longer this execution's", task.job.key);
            return Ok(Err((errors::SUPERSEDED, cause)));
        }
    };
    let package = task.job.package_recipe()?;
    let keys = chunk_keys(&task.job.input_hash, &package, task.spans());
    let reads: Vec<_> = keys.iter().map(|key| app.ledger.get(key)).collect();
    let chunks: Vec<Option<JobRow>> = futures::stream::iter(reads)
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let mut done = Vec::with_capacity(chunks.len());
    for (index, (key, chunk)) in keys.iter().zip(&chunks).enumerate() {
        match chunk {
            Some(chunk) if chunk.status == JobStatus::Done => done.push(chunk),
            other => {
                let cause = format!(
                    "chunk {index} (job {key}) is {} at the join",
                    other.as_ref().map_or("gone", |c| c.status.as_str())
                );
                return Ok(Err((errors::TRANSIENT, cause)));
            }
        }
    }
    let claim = claim_of(&row);
    let written = write_package(app, &row, task.job.recipe.clone(), &package, &done).await;
    let failure = match written {
        Ok(()) => None,
        // Retried by the definition; the row stays this execution's.
        Err(err) if !err.is_permanent() => {
            return Ok(Err((errors::TRANSIENT, format!("joining {}: {err}", row.job_key))))
        }
        Err(err) => Some(err),
    };
    let cause = failure.as_ref().map(StepError::to_string);
    match finish(&app.ledger, &claim, failure, app.now_ms()).await {
        Ok(()) => Ok(match cause {
            None => Ok(()),
            Some(cause) => Err((errors::UNPROCESSABLE, cause)),
        }),
        Err(FinishError::LostLease(_)) => Ok(Err((
            errors::SUPERSEDED,
            format!("job {} was taken over before its join finished", row.job_key),
        ))),
        Err(err) => Ok(Err((errors::TRANSIENT, err.to_string()))),
    }
}

/// The chunks' segments copied into the job's prefix, its playlists
/// and its manifest written: what one run of the whole input writes.
/// `recipe` is the execution's, as the manifest records it; `package`
/// the same, parsed.
pub(in crate::handler) async fn write_package(
app: &App,
parent: &JobRow,
recipe: serde_json::Value,
package: &Recipe,
chunks: &[&JobRow],
) -> Result<(), StepError> {
    let located = |row: &JobRow| {
        split_s3_location(&row.output_prefix)
            .map(|(b, p)| (b.to_string(), p.to_string()))
            .ok_or_else(|| {
                StepError::Failed(format!(
                    "job {}'s output_prefix {:?} is not an s3://bucket/prefix/ location",
                    row.job_key, row.output_prefix
                ))
            })
    };
    // Each chunk's manifest and summaries (two GETs), 16 chunks at a
    // time, in order.
    let reads: Vec<_> = chunks
        .iter()
        .map(|chunk| async move {
            let (bucket, prefix) = located(chunk)?;
            let missing = |what: &str| {
                StepError::Failed(format!("chunk {}'s {what} is missing", chunk.job_key))
            };
            let manifest: Manifest = app
                .manifest_under(&bucket, &prefix)
                .await
                .map_err(StepError::Failed)?
                .ok_or_else(|| missing("manifest"))?;
            let segments: ChunkSegments = app
                .json_object(&bucket, &format!("{prefix}{SEGMENTS_FILE}"), "a chunk's segments")
                .await
                .map_err(StepError::Failed)?
                .ok_or_else(|| missing(SEGMENTS_FILE))?;
            Ok::<_, StepError>(ChunkOutputs {
                bucket,
                prefix,
                manifest,
                segments,
            })
        })
        .collect();
    let read: Vec<ChunkOutputs> = futures::stream::iter(reads)
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await?;
    // The recipe as the execution carries it, as the chunks were run.
    let iframes = HlsParams::from_params(&package.params)
        .map_err(|e| StepError::Unprocessable(format!("the execution's recipe: {e}")))?
        .iframes;
    let plan = plan_join(&read, iframes).map_err(StepError::Unprocessable)?;
    let (bucket, prefix) = located(parent)?;
    let mut outputs = JobOutputs::new(app.store.clone(), bucket, prefix);
    outputs.copy_in(plan.copies).await?;
    for (name, text) in plan.playlists {
        outputs
            .put_bytes(&name, content_type(&name), text.into_bytes())
            .await?;
    }
    let manifest = Manifest {
        job_key: parent.job_key.clone(),
        input_hash: parent.input_hash.clone(),
        recipe,
        outputs: outputs.files(),
    };
    outputs.write_manifest(&manifest).await
}
