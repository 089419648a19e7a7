//! FIFO queues: a failed message fails the later messages of its message
//! group in the batch, so the group's order is kept; other groups go on.

mod common;

use aws_sdk_sqs::types::QueueAttributeName;
use common::{failed_ids, lambda_message, queue_arn, receive_from, unique, Options, Pipeline};
use mediaonce::handler::Outcome;

#[tokio::test]
async fn a_failure_holds_back_the_rest_of_its_group_only() {
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"counted-probe","version":1,"params":{}}]"#.into()),
        ..Options::default()
    })
    .await;
    // S3 cannot notify a FIFO queue, so the notifications S3 sent to the
    // standard queue are forwarded to a FIFO queue, as a router would.
    p.put("a1.bin", b"group a, second", true).await;
    p.put("b1.bin", b"group b, first", true).await;
    let notifications = p.receive(2).await;
    let body_of = |key: &str| {
        notifications
            .iter()
            .find(|m| m.body.as_deref().unwrap().contains(key))
            .and_then(|m| m.body.clone())
            .unwrap()
    };

    let fifo_url = p
        .sqs
        .create_queue()
        .queue_name(format!("{}.fifo", unique("f")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let fifo_arn = queue_arn(&p.sqs, &fifo_url).await;
    let sends = [
        ("a", "{\"not\": \"an S3 notification\"}".to_string()),
        ("a", body_of("a1.bin")),
        ("b", body_of("b1.bin")),
    ];
    for (group, body) in &sends {
        p.sqs
            .send_message()
            .queue_url(&fifo_url)
            .message_group_id(*group)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    let mut batch = Vec::new();
    for _ in 0..20 {
        if batch.len() == 3 {
            break;
        }
        batch.extend(
            receive_from(&p.sqs, &fifo_url)
                .await
                .into_iter()
                .map(|m| lambda_message(m, &fifo_arn)),
        );
    }
    assert_eq!(batch.len(), 3);
    let ids: Vec<String> = batch
        .iter()
        .map(|m| m.message_id.clone().unwrap())
        .collect();
    let group_of = |i: usize| batch[i].attributes["MessageGroupId"].clone();
    let (a_bad, a_good, b_good) = (
        (0..3)
            .find(|&i| group_of(i) == "a" && batch[i].body.as_deref().unwrap().contains("not"))
            .unwrap(),
        (0..3)
            .find(|&i| group_of(i) == "a" && batch[i].body.as_deref().unwrap().contains("a1.bin"))
            .unwrap(),
        (0..3).find(|&i| group_of(i) == "b").unwrap(),
    );
    assert!(a_bad < a_good, "SQS delivers a group in order");

    let report = p.handle(batch).await;
    let mut failed = failed_ids(&report);
    failed.sort();
    let mut expected = vec![ids[a_bad].clone(), ids[a_good].clone()];
    expected.sort();
    assert_eq!(failed, expected, "{report:?}");
    // The held-back message did not run; group b did.
    assert_eq!(p.counted.runs(), 1);
    assert_eq!(report.messages[b_good].jobs[0].outcome, Outcome::Ran);
    assert!(report.messages[a_good].jobs.is_empty());
    assert!(report.messages[a_good]
        .error
        .as_deref()
        .unwrap()
        .contains("earlier message of its FIFO group"));
}

/// Issue 41 (a review): what mediaonce sends to a FIFO queue is
/// deduplicated by its cause and body, not its body alone. A hand-on's
/// body repeats (a version handed on by a walk, then by a split's end,
/// `handOns: 1` both times), and deduplicating by the body dropped the
/// second, leaving the version without its event. The same cause and body
/// twice (a send retried) is one message.
#[tokio::test]
async fn messages_to_a_fifo_queue_are_one_per_cause_and_body() {
    let p = Pipeline::new(Options::default()).await;
    let fifo_url = p
        .sqs
        .create_queue()
        .queue_name(format!("{}.fifo", unique("sent")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let queue = mediaonce::queue::Queue::sqs(p.sqs.clone());
    let body = r#"{"mediaonce":"pipeline/1","bucket":"in","key":"a.mp4","versionId":null,"eTag":"e","size":1,"recipes":["hls"],"handOns":1}"#;
    let group = mediaonce::queue::message_group("in", "a.mp4");
    for cause in [
        "walk-of-message-1",
        "walk-of-message-1",
        "end-of-split-owner-7",
    ] {
        let message = mediaonce::queue::Outgoing {
            body,
            group: &group,
            cause,
        };
        queue.send(&fifo_url, &message).await.unwrap();
    }
    let mut delivered = 0;
    for _ in 0..5 {
        let got = receive_from(&p.sqs, &fifo_url).await;
        for message in &got {
            assert_eq!(message.body(), Some(body));
            p.sqs
                .delete_message()
                .queue_url(&fifo_url)
                .receipt_handle(message.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        delivered += got.len();
    }
    assert_eq!(delivered, 2, "one per cause");
}
