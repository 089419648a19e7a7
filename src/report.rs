//! What a batch came to: per job, per message, and the partial batch
//! response derived from them. Pure.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse};

/// What a job came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome {
    /// This worker ran the step and marked the job done.
    Ran,
    /// The job was already done: its output is reused.
    Reused,
    /// Another worker holds it (or took it over): the message comes back.
    Busy,
    /// The step or a service call failed: the message comes back.
    Failed,
    /// Nothing to do: the object is gone or was replaced since the event.
    Skipped,
    /// Failed on every allowed attempt: not run again; the message goes to
    /// the DLQ through the queue's redrive policy. What the function itself
    /// could not handle (runs that died, failures not the input's fault).
    Poisoned,
    /// The input is one no run can process (undecodable, truncated, a
    /// pixel bomb, an unsupported format): a business outcome, not a
    /// fault. Recorded (the row is `failed`, permanent), its failure event
    /// published, and the message acknowledged: it never reaches the DLQ.
    Unprocessable,
    /// Not started: too close to the invocation deadline. The message comes back.
    Deferred,
    /// Not started here: a chained job with no time left in this
    /// invocation, handed on to the job queue in a hand-on message
    /// ([`crate::pipeline::HandOn`]); the message that carried it is done.
    #[serde(rename = "handed-on")]
    HandedOn,
    /// Split into chunk jobs that run in other invocations
    /// (DESIGN.md, "Chunked HLS"): the message is done, and when the job
    /// ends the version is handed on ([`crate::pipeline::HandOn`]) to
    /// walk its pipeline again.
    Waiting,
    /// A recipe a hand-on message named that this configuration no longer
    /// runs on the key (a deployment changed the recipes since the
    /// pipeline began): nothing runs for it, and its version's event says
    /// so (failed, class `configuration`). Terminal; the message is done.
    Unmatched,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Reused => "reused",
            Outcome::Busy => "busy",
            Outcome::Failed => "failed",
            Outcome::Skipped => "skipped",
            Outcome::Poisoned => "poisoned",
            Outcome::Unprocessable => "unprocessable",
            Outcome::Deferred => "deferred",
            Outcome::HandedOn => "handed-on",
            Outcome::Waiting => "waiting",
            Outcome::Unmatched => "unmatched",
        }
    }

    /// Whether the message carrying this job must be delivered again.
    pub fn must_retry(self) -> bool {
        matches!(
            self,
            Outcome::Busy | Outcome::Failed | Outcome::Poisoned | Outcome::Deferred
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobReport {
    /// Empty when the object could not be fingerprinted (gone, unreadable).
    pub job_key: String,
    /// The recipe's name (its step's, when it has none).
    pub recipe: String,
    pub step: String,
    /// The recipe's `version`: with its name and step, the rule that made
    /// the job (unnamed recipes of one step share a name).
    pub version: u64,
    pub outcome: Outcome,
    /// The attempt that ran (or the row's attempts, for reused and busy).
    pub attempt: u64,
    pub duration_ms: u64,
    /// Why it failed or was skipped.
    pub reason: Option<String>,
    /// When busy: when the holder's lease ends.
    pub busy_until_ms: Option<u64>,
    /// Where the job's input hash came from; `None` when it has none.
    pub input_hash_source: Option<crate::fingerprint::FingerprintSource>,
    /// Where its outputs are (`s3://bucket/prefix/`), when it is done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<String>,
}

impl JobReport {
    /// The report for another message of the batch that carries the same
    /// job: the step ran once, for the first; the others reuse its output.
    pub(crate) fn seen_again(&self) -> JobReport {
        let mut report = self.clone();
        if report.outcome == Outcome::Ran {
            report.outcome = Outcome::Reused;
            report.reason = Some("ran for an earlier message of this batch".into());
        }
        report
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MessageReport {
    pub message_id: String,
    pub jobs: Vec<JobReport>,
    /// The body could not be used (or the message's task panicked).
    pub error: Option<String>,
}

impl MessageReport {
    pub fn must_retry(&self) -> bool {
        self.error.is_some() || self.jobs.iter().any(|j| j.outcome.must_retry())
    }

    /// When the last lease of its busy jobs ends, if any is busy.
    pub fn busy_until_ms(&self) -> Option<u64> {
        self.jobs.iter().filter_map(|j| j.busy_until_ms).max()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BatchReport {
    pub messages: Vec<MessageReport>,
    /// What the batch cost in calls and bytes.
    pub usage: BatchUsage,
}

/// What a batch cost: measured on the app's clients while it ran (batches
/// of one app are not run at once in Lambda; in a test that runs several
/// at once, each counts the others' too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchUsage {
    pub input_bytes_read: u64,
    pub output_bytes_written: u64,
    pub dynamodb_calls: u64,
    /// Contended DynamoDB calls retried in-process (transaction conflicts
    /// and throttles): the price of contention, in calls.
    pub dynamodb_retries: u64,
    /// Completion events published, and publications that failed.
    pub events_published: u64,
    pub event_publish_failures: u64,
}

impl BatchUsage {
    /// The usage between `before` and these counts.
    pub fn since(&self, before: &BatchUsage) -> BatchUsage {
        BatchUsage {
            input_bytes_read: self.input_bytes_read.saturating_sub(before.input_bytes_read),
            output_bytes_written: self
                .output_bytes_written
                .saturating_sub(before.output_bytes_written),
            dynamodb_calls: self.dynamodb_calls.saturating_sub(before.dynamodb_calls),
            dynamodb_retries: self
                .dynamodb_retries
                .saturating_sub(before.dynamodb_retries),
            events_published: self
                .events_published
                .saturating_sub(before.events_published),
            event_publish_failures: self
                .event_publish_failures
                .saturating_sub(before.event_publish_failures),
        }
    }
}

impl BatchReport {
    /// The partial batch response: one failure per message to redeliver.
    pub fn response(&self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for message in self.messages.iter().filter(|m| m.must_retry()) {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = message.message_id.clone();
            response.batch_item_failures.push(failure);
        }
        response
    }

    pub fn jobs(&self) -> impl Iterator<Item = &JobReport> {
        self.messages.iter().flat_map(|m| m.jobs.iter())
    }

    /// How many jobs came to `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.jobs().filter(|j| j.outcome == outcome).count()
    }

    /// A short table for a person (`mediaonce invoke --pretty`): the jobs
    /// by outcome, then one line per job (key prefix, step, outcome,
    /// duration, message), and each unusable message.
    pub fn summary(&self) -> String {
        const OUTCOMES: [Outcome; 11] = [
            Outcome::Ran,
            Outcome::Reused,
            Outcome::Busy,
            Outcome::Failed,
            Outcome::Skipped,
            Outcome::Poisoned,
            Outcome::Unprocessable,
            Outcome::Deferred,
            Outcome::HandedOn,
            Outcome::Waiting,
            Outcome::Unmatched,
        ];
        let by_outcome: Vec<String> = OUTCOMES
            .iter()
            .map(|&o| (o, self.count(o)))
            .filter(|(_, n)| *n > 0)
            .map(|(o, n)| format!("{} {n}", o.as_str()))
            .collect();
        let mut text = format!(
            "batch: {} message(s), {} job(s){}{}; {} message(s) come back\n",
            self.messages.len(),
            self.jobs().count(),
            if by_outcome.is_empty() { "" } else { ": " },
            by_outcome.join(", "),
            self.response().batch_item_failures.len()
        );
        if self.jobs().next().is_some() {
            text.push_str(&format!(
                "  {:<14} {:<14} {:<9} {:>8}  {}\n",
                "job", "step", "outcome", "ms", "message"
            ));
        }
        for message in &self.messages {
            for job in &message.jobs {
                let key = if job.job_key.len() > 12 {
                    format!("{}…", &job.job_key[..12])
                } else {
                    job.job_key.clone()
                };
                text.push_str(&format!(
                    "  {:<14} {:<14} {:<9} {:>8}  {}\n",
                    key,
                    job.step,
                    job.outcome.as_str(),
                    job.duration_ms,
                    message.message_id
                ));
            }
            if let Some(error) = &message.error {
                text.push_str(&format!("  message {}: {error}\n", message.message_id));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(outcome: Outcome, busy_until_ms: Option<u64>) -> JobReport {
        JobReport {
            job_key: "k".into(),
            recipe: "probe".into(),
            step: "probe".into(),
            version: 1,
            outcome,
            attempt: 1,
            duration_ms: 0,
            reason: None,
            busy_until_ms,
            input_hash_source: None,
            outputs: None,
        }
    }

    fn message(id: &str, jobs: Vec<JobReport>, error: Option<&str>) -> MessageReport {
        MessageReport {
            message_id: id.into(),
            jobs,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn the_response_names_exactly_the_messages_to_redeliver() {
        let batch = BatchReport {
            messages: vec![
                message(
                    "ran",
                    vec![job(Outcome::Ran, None), job(Outcome::Skipped, None)],
                    None,
                ),
                message("reused", vec![job(Outcome::Reused, None)], None),
                message("no-jobs", vec![], None),
                message(
                    "half-busy",
                    vec![job(Outcome::Ran, None), job(Outcome::Busy, Some(5))],
                    None,
                ),
                message("bad-body", vec![], Some("body is not JSON")),
                message("poisoned", vec![job(Outcome::Poisoned, None)], None),
                message("deferred", vec![job(Outcome::Deferred, None)], None),
                message("failed", vec![job(Outcome::Failed, None)], None),
            ],
            usage: BatchUsage::default(),
        };
        let ids: Vec<String> = batch
            .response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        assert_eq!(
            ids,
            ["half-busy", "bad-body", "poisoned", "deferred", "failed"]
        );
        assert_eq!(batch.count(Outcome::Ran), 2);
        assert_eq!(batch.messages[3].busy_until_ms(), Some(5));
    }

    #[test]
    fn the_summary_counts_outcomes_and_lists_each_job() {
        let mut ran = job(Outcome::Ran, None);
        ran.job_key = "3f9a2c1d0e4b5a6978".into();
        ran.duration_ms = 43;
        let batch = BatchReport {
            messages: vec![
                message("m-1", vec![ran, job(Outcome::Busy, Some(9))], None),
                message("m-2", vec![], Some("body is not JSON")),
            ],
            usage: BatchUsage::default(),
        };
        let summary = batch.summary();
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(
            lines[0],
            "batch: 2 message(s), 2 job(s): ran 1, busy 1; 2 message(s) come back"
        );
        assert!(lines[2].starts_with("  3f9a2c1d0e4b…  probe          ran             43  m-1"), "{summary}");
        assert!(lines[3].contains("busy"), "{summary}");
        assert_eq!(lines[4], "  message m-2: body is not JSON");
    }

    #[test]
    fn a_job_seen_again_in_the_batch_is_reused_not_ran() {
        assert_eq!(
            job(Outcome::Ran, None).seen_again().outcome,
            Outcome::Reused
        );
        assert_eq!(
            job(Outcome::Busy, Some(1)).seen_again().outcome,
            Outcome::Busy
        );
    }
}
