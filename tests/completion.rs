//! Completion events on the emulators: LocalStack's EventBridge delivers
//! what the handler publishes, through a rule, to an SQS queue, as an
//! application would subscribe. Every upload gets its event (a reused one
//! too), a redelivery publishes the same event id again, and a job that
//! failed for good makes the failure event. (LocalStack accepts PutEvents
//! to a bus that does not exist, so a refused event bringing the message
//! back is proven on the recording bus, in the handler's unit tests.)

mod common;

use std::collections::HashMap;

use common::media::noise_png;
use common::{Options, Pipeline};
use mediaonce::config::ENV_EVENT_BUS;
use mediaonce::handler::Outcome;
use serde_json::Value;

const RECIPES: &str = r#"[
  {"name": "probe", "step": "probe", "version": 1, "params": {}},
  {"name": "thumbs", "step": "thumbnail", "version": 1, "params": {"widths": [32]},
   "match": {"suffix": ".jpg"}}
]"#;

/// A bus with a rule sending every mediaonce event to a new queue: the
/// bus's name and the queue's URL.
async fn subscribed_bus(p: &Pipeline) -> (String, String) {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let events = mediaonce::aws::eventbridge_client(&sdk);
    let bus = common::unique("bus");
    events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("create bus");
    let queue_url = p
        .sqs
        .create_queue()
        .queue_name(common::unique("app"))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url");
    let queue_arn = common::queue_arn(&p.sqs, &queue_url).await;
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
async fn events(p: &Pipeline, queue_url: &str, count: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for _ in 0..20 {
        if got.len() >= count {
            break;
        }
        for message in common::receive_from(&p.sqs, queue_url).await {
            got.push(serde_json::from_str(message.body().unwrap()).expect("an event"));
        }
    }
    assert_eq!(got.len(), count, "{got:#?}");
    got
}

fn job<'a>(event: &'a Value, recipe: &str) -> &'a Value {
    event["detail"]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["recipe"] == recipe)
        .unwrap_or_else(|| panic!("no job {recipe} in {event:#}"))
}

#[tokio::test]
async fn every_upload_hears_of_its_outputs_once_each_delivery_with_one_id() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = subscribed_bus(&p0).await;
    let p = Pipeline::new(Options {
        versioned: true,
        separate_output_bucket: true,
        recipes: Some(RECIPES.into()),
        vars: vec![(ENV_EVENT_BUS, bus.clone())],
    })
    .await;
    let png = noise_png(64, 48, 3);

    // An upload: both jobs ran; one success event with everything an
    // application records.
    let put = p.put("a.jpg", &png, true).await;
    let first = p.receive(1).await;
    let report = p.handle(first.clone()).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.usage.events_published, 1, "{report:?}");
    let event = &events(&p, &app_queue, 1).await[0];
    assert_eq!(event["source"], "mediaonce");
    assert_eq!(event["detail-type"], "Media Pipeline Succeeded");
    let detail = &event["detail"];
    assert_eq!(detail["bucket"], p.bucket.as_str());
    assert_eq!(detail["key"], "a.jpg");
    assert_eq!(detail["versionId"], put.version_id.as_deref().unwrap());
    assert_eq!(detail["status"], "succeeded");
    assert_eq!(
        detail["inputHash"],
        mediaonce::key::sha256_hex(&png).as_str()
    );
    assert_eq!(detail["inputHashSource"], "s3-checksum");
    let thumbs = job(event, "thumbs");
    assert_eq!(
        (&thumbs["step"], &thumbs["status"], &thumbs["outcome"]),
        (&"thumbnail".into(), &"done".into(), &"ran".into()),
        "{event:#}"
    );
    let key = thumbs["jobKey"].as_str().unwrap();
    assert_eq!(
        thumbs["outputPrefix"],
        format!("s3://{}/derived/{key}/", p.output_bucket).as_str()
    );
    let file = &thumbs["files"][0];
    assert_eq!(file["contentType"], "image/jpeg", "{event:#}");
    let stored = p
        .output(&format!("derived/{key}/{}", file["name"].as_str().unwrap()))
        .await;
    assert_eq!(
        (file["size"].as_u64(), file["sha256"].as_str()),
        (
            Some(stored.len() as u64),
            Some(mediaonce::key::sha256_hex(&stored).as_str())
        )
    );
    let first_id = detail["eventId"].as_str().unwrap().to_string();

    // The same message again (a redelivery): reused, and the same event
    // id, which the application deduplicates on.
    let again = p.send_raw(first[0].body.as_deref().unwrap()).await;
    let report = p.handle(vec![again]).await;
    assert!(
        report.jobs().all(|j| j.outcome == Outcome::Reused),
        "{report:?}"
    );
    let event = &events(&p, &app_queue, 1).await[0];
    assert_eq!(event["detail"]["eventId"], first_id.as_str());
    assert_eq!(job(event, "thumbs")["outcome"], "reused");

    // The same bytes under another key: reused, and told just the same
    // (its own event id: another object).
    p.put("b.jpg", &png, true).await;
    p.handle(p.receive(1).await).await;
    let event = &events(&p, &app_queue, 1).await[0];
    assert_eq!(event["detail"]["key"], "b.jpg");
    assert_eq!(job(event, "thumbs")["jobKey"], key);
    assert_ne!(event["detail"]["eventId"], first_id.as_str());

    // Bytes the thumbnail cannot read: it fails for good, the probe is
    // done, and the event says which failed and why. (The message still
    // goes on to the dead-letter queue, as a poisoned job's does; each
    // receive publishes the same event id.)
    p.put("bad.jpg", b"not an image at all", true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(report.count(Outcome::Poisoned), 1, "{report:?}");
    assert_eq!(report.usage.events_published, 1, "{report:?}");
    let event = &events(&p, &app_queue, 1).await[0];
    assert_eq!(event["detail-type"], "Media Pipeline Failed", "{event:#}");
    assert_eq!(event["detail"]["status"], "failed");
    let outcomes: HashMap<&str, &str> = event["detail"]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["recipe"].as_str().unwrap(), j["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        HashMap::from([("probe", "done"), ("thumbs", "failed")])
    );
    let error = &job(event, "thumbs")["error"];
    assert_eq!(error["class"], "permanent", "{event:#}");
    assert!(!error["message"].as_str().unwrap().is_empty(), "{event:#}");
}
