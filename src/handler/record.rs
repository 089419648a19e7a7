//! A message's body and its S3 records: parse, filter by event and recipe,
//! head the object version, find its input hash ([`super::identify`]), then
//! one job per matching recipe (claimed once per batch).

use std::collections::BTreeSet;
use std::time::Instant;


use super::chain::{Downstream, PendingHandOn};
use super::collect::collect_now;
use super::completion::publish_if_complete;
use super::identify::{forget_if_disproved, identify, Identified};
use super::job::{elapsed_ms, BatchJobs, JobRun};
use super::references::{bytes_of, head_null_version, reconcile_version, Start};
use super::log::log_job;
use super::{App, Invocation, JobReport, MessageReport, Outcome, StartCheck};
use crate::config::RecipeRule;
use crate::event::{parse_body, EventKind, Notification, S3Record};
use crate::fingerprint::{
    replaced_since_event, s3_checksum, version_etag, Fingerprint, FingerprintSource, ObjectHead,
};
use crate::key::job_key;
use crate::references::{Keyed, Seen, VersionName};
use crate::queue::{message_group, Outgoing};
use crate::store::ObjectRef;

/// A message's body: its records' jobs. `queue_url`: the queue it came
/// from, where a hand-on message goes.
pub(super) async fn process_body(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message_id: String,
    queue_url: Option<&str>,
    body: &str,
) -> MessageReport {
    let records = match parse_body(body) {
        Ok(Notification::Records(records)) => records,
        Ok(Notification::SplitTask(task)) => {
            return super::split::process_task(app, batch, invocation, message_id, &task)
                .await;
        }
        Ok(Notification::ExecutionClosed(closed)) => {
            return super::split::process_closed(app, message_id, &closed).await;
        }
        Ok(Notification::TestEvent) => {
            tracing::info!(message_id, "s3:TestEvent acknowledged");
            return MessageReport {
                message_id,
                jobs: Vec::new(),
                error: None,
            };
        }
        Err(err) => {
            tracing::error!(message_id, error = %err, "message body is not a usable S3 notification");
            return MessageReport {
                message_id,
                jobs: Vec::new(),
                error: Some(err.to_string()),
            };
        }
    };
    let mut jobs = Vec::new();
    let mut errors = Vec::new();
    let mut hand_ons = Vec::new();
    // A record equal to an earlier one of the body is the same hint: the
    // earlier one brought its version in line with S3 moments ago, so it
    // shares that record's outcome instead of reconciling again (a job
    // that ran for it is reused by this one: it ran once).
    let mut handled: Vec<(&S3Record, Vec<JobReport>)> = Vec::new();
    for record in &records {
        if let Some((_, reports)) = handled.iter().find(|(seen, _)| *seen == record) {
            jobs.extend(reports.iter().map(JobReport::seen_again));
            continue;
        }
        let done = process_record(app, batch, invocation, (&message_id, queue_url), record).await;
        jobs.extend(done.reports.iter().cloned());
        errors.extend(done.error);
        hand_ons.extend(done.hand_on);
        handled.push((record, done.reports));
    }
    let mut report = MessageReport {
        message_id,
        jobs,
        error: (!errors.is_empty()).then(|| errors.join("; ")),
    };
    send_hand_ons(app, &mut report, hand_ons).await;
    report
}

/// The hand-ons the message's walks ask for, sent when the message is
/// acknowledged; when it comes back (or a send fails), the jobs they carry
/// are deferred instead: its redelivery walks the pipeline again. A
/// message that comes back and hands on would hand on again at every
/// receive, and each hand-on likewise: sent only from an acknowledged
/// message, the hand-ons of a pipeline are a chain.
async fn send_hand_ons(app: &App, report: &mut MessageReport, hand_ons: Vec<PendingHandOn>) {
    for pending in hand_ons {
        let message = &pending.message;
        let not_sent = if report.must_retry() {
            Some("the message comes back (another of its jobs must), so nothing is handed on: \
                  its redelivery walks the pipeline again"
                .to_string())
        } else {
            let (group, body) = (message_group(&message.bucket, &message.key), message.to_body());
            let outgoing = Outgoing {
                body: &body,
                group: &group,
                cause: &report.message_id,
            };
            app.queue
                .send(&pending.queue_url, &outgoing)
                .await
                .err()
                .map(|err| format!("no time left in this invocation, and handing on failed: {err}"))
        };
        let Some(reason) = not_sent else {
            tracing::info!(
                message_id = report.message_id,
                bucket = message.bucket,
                key = message.key,
                recipes = ?message.recipes,
                hand_ons = message.hand_ons,
                "pipeline handed on"
            );
            continue;
        };
        tracing::warn!(message_id = report.message_id, key = message.key, reason, "not handed on: deferred");
        for job in report.jobs.iter_mut().filter(|job| {
            job.outcome == Outcome::HandedOn
                && message.recipes.contains(&job.recipe)
        }) {
            job.outcome = Outcome::Deferred;
            job.reason = Some(reason.clone());
        }
    }
}

/// What one record came to.
#[derive(Debug, Default)]
struct RecordDone {
    reports: Vec<JobReport>,
    /// Why its message must come back when no job says so (a release
    /// that failed, a completion event not published).
    error: Option<String>,
    /// The hand-on its pipeline asks for.
    hand_on: Option<PendingHandOn>,
}

impl RecordDone {
    fn of(reports: Vec<JobReport>) -> Self {
        RecordDone {
            reports,
            ..RecordDone::default()
        }
    }

    fn failed(error: Option<String>) -> Self {
        RecordDone {
            error,
            ..RecordDone::default()
        }
    }
}

/// A record's job reports, why its message must come back when no job
/// says so (a release that failed), and the hand-on it asks for.
async fn process_record(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    (message_id, queue_url): (&str, Option<&str>),
    record: &S3Record,
) -> RecordDone {
    let version = VersionName {
        bucket: record.bucket.clone(),
        key: record.key.clone(),
        version_id: record.version_id.clone(),
    };
    // One record of a version at a time in the batch.
    let turn = batch.version_turn(&version.row_key());
    let _turn = turn.lock().await;
    match record.kind() {
        EventKind::Created => {
            process_created(app, batch, invocation, (message_id, queue_url), record).await
        }
        EventKind::Removed | EventKind::DeleteMarker => {
            RecordDone::failed(process_removed(app, message_id, record, &version).await)
        }
        EventKind::Other => {
            tracing::info!(
                message_id,
                bucket = record.bucket,
                key = record.key,
                event = record.event_name,
                "not an ObjectCreated event: acknowledged, no job"
            );
            RecordDone::default()
        }
    }
}

/// A removed version (or a delete marker) reconciled with S3; `Some` with
/// the reason when the message must come back.
async fn process_removed(
    app: &App,
    message_id: &str,
    record: &S3Record,
    version: &VersionName,
) -> Option<String> {
    let (bucket, key, event) = (&record.bucket, &record.key, &record.event_name);
    let released = match record.kind() {
        // A marker without a version id (S3 writes "null") is a null
        // marker: in a versioning-suspended bucket a DELETE removes the
        // null version for good and puts one. That version is gone, not
        // hidden: released whatever the setting (it leaked before).
        EventKind::DeleteMarker if version.is_unversioned() => {
            null_version_removed(app, version).await
        }
        EventKind::DeleteMarker if !app.config.release_on_delete_marker => {
            tracing::info!(
                message_id,
                bucket,
                key,
                event,
                "delete marker: the versions still exist, nothing released"
            );
            return None;
        }
        EventKind::DeleteMarker => reconcile_every_version(app, version).await,
        _ if app.config.release_on_delete_marker => removed_releasing_on_markers(app, version).await,
        _ => reconcile_version(app, version, None, Start::Unknown)
            .await
            .map(|done| done.released)
            .map_err(|err| err.to_string()),
    };
    match released {
        Ok(released) => {
            tracing::info!(message_id, version = %version, event, released = ?released, "object version removed: its references reconciled with S3");
            collect_now(app, &released).await;
            None
        }
        Err(err) => {
            tracing::warn!(message_id, version = %version, event, error = %err, "releasing references failed: the message comes back");
            Some(err)
        }
    }
}

/// A created version's jobs: one per matching recipe, keyed by its input
/// hash, referenced by the version before any is claimed or reused.
async fn process_created(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    (message_id, queue_url): (&str, Option<&str>),
    record: &S3Record,
) -> RecordDone {
    let (bucket, key) = (&record.bucket, &record.key);
    if app.config.is_own_output(bucket, key) {
        tracing::info!(
            message_id,
            bucket,
            key,
            "object is one of our outputs: acknowledged, no job (recursion guard)"
        );
        return RecordDone::default();
    }
    let rules: Vec<&RecipeRule> = app.config.recipes_for(key);
    if let (true, Some(handed_on)) = (rules.is_empty(), &record.handed_on) {
        return end_unmatched(app, message_id, record, &handed_on.recipes).await;
    }
    if rules.is_empty() {
        tracing::info!(
            message_id,
            bucket,
            key,
            "no recipe matches the key: acknowledged, no job"
        );
        return RecordDone::default();
    }
    let unclaimed = Unclaimed {
        rules: &rules,
        started: Instant::now(),
        message_id,
        object: ObjectRef {
            bucket: bucket.clone(),
            key: key.clone(),
            version_id: record.version_id.clone(),
            if_match: None,
        },
    };
    // Not even the quickest of the record's jobs could start: no HeadObject.
    let quickest = rules
        .iter()
        .map(|rule| app.start_margin(rule))
        .min()
        .unwrap_or_default();
    // (One that never fits is headed and keyed all the same: each job is
    // then refused for good, and the failure event names the object.)
    let head = match app.start_check(invocation, quickest) {
        StartCheck::Later(reason) => Err((Outcome::Deferred, reason)),
        StartCheck::Now | StartCheck::Never(_) => {
            head_for_record(app, record, &unclaimed.object).await
        }
    };
    let identified = match head {
        Ok(head) => identify(app, batch, head, &rules).await,
        Err(err) => Err(err),
    };
    let identified = match identified {
        Ok(identified) => identified,
        // No input hash, no key: report each recipe's job without claiming it.
        Err((outcome, reason)) => return RecordDone::of(unclaimed.report(None, outcome, &reason)),
    };
    let walk = Walk {
        batch,
        invocation,
        queue_url,
        hand_ons: record.handed_on.as_ref().map_or(0, |h| h.count),
        handed_on: record.handed_on.as_ref().map_or(&[], |h| h.recipes.as_slice()),
        ran: record.handed_on.as_ref().and_then(|h| h.ran.as_deref()),
    };
    let done = run_pipeline(app, &walk, &rules, &identified, &unclaimed).await;
    forget_if_disproved(app, &identified).await;
    done
}

/// A hand-on whose key no recipe matches any more (a deployment changed
/// the recipes' `match` since its pipeline began): the pipeline ends with
/// a failure event saying so, for the version it names, if it still holds
/// the bytes (a version gone or overwritten has its own events).
async fn end_unmatched(
    app: &App,
    message_id: &str,
    record: &S3Record,
    recipes: &[String],
) -> RecordDone {
    let object = ObjectRef {
        bucket: record.bucket.clone(),
        key: record.key.clone(),
        version_id: record.version_id.clone(),
        if_match: None,
    };
    let head = match head_for_record(app, record, &object).await {
        Ok(head) => head,
        Err((Outcome::Skipped, reason)) => {
            tracing::info!(message_id, object = %object, reason, "handed-on pipeline no recipe matches, of a version gone: acknowledged");
            return RecordDone::default();
        }
        Err((_, reason)) => return RecordDone::failed(Some(reason)),
    };
    // The event names the bytes without reading them: S3's SHA-256, else
    // the version and ETag (no job is keyed by it).
    let fingerprint = s3_checksum(&head).unwrap_or_else(|| version_etag(&head));
    tracing::warn!(message_id, object = %object, recipes = ?recipes, "a handed-on pipeline that no recipe matches any more: it ends with a failure event");
    let reports = unmatched(app, recipes, &object);
    let version = VersionName::of_head(&head);
    let published = publish_if_complete(app, &version, &head, &fingerprint, &reports).await;
    RecordDone {
        reports,
        error: published.err(),
        hand_on: None,
    }
}

/// The recipes a hand-on named that this configuration does not run on
/// its object, each reported [`Outcome::Unmatched`]. Unnamed recipes of
/// one step share a name: a version only when one rule has it (0: not
/// known; a removed recipe has neither step nor version).
fn unmatched(app: &App, names: &[String], object: &ObjectRef) -> Vec<JobReport> {
    let reason = format!(
        "this version's pipeline was handed on, and the configuration deployed since does not \
         run this recipe on {object}: nothing more runs for it (mediaonce reprocess runs what \
         matches now)"
    );
    names
        .iter()
        .map(|name| {
            let mut named = app.config.recipes.iter().filter(|rule| &rule.name == name);
            let rule = named.next();
            let one = named.next().is_none();
            JobReport {
                job_key: String::new(),
                recipe: name.clone(),
                step: rule.map(|r| r.recipe.step.clone()).unwrap_or_default(),
                version: rule.filter(|_| one).map_or(0, |r| r.recipe.version),
                outcome: Outcome::Unmatched,
                attempt: 0,
                duration_ms: 0,
                reason: Some(reason.clone()),
                busy_until_ms: None,
                input_hash_source: None,
                outputs: None,
            }
        })
        .collect()
}

/// A keyed version's pipeline: every root job referenced by the version
/// before any is claimed or reused, run, and then the jobs chained to
/// them ([`Downstream`]). Each report is logged; when every job is
/// terminal, the completion event is published (`Some` with why the
/// message must come back when that failed).
async fn run_pipeline(
    app: &App,
    walk: &Walk<'_>,
    rules: &[&RecipeRule],
    identified: &Identified,
    unclaimed: &Unclaimed<'_>,
) -> RecordDone {
    let Walk {
        batch,
        invocation,
        queue_url,
        hand_ons,
        ..
    } = *walk;
    let fingerprint = &identified.fingerprint;
    let head = &identified.bytes.head;
    // The version as headed: in a versioned bucket the event's version.
    let version = VersionName::of_head(head);
    let wanted: BTreeSet<String> = rules
        .iter()
        .map(|rule| job_key(&fingerprint.input_hash, &rule.recipe_hash))
        .collect();
    // Each claim's consistent read follows the reference (DESIGN.md, "The
    // collector and the adder"). A hash from the cache (almost always a
    // redelivery) reads the row first: it likely exists.
    let start = if fingerprint.source == FingerprintSource::Cached {
        Start::Unknown
    } else {
        Start::Headed(Seen::Holds(bytes_of(head, None)))
    };
    let keyed = Keyed {
        bytes: bytes_of(head, Some(fingerprint)),
        wanted,
    };
    let referenced = match reconcile_version(app, &version, Some(keyed), start).await {
        Ok(referenced) => referenced,
        Err(err) => {
            // Contended by other hints of the version: busy, not failed.
            let outcome = if err.contended {
                Outcome::Busy
            } else {
                Outcome::Failed
            };
            return RecordDone::of(unclaimed.report(Some(fingerprint), outcome, &err.message));
        }
    };
    collect_now(app, &referenced.released).await;
    if let Some(stale) = referenced.stale {
        let reason = format!("{stale}: its outputs are not referenced by this version");
        return RecordDone::of(unclaimed.report(Some(fingerprint), Outcome::Skipped, &reason));
    }
    let mut reports = run_jobs(app, batch, invocation, queue_url, rules, identified, &referenced.added).await;
    // The upload whose delivery started a split: the execution ran the job
    // for it, which its walk finds done.
    if let Some(ran) = walk.ran {
        for report in reports.iter_mut() {
            if report.job_key == ran && report.outcome == Outcome::Reused {
                report.outcome = Outcome::Ran;
            }
        }
    }
    let mut hand_on = None;
    if rules.iter().any(|rule| !app.config.chained_to(rule).is_empty()) {
        let roots = rules.iter().copied().zip(reports.iter().cloned()).collect();
        let downstream = Downstream {
            app,
            batch,
            invocation,
            version: &version,
            head,
            queue_url,
            hand_ons,
        };
        let (mut chained, pending) = downstream.run(roots).await;
        reports.append(&mut chained);
        hand_on = pending;
    }
    // A recipe the hand-on named that this configuration's pipeline for
    // the key no longer has (a deployment changed the recipes) is
    // reported so, not dropped.
    if !walk.handed_on.is_empty() {
        let roots: Vec<usize> = rules.iter().map(|rule| rule.index).collect();
        let pipeline = app.config.graph.pipeline_of(&roots);
        let dropped: Vec<String> = walk
            .handed_on
            .iter()
            .filter(|name| !pipeline.iter().any(|&i| app.config.recipes[i].name == **name))
            .cloned()
            .collect();
        reports.extend(unmatched(app, &dropped, &unclaimed.object));
    }
    for report in &reports {
        log_job(report, unclaimed.message_id, &unclaimed.object);
    }
    let published = publish_if_complete(app, &version, head, fingerprint, &reports).await;
    RecordDone {
        reports,
        error: published.err(),
        hand_on,
    }
}

/// Where a record's pipeline is walked: its batch and invocation, the
/// queue its message came from, and the hand-ons behind it.
#[derive(Clone, Copy)]
struct Walk<'a> {
    batch: &'a BatchJobs,
    invocation: &'a Invocation,
    queue_url: Option<&'a str>,
    hand_ons: u32,
    /// The recipes a hand-on named (none for S3's records).
    handed_on: &'a [String],
    /// The job a split's execution ran for this version ([`HandOn::ran`]).
    ran: Option<&'a str>,
}

/// The version's jobs, one per recipe: claimed and run (or reused) once
/// per batch. A job another record of the batch settled is read again
/// when this record's reference (`added`) came after that read.
async fn run_jobs(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    queue_url: Option<&str>,
    rules: &[&RecipeRule],
    identified: &Identified,
    added: &[String],
) -> Vec<JobReport> {
    let fingerprint = &identified.fingerprint;
    let mut reports = Vec::with_capacity(rules.len());
    for rule in rules {
        let job_key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
        let run = JobRun {
            app,
            invocation,
            rule,
            job_key: &job_key,
            bytes: &identified.bytes,
            fingerprint,
            queue_url,
        };
        reports.push(run.run_in(batch, added).await);
    }
    reports
}

/// A record's recipes when no job of it is claimed: each reported with one
/// outcome and logged.
struct Unclaimed<'a> {
    rules: &'a [&'a RecipeRule],
    started: Instant,
    message_id: &'a str,
    object: ObjectRef,
}

impl Unclaimed<'_> {
    /// Every recipe's job with `outcome`; without an input hash (`None`)
    /// there is no job key.
    fn report(
        &self,
        fingerprint: Option<&Fingerprint>,
        outcome: Outcome,
        reason: &str,
    ) -> Vec<JobReport> {
        let reports: Vec<JobReport> = self
            .rules
            .iter()
            .map(|rule| JobReport {
                job_key: fingerprint
                    .map(|f| job_key(&f.input_hash, &rule.recipe_hash))
                    .unwrap_or_default(),
                recipe: rule.name.clone(),
                step: rule.recipe.step.clone(),
                version: rule.recipe.version,
                outcome,
                attempt: 0,
                duration_ms: elapsed_ms(self.started),
                reason: Some(reason.to_string()),
                busy_until_ms: None,
                input_hash_source: fingerprint.map(|f| f.source),
                outputs: None,
            })
            .collect();
        for report in &reports {
            log_job(report, self.message_id, &self.object);
        }
        reports
    }
}

/// A null delete marker's key: its null version (`marker` names it) is
/// reconciled as a removed version, and under
/// `MEDIAONCE_RELEASE_ON_DELETE_MARKER` every listed version the marker
/// hides too. Returns the jobs released.
async fn null_version_removed(app: &App, marker: &VersionName) -> Result<Vec<String>, String> {
    let mut released = reconcile_version(app, marker, None, Start::Unknown)
        .await
        .map_err(|err| err.to_string())?
        .released;
    if app.config.release_on_delete_marker {
        released.extend(reconcile_every_version(app, marker).await?);
    }
    Ok(released)
}

/// A version removed for good under `MEDIAONCE_RELEASE_ON_DELETE_MARKER`:
/// reconciled, and when its removal leaves a delete marker the key's
/// current entry, every listed version too. Deleting the newest version
/// can bring an older marker back to the top, and S3 sends no event for
/// that. A version the marker's own event kept, because the two were
/// written in the same second (`hidden_by_marker`), is hidden beyond
/// doubt now and is released (LIFECYCLE_SEED=12704185757626185339 left
/// its reference for good). Returns the jobs released.
async fn removed_releasing_on_markers(
    app: &App,
    version: &VersionName,
) -> Result<Vec<String>, String> {
    let mut released = reconcile_version(app, version, None, Start::Unknown)
        .await
        .map_err(|err| err.to_string())?
        .released;
    let history = app
        .store
        .history_of(&version.bucket, &version.key)
        .await
        .map_err(|e| e.to_string())?;
    if history.iter().any(|e| e.delete_marker && e.is_latest) {
        released.extend(reconcile_every_version(app, version).await?);
    }
    Ok(released)
}

/// Every listed version of `marker`'s key reconciled (a delete marker,
/// with `MEDIAONCE_RELEASE_ON_DELETE_MARKER`): those the marker hides are
/// released; one written after it keeps its references. Returns the jobs
/// released.
async fn reconcile_every_version(app: &App, marker: &VersionName) -> Result<Vec<String>, String> {
    let versions = app
        .store
        .versions_of(&marker.bucket, &marker.key)
        .await
        .map_err(|e| e.to_string())?;
    let mut released = Vec::new();
    for version_id in versions {
        let version = VersionName {
            version_id,
            ..marker.clone()
        };
        released.extend(
            reconcile_version(app, &version, None, Start::Unknown)
                .await
                .map_err(|e| e.to_string())?
                .released,
        );
    }
    Ok(released)
}

/// HeadObject of the record's object version; `Err` with the outcome when
/// there is nothing to claim.
///
/// A record without a version id names the key's current version, or its
/// `null` version: S3's own event of an object put before versioning was
/// enabled has no version id, and by the time it is handled newer versions
/// (or a delete marker) may stand over it. So when the current version is
/// another (a real version id) or there is none, and the record has an
/// ETag, the `null` version is headed too: holding the record's bytes, it
/// is the version the record names, read as `versionId=null`.
async fn head_for_record(
    app: &App,
    record: &S3Record,
    object: &ObjectRef,
) -> Result<ObjectHead, (Outcome, String)> {
    let head = app
        .store
        .head(object)
        .await
        .map_err(|err| (Outcome::Failed, err.to_string()))?;
    let over_null = object.version_id.is_none()
        && record.etag.is_some()
        && head.as_ref().is_none_or(|h| h.version_id.is_some());
    let null_version = if over_null {
        head_null_version(app, object)
            .await
            .map_err(|err| (Outcome::Failed, err))?
            .filter(|h| !replaced_since_event(record.etag.as_deref(), None, h))
    } else {
        None
    };
    match (null_version, head) {
        (Some(null), _) => Ok(null),
        (None, Some(head))
            if replaced_since_event(
                record.etag.as_deref(),
                record.version_id.as_deref(),
                &head,
            ) =>
        {
            Err((
                Outcome::Skipped,
                format!(
                    "{object} was replaced since the event (ETag {} is now {})",
                    record.etag.as_deref().unwrap_or(""),
                    head.etag
                ),
            ))
        }
        (None, Some(head)) => Ok(head),
        (None, None) => Err((Outcome::Skipped, format!("{object} is gone (NoSuchKey)"))),
    }
}
