//! Objects in S3: each [`ObjectClient`] call is one request.

use std::ops::Range;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ChecksumMode;
use aws_sdk_s3::Client;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response;

use super::{
    owner_mismatch, DeleteError, ErrorKind, GetError, HeadError, KeyEntry, ListError, ObjectClient,
    ObjectHeaders, ObjectRef, PutError, VersionsPage,
};
use crate::aws::describe_error;
use crate::fingerprint::ObjectHead;

/// An ETag as HTTP writes it, in double quotes.
fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// Objects in S3.
#[derive(Debug, Clone)]
pub struct S3Objects {
    client: Client,
    expected_bucket_owner: Option<String>,
}

impl S3Objects {
    pub fn new(client: Client) -> Self {
        S3Objects {
            client,
            expected_bucket_owner: None,
        }
    }

    /// Every call names `account` as the bucket's expected owner
    /// (`ExpectedBucketOwner`): S3 refuses it with 403 when another account
    /// owns the bucket.
    pub fn expecting_owner(mut self, account: Option<String>) -> Self {
        self.expected_bucket_owner = account;
        self
    }

    /// An SDK error's description; a 403 while an owner is expected says
    /// which setting may be the cause.
    fn describe<E>(&self, err: &SdkError<E, Response>) -> String
    where
        E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    {
        let message = describe_error(err);
        match (&self.expected_bucket_owner, err.raw_response()) {
            (Some(account), Some(raw)) if raw.status().as_u16() == 403 => {
                format!("{message} ({})", owner_mismatch(account))
            }
            _ => message,
        }
    }
}

/// Whether an ETag is the MD5 of the object's bytes, as S3 documents it:
/// for a single-part upload (a multipart ETag ends `-<parts>`) stored
/// unencrypted or under SSE-S3, not SSE-KMS (`aws:kms`, `aws:kms:dsse`)
/// nor SSE-C. The same bytes get other ETags otherwise. Pure.
pub fn etag_is_md5(etag: &str, server_side_encryption: Option<&str>, sse_c: bool) -> bool {
    let etag = etag.trim_matches('"');
    let kms = server_side_encryption.is_some_and(|sse| sse.starts_with("aws:kms"));
    etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit()) && !kms && !sse_c
}

/// What a copy source's key keeps unencoded: RFC 3986's unreserved
/// characters and the `/` between a key's parts.
const COPY_SOURCE_KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

#[async_trait::async_trait]
impl ObjectClient for S3Objects {
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        let result = self
            .client
            .head_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_version_id(object.version_id.clone())
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await;
        let output = match result {
            Ok(output) => output,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => {
                return Ok(None)
            }
            Err(err)
                if err
                    .raw_response()
                    .is_some_and(|r| r.status().as_u16() == 404) =>
            {
                return Ok(None)
            }
            // A HEAD by version id of a delete marker: S3 answers 405
            // MethodNotAllowed (with `x-amz-delete-marker: true`), not 404.
            // No object is there: in a versioning-suspended bucket a
            // DELETE removes the null version for good and leaves a null
            // marker, and `versionId=null` then names the marker.
            Err(err)
                if object.version_id.is_some()
                    && err
                        .raw_response()
                        .is_some_and(|r| r.status().as_u16() == 405) =>
            {
                return Ok(None)
            }
            Err(err) => {
                return Err(HeadError {
                    object: object.to_string(),
                    message: self.describe(&err),
                    kind: ErrorKind::of_sdk(&err),
                })
            }
        };
        Ok(Some(ObjectHead {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            version_id: object.version_id.clone().or_else(|| {
                output
                    .version_id()
                    .filter(|v| *v != "null")
                    .map(str::to_string)
            }),
            etag: output
                .e_tag()
                .unwrap_or_default()
                .trim_matches('"')
                .to_string(),
            size: output.content_length().unwrap_or(0).max(0) as u64,
            checksum_sha256: output.checksum_sha256().map(str::to_string),
            checksum_type: output.checksum_type().map(|t| t.as_str().to_string()),
            content_type: output.content_type().map(str::to_string),
            cache_control: output.cache_control().map(str::to_string),
            checksum_crc64nvme: output.checksum_crc64_nvme().map(str::to_string),
            declared_sha256: output
                .metadata()
                .and_then(|m| m.get(crate::fingerprint::DECLARED_SHA256_METADATA))
                .cloned(),
            etag_md5: etag_is_md5(
                output.e_tag().unwrap_or_default(),
                output.server_side_encryption().map(|s| s.as_str()),
                output.sse_customer_algorithm().is_some(),
            ),
        }))
    }

    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.client
            .get_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_version_id(object.version_id.clone())
            .set_if_match(object.if_match.as_deref().map(quoted))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .send()
            .await
            .map(|output| output.body)
            .map_err(|err| GetError {
                object: object.to_string(),
                message: self.describe(&err),
                kind: ErrorKind::of_sdk(&err),
            })
    }

    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        let error = |message: String, kind| GetError {
            object: format!("{object} bytes={}-{}", range.start, range.end),
            message,
            kind,
        };
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let output = self
            .client
            .get_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_version_id(object.version_id.clone())
            .set_if_match(object.if_match.as_deref().map(quoted))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            // HTTP ranges are inclusive at both ends.
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await
            .map_err(|err| error(self.describe(&err), ErrorKind::of_sdk(&err)))?;
        let bytes = output
            .body
            .collect()
            .await
            .map_err(|err| error(err.to_string(), ErrorKind::Other))?
            .into_bytes();
        Ok(bytes.to_vec())
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError> {
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type(headers.content_type)
            .set_cache_control(headers.cache_control.map(str::to_string))
            .set_checksum_sha256(checksum_sha256.map(str::to_string))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .body(body)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| PutError {
                bucket: bucket.to_string(),
                key: key.to_string(),
                message: self.describe(&err),
                kind: ErrorKind::of_sdk(&err),
            })
    }

    async fn copy_object(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        // The copy source is `bucket/key`, URL-encoded, `?versionId=` when
        // pinned to a version.
        let mut source = format!(
            "{}/{}",
            from.bucket,
            percent_encoding::utf8_percent_encode(&from.key, COPY_SOURCE_KEY)
        );
        if let Some(version) = &from.version_id {
            source.push_str("?versionId=");
            source.extend(percent_encoding::utf8_percent_encode(
                version,
                percent_encoding::NON_ALPHANUMERIC,
            ));
        }
        self.client
            .copy_object()
            .copy_source(source)
            .set_copy_source_if_match(from.if_match.as_deref().map(quoted))
            .bucket(bucket)
            .key(key)
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .content_type(headers.content_type)
            .set_cache_control(headers.cache_control.map(str::to_string))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .set_expected_source_bucket_owner(self.expected_bucket_owner.clone())
            .send()
            .await
            .map(|_| ())
            .map_err(|err| PutError {
                bucket: bucket.to_string(),
                key: key.to_string(),
                message: format!("copying {from}: {}", self.describe(&err)),
                kind: ErrorKind::of_sdk(&err),
            })
    }

    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
        let output = self
            .client
            .list_object_versions()
            .bucket(bucket)
            .prefix(prefix)
            .set_key_marker(from.map(|(key, _)| key.clone()))
            .set_version_id_marker(from.map(|(_, version)| version.clone()))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .send()
            .await
            .map_err(|err| ListError {
                operation: "ListObjectVersions",
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
                message: self.describe(&err),
                kind: ErrorKind::of_sdk(&err),
            })?;
        let versions = output
            .versions()
            .iter()
            .filter_map(|v| {
                let key = v.key()?.to_string();
                let version = v
                    .version_id()
                    .filter(|id| *id != "null")
                    .map(str::to_string);
                Some((key, version))
            })
            .collect();
        let id = |id: Option<&str>| id.filter(|id| *id != "null").map(str::to_string);
        let millis =
            |at: Option<&aws_sdk_s3::primitives::DateTime>| at.and_then(|at| at.to_millis().ok());
        let mut entries: Vec<KeyEntry> = output
            .versions()
            .iter()
            .map(|v| KeyEntry {
                key: v.key().unwrap_or_default().to_string(),
                version_id: id(v.version_id()),
                delete_marker: false,
                is_latest: v.is_latest() == Some(true),
                last_modified_ms: millis(v.last_modified()),
            })
            .collect();
        entries.extend(output.delete_markers().iter().map(|m| KeyEntry {
            key: m.key().unwrap_or_default().to_string(),
            version_id: id(m.version_id()),
            delete_marker: true,
            is_latest: m.is_latest() == Some(true),
            last_modified_ms: millis(m.last_modified()),
        }));
        let next = if output.is_truncated() == Some(true) {
            output
                .next_key_marker()
                .zip(output.next_version_id_marker())
                .map(|(key, version)| (key.to_string(), version.to_string()))
        } else {
            None
        };
        Ok(VersionsPage {
            versions,
            next,
            entries,
        })
    }

    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError> {
        let output = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(from.map(str::to_string))
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .send()
            .await
            .map_err(|err| ListError {
                operation: "ListObjectsV2",
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
                message: self.describe(&err),
                kind: ErrorKind::of_sdk(&err),
            })?;
        let keys = output
            .contents()
            .iter()
            .filter_map(|object| object.key().map(str::to_string))
            .collect();
        let next = output
            .next_continuation_token()
            .filter(|_| output.is_truncated() == Some(true))
            .map(str::to_string);
        Ok((keys, next))
    }

    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        let failed = |message: String, kind| DeleteError {
            bucket: bucket.to_string(),
            message,
            kind,
        };
        if keys.is_empty() {
            return Ok(());
        }
        let objects = keys
            .iter()
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(e.to_string(), ErrorKind::Other))?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|e| failed(e.to_string(), ErrorKind::Other))?;
        let output = self
            .client
            .delete_objects()
            .bucket(bucket)
            .delete(delete)
            .set_expected_bucket_owner(self.expected_bucket_owner.clone())
            .send()
            .await
            .map_err(|err| failed(self.describe(&err), ErrorKind::of_sdk(&err)))?;
        match output.errors().first() {
            None => Ok(()),
            Some(error) => Err(failed(
                format!(
                    "{}: {} {}",
                    error.key().unwrap_or_default(),
                    error.code().unwrap_or_default(),
                    error.message().unwrap_or_default()
                ),
                ErrorKind::Other,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::etag_is_md5;

    #[test]
    fn an_etag_is_an_md5_only_for_a_single_part_upload_without_kms_or_sse_c() {
        let md5 = "\"9e107d9d372bb6826bd81d3542a419d6\"";
        assert!(etag_is_md5(md5, None, false));
        assert!(etag_is_md5(md5, Some("AES256"), false));
        assert!(!etag_is_md5(md5, Some("aws:kms"), false));
        assert!(!etag_is_md5(md5, Some("aws:kms:dsse"), false));
        assert!(!etag_is_md5(md5, Some("AES256"), true));
        assert!(!etag_is_md5(
            "\"9e107d9d372bb6826bd81d3542a419d6-3\"",
            None,
            false
        ));
        assert!(!etag_is_md5("", None, false));
    }
}
