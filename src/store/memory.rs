//! Objects in memory, for unit tests and local tools: a store whose
//! HeadObject answers like S3's (ETag, size, and a full-object SHA-256
//! checksum for objects inserted with one), and which refuses a call to a
//! bucket another account owns with S3's 403 when an owner is expected.
//!
//! A bucket is unversioned unless [`InMemoryObjects::enable_versioning`]
//! is called for it: then every put is a new version with its own id, a
//! DELETE without a version id puts a delete marker (the key's current
//! entry, which a HEAD or GET of the key finds no object behind, and a HEAD
//! by the marker's own id neither: S3 answers 405 there, the client
//! contract is `None`, as for a 404), and a version is removed for good
//! only by name ([`InMemoryObjects::delete_version`], as a user's DELETE
//! with a version id or a lifecycle expiration does).
//!
//! In an unversioned bucket each object is its key's `null` version. A
//! bucket whose versioning is suspended is modelled by its deletes
//! ([`InMemoryObjects::delete_suspended`]): the null version removed for
//! good and a null delete marker put, which the key's version listing
//! shows as its current entry, and which a HEAD of `versionId=null` finds
//! no object behind.

use super::{DeleteError, ListError, VersionsPage};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::{
    owner_mismatch, ErrorKind, GetError, HeadError, ObjectClient, ObjectHeaders, ObjectRef,
    PutError,
};
use crate::fingerprint::ObjectHead;

#[derive(Debug, Clone)]
struct Stored {
    bytes: Vec<u8>,
    content_type: String,
    cache_control: Option<String>,
    with_sha256: bool,
    /// Uploaded in parts: its ETag is S3's multipart form (`<hex>-<parts>`),
    /// not the bytes' MD5, so the same bytes have another ETag.
    multipart: bool,
    /// Encrypted with SSE-KMS (the bucket's default): S3 gives the put an
    /// ETag that is not the bytes' MD5, another for every put of them.
    kms_etag: Option<String>,
}

impl Stored {
    fn etag(&self) -> String {
        let hex = self.kms_etag.clone().unwrap_or_else(|| etag(&self.bytes));
        if self.multipart {
            format!("{hex}-2")
        } else {
            hex
        }
    }
}

/// One entry of a versioned key's history.
#[derive(Debug, Clone)]
struct Version {
    id: String,
    /// `None`: a delete marker.
    stored: Option<Stored>,
}

#[derive(Debug, Default)]
pub struct InMemoryObjects {
    objects: Mutex<BTreeMap<(String, String), Stored>>,
    /// Buckets whose versioning is enabled.
    versioned: Mutex<BTreeSet<String>>,
    /// A versioned bucket's keys: each one's versions and delete markers,
    /// oldest first.
    versions: Mutex<BTreeMap<(String, String), Vec<Version>>>,
    /// The last version id given (ids are opaque to callers, as S3's are).
    last_version: AtomicU64,
    /// Buckets whose default encryption is SSE-KMS, and the puts to them.
    kms: Mutex<BTreeSet<String>>,
    kms_puts: AtomicU64,
    /// Keys whose current entry is a null delete marker (a DELETE in a
    /// versioning-suspended bucket); a put over it replaces it.
    null_markers: Mutex<std::collections::BTreeSet<(String, String)>>,
    /// Bucket → the account that owns it; unnamed buckets are the caller's.
    owners: Mutex<HashMap<String, String>>,
    /// The owner every call expects (`ExpectedBucketOwner`), if any.
    expected_owner: Mutex<Option<String>>,
}

impl InMemoryObjects {
    pub fn new() -> Arc<Self> {
        Arc::new(InMemoryObjects::default())
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Stored>> {
        lock(&self.objects)
    }

    /// Turns versioning on for `bucket` (before anything is stored in it).
    pub fn enable_versioning(&self, bucket: &str) {
        lock(&self.versioned).insert(bucket.to_string());
    }

    /// Encrypts every later put to `bucket` with SSE-KMS, as a bucket's
    /// default encryption does: each put's ETag is not its bytes' MD5 (AWS
    /// documents no relation), another for every put of the same bytes.
    pub fn encrypt_with_kms(&self, bucket: &str) {
        lock(&self.kms).insert(bucket.to_string());
    }

    fn is_versioned(&self, bucket: &str) -> bool {
        lock(&self.versioned).contains(bucket)
    }

    /// Appends an entry to a versioned key's history; returns its id.
    fn push_version(&self, bucket: &str, key: &str, stored: Option<Stored>) -> String {
        let id = format!(
            "v{:08}",
            self.last_version.fetch_add(1, Ordering::Relaxed) + 1
        );
        lock(&self.versions)
            .entry((bucket.to_string(), key.to_string()))
            .or_default()
            .push(Version {
                id: id.clone(),
                stored,
            });
        id
    }

    /// The object `object` names: in a versioned bucket its named version
    /// or the key's current entry (`None` if that is a delete marker), with
    /// its version id; in an unversioned one the key's object (`None` for
    /// any named version).
    fn resolve(&self, object: &ObjectRef) -> Option<(Stored, Option<String>)> {
        if !self.is_versioned(&object.bucket) {
            return self
                .objects()
                .get(&(object.bucket.clone(), object.key.clone()))
                .filter(|_| object.version_id.is_none())
                .map(|stored| (stored.clone(), None));
        }
        let versions = lock(&self.versions);
        let history = versions.get(&(object.bucket.clone(), object.key.clone()))?;
        let entry = match &object.version_id {
            Some(id) => history.iter().find(|v| &v.id == id)?,
            None => history.last()?,
        };
        Some((entry.stored.clone()?, Some(entry.id.clone())))
    }

    /// The id of a versioned key's current entry (a version or a delete
    /// marker).
    pub fn current_version(&self, bucket: &str, key: &str) -> Option<String> {
        lock(&self.versions)
            .get(&(bucket.to_string(), key.to_string()))
            .and_then(|history| history.last())
            .map(|v| v.id.clone())
    }

    /// A DELETE without a version id in a versioned bucket: a delete
    /// marker put as the key's current entry. Returns the marker's id.
    pub fn put_delete_marker(&self, bucket: &str, key: &str) -> String {
        self.push_version(bucket, key, None)
    }

    /// A version (or delete marker) of a versioned bucket removed for good,
    /// as a DELETE naming it or a lifecycle expiration does. Whether it
    /// was there.
    pub fn delete_version(&self, bucket: &str, key: &str, version_id: &str) -> bool {
        let mut versions = lock(&self.versions);
        let Some(history) = versions.get_mut(&(bucket.to_string(), key.to_string())) else {
            return false;
        };
        let before = history.len();
        history.retain(|v| v.id != version_id);
        before != history.len()
    }

    /// Stores an object as an upload would; with `sha256`, as one that asked
    /// S3 for a SHA-256 checksum. Returns its ETag.
    pub fn insert(&self, bucket: &str, key: &str, bytes: &[u8], sha256: bool) -> String {
        self.store(bucket, key, bytes, sha256, false)
    }

    /// Stores an object as a multipart upload would: the same bytes as a
    /// single-part upload get another ETag, one that is not their MD5.
    pub fn insert_multipart(&self, bucket: &str, key: &str, bytes: &[u8], sha256: bool) -> String {
        self.store(bucket, key, bytes, sha256, true)
    }

    fn store(
        &self,
        bucket: &str,
        key: &str,
        bytes: &[u8],
        sha256: bool,
        multipart: bool,
    ) -> String {
        let stored = Stored {
            bytes: bytes.to_vec(),
            content_type: "application/octet-stream".into(),
            cache_control: None,
            with_sha256: sha256,
            multipart,
            kms_etag: None,
        };
        self.put_stored(bucket, key, stored)
    }

    /// A put's bytes stored: a new version in a versioned bucket, else the
    /// key's object replaced (and a null marker over it gone). Its ETag.
    fn put_stored(&self, bucket: &str, key: &str, mut stored: Stored) -> String {
        if lock(&self.kms).contains(bucket) {
            let put = self.kms_puts.fetch_add(1, Ordering::Relaxed);
            let mut salted = stored.bytes.clone();
            salted.extend_from_slice(format!("kms put {put}").as_bytes());
            stored.kms_etag = Some(etag(&salted));
        }
        let etag = stored.etag();
        if self.is_versioned(bucket) {
            self.push_version(bucket, key, Some(stored));
        } else {
            lock(&self.null_markers).remove(&(bucket.to_string(), key.to_string()));
            self.objects()
                .insert((bucket.to_string(), key.to_string()), stored);
        }
        etag
    }

    /// Makes `account` the owner of `bucket`.
    pub fn set_bucket_owner(&self, bucket: &str, account: &str) {
        lock(&self.owners).insert(bucket.to_string(), account.to_string());
    }

    /// Every later call names `account` as the expected bucket owner, as
    /// `S3Objects::expecting_owner` does.
    pub fn expect_owner(&self, account: Option<String>) {
        *lock(&self.expected_owner) = account;
    }

    /// S3's answer to a call whose expected owner does not own the bucket.
    fn check_owner(&self, bucket: &str) -> Result<(), String> {
        let expected = lock(&self.expected_owner).clone();
        match (expected, lock(&self.owners).get(bucket)) {
            (Some(expected), Some(owner)) if *owner != expected => Err(format!(
                "HTTP 403 AccessDenied: Access Denied ({})",
                owner_mismatch(&expected)
            )),
            _ => Ok(()),
        }
    }

    /// The object a GET of `object` reads, as S3 answers it: the caller's
    /// bucket owner checked, a missing key (or version, or a delete
    /// marker) `NoSuchKey`, and an `If-Match` that is not the current ETag
    /// 412.
    fn current(&self, object: &ObjectRef) -> Result<Stored, GetError> {
        let error = |message: String, kind| GetError {
            object: object.to_string(),
            message,
            kind,
        };
        self.check_owner(&object.bucket)
            .map_err(|message| error(message, ErrorKind::Other))?;
        let (stored, _) = self
            .resolve(object)
            .ok_or_else(|| error("NoSuchKey".into(), ErrorKind::NotFound))?;
        if let Some(expected) = &object.if_match {
            let current = stored.etag();
            if *expected != current {
                return Err(error(
                    format!("HTTP 412 PreconditionFailed: If-Match {expected}, ETag is {current}"),
                    ErrorKind::PreconditionFailed,
                ));
            }
        }
        Ok(stored)
    }

    /// Deletes an object (as another writer would): in a versioned
    /// bucket, puts a delete marker.
    pub fn remove(&self, bucket: &str, key: &str) {
        if self.is_versioned(bucket) {
            self.put_delete_marker(bucket, key);
            return;
        }
        self.objects()
            .remove(&(bucket.to_string(), key.to_string()));
    }

    /// A DELETE in a versioning-suspended bucket, as S3 does it: the null
    /// version is removed for good and a null delete marker put (its event
    /// is `ObjectRemoved:DeleteMarkerCreated` with the version id `null`).
    pub fn delete_suspended(&self, bucket: &str, key: &str) {
        self.remove(bucket, key);
        lock(&self.null_markers).insert((bucket.to_string(), key.to_string()));
    }

    /// An object's bytes (a versioned key's current version's).
    pub fn bytes(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        self.resolve(&ObjectRef {
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id: None,
            if_match: None,
        })
        .map(|(stored, _)| stored.bytes)
    }

    /// The keys in a bucket under a prefix, in order (of a versioned
    /// bucket, the ones whose current entry is not a delete marker).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        if self.is_versioned(bucket) {
            return lock(&self.versions)
                .iter()
                .filter(|((b, k), history)| {
                    b == bucket
                        && k.starts_with(prefix)
                        && history.last().is_some_and(|v| v.stored.is_some())
                })
                .map(|((_, k), _)| k.clone())
                .collect();
        }
        self.objects()
            .keys()
            .filter(|(b, k)| b == bucket && k.starts_with(prefix))
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// A versioned bucket's listing: every version and delete marker under
    /// `prefix`, each key's newest first, as ListObjectVersions gives them.
    fn versions_page(&self, bucket: &str, prefix: &str) -> VersionsPage {
        let versions = lock(&self.versions);
        let mut page = VersionsPage::default();
        for ((b, key), history) in versions.iter() {
            if b != bucket || !key.starts_with(prefix) {
                continue;
            }
            for (n, version) in history.iter().enumerate().rev() {
                page.entries.push(super::KeyEntry {
                    key: key.clone(),
                    version_id: Some(version.id.clone()),
                    delete_marker: version.stored.is_none(),
                    is_latest: n + 1 == history.len(),
                    ..Default::default()
                });
                if version.stored.is_some() {
                    page.versions.push((key.clone(), Some(version.id.clone())));
                }
            }
        }
        page
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The bytes' SHA-256 as S3's `x-amz-checksum-sha256` gives it (base64).
fn sha256_checksum(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(bytes))
}

/// Unique per content, as S3's ETag of a single-part upload is (S3 uses MD5).
fn etag(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..16])
}

#[async_trait::async_trait]
impl ObjectClient for Arc<InMemoryObjects> {
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        self.check_owner(&object.bucket)
            .map_err(|message| HeadError {
                object: object.to_string(),
                message,
                kind: ErrorKind::Other,
            })?;
        let Some((stored, version_id)) = self.resolve(object) else {
            return Ok(None);
        };
        Ok(Some(ObjectHead {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            version_id,
            etag: stored.etag(),
            size: stored.bytes.len() as u64,
            checksum_sha256: stored.with_sha256.then(|| sha256_checksum(&stored.bytes)),
            checksum_type: stored.with_sha256.then(|| "FULL_OBJECT".to_string()),
            content_type: Some(stored.content_type.clone()),
            cache_control: stored.cache_control.clone(),
            // Unique per content, as a single-part upload's MD5 is.
            etag_md5: !stored.multipart && stored.kms_etag.is_none(),
            ..Default::default()
        }))
    }

    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.current(object)
            .map(|stored| ByteStream::from(stored.bytes))
    }

    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        let bytes = self.current(object)?.bytes;
        let size = bytes.len();
        bytes
            .get(range.start as usize..range.end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| GetError {
                object: object.to_string(),
                message: format!("InvalidRange: {range:?} of {size} bytes"),
                kind: ErrorKind::Other,
            })
    }

    async fn copy_object(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        let error = |message: String, kind| PutError {
            bucket: bucket.to_string(),
            key: key.to_string(),
            message: format!("copying {from}: {message}"),
            kind,
        };
        self.check_owner(bucket)
            .map_err(|message| error(message, ErrorKind::Other))?;
        let Stored { bytes, .. } = self.current(from).map_err(|e| error(e.message, e.kind))?;
        self.put_stored(
            bucket,
            key,
            Stored {
                bytes,
                content_type: headers.content_type.to_string(),
                cache_control: headers.cache_control.map(str::to_string),
                with_sha256: false,
                multipart: false,
                kms_etag: None,
            },
        );
        Ok(())
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError> {
        self.check_owner(bucket).map_err(|message| PutError {
            bucket: bucket.to_string(),
            key: key.to_string(),
            message,
            kind: ErrorKind::Other,
        })?;
        let bytes = body.collect().await.map_err(|e| PutError {
            bucket: bucket.to_string(),
            key: key.to_string(),
            message: e.to_string(),
            kind: ErrorKind::Other,
        })?;
        let bytes = bytes.into_bytes().to_vec();
        // As S3 answers a checksum the bytes do not have.
        if checksum_sha256.is_some_and(|given| given != sha256_checksum(&bytes)) {
            return Err(PutError {
                bucket: bucket.to_string(),
                key: key.to_string(),
                message: "HTTP 400 BadDigest: the SHA-256 you specified did not match the calculated checksum".into(),
                kind: ErrorKind::Other,
            });
        }
        self.put_stored(
            bucket,
            key,
            Stored {
                bytes,
                content_type: headers.content_type.to_string(),
                cache_control: headers.cache_control.map(str::to_string),
                with_sha256: checksum_sha256.is_some(),
                multipart: false,
                kms_etag: None,
            },
        );
        Ok(())
    }

    /// A versioned bucket's every version and marker; an unversioned
    /// one's objects, each its `null` version.
    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        _from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
        if self.is_versioned(bucket) {
            return Ok(self.versions_page(bucket, prefix));
        }
        let keys = self.keys(bucket, prefix);
        let markers: Vec<super::KeyEntry> = lock(&self.null_markers)
            .iter()
            .filter(|(b, k)| b == bucket && k.starts_with(prefix))
            .map(|(_, key)| super::KeyEntry {
                key: key.clone(),
                delete_marker: true,
                is_latest: true,
                ..Default::default()
            })
            .collect();
        Ok(VersionsPage {
            entries: keys
                .iter()
                .map(|key| super::KeyEntry {
                    key: key.clone(),
                    is_latest: true,
                    ..Default::default()
                })
                .chain(markers)
                .collect(),
            versions: keys.into_iter().map(|key| (key, None)).collect(),
            next: None,
        })
    }

    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        _from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError> {
        Ok((self.keys(bucket, prefix), None))
    }

    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        for key in keys {
            self.remove(bucket, key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_sse_kms_buckets_puts_have_etags_that_are_not_their_md5() {
        let objects = InMemoryObjects::new();
        objects.encrypt_with_kms("in");
        let first = objects.insert("in", "a", b"same bytes", false);
        let again = objects.insert("in", "a", b"same bytes", false);
        assert_ne!(first, again, "another ETag for every put of the bytes");
        assert_ne!(
            first.trim_matches('"'),
            etag(b"same bytes").trim_matches('"')
        );
        let object = ObjectRef {
            bucket: "in".into(),
            key: "a".into(),
            version_id: None,
            if_match: None,
        };
        let head = objects.head_object(&object).await.unwrap().unwrap();
        assert_eq!(head.etag, again);
        assert!(!head.etag_md5, "another such ETag proves nothing");
        // A bucket without it: the MD5, the same for the same bytes.
        let plain = objects.insert("out", "a", b"same bytes", false);
        assert_eq!(plain, objects.insert("out", "b", b"same bytes", false));
    }
}
