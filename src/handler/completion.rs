//! A version's completion event ([`crate::pipeline::completion`]): once
//! every job of its pipeline is terminal in a delivery, one event goes to
//! the bus before the message is acknowledged. A failed publication brings
//! the message back (its redelivery publishes the same event id again).

use super::{App, JobReport, Outcome};
use crate::bus::{BusEvent, MAX_ENTRY_BYTES};
use crate::config::split_s3_location;
use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::ledger::{truncate_chars, MAX_ERROR_CHARS};
use crate::pipeline::completion::{self, CompletedFile, CompletedJob, Completion, JobError};
use crate::references::VersionName;
use crate::step::content_type;

/// Whether a job's outcome ends it for this version: done, or failed for
/// good. Anything else (busy, failed, deferred, handed on, skipped because
/// the version changed) leaves the pipeline unfinished here.
fn terminal(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Ran
            | Outcome::Reused
            | Outcome::Poisoned
            | Outcome::Unprocessable
            | Outcome::Unmatched
    )
}

/// Bytes kept under EventBridge's entry limit for the envelope a rule's
/// target adds (an SNS topic or an SQS queue takes 256 KiB with it).
const ENVELOPE_HEADROOM: usize = 4 * 1024;

/// Publishes the version's completion event when every job of `reports`
/// is terminal and a bus is configured; `Err` with why the message must
/// come back.
pub(super) async fn publish_if_complete(
    app: &App,
    version: &VersionName,
    head: &ObjectHead,
    fingerprint: &Fingerprint,
    reports: &[JobReport],
) -> Result<(), String> {
    let (Some(bus), Some(bus_name)) = (&app.bus, &app.config.event_bus) else {
        return Ok(());
    };
    if reports.is_empty() || !reports.iter().all(|r| terminal(r.outcome)) {
        return Ok(());
    }
    let mut jobs = Vec::with_capacity(reports.len());
    for report in reports {
        jobs.push(completed_job(app, report).await?);
    }
    let mut detail = Completion::new(
        &version.bucket,
        &version.key,
        version.version_id.as_deref(),
        &head.etag,
        (&fingerprint.input_hash, fingerprint.source),
        jobs,
    );
    let mut event = BusEvent {
        bus: bus_name.clone(),
        source: completion::SOURCE.to_string(),
        detail_type: detail.detail_type().to_string(),
        detail: String::new(),
        resources: vec![format!(
            "arn:aws:s3:::{}/{}",
            version.bucket, version.key
        )],
    };
    // PutEvents refuses a larger entry on every delivery: the message
    // would end in the dead-letter queue and the event never arrive.
    event.detail = detail.fit(MAX_ENTRY_BYTES.saturating_sub(event.entry_size() + ENVELOPE_HEADROOM));
    match bus.publish(&event).await {
        Ok(()) => {
            tracing::info!(version = %version, event_id = detail.event_id, status = detail.status, "completion event published");
            Ok(())
        }
        Err(err) => {
            tracing::warn!(version = %version, error = %err, "publishing the completion event failed: the message comes back");
            Err(err.to_string())
        }
    }
}

/// One job as the event reports it: a done job with its manifest's files.
/// A done job whose outputs or manifest cannot be found is never reported
/// succeeded: `Err`, and the message comes back (its redelivery claims the
/// job again, which runs it when it was collected meanwhile).
async fn completed_job(app: &App, report: &JobReport) -> Result<CompletedJob, String> {
    let done = matches!(report.outcome, Outcome::Ran | Outcome::Reused);
    let files = if done {
        let outputs = report.outputs.as_deref().unwrap_or_default();
        let (bucket, prefix) = split_s3_location(outputs).ok_or_else(|| {
            format!("job {}'s outputs {outputs:?} are not an s3://bucket/prefix/ location", report.job_key)
        })?;
        let manifest = app.manifest_under(bucket, prefix).await?.ok_or_else(|| {
            format!(
                "job {} is done but its manifest is missing from {outputs}: no event until it is \
                 there",
                report.job_key
            )
        })?;
        manifest
            .outputs
            .into_iter()
            .map(|file| CompletedFile {
                content_type: content_type(&file.name).to_string(),
                name: file.name,
                size: file.size,
                sha256: file.sha256,
            })
            .collect()
    } else {
        Vec::new()
    };
    let file_count = done.then_some(files.len() as u64);
    let files = completion::listed(files);
    let error = (!done).then(|| JobError {
        class: match report.outcome {
            Outcome::Unmatched => "configuration",
            _ if report.job_key.is_empty() => "upstream",
            _ => "permanent",
        }
        .to_string(),
        // Cut as a row's error is: a reason may list thousands of files.
        message: truncate_chars(report.reason.as_deref().unwrap_or_default(), MAX_ERROR_CHARS),
    });
    Ok(CompletedJob {
        recipe: report.recipe.clone(),
        step: report.step.clone(),
        version: report.version,
        job_key: report.job_key.clone(),
        status: if done { "done" } else { "failed" }.to_string(),
        outcome: report.outcome.as_str().to_string(),
        output_prefix: report.outputs.clone().filter(|_| done),
        files,
        file_count,
        error,
    })
}
