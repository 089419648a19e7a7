//! SQS as the explorer models it: a message is invisible for its
//! visibility while an invocation holds it, comes back after the busy
//! delay the handler asked for or its visibility, and is dead-lettered at
//! its fifth receive; an invocation takes one to three visible messages.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::Value;

use super::{
    Running, World, ACTOR, FUNCTION_TIMEOUT_MS, INJECTED_FAILURE, MAX_RECEIVES, QUEUE_ARN,
    VISIBILITY_MS,
};
use crate::handler::{handle_batch, BatchReport, Invocation, JobReport, Outcome};

/// A message in the simulated queue.
#[derive(Debug, Clone)]
pub(super) struct Message {
    pub(super) id: String,
    pub(super) body: String,
    pub(super) visible_at: u64,
    pub(super) receives: u32,
    /// Receives that ended with their invocation's crash (or timeout), or
    /// with a step's injected failure.
    pub(super) faults: u32,
    /// Receives that found a job of it busy.
    pub(super) busy: u32,
    /// The invocation it was last handed to, and the receipt.
    pub(super) holder: Option<(u64, String)>,
}

impl World {
    pub(super) fn enqueue(&mut self, body: String, delay_ms: u64) {
        self.next_message += 1;
        self.messages.push(Message {
            id: format!("m-{}", self.next_message),
            body,
            visible_at: self.now() + delay_ms,
            receives: 0,
            faults: 0,
            busy: 0,
            holder: None,
        });
    }

    /// An invocation of the handler on up to three visible messages.
    pub(super) fn invoke(&mut self) {
        self.next_actor += 1;
        let actor = self.next_actor;
        let now = self.now();
        let mut picked: Vec<usize> = (0..self.messages.len())
            .filter(|&i| self.messages[i].holder.is_none() && self.messages[i].visible_at <= now)
            .collect();
        self.rng.shuffle(&mut picked);
        picked.truncate(1 + self.rng.usize(0..3));
        let mut records = Vec::new();
        let mut names = Vec::new();
        for i in picked {
            self.receipts += 1;
            let receipt = format!("r-{}", self.receipts);
            let message = &mut self.messages[i];
            message.receives += 1;
            message.visible_at = now + VISIBILITY_MS;
            message.holder = Some((actor, receipt.clone()));
            let mut sqs = SqsMessage::default();
            sqs.message_id = Some(message.id.clone());
            sqs.receipt_handle = Some(receipt);
            sqs.body = Some(message.body.clone());
            sqs.event_source_arn = Some(QUEUE_ARN.to_string());
            sqs.attributes.insert(
                "ApproximateReceiveCount".into(),
                message.receives.to_string(),
            );
            names.push(format!("{} ({})", message.id, describe(&message.body)));
            records.push(sqs);
        }
        let mut event = SqsEvent::default();
        event.records = records;
        let invocation = Invocation {
            request_id: format!("inv-{actor}"),
            deadline_ms: Some(now + FUNCTION_TIMEOUT_MS),
            timeout_ms: Some(FUNCTION_TIMEOUT_MS),
        };
        let app = self.app.clone();
        let skew = self.skew(actor);
        names.push(format!("clock {skew:+} ms"));
        let handle = tokio::spawn(ACTOR.scope(actor, handle_batch(app, event, invocation)));
        let started = self.report.steps;
        self.actors.insert(
            actor,
            Running::Invocation(handle, started, self.deployment.generation),
        );
        self.deadlines.insert(actor, now + FUNCTION_TIMEOUT_MS);
        self.act(
            "invoke",
            actor,
            format!("invocation of {}", names.join(", ")),
        );
    }

    /// A finished invocation: acknowledged messages deleted, the others
    /// back after their delay or visibility, or to the dead-letter queue.
    pub(super) fn invoked(
        &mut self,
        actor: u64,
        (started, generation): (u64, u64),
        report: &BatchReport,
    ) {
        let failed: Vec<String> = report
            .response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        let now = self.now();
        let mut acked = Vec::new();
        let mut dead = 0;
        let mut by_faults = 0;
        let mut dead_lettered = Vec::new();
        let mut poisoned_dead = 0;
        let poisoned = messages_where(report, |j| j.outcome == Outcome::Poisoned);
        let busy = messages_where(report, |j| j.outcome == Outcome::Busy);
        let injected = messages_where(report, |j| {
            j.reason
                .as_deref()
                .is_some_and(|r| r.contains(INJECTED_FAILURE))
        });
        self.messages.retain_mut(|message| {
            let Some((holder, receipt)) = &message.holder else {
                return true;
            };
            if *holder != actor {
                return true;
            }
            if !failed.contains(&message.id) {
                acked.push((message.id.clone(), message.body.clone()));
                return false;
            }
            if injected.contains(&message.id.as_str()) {
                message.faults += 1;
            } else if busy.contains(&message.id.as_str()) {
                message.busy += 1;
            }
            if message.receives >= MAX_RECEIVES {
                dead += 1;
                if poisoned.contains(&message.id.as_str()) {
                    poisoned_dead += 1;
                } else if message.faults >= 3
                    || (message.faults >= 1 && message.faults + message.busy >= MAX_RECEIVES)
                {
                    by_faults += 1;
                    dead_lettered.push(message.body.clone());
                }
                return false;
            }
            let delay = self
                .parts
                .queue
                .delay_of(receipt)
                .map(|s| s.max(0) as u64 * 1_000);
            message.visible_at = now + delay.unwrap_or(VISIBILITY_MS);
            message.holder = None;
            true
        });
        self.report.dead_letters += dead;
        self.report.dead_letters_by_faults += by_faults;
        for body in dead_lettered {
            // A split's task: every version of its job stops where the
            // execution leaves it.
            let value: Value = serde_json::from_str(&body).unwrap_or_default();
            if let Some(job) = value["job"]["key"].as_str() {
                for live in self.inputs.values_mut() {
                    if live.jobs.first().map(String::as_str) == Some(job) {
                        live.dead_lettered = true;
                    }
                }
                continue;
            }
            let (key, version) = target_of(&body);
            for live in self.inputs.values_mut() {
                if key.as_deref() == Some(live.key.as_str())
                    && (version.is_none() || version == live.version)
                {
                    live.dead_lettered = true;
                }
            }
        }
        self.report.dead_letters_poisoned += poisoned_dead;
        // A create (or a hand-on) acknowledged for the bytes a key holds,
        // by an invocation that began after they were written (so every
        // HEAD of it saw them): promised; walked past the root unless a
        // job of it waits on a split.
        let waiting = messages_where(report, |j| j.outcome == Outcome::Waiting);
        for (id, body) in acked {
            let value: Value = serde_json::from_str(&body).unwrap_or_default();
            let object = &value["Records"][0]["s3"]["object"];
            let field = |name: &str| object[name].as_str().or(value[name].as_str());
            let (key, etag, version) = (field("key"), field("eTag"), field("versionId"));
            for live in self.inputs.values_mut() {
                if started > live.written
                    && !live.hidden
                    && generation == self.deployment.generation
                    && key == Some(live.key.as_str())
                    && etag == Some(live.etag.as_str())
                    && version.filter(|v| *v != "null") == live.version.as_deref()
                {
                    live.promised = true;
                    live.walked |= !waiting.contains(&id.as_str());
                }
            }
        }
        let outcomes: Vec<String> = report
            .jobs()
            .map(|j| {
                let reason = j.reason.as_deref().unwrap_or("");
                format!(
                    "{} {}: {}",
                    &j.job_key[..j.job_key.len().min(8)],
                    j.outcome.as_str(),
                    &reason[..reason.len().min(120)]
                )
            })
            .collect();
        self.act(
            "done",
            actor,
            format!(
                "finished: {} failed, {dead} dead-lettered [{}]",
                failed.len(),
                outcomes.join("; ")
            ),
        );
    }
}

/// The messages of `report` one of whose jobs `is`.
fn messages_where(report: &BatchReport, is: impl Fn(&JobReport) -> bool) -> Vec<&str> {
    report
        .messages
        .iter()
        .filter(|m| m.jobs.iter().any(&is))
        .map(|m| m.message_id.as_str())
        .collect()
}

/// The object version a message is about: an S3 notification's, or a
/// hand-on's (`None` version: the key's every one).
pub(super) fn target_of(body: &str) -> (Option<String>, Option<String>) {
    let value: Value = serde_json::from_str(body).unwrap_or_default();
    let object = &value["Records"][0]["s3"]["object"];
    let key = object["key"].as_str().or(value["key"].as_str());
    let version = object["versionId"]
        .as_str()
        .or(value["versionId"].as_str())
        .filter(|v| *v != "null");
    (key.map(str::to_owned), version.map(str::to_owned))
}

/// A message, in a few words: what happened to which key.
pub(super) fn describe(body: &str) -> String {
    let value: Value = serde_json::from_str(body).unwrap_or_default();
    if let (Some(task), Some(job)) = (value["mediaonce"].as_str(), value["job"]["key"].as_str()) {
        let span = value["span"]["index"]
            .as_u64()
            .map(|i| format!(" chunk {i}"))
            .unwrap_or_default();
        let execution = value["execution"].as_str().unwrap_or_default();
        let execution = &execution[execution.len().saturating_sub(4)..];
        return format!(
            "{task} {}{span} (execution …{execution})",
            &job[..job.len().min(8)]
        );
    }
    if let Some(arn) = value["detail"]["executionArn"].as_str() {
        return format!("execution …{} closed", &arn[arn.len().saturating_sub(4)..]);
    }
    let record = &value["Records"][0];
    let key = record["s3"]["object"]["key"]
        .as_str()
        .or(value["key"].as_str())
        .unwrap_or("?");
    let what = match record["eventName"].as_str() {
        Some(name) if name.starts_with("ObjectCreated") => "create",
        Some(name) if name.starts_with("ObjectRemoved") => "delete",
        _ => value["mediaonce"].as_str().unwrap_or("other"),
    };
    let etag = record["s3"]["object"]["eTag"]
        .as_str()
        .or(value["eTag"].as_str())
        .map(|e| format!(" {}", &e[..e.len().min(6)]))
        .unwrap_or_default();
    format!("{what} {key}{etag}")
}
