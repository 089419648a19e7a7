//! Uploading a file so that its jobs are keyed by its content
//! (`mediaonce upload`).
//!
//! The file's SHA-256 is computed while it is read. Up to
//! [`SINGLE_PUT_MAX`] it goes up in one streamed PUT carrying
//! `x-amz-checksum-sha256`: S3 verifies the bytes against it and keeps it as
//! the object's full-object checksum, so no worker ever reads the object to
//! key it. Above that, S3 only takes a multipart upload, whose SHA-256 can
//! only be *composite* (a hash of the parts' hashes): a worker then hashes
//! the object once and caches the result (DESIGN.md, "Content identity").

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use aws_smithy_types::body::SdkBody;
use base64::Engine;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use crate::aws::describe_error;
use crate::fingerprint::ContentHasher;
use crate::step::hash_file;

/// S3's largest single PUT: 5 GiB.
pub const SINGLE_PUT_MAX: u64 = 5 * 1024 * 1024 * 1024;
/// S3's smallest part (all but the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The AWS CLI's part size.
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// S3's most parts in one upload.
pub const MAX_PARTS: u64 = 10_000;
/// S3's largest object: 5 TiB.
pub const MAX_OBJECT_SIZE: u64 = 5 * 1024 * 1024 * 1024 * 1024;
/// Parts uploaded at once (each held in memory while it goes up).
const PARTS_IN_FLIGHT: usize = 4;
/// Read size for hashing and streaming.
const CHUNK: usize = 256 * 1024;

/// How a file goes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadOptions {
    /// Files up to this size go in one PUT; larger ones in parts. At most
    /// [`SINGLE_PUT_MAX`]; lower it to force a multipart upload.
    pub single_put_max: u64,
    /// The part size of a multipart upload (at least [`MIN_PART_SIZE`];
    /// raised when the file would need more than [`MAX_PARTS`]).
    pub part_size: u64,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            single_put_max: SINGLE_PUT_MAX,
            part_size: DEFAULT_PART_SIZE,
        }
    }
}

/// What an upload left in S3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// The SHA-256 of the file's bytes, lowercase hex: the input hash its
    /// jobs are keyed on.
    pub input_hash: String,
    /// The object's version id (`None` in an unversioned bucket).
    pub version_id: Option<String>,
    pub size: u64,
    /// `None` for a single PUT (S3 keeps the SHA-256 as the full-object
    /// checksum); the number of parts of a multipart upload.
    pub parts: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is {size} bytes, over S3's largest object ({MAX_OBJECT_SIZE} bytes)", path.display())]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{operation} s3://{bucket}/{key} failed: {message}")]
    S3 {
        operation: &'static str,
        bucket: String,
        key: String,
        message: String,
    },
    #[error("S3 stored SHA-256 {stored:?} for s3://{bucket}/{key}, but the file's is {computed}")]
    ChecksumMismatch {
        bucket: String,
        key: String,
        stored: Option<String>,
        computed: String,
    },
}

/// Bytes sent so far, for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
}

impl Progress {
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: u64) {
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    fn take_back(&self, bytes: u64) {
        self.sent.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Uploads `path` to `s3://bucket/key` as [`UploadOptions`] say, counting
/// the bytes sent in `progress`.
pub async fn upload(
    client: &Client,
    path: &Path,
    bucket: &str,
    key: &str,
    options: UploadOptions,
    progress: Arc<Progress>,
) -> Result<Uploaded, UploadError> {
    let read_error = |source| UploadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let metadata = tokio::fs::metadata(path).await.map_err(read_error)?;
    if !metadata.is_file() {
        return Err(read_error(std::io::Error::other("not a regular file")));
    }
    let size = metadata.len();
    if size > MAX_OBJECT_SIZE {
        return Err(UploadError::TooLarge {
            path: path.to_path_buf(),
            size,
        });
    }
    let target = Target {
        client,
        bucket,
        key,
        content_type: content_type(key),
    };
    if size <= options.single_put_max.min(SINGLE_PUT_MAX) {
        target.single_put(path, size, progress).await
    } else {
        target
            .multipart(path, size, options.part_size, progress)
            .await
    }
}

/// The media type S3 stores for an upload, from the key's extension.
pub fn content_type(key: &str) -> &'static str {
    let extension = key.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match extension.as_deref() {
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        Some("gif") => "image/gif",
        Some("tif" | "tiff") => "image/tiff",
        Some("heic") => "image/heic",
        Some("mp4" | "m4v") => "video/mp4",
        Some("mov") => "video/quicktime",
        Some("m4a") => "audio/mp4",
        _ => "application/octet-stream",
    }
}

/// The part size for `size` bytes: `wanted`, at least S3's minimum, and
/// enough that the parts number at most [`MAX_PARTS`]. Pure.
pub fn part_size(size: u64, wanted: u64) -> u64 {
    wanted.max(MIN_PART_SIZE).max(size.div_ceil(MAX_PARTS))
}

struct Target<'a> {
    client: &'a Client,
    bucket: &'a str,
    key: &'a str,
    content_type: &'static str,
}

impl Target<'_> {
    fn s3_error<E, R>(
        &self,
        operation: &'static str,
    ) -> impl Fn(aws_smithy_runtime_api::client::result::SdkError<E, R>) -> UploadError + '_
    where
        E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug + crate::aws::HasStatus,
    {
        move |err| UploadError::S3 {
            operation,
            bucket: self.bucket.to_string(),
            key: self.key.to_string(),
            message: describe_error(&err),
        }
    }

    /// One streamed PUT with the SHA-256 S3 verifies and keeps.
    async fn single_put(
        &self,
        path: &Path,
        size: u64,
        progress: Arc<Progress>,
    ) -> Result<Uploaded, UploadError> {
        let (_, input_hash) = hash_file(path).await.map_err(|source| UploadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let checksum = base64::engine::general_purpose::STANDARD
            .encode(hex::decode(&input_hash).expect("hex from the hasher"));
        let body_path = path.to_path_buf();
        let body = SdkBody::retryable(move || {
            SdkBody::from_body_1_x(FileBody::open(&body_path, size, progress.clone()))
        });
        let output = self
            .client
            .put_object()
            .bucket(self.bucket)
            .key(self.key)
            .content_type(self.content_type)
            .content_length(size as i64)
            .checksum_sha256(&checksum)
            .body(ByteStream::new(body))
            .send()
            .await
            .map_err(self.s3_error("PutObject"))?;
        if output.checksum_sha256() != Some(checksum.as_str()) {
            return Err(UploadError::ChecksumMismatch {
                bucket: self.bucket.to_string(),
                key: self.key.to_string(),
                stored: output.checksum_sha256().map(str::to_string),
                computed: input_hash,
            });
        }
        Ok(Uploaded {
            input_hash,
            version_id: output.version_id().map(str::to_string),
            size,
            parts: None,
        })
    }

    /// A multipart upload with SHA-256 part checksums; the file is read
    /// once, in order, hashing it whole as the parts are cut. Aborted on
    /// any failure, so no parts are left behind to be billed.
    async fn multipart(
        &self,
        path: &Path,
        size: u64,
        wanted_part_size: u64,
        progress: Arc<Progress>,
    ) -> Result<Uploaded, UploadError> {
        let part_size = part_size(size, wanted_part_size);
        let created = self
            .client
            .create_multipart_upload()
            .bucket(self.bucket)
            .key(self.key)
            .content_type(self.content_type)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .map_err(self.s3_error("CreateMultipartUpload"))?;
        let upload_id = created.upload_id().unwrap_or_default().to_string();
        match self
            .upload_parts(path, size, part_size, &upload_id, &progress)
            .await
        {
            Ok(uploaded) => Ok(uploaded),
            Err(err) => {
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(self.bucket)
                    .key(self.key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                Err(err)
            }
        }
    }

    async fn upload_parts(
        &self,
        path: &Path,
        size: u64,
        part_size: u64,
        upload_id: &str,
        progress: &Progress,
    ) -> Result<Uploaded, UploadError> {
        let read_error = |source| UploadError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::open(path).await.map_err(read_error)?;
        let mut whole = ContentHasher::new();
        let mut in_flight = FuturesUnordered::new();
        let mut completed = Vec::new();
        let count = size.div_ceil(part_size);
        for number in 1..=count {
            let length = part_size.min(size - (number - 1) * part_size);
            let mut part = vec![0; length as usize];
            file.read_exact(&mut part).await.map_err(read_error)?;
            whole.update(&part);
            while in_flight.len() >= PARTS_IN_FLIGHT {
                completed.push(in_flight.next().await.expect("a part in flight")?);
            }
            in_flight.push(self.upload_part(upload_id, number as i32, Bytes::from(part), progress));
        }
        while let Some(part) = in_flight.next().await {
            completed.push(part?);
        }
        completed.sort_by_key(|part: &CompletedPart| part.part_number());
        let output = self
            .client
            .complete_multipart_upload()
            .bucket(self.bucket)
            .key(self.key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(completed))
                    .build(),
            )
            .send()
            .await
            .map_err(self.s3_error("CompleteMultipartUpload"))?;
        Ok(Uploaded {
            input_hash: whole.finish(),
            version_id: output.version_id().map(str::to_string),
            size,
            parts: Some(count),
        })
    }

    async fn upload_part(
        &self,
        upload_id: &str,
        number: i32,
        bytes: Bytes,
        progress: &Progress,
    ) -> Result<CompletedPart, UploadError> {
        let length = bytes.len() as u64;
        let checksum = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&bytes));
        let output = self
            .client
            .upload_part()
            .bucket(self.bucket)
            .key(self.key)
            .upload_id(upload_id)
            .part_number(number)
            .content_length(length as i64)
            .checksum_sha256(&checksum)
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map_err(self.s3_error("UploadPart"))?;
        progress.add(length);
        Ok(CompletedPart::builder()
            .part_number(number)
            .set_e_tag(output.e_tag)
            .checksum_sha256(checksum)
            .build())
    }
}

/// A file as an HTTP body of exactly `size` bytes, counting what is sent.
/// A retry makes a new one (and takes back what the failed attempt counted).
struct FileBody {
    file: Option<tokio::fs::File>,
    open_error: Option<std::io::Error>,
    remaining: u64,
    buffer: Vec<u8>,
    progress: Arc<Progress>,
    counted: u64,
}

impl FileBody {
    fn open(path: &Path, size: u64, progress: Arc<Progress>) -> Self {
        let (file, open_error) = match std::fs::File::open(path) {
            Ok(file) => (Some(tokio::fs::File::from_std(file)), None),
            Err(err) => (None, Some(err)),
        };
        FileBody {
            file,
            open_error,
            remaining: size,
            buffer: vec![0; CHUNK],
            progress,
            counted: 0,
        }
    }
}

impl Drop for FileBody {
    fn drop(&mut self) {
        if self.remaining > 0 {
            // Not sent in full: a retry will count again.
            self.progress.take_back(self.counted);
        }
    }
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if let Some(err) = this.open_error.take() {
            return Poll::Ready(Some(Err(err)));
        }
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let Some(file) = this.file.as_mut() else {
            return Poll::Ready(None);
        };
        let want = this.buffer.len().min(this.remaining as usize);
        let mut read = ReadBuf::new(&mut this.buffer[..want]);
        match Pin::new(file).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(err)) => Poll::Ready(Some(Err(err))),
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was uploaded",
                ))))
            }
            Poll::Ready(Ok(())) => {
                let chunk = Bytes::copy_from_slice(read.filled());
                let length = chunk.len() as u64;
                this.remaining -= length;
                this.counted += length;
                this.progress.add(length);
                Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_at_least_s3s_minimum_and_at_most_ten_thousand() {
        assert_eq!(part_size(100, DEFAULT_PART_SIZE), DEFAULT_PART_SIZE);
        assert_eq!(part_size(100, 1), MIN_PART_SIZE);
        let huge = MAX_OBJECT_SIZE;
        let size = part_size(huge, DEFAULT_PART_SIZE);
        assert!(huge.div_ceil(size) <= MAX_PARTS);
        assert!(size > DEFAULT_PART_SIZE);
    }
}
