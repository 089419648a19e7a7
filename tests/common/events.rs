//! A bus on LocalStack's EventBridge whose rule sends every mediaonce
//! event to a queue of the test's: what an application subscribes.

use serde_json::Value;

use super::Pipeline;

/// A bus with a rule sending every mediaonce event to a new queue: the
/// bus's name and the queue's URL.
pub async fn subscribed_bus(p: &Pipeline) -> (String, String) {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let events = mediaonce::aws::eventbridge_client(&sdk);
    let bus = super::unique("bus");
    events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("create bus");
    let queue_url = p
        .sqs
        .create_queue()
        .queue_name(super::unique("app"))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url");
    let queue_arn = super::queue_arn(&p.sqs, &queue_url).await;
    events
        .put_rule()
        .name("mediaonce-completions")
        .event_bus_name(&bus)
        .event_pattern(r#"{"source": ["mediaonce"]}"#)
        .send()
        .await
        .expect("put rule");
    events
        .put_targets()
        .rule("mediaonce-completions")
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("app-queue")
                .arn(queue_arn)
                .build()
                .expect("target"),
        )
        .send()
        .await
        .expect("put targets");
    (bus, queue_url)
}

/// The next `count` events the application's queue receives, as
/// EventBridge delivers them.
pub async fn events(p: &Pipeline, queue_url: &str, count: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for _ in 0..20 {
        if got.len() >= count {
            break;
        }
        for message in super::receive_from(&p.sqs, queue_url).await {
            got.push(serde_json::from_str(message.body().unwrap()).expect("an event"));
        }
    }
    assert_eq!(got.len(), count, "{got:#?}");
    got
}
