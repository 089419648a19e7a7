//! Completion events on the emulators: LocalStack's EventBridge delivers
//! what the handler publishes, through a rule, to an SQS queue, as an
//! application would subscribe. Every upload gets its event (a reused one
//! too), a redelivery publishes the same event id again, and a job that
//! failed for good makes the failure event. (LocalStack accepts PutEvents
//! to a bus that does not exist, so a refused event bringing the message
//! back is proven on the recording bus, in the handler's unit tests.)

mod common;

use std::collections::HashMap;

use common::events::{events, subscribed_bus};
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
    // done, and the event says which failed and why. A user's bad file is
    // a business outcome (issue 37, defect 7): the message is acknowledged
    // after its one event, never sent round again to the dead-letter
    // queue (five receives, five events, then the DLQ alarm, before).
    p.put("bad.jpg", b"not an image at all", true).await;
    let bad = p.receive(1).await;
    let report = p.handle(bad.clone()).await;
    assert_eq!(report.count(Outcome::Unprocessable), 1, "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "acknowledged: {report:?}"
    );
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
    assert_eq!(
        job(event, "thumbs")["outcome"],
        "unprocessable",
        "{event:#}"
    );
    // S3's duplicate of that notification: no run, acknowledged, and told
    // with the same event id (the application deduplicates on it).
    let again = p.send_raw(bad[0].body.as_deref().unwrap()).await;
    let report = p.handle(vec![again]).await;
    assert_eq!(report.count(Outcome::Unprocessable), 1, "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let repeated = &events(&p, &app_queue, 1).await[0];
    assert_eq!(repeated["detail"]["eventId"], event["detail"]["eventId"]);
}

const VIDEO_RECIPES: &str = r#"[
  {"name": "probe", "step": "probe", "version": 1, "params": {}, "match": {"suffix": ".mp4"}},
  {"name": "hls", "step": "hls-package", "version": 1, "params": {"ladder": [240], "min_seconds": 5}, "match": {"suffix": ".mp4"}},
  {"name": "poster", "step": "poster", "version": 1, "params": {"at": 0.5}, "match": {"suffix": ".mp4"}},
  {"name": "poster-thumbs", "step": "thumbnail", "version": 1, "params": {"widths": [64]},
   "input": {"recipe": "poster", "file": "poster.jpg"}}
]"#;

/// (recipe, outcome) of every job of a batch.
fn outcomes(report: &mediaonce::handler::BatchReport) -> HashMap<String, Outcome> {
    report
        .jobs()
        .map(|j| (j.recipe.clone(), j.outcome))
        .collect()
}

fn all(outcome: Outcome) -> HashMap<String, Outcome> {
    ["probe", "hls", "poster", "poster-thumbs"]
        .iter()
        .map(|r| (r.to_string(), outcome))
        .collect()
}

/// (name, size, sha256) of a list of files, as a manifest or an event
/// lists them.
fn files(list: &Value) -> Vec<(&str, u64, &str)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap(),
                f["size"].as_u64().unwrap(),
                f["sha256"].as_str().unwrap(),
            )
        })
        .collect()
}

/// What one upload's pipeline cost and took: the handler's DynamoDB and S3
/// calls, and the time from the PUT to the application's event (S3's
/// notification, the queue, the handler, EventBridge, the rule's queue)
/// against the steps' own time. Printed for `bench/pipeline.sh`; asserted
/// nowhere (no timed tests).
struct Figures {
    started: std::time::Instant,
    dynamodb: usize,
    s3: usize,
}

impl Figures {
    fn start(p: &Pipeline) -> Self {
        Figures {
            started: std::time::Instant::now(),
            dynamodb: p.ledger_calls.get(),
            s3: p.s3_calls.get(),
        }
    }

    fn print(&self, p: &Pipeline, what: &str, report: &mediaonce::handler::BatchReport) {
        let steps_ms: u64 = report
            .jobs()
            .filter(|j| j.outcome == Outcome::Ran)
            .map(|j| j.duration_ms)
            .sum();
        println!(
            "pipeline-figures: {what}: DynamoDB calls {}, S3 requests {}, upload to event {} ms, \
             steps {steps_ms} ms",
            p.ledger_calls.get() - self.dynamodb,
            p.s3_calls.get() - self.s3,
            self.started.elapsed().as_millis(),
        );
    }
}

#[tokio::test]
async fn a_video_pipeline_from_upload_to_event_to_deletion() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = subscribed_bus(&p0).await;
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(VIDEO_RECIPES.into()),
        vars: vec![
            (ENV_EVENT_BUS, bus),
            (mediaonce::config::ENV_GC_GRACE_SECS, "0".into()),
        ],
        ..Options::default()
    })
    .await;
    let clip_path = common::media::av_clip("pipeline.mp4", "320x240", 25, 2, &[]);
    let video = std::fs::read(&clip_path).unwrap();

    // The first delivery's worker dies after the upstream jobs are done and
    // before the chained job starts (its reference transaction fails): the
    // message comes back, and nothing is announced.
    p.put("v1.mp4", &video, true).await;
    let first = p.receive(1).await;
    let faults = std::sync::Arc::new(mediaonce::faults::FaultPlan::new());
    faults.fail_after(
        mediaonce::faults::Call::ChangeRefs,
        1,
        1,
        "injected: the worker dies",
    );
    let dying = p.seeded_worker(0, faults, 1);
    let report = common::handle_with(dying, first.clone()).await;
    let mut expected = all(Outcome::Ran);
    expected.insert("poster-thumbs".into(), Outcome::Failed);
    assert_eq!(outcomes(&report), expected, "{report:?}");
    assert_eq!(report.response().batch_item_failures.len(), 1);
    assert_eq!(report.usage.events_published, 0);

    // The redelivery reuses every upstream job and runs the chained one;
    // the pipeline is over and the application hears of it, with files
    // that are the manifests' in the bucket.
    let redelivered = p.send_raw(first[0].body.as_deref().unwrap()).await;
    let report = p.handle(vec![redelivered.clone()]).await;
    let mut expected = all(Outcome::Reused);
    expected.insert("poster-thumbs".into(), Outcome::Ran);
    assert_eq!(outcomes(&report), expected, "{report:?}");
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let event = events(&p, &app_queue, 1).await.remove(0);
    assert_eq!(event["detail-type"], "Media Pipeline Succeeded");
    let jobs = event["detail"]["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4, "{event:#}");
    for job in jobs {
        let key = job["jobKey"].as_str().unwrap();
        let manifest: Value =
            serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await)
                .unwrap();
        assert_eq!(
            files(&job["files"]),
            files(&manifest["outputs"]),
            "{}",
            job["recipe"]
        );
    }
    let first_id = event["detail"]["eventId"].clone();
    let video_keys: Vec<String> = ["probe", "hls", "poster"]
        .iter()
        .map(|r| job(&event, r)["jobKey"].as_str().unwrap().to_string())
        .collect();

    // Delivered once more: nothing runs, the same event id.
    let figures = Figures::start(&p);
    let report = p
        .handle(vec![p.send_raw(first[0].body.as_deref().unwrap()).await])
        .await;
    assert_eq!(outcomes(&report), all(Outcome::Reused), "{report:?}");
    let event = events(&p, &app_queue, 1).await.remove(0);
    figures.print(&p, "the same message again", &report);
    assert_eq!(event["detail"]["eventId"], first_id);

    // The same video uploaded again under another key: every job reused,
    // its own event.
    let figures = Figures::start(&p);
    p.put("v2.mp4", &video, true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(outcomes(&report), all(Outcome::Reused), "{report:?}");
    let event = events(&p, &app_queue, 1).await.remove(0);
    figures.print(&p, "the same bytes re-uploaded", &report);
    assert_eq!(event["detail"]["key"], "v2.mp4");
    assert_ne!(event["detail"]["eventId"], first_id);
    let thumbs_key = job(&event, "poster-thumbs")["jobKey"].clone();

    // The same clip re-muxed (other bytes, the same frames): its own
    // probe, hls and poster, and the poster's thumbnails are one job with
    // the first video's.
    let remuxed = common::media::clip(
        "pipeline-remuxed.mp4",
        &[
            "-i",
            &clip_path.display().to_string(),
            "-c",
            "copy",
            "-movflags",
            "+faststart",
        ],
    );
    let remuxed = std::fs::read(remuxed).unwrap();
    assert_ne!(remuxed, video);
    p.put("r.mp4", &remuxed, true).await;
    let report = p.handle(p.receive(1).await).await;
    let mut expected = all(Outcome::Ran);
    expected.insert("poster-thumbs".into(), Outcome::Reused);
    assert_eq!(outcomes(&report), expected, "{report:?}");
    let event = events(&p, &app_queue, 1).await.remove(0);
    assert_eq!(job(&event, "poster-thumbs")["jobKey"], thumbs_key);

    // A video never seen: every job runs, in one delivery.
    let figures = Figures::start(&p);
    let fresh = common::media::av_clip("pipeline-fresh.mp4", "352x288", 25, 2, &[]);
    p.put("fresh.mp4", &std::fs::read(fresh).unwrap(), true)
        .await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(outcomes(&report), all(Outcome::Ran), "{report:?}");
    events(&p, &app_queue, 1).await;
    figures.print(&p, "a new video", &report);

    // Audio only: the poster fails for good, so does its chain, and the
    // event says so.
    p.put("a.mp4", &common::media::audio_only_mp4(), true).await;
    p.handle(p.receive(1).await).await;
    let event = events(&p, &app_queue, 1).await.remove(0);
    assert_eq!(event["detail-type"], "Media Pipeline Failed", "{event:#}");
    assert_eq!(job(&event, "poster")["status"], "failed");
    assert_eq!(job(&event, "poster-thumbs")["error"]["class"], "upstream");
    assert_eq!(job(&event, "probe")["status"], "done");

    // Deleting both copies of the video frees its whole pipeline (no
    // grace); the thumbnails stay for the re-muxed copy, then go with it.
    for key in ["v1.mp4", "v2.mp4"] {
        p.s3.delete_object()
            .bucket(&p.bucket)
            .key(key)
            .send()
            .await
            .unwrap();
    }
    let report = p.handle(p.receive(2).await).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    for key in &video_keys {
        assert_eq!(p.row(key).await, None, "{key} collected");
        assert!(p.output_keys(&format!("derived/{key}/")).await.is_empty());
    }
    let thumbs_key = thumbs_key.as_str().unwrap();
    assert_eq!(p.refs(thumbs_key).await, 1, "the re-muxed copy's");
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key("r.mp4")
        .send()
        .await
        .unwrap();
    p.handle(p.receive(1).await).await;
    assert_eq!(p.row(thumbs_key).await, None);
}
