//! `mediaonce upload`, run as a user would, against S3 (LocalStack): below
//! the multipart threshold one PUT whose SHA-256 S3 keeps, above it a
//! multipart upload that a worker hashes once; both keyed by content.

mod common;

use std::process::{Command, Output};

use common::media::noise_png;
use common::{Options, Pipeline};
use mediaonce::fingerprint::FingerprintSource;
use mediaonce::handler::{JobReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::upload::MIN_PART_SIZE;

const THUMBNAIL: &str = r#"[{"step":"thumbnail","version":1,"params":{"widths":[64]}}]"#;

fn mediaonce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(args)
        .output()
        .expect("mediaonce runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value of a `name: value` line of the command's output.
fn field(out: &Output, name: &str) -> String {
    text(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in {:?}", text(&out.stdout)))
}

async fn only_job(p: &Pipeline) -> JobReport {
    let report = p.handle(p.receive(1).await).await;
    let jobs: Vec<&JobReport> = report.jobs().collect();
    assert_eq!(jobs.len(), 1, "{report:?}");
    jobs[0].clone()
}

#[tokio::test]
async fn uploads_below_and_above_the_multipart_threshold_are_keyed_by_content() {
    let p = Pipeline::new(Options {
        recipes: Some(THUMBNAIL.into()),
        separate_output_bucket: true,
        versioned: true,
        ..Options::default()
    })
    .await;
    let bytes = noise_png(1_300, 1_400, 11);
    assert!(bytes.len() as u64 > MIN_PART_SIZE);
    let dir = std::env::temp_dir().join(common::unique("upload"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("photo.png");
    std::fs::write(&file, &bytes).unwrap();
    let file = file.to_str().unwrap();
    let expected_key = job_key(&sha256_hex(&bytes), &p.app.config.recipes[0].recipe_hash);

    // Below the threshold: one PUT, and S3 keeps the SHA-256.
    let single = mediaonce(&[
        "upload",
        "--quiet",
        file,
        &format!("s3://{}/one/photo.png", p.bucket),
    ]);
    assert!(single.status.success(), "{}", text(&single.stderr));
    assert_eq!(field(&single, "input_hash"), sha256_hex(&bytes));
    assert!(field(&single, "identity").starts_with("s3-checksum"));
    let head =
        p.s3.head_object()
            .bucket(&p.bucket)
            .key("one/photo.png")
            .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
    assert_eq!(
        field(&single, "version_id"),
        head.version_id.clone().unwrap()
    );
    assert_eq!(head.content_type.as_deref(), Some("image/png"));
    assert_eq!(
        head.checksum_type.as_ref().map(|t| t.as_str()),
        Some("FULL_OBJECT")
    );
    let job = only_job(&p).await;
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Ran, Some(FingerprintSource::S3Checksum)),
        "{job:?}"
    );
    assert_eq!(job.job_key, expected_key);

    // Above it (lowered for the test): parts, a composite checksum, and the
    // worker's hash gives the same key.
    let threshold = MIN_PART_SIZE.to_string();
    let parts = mediaonce(&[
        "upload",
        file,
        &format!("s3://{}/two/photo.png", p.bucket),
        "--multipart-threshold",
        &threshold,
        "--part-size",
        &threshold,
    ]);
    assert!(parts.status.success(), "{}", text(&parts.stderr));
    assert_eq!(field(&parts, "input_hash"), sha256_hex(&bytes));
    assert!(field(&parts, "identity").starts_with("computed (2 parts"));
    // Progress went to stderr, and ended at the whole file.
    assert!(
        text(&parts.stderr).contains("uploaded 100%"),
        "{}",
        text(&parts.stderr)
    );
    let job = only_job(&p).await;
    assert_eq!(
        (job.outcome, job.input_hash_source),
        (Outcome::Reused, Some(FingerprintSource::Computed)),
        "{job:?}"
    );
    assert_eq!(job.job_key, expected_key);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn upload_errors_are_one_line_naming_the_cause() {
    let p = Pipeline::new(Options::default()).await;
    let missing = mediaonce(&[
        "upload",
        "/no/such/file.png",
        &format!("s3://{}/x.png", p.bucket),
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        text(&missing.stderr),
        "mediaonce: upload: cannot read /no/such/file.png: No such file or directory (os error 2)\n"
    );

    let file = std::env::temp_dir().join(common::unique("upload-small"));
    std::fs::write(&file, b"small").unwrap();
    let file_arg = file.to_str().unwrap();
    let no_bucket = common::unique("missing");
    let out = mediaonce(&[
        "upload",
        "--quiet",
        file_arg,
        &format!("s3://{no_bucket}/x.png"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("PutObject s3://{no_bucket}/x.png failed"))
            && stderr.contains("NoSuchBucket"),
        "{stderr}"
    );

    let bad = mediaonce(&["upload", file_arg, "s3://just-a-bucket"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("is not an s3://bucket/key destination"));
    let too_big = mediaonce(&[
        "upload",
        file_arg,
        "s3://b/k",
        "--multipart-threshold",
        "6000000000",
    ]);
    assert_eq!(too_big.status.code(), Some(1));
    assert!(text(&too_big.stderr).contains("at most 5368709120 bytes"));
    std::fs::remove_file(&file).unwrap();
}
