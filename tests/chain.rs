//! Pipelines on the emulators: a recipe that reads another recipe's output
//! file, keyed by the SHA-256 the upstream manifest records; chained jobs
//! referenced by the upload's version and freed with it; jobs with no time
//! left handed on through the real queue.

mod common;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use common::events::{events, subscribed_bus};
use common::media::{av_clip, noise_png};
use common::{
    handle_before, handle_in, lambda_message, queue_arn, receive_from, Options, Pipeline,
};
use mediaonce::config::{ENV_EVENT_BUS, ENV_GC_GRACE_SECS};
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{BatchReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::{ClaimRequest, JobRow};
use mediaonce::pipeline::message::MAX_HAND_ONS;
use mediaonce::pipeline::HandOn;
use mediaonce::queue::message_group;
use mediaonce::references::VersionName;
use serde_json::{json, Value};

/// (recipe, outcome) of every job of a batch, in report order.
fn outcomes(report: &BatchReport) -> Vec<(String, Outcome)> {
    report
        .messages
        .iter()
        .flat_map(|m| m.jobs.iter())
        .map(|j| (j.recipe.clone(), j.outcome))
        .collect()
}

fn pairs(list: &[(&str, Outcome)]) -> Vec<(String, Outcome)> {
    list.iter().map(|(r, o)| (r.to_string(), *o)).collect()
}

fn key_of(report: &BatchReport, recipe: &str) -> String {
    report
        .messages
        .iter()
        .flat_map(|m| m.jobs.iter())
        .find(|j| j.recipe == recipe)
        .unwrap_or_else(|| panic!("no job of {recipe}: {report:?}"))
        .job_key
        .clone()
}

const POSTER_RECIPES: &str = r#"[
  {"name": "poster", "step": "poster", "version": 1, "params": {"at": 0.5}, "match": {"suffix": ".mp4"}},
  {"name": "poster-thumbs", "step": "thumbnail", "version": 1, "params": {"widths": [64]},
   "input": {"recipe": "poster", "file": "poster.jpg"}},
  {"name": "photo-thumbs", "step": "thumbnail", "version": 1, "params": {"widths": [64]},
   "match": {"suffix": ".jpg"}}
]"#;

#[tokio::test]
async fn a_poster_feeds_thumbnails_keyed_by_its_bytes_and_freed_with_the_video() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(POSTER_RECIPES.into()),
        vars: vec![(ENV_GC_GRACE_SECS, "0".into())],
        ..Options::default()
    })
    .await;
    let clip = std::fs::read(av_clip("chain.mp4", "320x240", 25, 2, &[])).unwrap();
    p.put("v.mp4", &clip, true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("poster", Outcome::Ran), ("poster-thumbs", Outcome::Ran)]),
        "{report:?}"
    );
    assert!(report.response().batch_item_failures.is_empty());

    // The poster: a JPEG at the source's resolution.
    let poster_key = key_of(&report, "poster");
    let poster = p.output(&format!("derived/{poster_key}/poster.jpg")).await;
    assert_eq!(&poster[..2], [0xFF, 0xD8], "a JPEG");
    let size = imagesize::blob_size(&poster).expect("a JPEG's size");
    assert_eq!((size.width, size.height), (320, 240));

    // The chained job is keyed by the poster's bytes, as the manifest says.
    let thumbs = &p.app.config.recipes[1];
    let thumbs_key = key_of(&report, "poster-thumbs");
    assert_eq!(
        thumbs_key,
        job_key(&sha256_hex(&poster), &thumbs.recipe_hash)
    );
    let source = report.messages[0].jobs[1].input_hash_source;
    assert_eq!(source, Some(FingerprintSource::UpstreamManifest));
    let thumb = p
        .output(&format!("derived/{thumbs_key}/thumb-64.jpg"))
        .await;
    let size = imagesize::blob_size(&thumb).unwrap();
    assert_eq!((size.width, size.height), (64, 48));

    // The video's version references the whole pipeline.
    let version = VersionName {
        bucket: p.bucket.clone(),
        key: "v.mp4".into(),
        version_id: None,
    };
    let row = p.app.ledger.version_refs(&version).await.unwrap().unwrap();
    assert_eq!(
        row.job_keys,
        [poster_key.clone(), thumbs_key.clone()].into()
    );

    // The video's notification again: everything reused, and
    // nothing released: a hint of the roots alone keeps the chained job
    // (with no grace, a release would collect it at once).
    let body = serde_json::to_string(&serde_json::json!({"Records": [{
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": p.bucket}, "object": {"key": "v.mp4"}}
    }]}))
    .unwrap();
    let report = p.handle(vec![p.send_raw(&body).await]).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[
            ("poster", Outcome::Reused),
            ("poster-thumbs", Outcome::Reused)
        ])
    );

    // A photo with the poster's bytes is the same thumbnail job: reused.
    p.put("same.jpg", &poster, false).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("photo-thumbs", Outcome::Reused)])
    );
    assert_eq!(key_of(&report, "photo-thumbs"), thumbs_key);

    // Deleting the video frees the poster; the thumbnail stays for the photo.
    assert_eq!(
        (p.refs(&poster_key).await, p.refs(&thumbs_key).await),
        (1, 2)
    );
    // `mediaonce outputs` shows the video's pipeline as a tree.
    let video = mediaonce::store::ObjectRef {
        bucket: p.bucket.clone(),
        key: "v.mp4".into(),
        version_id: None,
        if_match: None,
    };
    let tree = p.app.outputs_of(&video).await.unwrap();
    let tree = serde_json::to_value(&tree).unwrap();
    assert_eq!(tree.as_array().unwrap().len(), 1, "{tree:#}");
    let root = &tree[0];
    assert_eq!(
        (
            &root["name"],
            &root["job_key"],
            &root["status"],
            &root["refs"]
        ),
        (
            &json!("poster"),
            &json!(poster_key),
            &json!("done"),
            &json!(1)
        ),
        "{tree:#}"
    );
    let child = &root["downstream"][0];
    assert_eq!(
        (
            &child["name"],
            &child["job_key"],
            &child["status"],
            &child["refs"]
        ),
        (
            &json!("poster-thumbs"),
            &json!(thumbs_key),
            &json!("done"),
            &json!(2)
        ),
        "{tree:#}"
    );
    assert_eq!(child["input_hash_source"], "upstream-manifest");
    assert_eq!(child["files"][0]["name"], "thumb-64.jpg", "{tree:#}");
    assert!(child.get("downstream").is_none(), "{tree:#}");
    p.s3.delete_object()
        .bucket(&p.bucket)
        .key("v.mp4")
        .send()
        .await
        .unwrap();
    let report = p.handle(p.receive(1).await).await;
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        (p.refs(&poster_key).await, p.refs(&thumbs_key).await),
        (0, 1)
    );
}

#[tokio::test]
async fn an_audio_only_upload_fails_the_poster_and_its_chain_for_good() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(POSTER_RECIPES.into()),
        ..Options::default()
    })
    .await;
    p.put("a.mp4", &common::media::audio_only_mp4(), true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[
            ("poster", Outcome::Unprocessable),
            ("poster-thumbs", Outcome::Unprocessable)
        ]),
        "{report:?}"
    );
    let jobs = &report.messages[0].jobs;
    assert!(
        jobs[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("needs a video track"),
        "{jobs:?}"
    );
    assert!(
        jobs[1]
            .reason
            .as_deref()
            .unwrap()
            .contains("failed for good"),
        "{jobs:?}"
    );
    // The input's fault, not the function's: acknowledged.
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
}

#[tokio::test]
async fn chained_jobs_with_no_time_left_are_handed_on_through_the_queue() {
    // The AVIF recipe declares 30 s; the JPEG one nothing: with 20 s left
    // the first runs and the second goes on in a hand-on message.
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(
            r#"[{"name": "small", "step": "thumbnail", "version": 1, "params": {"widths": [32]}},
                {"name": "small-avif", "step": "thumbnail", "version": 1,
                 "params": {"widths": [16], "format": "avif"},
                 "input": {"recipe": "small", "file": "thumb-32.jpg"}}]"#
                .into(),
        ),
        ..Options::default()
    })
    .await;
    p.put("a.png", &noise_png(64, 48, 7), true).await;
    let upload = p.receive(1).await;
    let report = handle_before(p.app.clone(), upload, p.app.now_ms() + 20_000).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("small", Outcome::Ran), ("small-avif", Outcome::HandedOn)]),
        "{report:?}"
    );
    assert!(
        report.response().batch_item_failures.is_empty(),
        "handed on: done"
    );
    let avif_key = key_of(&report, "small-avif");
    // Referenced before it was handed on.
    assert_eq!(p.refs(&avif_key).await, 1);

    // The hand-on message, from the real queue.
    let hand_on = p.receive(1).await;
    let body: Value = serde_json::from_str(hand_on[0].body.as_deref().unwrap()).unwrap();
    let message = HandOn::from_value(body.clone()).expect("a hand-on message");
    assert_eq!(
        (message.key.as_str(), message.recipes.clone()),
        ("a.png", vec!["small-avif".to_string()])
    );
    let report = p.handle(hand_on).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("small", Outcome::Reused), ("small-avif", Outcome::Ran)]),
        "{report:?}"
    );
    let avif = p.output(&format!("derived/{avif_key}/thumb-16.avif")).await;
    assert_eq!(&avif[4..12], b"ftypavif");

    // A duplicate of the hand-on runs nothing.
    let report = p.handle(vec![p.send_raw(&body.to_string()).await]).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("small", Outcome::Reused), ("small-avif", Outcome::Reused)])
    );
}

/// A pipeline of [`AVIF_CHAIN`], its outputs in a bucket of their own.
async fn avif_pipeline() -> Pipeline {
    Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(AVIF_CHAIN.into()),
        ..Options::default()
    })
    .await
}

/// A JPEG thumbnail, and an AVIF one of it chained (its step declares 30 s).
const AVIF_CHAIN: &str = r#"[{"name": "small", "step": "thumbnail", "version": 1, "params": {"widths": [32]}},
    {"name": "small-avif", "step": "thumbnail", "version": 1,
     "params": {"widths": [16], "format": "avif"},
     "input": {"recipe": "small", "file": "thumb-32.jpg"}}]"#;

/// Issue 41, defect 4: a hand-on to a FIFO job queue carries the object as
/// its `MessageGroupId` and the SHA-256 of its cause (the message that
/// walked) and body as its deduplication id (the queue has no
/// content-based deduplication): LocalStack refused it before
/// (`MissingParameter`), and the chained job was deferred. The same
/// message walked twice within SQS's five minutes sends one hand-on.
#[tokio::test]
async fn a_hand_on_to_a_fifo_queue_is_in_the_objects_group_and_sent_once() {
    let p = avif_pipeline().await;
    p.put("a.png", &noise_png(64, 48, 7), true).await;
    let notification = p.receive(1).await.remove(0);
    let fifo_url = p
        .sqs
        .create_queue()
        .queue_name(format!("{}.fifo", common::unique("jobs")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let fifo_arn = queue_arn(&p.sqs, &fifo_url).await;
    let group = message_group(&p.bucket, "a.png");
    p.sqs
        .send_message()
        .queue_url(&fifo_url)
        .message_group_id(&group)
        .message_deduplication_id("the-upload")
        .message_body(notification.body.unwrap())
        .send()
        .await
        .unwrap();
    let upload = receive_from(&p.sqs, &fifo_url).await.remove(0);
    let receipt = upload.receipt_handle.clone().unwrap();
    let upload = lambda_message(upload, &fifo_arn);

    for _delivery in 0..2 {
        let report =
            handle_before(p.app.clone(), vec![upload.clone()], p.app.now_ms() + 20_000).await;
        assert_eq!(
            outcomes(&report)[1],
            ("small-avif".to_string(), Outcome::HandedOn),
            "{report:?}"
        );
        assert!(
            report.response().batch_item_failures.is_empty(),
            "{report:?}"
        );
    }
    // Acknowledged: its group's next message can be received.
    p.sqs
        .delete_message()
        .queue_url(&fifo_url)
        .receipt_handle(receipt)
        .send()
        .await
        .unwrap();
    let hand_ons = receive_from(&p.sqs, &fifo_url).await;
    assert_eq!(hand_ons.len(), 1, "one hand-on, deduplicated: {hand_ons:?}");
    let attributes = hand_ons[0].attributes.clone().unwrap_or_default();
    assert_eq!(
        attributes
            .get(&MessageSystemAttributeName::MessageGroupId)
            .map(String::as_str),
        Some(group.as_str())
    );
    let body: Value = serde_json::from_str(hand_ons[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(HandOn::from_value(body).unwrap().hand_ons, 1);
    let report = p
        .handle(vec![lambda_message(hand_ons[0].clone(), &fifo_arn)])
        .await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("small", Outcome::Reused), ("small-avif", Outcome::Ran)]),
        "{report:?}"
    );
}

/// Issue 41, defect 2: a walk whose message comes back (here another root
/// job is busy) hands nothing on: its chained job is deferred, and the
/// redelivery walks again. Before, every receive sent a hand-on, and every
/// hand-on did the same (3, 9, 27... per generation).
#[tokio::test]
async fn a_message_that_comes_back_hands_nothing_on() {
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(
            r#"[{"name": "small", "step": "thumbnail", "version": 1, "params": {"widths": [32]}},
                {"name": "small-avif", "step": "thumbnail", "version": 1,
                 "params": {"widths": [16], "format": "avif"},
                 "input": {"recipe": "small", "file": "thumb-32.jpg"}},
                {"name": "probe", "step": "counted-probe", "version": 1, "params": {}}]"#
                .into(),
        ),
        ..Options::default()
    })
    .await;
    let png = noise_png(64, 48, 9);
    p.put("a.png", &png, true).await;
    let upload = p.receive(1).await;
    // Another worker holds the probe.
    let probe = &p.app.config.recipes[2];
    let probe_key = job_key(&sha256_hex(&png), &probe.recipe_hash);
    p.seed_row(&running_row(&p, &probe_key, &sha256_hex(&png)))
        .await;

    for _receive in 0..3 {
        let report = handle_before(p.app.clone(), upload.clone(), p.app.now_ms() + 20_000).await;
        let got = outcomes(&report);
        assert!(
            got.contains(&("probe".to_string(), Outcome::Busy)),
            "{report:?}"
        );
        assert!(
            got.contains(&("small-avif".to_string(), Outcome::Deferred)),
            "{report:?}"
        );
        let avif = report.jobs().find(|j| j.recipe == "small-avif").unwrap();
        assert!(
            avif.reason
                .as_deref()
                .unwrap()
                .contains("nothing is handed on"),
            "{avif:?}"
        );
        assert_eq!(report.response().batch_item_failures.len(), 1);
    }
    assert!(p.receive_batch().await.is_empty(), "no hand-on was sent");
}

/// Issue 41, defect 1: a chained job that needs more time to start than
/// the function's timeout (Lambda tells it through each invocation's
/// deadline) can never run: it is refused for good, and the pipeline ends
/// with its failure event. It was handed on for ever before (each hand-on
/// a fresh message: the dead-letter queue never stopped it).
#[tokio::test]
async fn a_chained_job_no_invocation_can_fit_fails_for_good_with_an_event() {
    let p0 = Pipeline::new(Options::default()).await;
    let (bus, app_queue) = subscribed_bus(&p0).await;
    let p = Pipeline::new(Options {
        separate_output_bucket: true,
        recipes: Some(AVIF_CHAIN.into()),
        vars: vec![(ENV_EVENT_BUS, bus)],
        ..Options::default()
    })
    .await;
    p.put("a.png", &noise_png(64, 48, 11), true).await;
    let upload = p.receive(1).await;
    // A function with a 20 s timeout: the AVIF job needs 35 s (5 s of
    // margin and its step's 30 s), past the 10 s slack for a retried init.
    let now = p.app.now_ms();
    let report = handle_in(p.app.clone(), upload, now + 20_000, Some(20_000)).await;
    assert_eq!(
        outcomes(&report),
        pairs(&[("small", Outcome::Ran), ("small-avif", Outcome::Poisoned)]),
        "{report:?}"
    );
    let avif = report.jobs().find(|j| j.recipe == "small-avif").unwrap();
    assert!(
        avif.reason
            .as_deref()
            .unwrap()
            .contains("no invocation can start it"),
        "{avif:?}"
    );
    assert!(p.receive_batch().await.is_empty(), "nothing handed on");
    let event = &events(&p, &app_queue, 1).await[0];
    assert_eq!(event["detail-type"], "Media Pipeline Failed", "{event:#}");
    let failed = event["detail"]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["recipe"] == "small-avif")
        .unwrap();
    assert_eq!(failed["status"], "failed", "{event:#}");
}

/// Issue 41: a pipeline handed on `MAX_HAND_ONS` times hands on no more:
/// the jobs it would hand on are refused for good (`poisoned`, terminal:
/// the failure event ends the pipeline, the message goes to the DLQ); one
/// handed on fewer times hands on with the count one higher.
#[tokio::test]
async fn hand_ons_stop_at_the_cap_and_the_pipeline_ends() {
    let p = avif_pipeline().await;
    let put = p.put("a.png", &noise_png(64, 48, 13), true).await;
    p.receive(1).await;
    let etag = put.e_tag.unwrap().trim_matches('"').to_string();
    let hand_on = |count: u32| {
        HandOn::new(
            &p.bucket,
            "a.png",
            None,
            &etag,
            0,
            vec!["small-avif".into()],
            count,
        )
        .to_body()
    };
    let at_cap = p.send_raw(&hand_on(MAX_HAND_ONS)).await;
    let report = handle_before(p.app.clone(), vec![at_cap], p.app.now_ms() + 20_000).await;
    assert_eq!(outcomes(&report)[1].1, Outcome::Poisoned, "{report:?}");
    assert_eq!(report.response().batch_item_failures.len(), 1);
    assert!(p.receive_batch().await.is_empty(), "nothing handed on");

    let below = p.send_raw(&hand_on(MAX_HAND_ONS - 1)).await;
    let report = handle_before(p.app.clone(), vec![below], p.app.now_ms() + 20_000).await;
    assert_eq!(outcomes(&report)[1].1, Outcome::HandedOn, "{report:?}");
    let next = p.receive(1).await;
    let body: Value = serde_json::from_str(next[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(HandOn::from_value(body).unwrap().hand_ons, MAX_HAND_ONS);
}

/// A row another worker holds, its lease ten minutes ahead.
fn running_row(p: &Pipeline, job_key: &str, input_hash: &str) -> JobRow {
    JobRow::claimed(&ClaimRequest {
        job_key: job_key.to_string(),
        step: "counted-probe".into(),
        input_hash: input_hash.to_string(),
        output_prefix: p.app.config.output_location(job_key),
        owner: "another-worker/1".into(),
        lease_until_ms: p.app.now_ms() + 600_000,
        now_ms: p.app.now_ms(),
        max_attempts: 3,
    })
}

/// Suspected in issue 41: a chained job reading its upstream file by
/// ranges never checked the bytes against the manifest. Every output is
/// now written with its SHA-256 as S3's checksum, and a chained job's
/// input is checked by its HEAD (its reads pinned to that HEAD's ETag):
/// a file changed after its job wrote it, even to bytes of the same size,
/// runs nothing.
#[tokio::test]
async fn a_chained_job_reads_only_the_bytes_its_upstream_manifest_names() {
    let p = avif_pipeline().await;
    p.put("a.png", &noise_png(64, 48, 17), true).await;
    let upload = p.receive(1).await;
    let report = handle_before(p.app.clone(), upload, p.app.now_ms() + 20_000).await;
    assert_eq!(outcomes(&report)[1].1, Outcome::HandedOn, "{report:?}");
    let thumb = format!("derived/{}/thumb-32.jpg", key_of(&report, "small"));
    let original = p.output(&thumb).await;
    let head =
        p.s3.head_object()
            .bucket(&p.output_bucket)
            .key(&thumb)
            .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
    assert_eq!(
        head.checksum_sha256().map(str::to_string),
        mediaonce::store::sha256_base64(&sha256_hex(&original)),
        "an output carries its SHA-256"
    );

    // Another writer changes the file: the same size, other bytes.
    let mut changed = original.clone();
    let last = changed.len() - 3;
    changed[last] ^= 0xFF;
    p.s3.put_object()
        .bucket(&p.output_bucket)
        .key(&thumb)
        .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Sha256)
        .body(changed.into())
        .send()
        .await
        .unwrap();
    let report = p.handle(p.receive(1).await).await;
    let avif = report.jobs().find(|j| j.recipe == "small-avif").unwrap();
    assert_eq!(avif.outcome, Outcome::Failed, "{report:?}");
    assert!(
        avif.reason
            .as_deref()
            .unwrap()
            .contains("not the file its manifest names"),
        "{avif:?}"
    );
    let row = p.row(&avif.job_key).await;
    assert!(row.is_none(), "nothing claimed: {row:?}");
}
