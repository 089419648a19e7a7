//! Collection: a job no object version references any more, once its grace
//! has passed, loses its outputs and then its row. DESIGN.md ("Collection")
//! has the argument that no referenced prefix is ever deleted.
//!
//! 1. The row moves `done` → `collecting` in one conditional write: `refs = 0`
//!    and the last release at or before the cut-off. A reference added in
//!    between makes the write fail; one added after it finds the row not
//!    `done` and waits (busy).
//! 2. Every object under the row's output prefix is deleted, a page at a
//!    time (ListObjectsV2, DeleteObjects), while the collector's lease
//!    lasts.
//! 3. The row is deleted, conditioned on still being this collection's.
//!
//! A collection that stops anywhere leaves a `collecting` row whose lease
//! passes: the next collection (or a claim, which runs the job again from
//! nothing) takes it over.
//!
//! Abandoned rows are collected the same way: a `running` row whose lease
//! ended a grace ago, or a `failed` one (not poisoned) untouched for a
//! grace: no message came back for them, because their object is gone.

use std::time::Duration;

use super::App;
use crate::config::split_s3_location;
use crate::ledger::{CollectDue, CollectRequest, Conditional, JobRow};

/// How long a collection may take before another may take it over.
pub const COLLECT_LEASE: Duration = Duration::from_secs(300);
/// No page of deletes starts with less than this left of the lease.
const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// What collecting a job came to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Collected {
    pub job_key: String,
    /// The objects deleted (or, in a dry run, that would be).
    pub deleted: Vec<String>,
    /// `collected`, `dry-run`, or why not (`not due: ...`).
    pub outcome: String,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl App {
    /// Collects `job_key` if it is due now. `Err` when a call fails (the
    /// row stays `collecting` until its lease passes, then is taken over).
    pub async fn collect(&self, job_key: &str) -> Result<Collected, String> {
        let now = self.now_ms();
        let owner = self.owner_token("collector");
        let lease_until_ms = now + millis(COLLECT_LEASE);
        let request = CollectRequest {
            job_key: job_key.to_string(),
            owner: owner.clone(),
            lease_until_ms,
            due: self.collect_due_at(now),
        };
        let row = match self.ledger.begin_collect(&request).await {
            Ok(Conditional::Applied(row)) => row,
            Ok(Conditional::Rejected(row)) => {
                return Ok(Collected {
                    job_key: job_key.to_string(),
                    deleted: Vec::new(),
                    outcome: format!("not due: {}", why_not(row.as_ref())),
                })
            }
            Err(err) => return Err(err.to_string()),
        };
        let (bucket, prefix) = prefix_of(&row)?;
        let mut deleted = Vec::new();
        loop {
            // Never past the lease: a collection taken over must not delete
            // what the next run writes.
            if self.now_ms() + millis(LEASE_MARGIN) >= lease_until_ms {
                return Err(format!(
                    "collecting {job_key}: the lease ran short after {} objects; \
                     the next collection finishes it",
                    deleted.len()
                ));
            }
            let (keys, _) = self
                .store
                .list_page(bucket, prefix, None)
                .await
                .map_err(|e| e.to_string())?;
            if keys.is_empty() {
                break;
            }
            self.store
                .delete_keys(bucket, &keys)
                .await
                .map_err(|e| e.to_string())?;
            deleted.extend(keys);
        }
        match self.ledger.end_collect(job_key, &owner).await {
            Ok(Conditional::Applied(())) => {
                tracing::info!(job_key, objects = deleted.len(), "collected");
                Ok(Collected {
                    job_key: job_key.to_string(),
                    deleted,
                    outcome: "collected".into(),
                })
            }
            Ok(Conditional::Rejected(row)) => Err(format!(
                "collecting {job_key}: the row changed under the collection ({})",
                why_not(row.as_ref())
            )),
            Err(err) => Err(err.to_string()),
        }
    }

    /// What is due at `now_ms`, with this configuration's grace and caps.
    fn collect_due_at(&self, now_ms: u64) -> CollectDue {
        CollectDue {
            before_ms: now_ms.saturating_sub(millis(self.config.gc_grace)),
            now_ms,
            max_attempts: self.config.max_attempts,
        }
    }

    /// Every job due for collection now; with `dry_run`, what would be
    /// deleted, touching nothing.
    pub async fn collect_due(&self, dry_run: bool) -> Result<Vec<Collected>, String> {
        let due = self
            .ledger
            .collectable(&self.collect_due_at(self.now_ms()))
            .await
            .map_err(|e| e.to_string())?;
        let mut collected = Vec::with_capacity(due.len());
        for row in due {
            if dry_run {
                let (bucket, prefix) = prefix_of(&row)?;
                let mut keys = Vec::new();
                let mut from: Option<String> = None;
                loop {
                    let (page, next) = self
                        .store
                        .list_page(bucket, prefix, from.as_deref())
                        .await
                        .map_err(|e| e.to_string())?;
                    keys.extend(page);
                    match next {
                        Some(next) => from = Some(next),
                        None => break,
                    }
                }
                collected.push(Collected {
                    job_key: row.job_key.clone(),
                    deleted: keys,
                    outcome: "dry-run".into(),
                });
            } else {
                collected.push(self.collect(&row.job_key).await?);
            }
        }
        Ok(collected)
    }
}

/// The bucket and key prefix a row's outputs are under, refused unless it
/// ends with the job's own key: collection never deletes anything else.
fn prefix_of(row: &JobRow) -> Result<(&str, &str), String> {
    let own = format!("{}/", row.job_key);
    match split_s3_location(&row.output_prefix) {
        Some((bucket, prefix)) if prefix.ends_with(&own) => Ok((bucket, prefix)),
        _ => Err(format!(
            "job {}: its output_prefix {:?} is not an s3://bucket/.../<job key>/ location: not collected",
            row.job_key, row.output_prefix
        )),
    }
}

fn why_not(row: Option<&JobRow>) -> String {
    match row {
        None => "no such job".into(),
        Some(row) => format!(
            "{} with refs {:?}, last released at {:?}",
            row.status.as_str(),
            row.refs,
            row.released_at_ms
        ),
    }
}
