//! Step Functions on LocalStack: the split's state machine, as the
//! template deploys it.

use aws_sdk_sfn::types::StateMachineType;

use super::unique;

/// The definition the template deploys.
pub const DEFINITION: &str = include_str!("../../statemachine/hls-split.asl.json");

/// A fresh state machine of the split's definition: its ARN.
pub async fn split_machine(sfn: &aws_sdk_sfn::Client) -> String {
    sfn.create_state_machine()
        .name(unique("hls-split"))
        .definition(DEFINITION)
        .role_arn("arn:aws:iam::000000000000:role/mediaonce-split")
        .r#type(StateMachineType::Standard)
        .send()
        .await
        .expect("the definition is accepted")
        .state_machine_arn
}

/// A fresh standard queue: its URL.
pub async fn queue(sqs: &aws_sdk_sqs::Client, name: &str) -> String {
    sqs.create_queue()
        .queue_name(unique(name))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url")
}
