//! Objects in memory, for unit tests and local tools: an unversioned store
//! whose HeadObject answers like S3's (ETag, size, and a full-object SHA-256
//! checksum for objects inserted with one), and which refuses a call to a
//! bucket another account owns with S3's 403 when an owner is expected.
//!
//! Each object is its key's `null` version. A bucket whose versioning is
//! suspended is modelled by its deletes ([`InMemoryObjects::delete_suspended`]):
//! the null version removed for good and a null delete marker put, which
//! the key's version listing shows as its current entry, and which a HEAD
//! of `versionId=null` finds no object behind (S3 answers 405 there; the
//! client contract is `None`, as for a 404).

use super::{DeleteError, ListError, VersionsPage};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::{owner_mismatch, ErrorKind, GetError, HeadError, ObjectClient, ObjectRef, PutError};
use crate::fingerprint::ObjectHead;

#[derive(Debug, Clone)]
struct Stored {
    bytes: Vec<u8>,
    content_type: String,
    with_sha256: bool,
    /// Uploaded in parts: its ETag is S3's multipart form (`<hex>-<parts>`),
    /// not the bytes' MD5, so the same bytes have another ETag.
    multipart: bool,
}

impl Stored {
    fn etag(&self) -> String {
        if self.multipart {
            format!("{}-2", etag(&self.bytes))
        } else {
            etag(&self.bytes)
        }
    }
}

#[derive(Debug, Default)]
pub struct InMemoryObjects {
    objects: Mutex<BTreeMap<(String, String), Stored>>,
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
        lock(&self.null_markers).remove(&(bucket.to_string(), key.to_string()));
        let stored = Stored {
            bytes: bytes.to_vec(),
            content_type: "application/octet-stream".into(),
            with_sha256: sha256,
            multipart,
        };
        let etag = stored.etag();
        self.objects()
            .insert((bucket.to_string(), key.to_string()), stored);
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

    /// The bytes a GET of `object` reads, as S3 answers it: the caller's
    /// bucket owner checked, a missing key (or any named version: this store
    /// is unversioned) `NoSuchKey`, and an `If-Match` that is not the
    /// current ETag 412.
    fn current(&self, object: &ObjectRef) -> Result<Vec<u8>, GetError> {
        let error = |message: String, kind| GetError {
            object: object.to_string(),
            message,
            kind,
        };
        self.check_owner(&object.bucket)
            .map_err(|message| error(message, ErrorKind::Other))?;
        let objects = self.objects();
        let stored = objects
            .get(&(object.bucket.clone(), object.key.clone()))
            .filter(|_| object.version_id.is_none())
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
        Ok(stored.bytes.clone())
    }

    /// Deletes an object (as another writer would).
    pub fn remove(&self, bucket: &str, key: &str) {
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

    /// An object's bytes.
    pub fn bytes(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        self.objects()
            .get(&(bucket.to_string(), key.to_string()))
            .map(|s| s.bytes.clone())
    }

    /// The keys in a bucket under a prefix, in order.
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        self.objects()
            .keys()
            .filter(|(b, k)| b == bucket && k.starts_with(prefix))
            .map(|(_, k)| k.clone())
            .collect()
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
        // Unversioned: a named version does not exist.
        if object.version_id.is_some() {
            return Ok(None);
        }
        let objects = self.objects();
        let Some(stored) = objects.get(&(object.bucket.clone(), object.key.clone())) else {
            return Ok(None);
        };
        Ok(Some(ObjectHead {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            version_id: None,
            etag: stored.etag(),
            size: stored.bytes.len() as u64,
            checksum_sha256: stored.with_sha256.then(|| sha256_checksum(&stored.bytes)),
            checksum_type: stored.with_sha256.then(|| "FULL_OBJECT".to_string()),
            content_type: Some(stored.content_type.clone()),
            // Unique per content, as a single-part upload's MD5 is.
            etag_md5: !stored.multipart,
            ..Default::default()
        }))
    }

    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.current(object).map(ByteStream::from)
    }

    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        let bytes = self.current(object)?;
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

    async fn copy_object(&self, from: &ObjectRef, bucket: &str, key: &str) -> Result<(), PutError> {
        let error = |message: String, kind| PutError {
            bucket: bucket.to_string(),
            key: key.to_string(),
            message: format!("copying {from}: {message}"),
            kind,
        };
        self.check_owner(bucket)
            .map_err(|message| error(message, ErrorKind::Other))?;
        let bytes = self.current(from).map_err(|e| error(e.message, e.kind))?;
        let content_type = self
            .objects()
            .get(&(from.bucket.clone(), from.key.clone()))
            .map(|stored| stored.content_type.clone())
            .unwrap_or_default();
        self.objects().insert(
            (bucket.to_string(), key.to_string()),
            Stored {
                bytes,
                content_type,
                with_sha256: false,
                multipart: false,
            },
        );
        Ok(())
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        content_type: &str,
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
        self.objects().insert(
            (bucket.to_string(), key.to_string()),
            Stored {
                bytes,
                content_type: content_type.to_string(),
                with_sha256: checksum_sha256.is_some(),
                multipart: false,
            },
        );
        Ok(())
    }

    /// Objects here are unversioned: each is its `null` version.
    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        _from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
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
        let mut objects = self.objects();
        for key in keys {
            objects.remove(&(bucket.to_string(), key.clone()));
        }
        Ok(())
    }
}
