//! Step Functions in a split world: the state machine's executions moved
//! on as its definition says (`simulate::machine`), their task messages on
//! the queue, and the template's EventBridge event of an execution that
//! closed without succeeding.

use super::{sqs, World};
use crate::executions::ExecutionStatus;

impl World {
    /// Step Functions moves the split's executions on: tasks answered or
    /// timed out lead to the next, each a message on the queue (a retry's
    /// after its backoff). Whether anything moved.
    pub(super) fn states(&mut self) -> bool {
        let now = self.now();
        let Some(machine) = self.machine.as_mut() else {
            return false;
        };
        let ended = machine.counts.executions_succeeded + machine.counts.executions_failed;
        let started = machine.counts.executions_started;
        let sends = machine.step(now);
        let moved = !sends.is_empty()
            || machine.counts.executions_succeeded + machine.counts.executions_failed != ended
            || machine.counts.executions_started != started;
        if !moved {
            return false;
        }
        let running = machine.running();
        let mut kinds: Vec<String> = sends.iter().map(|(_, body)| sqs::describe(body)).collect();
        let closed: Vec<String> = machine
            .ended()
            .iter()
            .filter(|arn| !self.closed.contains(*arn))
            .cloned()
            .collect();
        for (at, body) in sends {
            self.enqueue(body, at.saturating_sub(now));
        }
        // The template's rule: an execution that closed without
        // succeeding is an event on the queue.
        for arn in closed {
            let executions = &self.parts.executions;
            let status = executions.status_of(&arn);
            if status != Some(ExecutionStatus::Succeeded) {
                let input = executions.started().remove(&arn);
                kinds.push(format!(
                    "{status:?} {}",
                    &arn[arn.len().saturating_sub(4)..]
                ));
                self.enqueue(status_change(&arn, input), 0);
            }
            self.closed.insert(arn);
        }
        self.act(
            "states",
            0,
            format!(
                "step functions: {running} running, sent [{}]",
                kinds.join(", ")
            ),
        );
        true
    }
}

/// EventBridge's event of an execution of the split's state machine that
/// closed without succeeding, as the template's rule delivers it.
pub(super) fn status_change(arn: &str, input: Option<String>) -> String {
    let (source, detail_type) = crate::pipeline::split::STATUS_CHANGE;
    serde_json::json!({
        "version": "0",
        "source": source,
        "detail-type": detail_type,
        "detail": {
            "executionArn": arn,
            "stateMachineArn": crate::simulate::machine::MACHINE_ARN,
            "status": "FAILED",
            "input": input,
        },
    })
    .to_string()
}
