//! The explorer's SQS, EventBridge and Step Functions clients: the
//! recording and in-memory twins, each call first held at the gate, as
//! every DynamoDB and S3 call is (`FaultyTable`, `FaultyObjects`), so the
//! scheduler orders a hand-on's send, a busy delay, a completion event and
//! a split's start and task answers against everything else, and a crash
//! can fall between any two of them.

use std::sync::Arc;

use crate::bus::{BusClient, BusEvent, PublishError, RecordingBus};
use crate::executions::{
    ExecutionClient, ExecutionError, ExecutionProgress, ExecutionStatus, InMemoryExecutions,
};
use crate::faults::{Call, FaultPlan};
use crate::queue::{DelayError, Outgoing, QueueClient, RecordingQueue, SendError};

/// [`RecordingQueue`] behind the gate.
#[derive(Debug)]
pub struct GatedQueue {
    pub inner: Arc<RecordingQueue>,
    pub plan: Arc<FaultPlan>,
}

#[async_trait::async_trait]
impl QueueClient for GatedQueue {
    async fn send(&self, queue_url: &str, message: &Outgoing<'_>) -> Result<(), SendError> {
        self.plan.pass(Call::SendMessage, queue_url).await;
        self.inner.send(queue_url, message).await
    }

    async fn change_visibility(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), DelayError> {
        self.plan.pass(Call::ChangeVisibility, receipt_handle).await;
        self.inner
            .change_visibility(queue_url, receipt_handle, seconds)
            .await
    }
}

/// [`RecordingBus`] behind the gate.
#[derive(Debug)]
pub struct GatedBus {
    pub inner: Arc<RecordingBus>,
    pub plan: Arc<FaultPlan>,
}

#[async_trait::async_trait]
impl BusClient for GatedBus {
    async fn put_event(&self, event: &BusEvent) -> Result<(), PublishError> {
        self.plan.pass(Call::PutEvents, &event.detail_type).await;
        self.inner.put_event(event).await
    }
}

/// [`InMemoryExecutions`] behind the gate.
#[derive(Debug)]
pub struct GatedExecutions {
    pub inner: Arc<InMemoryExecutions>,
    pub plan: Arc<FaultPlan>,
}

/// The last part of an ARN or token, which names it in a trace.
fn tail(text: &str) -> &str {
    &text[text.len().saturating_sub(12)..]
}

#[async_trait::async_trait]
impl ExecutionClient for GatedExecutions {
    async fn start_execution(
        &self,
        machine_arn: &str,
        name: &str,
        input: &str,
    ) -> Result<String, ExecutionError> {
        self.plan.pass(Call::StartExecution, tail(name)).await;
        self.inner.start_execution(machine_arn, name, input).await
    }

    async fn describe_execution(
        &self,
        execution_arn: &str,
    ) -> Result<Option<ExecutionStatus>, ExecutionError> {
        self.plan
            .pass(Call::DescribeExecution, tail(execution_arn))
            .await;
        self.inner.describe_execution(execution_arn).await
    }

    async fn execution_progress(
        &self,
        execution_arn: &str,
    ) -> Result<ExecutionProgress, ExecutionError> {
        self.inner.execution_progress(execution_arn).await
    }

    async fn send_task_success(&self, token: &str, output: &str) -> Result<(), ExecutionError> {
        self.plan.pass(Call::SendTaskAnswer, token).await;
        self.inner.send_task_success(token, output).await
    }

    async fn send_task_failure(
        &self,
        token: &str,
        error: &str,
        cause: &str,
    ) -> Result<(), ExecutionError> {
        self.plan.pass(Call::SendTaskAnswer, token).await;
        self.inner.send_task_failure(token, error, cause).await
    }

    async fn send_task_heartbeat(&self, token: &str) -> Result<(), ExecutionError> {
        self.plan.pass(Call::SendTaskHeartbeat, token).await;
        self.inner.send_task_heartbeat(token).await
    }
}
