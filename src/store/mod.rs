//! The object store: the S3 calls mediaonce makes, one method per call and
//! one error type per operation, behind the [`ObjectClient`] trait.
//! [`s3::S3Objects`] is the real client, [`memory::InMemoryObjects`] keeps
//! objects in a map (unit tests), and [`faults::FaultyObjects`] injects
//! failures into any client.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;

use crate::fingerprint::ObjectHead;

mod counting;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod faults;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
pub(crate) mod faults;
// In memory: the simulation's (`mediaonce simulate`) and the tests'.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod memory;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
pub(crate) mod memory;
pub mod s3;

/// Where an object version is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    /// GETs send `If-Match` with this ETag (without quotes): the bytes read
    /// are those of the object that was headed and keyed, or the read fails
    /// with [`ErrorKind::PreconditionFailed`].
    pub if_match: Option<String>,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)?;
        if let Some(version) = &self.version_id {
            write!(f, "?versionId={version}")?;
        }
        Ok(())
    }
}

pub use crate::error::ErrorKind;

#[derive(Debug, thiserror::Error)]
#[error("HeadObject {object} failed: {message}")]
pub struct HeadError {
    pub object: String,
    pub message: String,
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
#[error("GetObject {object} failed: {message}")]
pub struct GetError {
    pub object: String,
    pub message: String,
    /// `PreconditionFailed`: `If-Match` failed, the object is no longer the
    /// one headed.
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
#[error("PutObject s3://{bucket}/{key} failed: {message}")]
pub struct PutError {
    pub bucket: String,
    pub key: String,
    pub message: String,
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
#[error("{operation} s3://{bucket}/{prefix} failed: {message}")]
pub struct ListError {
    /// `ListObjectsV2` or `ListObjectVersions`.
    pub operation: &'static str,
    pub bucket: String,
    pub prefix: String,
    pub message: String,
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
#[error("DeleteObjects in s3://{bucket} failed: {message}")]
pub struct DeleteError {
    pub bucket: String,
    pub message: String,
    pub kind: ErrorKind,
}

/// S3's most keys in one DeleteObjects (and one ListObjectsV2 page).
pub const MAX_KEYS_PER_CALL: usize = 1_000;

/// One page of ListObjectVersions: the versions (not delete markers) of
/// the keys under a prefix, and where the next page starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionsPage {
    /// (key, version id; `None` for S3's `null` version).
    pub versions: Vec<(String, Option<String>)>,
    /// The key and version id markers of the next page, if there is one.
    pub next: Option<(String, String)>,
    /// Every entry of the page, versions and delete markers, as listed.
    pub entries: Vec<KeyEntry>,
}

/// One entry of a ListObjectVersions page: a version or a delete marker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyEntry {
    pub key: String,
    /// `None` for S3's `null` version (or a `null` delete marker).
    pub version_id: Option<String>,
    pub delete_marker: bool,
    /// The key's current entry.
    pub is_latest: bool,
    /// `LastModified`, epoch ms (S3 gives whole seconds).
    pub last_modified_ms: Option<i64>,
}

/// The account every S3 call names as the bucket's owner, when set.
pub const ENV_EXPECTED_BUCKET_OWNER: &str = "MEDIAONCE_EXPECTED_BUCKET_OWNER";

/// What a refused call says when a bucket owner was expected: S3 answers
/// 403 for a bucket another account owns (also for a plain permissions
/// gap, hence "may").
pub fn owner_mismatch(account: &str) -> String {
    format!(
        "the bucket may not be owned by account {account}, which {} expects",
        ENV_EXPECTED_BUCKET_OWNER
    )
}

/// The headers an object is written with, and served with on every GET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectHeaders<'a> {
    pub content_type: &'a str,
    pub cache_control: Option<&'a str>,
}

impl<'a> ObjectHeaders<'a> {
    /// Only a `Content-Type`.
    pub fn typed(content_type: &'a str) -> Self {
        ObjectHeaders {
            content_type,
            cache_control: None,
        }
    }
}

/// The S3 calls, one method each.
#[async_trait::async_trait]
pub trait ObjectClient: Send + Sync + std::fmt::Debug {
    /// HeadObject of exactly the named version, with its checksum
    /// (`ChecksumMode=ENABLED`). `Ok(None)` when the object or version does
    /// not exist (any more).
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError>;

    /// GetObject: a stream of the version's bytes.
    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError>;

    /// GetObject with a `Range` header: the version's bytes in `range`
    /// (end exclusive, within the object), held in memory.
    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError>;

    /// PutObject with `headers`, replacing any earlier object at the key.
    /// With `checksum_sha256` (base64, as S3 takes it), S3 refuses bytes
    /// whose SHA-256 is another, and keeps it as the object's full-object
    /// checksum.
    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError>;

    /// CopyObject: `from` (its version, and `If-Match` its ETag when set:
    /// `x-amz-copy-source-if-match`) to `bucket`/`key`, server-side, with
    /// `headers` in place of the source's (`MetadataDirective=REPLACE`);
    /// replaces any earlier object at the key. By default (a client of
    /// one's own that has no copy), a GET and a PUT through this client,
    /// the object held in memory between them (a PUT to S3 needs a body of
    /// known size).
    async fn copy_object(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        let failed = |message: String, kind| PutError {
            bucket: bucket.to_string(),
            key: key.to_string(),
            message: format!("copying {from}: {message}"),
            kind,
        };
        let body = self
            .get_object(from)
            .await
            .map_err(|e| failed(e.message, e.kind))?
            .collect()
            .await
            .map_err(|e| failed(format!("reading the body: {e}"), ErrorKind::Transient))?
            .into_bytes();
        self.put_object(bucket, key, headers, ByteStream::from(body), None)
            .await
    }

    /// ListObjectsV2 of `prefix`, one page (up to 1,000 keys), from `from`
    /// (the previous page's continuation token): the keys, and the token
    /// of the next page if there is one.
    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError>;

    /// DeleteObjects of up to [`MAX_KEYS_PER_CALL`] keys (quiet): `Err`
    /// names the first key S3 could not delete. A missing key is deleted.
    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError>;

    /// ListObjectVersions of `prefix`, one page, from `from` (the previous
    /// page's `next`).
    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError>;
}

/// The object client the handler and the steps share, counting the bytes
/// that go through it (the `InputBytesRead` and `OutputBytesWritten`
/// metrics; clones share the counts).
#[derive(Debug, Clone)]
pub struct ObjectStore {
    client: Arc<dyn ObjectClient>,
    bytes: Arc<ByteCounts>,
}

/// Bytes read from and written to S3 through one store.
#[derive(Debug, Default)]
struct ByteCounts {
    read: Arc<AtomicU64>,
    written: AtomicU64,
}

impl ObjectStore {
    pub fn new(client: impl ObjectClient + 'static) -> Self {
        ObjectStore {
            client: Arc::new(client),
            bytes: Arc::default(),
        }
    }

    /// Object bytes received so far (GETs, whole or ranged).
    pub fn bytes_read(&self) -> u64 {
        self.bytes.read.load(Ordering::Relaxed)
    }

    /// Object bytes sent so far (PUTs).
    pub fn bytes_written(&self) -> u64 {
        self.bytes.written.load(Ordering::Relaxed)
    }

    /// The store in S3; every call names `expected_bucket_owner`, if given,
    /// as the bucket's owner.
    pub fn s3(client: aws_sdk_s3::Client, expected_bucket_owner: Option<String>) -> Self {
        ObjectStore::new(s3::S3Objects::new(client).expecting_owner(expected_bucket_owner))
    }

    pub async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        self.client.head_object(object).await
    }

    pub async fn get(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        let stream = self.client.get_object(object).await?;
        Ok(counting::count_reads(stream, self.bytes.read.clone()))
    }

    pub async fn get_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        let bytes = self.client.get_object_range(object, range).await?;
        self.bytes
            .read
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// One ListObjectsV2 page of `prefix`.
    pub async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError> {
        self.client.list_objects(bucket, prefix, from).await
    }

    /// Copies `from` to `bucket`/`key` within S3 ([`ObjectClient::copy_object`]):
    /// no byte passes through the function.
    pub async fn copy(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        self.client.copy_object(from, bucket, key, headers).await
    }

    /// Deletes up to [`MAX_KEYS_PER_CALL`] keys.
    pub async fn delete_keys(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        self.client.delete_objects(bucket, keys).await
    }

    /// One ListObjectVersions page of `prefix` (versions, not delete
    /// markers), from `from` (the previous page's `next`).
    pub async fn versions_page(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
        self.client.list_object_versions(bucket, prefix, from).await
    }

    /// Every version (not delete markers) of exactly `key`, all pages.
    pub async fn versions_of(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Vec<Option<String>>, ListError> {
        let mut versions = Vec::new();
        let mut from = None;
        loop {
            let page = self
                .client
                .list_object_versions(bucket, key, from.as_ref())
                .await?;
            versions.extend(
                page.versions
                    .into_iter()
                    .filter(|(listed, _)| listed == key)
                    .map(|(_, version)| version),
            );
            match page.next {
                Some(next) => from = Some(next),
                None => return Ok(versions),
            }
        }
    }

    /// Every entry (versions and delete markers) of exactly `key`, all
    /// pages.
    pub async fn history_of(&self, bucket: &str, key: &str) -> Result<Vec<KeyEntry>, ListError> {
        let mut entries = Vec::new();
        let mut from = None;
        loop {
            let page = self
                .client
                .list_object_versions(bucket, key, from.as_ref())
                .await?;
            entries.extend(page.entries.into_iter().filter(|e| e.key == key));
            match page.next {
                Some(next) => from = Some(next),
                None => return Ok(entries),
            }
        }
    }

    /// PutObject of `body`, whose SHA-256 is `sha256` (hex) when known:
    /// sent as its `x-amz-checksum-sha256`, S3 refuses bytes that do not
    /// match it and keeps it, so a HEAD later says which bytes the object
    /// holds without reading them (a chained job's input, read by ranges,
    /// is checked so against its upstream manifest).
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        sha256: Option<&str>,
    ) -> Result<(), PutError> {
        // Known before it is sent (bytes in memory, a file of known size);
        // wrapping the body to count it would cost it its retries.
        let (lower, upper) = body.size_hint();
        let checksum = sha256.and_then(sha256_base64);
        self.client
            .put_object(bucket, key, headers, body, checksum.as_deref())
            .await?;
        self.bytes
            .written
            .fetch_add(upper.unwrap_or(lower), Ordering::Relaxed);
        Ok(())
    }
}

/// A SHA-256 in hex as S3's `x-amz-checksum-sha256` (base64 of the 32
/// bytes); `None` when `hex` is not 64 hexadecimal digits. Pure.
pub fn sha256_base64(hex: &str) -> Option<String> {
    use base64::Engine;
    let bytes = hex::decode(hex).ok().filter(|b| b.len() == 32)?;
    Some(base64::engine::general_purpose::STANDARD.encode(bytes))
}
