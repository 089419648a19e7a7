//! Pipelines on the emulators: a recipe that reads another recipe's output
//! file, keyed by the SHA-256 the upstream manifest records; chained jobs
//! referenced by the upload's version and freed with it; jobs with no time
//! left handed on through the real queue.

mod common;

use common::media::{av_clip, noise_png};
use common::{handle_before, Options, Pipeline};
use mediaonce::config::ENV_GC_GRACE_SECS;
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{BatchReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::pipeline::HandOn;
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
