//! An object client that fails the calls a [`FaultPlan`] names (SlowDown,
//! 5xx after the SDK's retries: transient), and passes the others to the
//! client it wraps.

use std::ops::Range;
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;

use super::{
    DeleteError, ErrorKind, GetError, HeadError, ListError, ObjectClient, ObjectHeaders, ObjectRef,
    PutError, VersionsPage,
};
use crate::faults::{Call, FaultPlan};
use crate::fingerprint::ObjectHead;

#[derive(Debug, Clone)]
pub struct FaultyObjects {
    inner: Arc<dyn ObjectClient>,
    plan: Arc<FaultPlan>,
}

impl FaultyObjects {
    pub fn new(inner: impl ObjectClient + 'static, plan: Arc<FaultPlan>) -> Self {
        FaultyObjects {
            inner: Arc::new(inner),
            plan,
        }
    }

    /// Another writer's PUT over `object`, when the plan has one due before
    /// this call.
    async fn overwrite_if_due(&self, call: Call, object: &ObjectRef) {
        if let Some(bytes) = self.plan.overwrite_due(call, &object.key) {
            self.inner
                .put_object(
                    &object.bucket,
                    &object.key,
                    ObjectHeaders::typed("application/octet-stream"),
                    ByteStream::from(bytes),
                    None,
                )
                .await
                .expect("the injected overwrite is written");
        }
    }
}

#[async_trait::async_trait]
impl ObjectClient for FaultyObjects {
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        self.overwrite_if_due(Call::HeadObject, object).await;
        self.plan.pass(Call::HeadObject, &object.key).await;
        if let Some(message) = self.plan.check(Call::HeadObject, &object.key) {
            return Err(HeadError {
                object: object.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.head_object(object).await
    }

    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.overwrite_if_due(Call::GetObject, object).await;
        self.plan.pass(Call::GetObject, &object.key).await;
        if let Some(message) = self.plan.check(Call::GetObject, &object.key) {
            return Err(GetError {
                object: object.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.get_object(object).await
    }

    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        self.overwrite_if_due(Call::GetObject, object).await;
        self.plan.pass(Call::GetObject, &object.key).await;
        if let Some(message) = self.plan.check(Call::GetObject, &object.key) {
            return Err(GetError {
                object: object.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.get_object_range(object, range).await
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError> {
        self.plan.pass(Call::PutObject, key).await;
        if let Some(message) = self.plan.check(Call::PutObject, key) {
            return Err(PutError {
                bucket: bucket.to_string(),
                key: key.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner
            .put_object(bucket, key, headers, body, checksum_sha256)
            .await
    }

    async fn copy_object(
        &self,
        from: &ObjectRef,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
    ) -> Result<(), PutError> {
        self.plan.pass(Call::CopyObject, key).await;
        if let Some(message) = self.plan.check(Call::CopyObject, key) {
            return Err(PutError {
                bucket: bucket.to_string(),
                key: key.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.copy_object(from, bucket, key, headers).await
    }

    async fn list_object_versions(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&(String, String)>,
    ) -> Result<VersionsPage, ListError> {
        self.inner.list_object_versions(bucket, prefix, from).await
    }

    async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        from: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), ListError> {
        self.plan.pass(Call::ListObjects, prefix).await;
        if let Some(message) = self.plan.check(Call::ListObjects, prefix) {
            return Err(ListError {
                operation: "ListObjectsV2",
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.list_objects(bucket, prefix, from).await
    }

    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        let first = keys.first().map(String::as_str).unwrap_or_default();
        self.plan.pass(Call::DeleteObjects, first).await;
        if let Some(message) = self.plan.check(Call::DeleteObjects, first) {
            return Err(DeleteError {
                bucket: bucket.to_string(),
                message,
                kind: ErrorKind::Transient,
            });
        }
        self.inner.delete_objects(bucket, keys).await
    }
}
