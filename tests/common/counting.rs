//! Clients that count: DynamoDB calls (an interceptor) and object reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_s3::primitives::ByteStream;
use mediaonce::fingerprint::ObjectHead;
use mediaonce::store::{
    DeleteError, GetError, HeadError, ListError, ObjectClient, ObjectHeaders, ObjectRef, PutError,
    VersionsPage,
};

/// Counts DynamoDB calls made through a client (one per operation, not per
/// retry attempt).
#[derive(Debug, Default, Clone)]
pub struct CallCounter(Arc<AtomicUsize>);

impl CallCounter {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Counts the object reads a client makes: whole GetObjects, ranged ones,
/// and the bytes the ranged ones returned.
#[derive(Debug, Clone)]
pub struct ReadCounter {
    inner: Arc<dyn ObjectClient>,
    pub whole: Arc<AtomicUsize>,
    pub ranged: Arc<AtomicUsize>,
    pub ranged_bytes: Arc<AtomicUsize>,
}

impl ReadCounter {
    pub fn new(inner: impl ObjectClient + 'static) -> Self {
        ReadCounter {
            inner: Arc::new(inner),
            whole: Default::default(),
            ranged: Default::default(),
            ranged_bytes: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl ObjectClient for ReadCounter {
    async fn head_object(&self, object: &ObjectRef) -> Result<Option<ObjectHead>, HeadError> {
        self.inner.head_object(object).await
    }

    async fn get_object(&self, object: &ObjectRef) -> Result<ByteStream, GetError> {
        self.whole.fetch_add(1, Ordering::SeqCst);
        self.inner.get_object(object).await
    }

    async fn get_object_range(
        &self,
        object: &ObjectRef,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, GetError> {
        let bytes = self.inner.get_object_range(object, range).await?;
        self.ranged.fetch_add(1, Ordering::SeqCst);
        self.ranged_bytes.fetch_add(bytes.len(), Ordering::SeqCst);
        Ok(bytes)
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        headers: ObjectHeaders<'_>,
        body: ByteStream,
        checksum_sha256: Option<&str>,
    ) -> Result<(), PutError> {
        self.inner
            .put_object(bucket, key, headers, body, checksum_sha256)
            .await
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
        self.inner.list_objects(bucket, prefix, from).await
    }

    async fn delete_objects(&self, bucket: &str, keys: &[String]) -> Result<(), DeleteError> {
        self.inner.delete_objects(bucket, keys).await
    }
}
