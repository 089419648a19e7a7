//! A version's completion event ([`crate::pipeline::completion`]): once
//! every job of its pipeline is terminal in a delivery, one event goes to
//! the bus before the message is acknowledged. A failed publication brings
//! the message back (its redelivery publishes the same event id again).

use super::{App, JobReport, Outcome};
use crate::bus::BusEvent;
use crate::config::{split_s3_location, RecipeRule};
use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::key::job_key;
use crate::pipeline::completion::{self, CompletedFile, CompletedJob, Completion, JobError};
use crate::references::VersionName;
use crate::step::content_type;

/// Whether a job's outcome ends it for this version: done, or failed for
/// good. Anything else (busy, failed, deferred, handed on, skipped because
/// the version changed) leaves the pipeline unfinished here.
fn terminal(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Ran | Outcome::Reused | Outcome::Poisoned | Outcome::Unprocessable
    )
}

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
        let rule = recipe_of(app, report, &fingerprint.input_hash);
        jobs.push(completed_job(app, rule, report).await?);
    }
    let detail = Completion::new(
        &version.bucket,
        &version.key,
        version.version_id.as_deref(),
        &head.etag,
        (&fingerprint.input_hash, fingerprint.source),
        jobs,
    );
    let event = BusEvent {
        bus: bus_name.clone(),
        source: completion::SOURCE.to_string(),
        detail_type: detail.detail_type().to_string(),
        detail: detail.to_detail(),
        resources: vec![format!(
            "arn:aws:s3:::{}/{}",
            version.bucket, version.key
        )],
    };
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

/// The recipe a report is of: by its name, and when unnamed recipes of
/// one step share it, the one whose key the report's is.
fn recipe_of<'a>(app: &'a App, report: &JobReport, input_hash: &str) -> Option<&'a RecipeRule> {
    let mut named = app
        .config
        .recipes
        .iter()
        .filter(|rule| rule.name == report.recipe && rule.recipe.step == report.step);
    let first = named.clone().next();
    named
        .find(|rule| job_key(input_hash, &rule.recipe_hash) == report.job_key)
        .or(first)
}

/// One job as the event reports it: a done job with its manifest's files.
async fn completed_job(
    app: &App,
    rule: Option<&RecipeRule>,
    report: &JobReport,
) -> Result<CompletedJob, String> {
    let done = matches!(report.outcome, Outcome::Ran | Outcome::Reused);
    let location = report.outputs.as_deref().and_then(split_s3_location);
    let files = match (location, done) {
        (Some((bucket, prefix)), true) => app
            .manifest_under(bucket, prefix)
            .await?
            .map(|manifest| {
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
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let file_count = done.then_some(files.len() as u64);
    let files = completion::listed(files);
    let error = (!done).then(|| JobError {
        class: if report.job_key.is_empty() {
            "upstream"
        } else {
            "permanent"
        }
        .to_string(),
        message: report.reason.clone().unwrap_or_default(),
    });
    Ok(CompletedJob {
        recipe: report.recipe.clone(),
        step: report.step.clone(),
        version: rule.map_or(0, |r| r.recipe.version),
        job_key: report.job_key.clone(),
        status: if done { "done" } else { "failed" }.to_string(),
        outcome: report.outcome.as_str().to_string(),
        output_prefix: report.outputs.clone().filter(|_| done),
        files,
        file_count,
        error,
    })
}
