//! Content identity on the emulators: which uploads share a job, what a
//! redelivery costs, and which hashes are never keys (issue 9, DESIGN.md
//! "Content identity").

mod common;

use std::sync::atomic::Ordering;

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use common::media::noise_png;
use common::{Options, Pipeline};
use mediaonce::config::ENV_IDENTITY;
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{BatchReport, JobReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::step::MANIFEST_NAME;

const THUMBNAIL: &str = r#"[{"step":"thumbnail","version":1,"params":{"widths":[64]}}]"#;
const PROBE: &str = r#"[{"step":"probe","version":1,"params":{}}]"#;

/// S3's smallest part but the last.
const MIN_PART: usize = 5 * 1024 * 1024;

fn small_png(seed: u64) -> Vec<u8> {
    noise_png(40, 30, seed)
}

/// A pipeline running `recipes`, its outputs in a bucket of their own (so
/// that their notifications are not received as uploads).
async fn pipeline(recipes: &str, vars: Vec<(&'static str, String)>) -> Pipeline {
    Pipeline::new(Options {
        recipes: Some(recipes.into()),
        vars,
        separate_output_bucket: true,
        ..Options::default()
    })
    .await
}

fn only_job(report: &BatchReport) -> &JobReport {
    let jobs: Vec<&JobReport> = report.jobs().collect();
    assert_eq!(jobs.len(), 1, "{report:?}");
    jobs[0]
}

fn key_of(p: &Pipeline, bytes: &[u8]) -> String {
    job_key(&sha256_hex(bytes), &p.app.config.recipes[0].recipe_hash)
}

/// A multipart upload with SHA-256 part checksums, in parts of `part_size`
/// bytes: S3 keeps a composite checksum (`…-N`), not a hash of the bytes.
async fn put_multipart(p: &Pipeline, key: &str, bytes: &[u8], part_size: usize) {
    let upload =
        p.s3.create_multipart_upload()
            .bucket(&p.bucket)
            .key(key)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .expect("create multipart upload");
    let id = upload.upload_id().expect("upload id");
    let mut parts = Vec::new();
    for (i, chunk) in bytes.chunks(part_size).enumerate() {
        let number = i as i32 + 1;
        let part =
            p.s3.upload_part()
                .bucket(&p.bucket)
                .key(key)
                .upload_id(id)
                .part_number(number)
                .checksum_algorithm(ChecksumAlgorithm::Sha256)
                .body(ByteStream::from(chunk.to_vec()))
                .send()
                .await
                .expect("upload part");
        parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(part.e_tag)
                .set_checksum_sha256(part.checksum_sha256)
                .build(),
        );
    }
    p.s3.complete_multipart_upload()
        .bucket(&p.bucket)
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .expect("complete multipart upload");
}

async fn head_checksum(p: &Pipeline, key: &str) -> Option<String> {
    p.s3.head_object()
        .bucket(&p.bucket)
        .key(key)
        .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
        .send()
        .await
        .expect("head")
        .checksum_sha256
}

/// The message again, as SQS redelivers it.
fn again(message: &SqsMessage) -> Vec<SqsMessage> {
    vec![message.clone()]
}

#[tokio::test]
async fn multipart_uploads_of_the_same_bytes_share_one_job() {
    let p = pipeline(THUMBNAIL, vec![]).await;
    let bytes = noise_png(1_300, 1_400, 1);
    assert!(bytes.len() > MIN_PART + 1, "{} bytes", bytes.len());
    put_multipart(&p, "post-1/photo.png", &bytes, MIN_PART).await;
    let two = head_checksum(&p, "post-1/photo.png").await;
    // A composite checksum: no key could come from it.
    assert!(two.as_deref().is_some_and(|c| c.ends_with("-2")), "{two:?}");
    let messages = p.receive(1).await;
    let calls = p.ledger_calls.get();
    let report = p.handle(messages).await;
    // Cache GetItem (a miss) and PutItem, reference, the claim's read and
    // put, finish.
    assert_eq!(p.ledger_calls.get() - calls, 6);
    let job = only_job(&report);
    assert_eq!(job.outcome, Outcome::Ran, "{report:?}");
    assert_eq!(job.input_hash_source, Some(FingerprintSource::Computed));
    assert_eq!(job.job_key, key_of(&p, &bytes));
    // One GetObject both keyed the job and fed the thumbnail step.
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 1);
    assert_eq!(p.reads.ranged.load(Ordering::SeqCst), 0);

    put_multipart(&p, "post-2/photo.png", &bytes, bytes.len()).await;
    let one = head_checksum(&p, "post-2/photo.png").await;
    assert!(one.as_deref().is_some_and(|c| c.ends_with("-1")), "{one:?}");
    let reads_before = p.reads.whole.load(Ordering::SeqCst);
    let calls_before = p.ledger_calls.get();
    let report = p.handle(p.receive(1).await).await;
    let job = only_job(&report);
    assert_eq!(job.outcome, Outcome::Reused, "{report:?}");
    assert_eq!(job.input_hash_source, Some(FingerprintSource::Computed));
    assert_eq!(job.job_key, key_of(&p, &bytes));
    // The new object was read once (to hash it), and no step ran on it:
    // the cache's GetItem (a miss) and PutItem, the new version's
    // reference, and the claim's read (done: reused, no write to the job).
    assert_eq!(p.reads.whole.load(Ordering::SeqCst) - reads_before, 1);
    assert_eq!(p.ledger_calls.get() - calls_before, 4);
    let manifest = p
        .output(&format!("derived/{}/{MANIFEST_NAME}", key_of(&p, &bytes)))
        .await;
    assert!(!manifest.is_empty());
}

#[tokio::test]
async fn a_plain_put_and_a_checksummed_put_of_the_same_bytes_are_one_job() {
    let p = pipeline(THUMBNAIL, vec![]).await;
    let bytes = small_png(2);
    // A client that sends no checksum at all (the SDKs' default sends CRC32).
    let sdk = mediaonce::aws::load_sdk_config().await;
    let plain = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .build(),
    );
    plain
        .put_object()
        .bucket(&p.bucket)
        .key("browser.png")
        .body(ByteStream::from(bytes.clone()))
        .send()
        .await
        .expect("plain put");
    assert_eq!(head_checksum(&p, "browser.png").await, None);
    let report = p.handle(p.receive(1).await).await;
    let job = only_job(&report);
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{report:?}"
    );

    p.put("cli.png", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let checked = only_job(&report);
    assert_eq!(
        (checked.outcome, checked.input_hash_source),
        (Outcome::Reused, Some(FingerprintSource::S3Checksum)),
        "{report:?}"
    );
    assert_eq!(checked.job_key, job.job_key);
    assert_eq!(job.job_key, key_of(&p, &bytes));
}

#[tokio::test]
async fn a_redelivered_hashed_version_reads_no_bytes_and_writes_nothing() {
    let p = Pipeline::new(Options {
        recipes: Some(THUMBNAIL.into()),
        versioned: true,
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let bytes = small_png(3);
    p.put("a.png", &bytes, false).await;
    let message = p.receive(1).await.remove(0);
    let report = p.handle(again(&message)).await;
    assert_eq!(only_job(&report).outcome, Outcome::Ran, "{report:?}");

    let (whole, ranged) = (
        p.reads.whole.load(Ordering::SeqCst),
        p.reads.ranged.load(Ordering::SeqCst),
    );
    let calls = p.ledger_calls.get();
    let report = p.handle(again(&message)).await;
    let job = only_job(&report);
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Reused, Some(FingerprintSource::Cached)),
        "{report:?}"
    );
    assert_eq!(job.job_key, key_of(&p, &bytes));
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), whole, "no GetObject");
    assert_eq!(
        p.reads.ranged.load(Ordering::SeqCst),
        ranged,
        "no ranged GET"
    );
    // The cache's GetItem, the version row's (it references the job
    // already: no write), and the claim's read (done: reused).
    assert_eq!(p.ledger_calls.get() - calls, 3);
}

#[tokio::test]
async fn a_declared_hash_never_takes_over_another_images_job() {
    let p = pipeline(THUMBNAIL, vec![]).await;
    let victim = small_png(4);
    p.put("victim.png", &victim, true).await;
    let report = p.handle(p.receive(1).await).await;
    assert_eq!(only_job(&report).outcome, Outcome::Ran, "{report:?}");
    let victim_key = key_of(&p, &victim);
    let victim_row = p.row(&victim_key).await.expect("victim's row");
    let manifest_key = format!("derived/{victim_key}/{MANIFEST_NAME}");
    let victim_manifest = p.output(&manifest_key).await;

    // Junk that claims the victim's SHA-256 in its metadata and its tags.
    let junk = small_png(5);
    p.s3.put_object()
        .bucket(&p.bucket)
        .key("junk.png")
        .metadata("sha256", sha256_hex(&victim))
        .tagging(format!("sha256={}", sha256_hex(&victim)))
        .body(ByteStream::from(junk.clone()))
        .send()
        .await
        .expect("put junk");
    let report = p.handle(p.receive(1).await).await;
    let job = only_job(&report);
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{report:?}"
    );
    assert_eq!(job.job_key, key_of(&p, &junk));
    assert_ne!(job.job_key, victim_key);
    assert_eq!(p.row(&victim_key).await, Some(victim_row));
    assert_eq!(p.output(&manifest_key).await, victim_manifest);
}

#[tokio::test]
async fn a_plain_probe_in_auto_keys_by_version_and_etag_without_a_whole_read() {
    let p = pipeline(PROBE, vec![]).await;
    let bytes = small_png(6);
    let put = p.put("p.png", &bytes, false).await;
    let messages = p.receive(1).await;
    let calls = p.ledger_calls.get();
    let report = p.handle(messages).await;
    // Cache GetItem (a miss), reference, the claim's read and put, finish.
    assert_eq!(p.ledger_calls.get() - calls, 5);
    let job = only_job(&report);
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::VersionEtag)),
        "{report:?}"
    );
    let etag = put.e_tag.unwrap().trim_matches('"').to_string();
    let input_hash =
        sha256_hex(format!("s3-version-etag\n{}\np.png\n\n{etag}", p.bucket).as_bytes());
    assert_eq!(
        job.job_key,
        job_key(&input_hash, &p.app.config.recipes[0].recipe_hash)
    );
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 0);
    assert!(p.reads.ranged.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn a_crc64nvme_checksum_is_never_a_key() {
    for (mode, source) in [
        ("auto", FingerprintSource::VersionEtag),
        ("content", FingerprintSource::Computed),
    ] {
        let p = pipeline(PROBE, vec![(ENV_IDENTITY, mode.into())]).await;
        let bytes = small_png(7);
        p.s3.put_object()
            .bucket(&p.bucket)
            .key("crc.png")
            .checksum_algorithm(ChecksumAlgorithm::Crc64Nvme)
            .body(ByteStream::from(bytes.clone()))
            .send()
            .await
            .expect("put with CRC64NVME");
        let head =
            p.s3.head_object()
                .bucket(&p.bucket)
                .key("crc.png")
                .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
                .send()
                .await
                .unwrap();
        assert!(head.checksum_crc64_nvme.is_some(), "{head:?}");
        assert_eq!(head.checksum_sha256, None);

        let report = p.handle(p.receive(1).await).await;
        let job = only_job(&report);
        assert_eq!(
            (job.outcome, job.input_hash_source),
            (Outcome::Ran, Some(source)),
            "{mode}: {report:?}"
        );
        if source == FingerprintSource::Computed {
            assert_eq!(job.job_key, key_of(&p, &bytes));
        }
    }
}

#[tokio::test]
async fn content_identity_hashes_a_ranged_only_job_without_keeping_the_bytes() {
    let p = pipeline(PROBE, vec![(ENV_IDENTITY, "content".into())]).await;
    let bytes = small_png(8);
    p.put("c.png", &bytes, false).await;
    let messages = p.receive(1).await;
    let calls = p.ledger_calls.get();
    let report = p.handle(messages).await;
    // Cache GetItem (a miss) and PutItem, reference, the claim's read and
    // put, finish.
    assert_eq!(p.ledger_calls.get() - calls, 6);
    let job = only_job(&report);
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::Computed)),
        "{report:?}"
    );
    assert_eq!(job.job_key, key_of(&p, &bytes));
    // One read to hash; probe's own ranged read went to S3 (nothing was kept).
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 1);
    let probe: serde_json::Value = serde_json::from_slice(
        &p.output(&format!("derived/{}/probe.json", job.job_key))
            .await,
    )
    .unwrap();
    assert_eq!(probe["sha256"], sha256_hex(&bytes));
}

#[tokio::test]
async fn a_notification_duplicated_within_a_batch_is_hashed_once() {
    let p = pipeline(THUMBNAIL, vec![]).await;
    let bytes = small_png(9);
    p.put("twice.png", &bytes, false).await;
    let message = p.receive(1).await.remove(0);
    let mut duplicate = message.clone();
    duplicate.message_id = Some("duplicate-of-the-notification".into());
    let report = p.handle(vec![message, duplicate]).await;
    let mut outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    outcomes.sort_by_key(|o| o.as_str());
    assert_eq!(outcomes, [Outcome::Ran, Outcome::Reused], "{report:?}");
    assert!(report.jobs().all(|j| j.job_key == key_of(&p, &bytes)));
    assert_eq!(p.reads.whole.load(Ordering::SeqCst), 1);
}
