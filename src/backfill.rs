//! Backfill: the objects already in a bucket, sent to the job queue as the
//! notifications S3 would have sent for them, so that the deployed
//! function runs a new recipe (or a new recipe version) over them
//! unchanged (`mediaonce backfill`). Running it twice costs only `reused`
//! jobs.

use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use crate::aws::describe_error;
pub use crate::event::created_notification;
use crate::queue::{deduplication_id, is_fifo_queue, message_group};

/// SQS's most messages in one SendMessageBatch.
const BATCH: usize = 10;

/// What to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillOptions {
    pub bucket: String,
    /// Only keys under this (empty: all).
    pub prefix: String,
    pub queue_url: String,
    /// Count only; send nothing.
    pub dry_run: bool,
    /// Resume after this key (S3's `StartAfter`).
    pub start_after: Option<String>,
}

/// Counts so far, for a progress display.
#[derive(Debug, Default)]
pub struct BackfillProgress {
    pub listed: AtomicU64,
    pub sent: AtomicU64,
}

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackfillSummary {
    pub listed: u64,
    pub sent: u64,
    /// The last key sent (or counted): `--start-after` resumes after it.
    pub last_key: Option<String>,
}

/// Lists every object under the prefix (all pages) and sends one
/// notification per object to the queue, ten to a SendMessageBatch.
/// Entries SQS refuses are sent again once; `Err` names what failed and
/// the last key sent, to resume from.
pub async fn backfill(
    s3: &aws_sdk_s3::Client,
    sqs: &aws_sdk_sqs::Client,
    options: &BackfillOptions,
    progress: &BackfillProgress,
) -> Result<BackfillSummary, String> {
    let mut summary = BackfillSummary::default();
    let mut token: Option<String> = None;
    loop {
        let page = s3
            .list_objects_v2()
            .bucket(&options.bucket)
            .prefix(&options.prefix)
            .set_start_after(options.start_after.clone())
            .set_continuation_token(token.clone())
            .send()
            .await
            .map_err(|e| {
                format!(
                    "ListObjectsV2 s3://{}/{} failed: {}{}",
                    options.bucket,
                    options.prefix,
                    describe_error(&e),
                    resume_hint(&summary)
                )
            })?;
        let objects: Vec<(String, String)> = page
            .contents()
            .iter()
            .filter_map(|object| {
                let key = object.key()?.to_string();
                let body = created_notification(
                    &options.bucket,
                    &key,
                    None,
                    object.e_tag().map(|e| e.trim_matches('"')),
                    object.size().map(|s| s.max(0) as u64),
                );
                Some((key, body))
            })
            .collect();
        summary.listed += objects.len() as u64;
        progress
            .listed
            .fetch_add(objects.len() as u64, Ordering::Relaxed);
        for chunk in objects.chunks(BATCH) {
            if !options.dry_run {
                send_batch(sqs, &options.queue_url, &options.bucket, chunk)
                    .await
                    .map_err(|e| format!("{e}{}", resume_hint(&summary)))?;
                summary.sent += chunk.len() as u64;
                progress
                    .sent
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            summary.last_key = chunk.last().map(|(key, _)| key.clone());
        }
        match page.next_continuation_token() {
            Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_string()),
            _ => return Ok(summary),
        }
    }
}

fn resume_hint(summary: &BackfillSummary) -> String {
    match &summary.last_key {
        Some(key) => format!(" (resume with --start-after {key:?})"),
        None => String::new(),
    }
}

/// One SendMessageBatch; the entries SQS refuses are sent once more.
async fn send_batch(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    bucket: &str,
    messages: &[(String, String)],
) -> Result<(), String> {
    let mut pending: Vec<usize> = (0..messages.len()).collect();
    for attempt in 0..2 {
        let entries = pending
            .iter()
            .map(|&i| {
                let (key, body) = &messages[i];
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body);
                if is_fifo_queue(queue_url) {
                    // One object's messages in its group; a backfill run
                    // again within SQS's five minutes sends each once.
                    entry = entry
                        .message_group_id(message_group(bucket, key))
                        .message_deduplication_id(deduplication_id("backfill", body));
                }
                entry.build().map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = sqs
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "SendMessageBatch to {queue_url} failed: {}",
                    describe_error(&e)
                )
            })?;
        let failed = output.failed();
        if failed.is_empty() {
            return Ok(());
        }
        if attempt == 1 {
            let first = &failed[0];
            let index: usize = first.id().parse().unwrap_or(0);
            return Err(format!(
                "SQS refused the message for {}: {} {}",
                messages.get(index).map_or("?", |m| m.0.as_str()),
                first.code(),
                first.message().unwrap_or_default()
            ));
        }
        pending = failed.iter().filter_map(|f| f.id().parse().ok()).collect();
    }
    Ok(())
}
