//! The input of a job: the object version that was headed and keyed, read
//! only as those bytes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use tokio::io::AsyncWriteExt;

use super::StepError;
use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::store::{ErrorKind, GetError, ObjectRef, ObjectStore};

/// The input object version of a job.
#[derive(Debug, Clone)]
pub struct JobInput {
    store: ObjectStore,
    pub head: ObjectHead,
    pub fingerprint: Fingerprint,
    /// Set when a read found the object replaced since the head: whatever
    /// the step makes of that error, its job must not be finished.
    replaced: Arc<AtomicBool>,
}

impl JobInput {
    pub fn new(store: ObjectStore, head: ObjectHead, fingerprint: Fingerprint) -> Self {
        JobInput {
            store,
            head,
            fingerprint,
            replaced: Arc::default(),
        }
    }

    /// The version that was headed and keyed; every read is pinned to its
    /// ETag (`If-Match`), so no byte of another object reaches the step.
    pub fn object(&self) -> ObjectRef {
        ObjectRef {
            bucket: self.head.bucket.clone(),
            key: self.head.key.clone(),
            version_id: self.head.version_id.clone(),
            if_match: Some(self.head.etag.clone()).filter(|etag| !etag.is_empty()),
        }
    }

    /// Whether a read found the object replaced since it was keyed.
    pub fn was_replaced(&self) -> bool {
        self.replaced.load(Ordering::SeqCst)
    }

    fn read_error(&self, err: GetError) -> StepError {
        if err.kind == ErrorKind::PreconditionFailed {
            self.replaced.store(true, Ordering::SeqCst);
        }
        StepError::Input(err.to_string())
    }

    /// Streams the exact version the job is keyed on.
    pub async fn stream(&self) -> Result<ByteStream, StepError> {
        self.store
            .get(&self.object())
            .await
            .map_err(|e| self.read_error(e))
    }

    /// Reads `range` of the input (end exclusive, within its size).
    pub async fn read_range(&self, range: std::ops::Range<u64>) -> Result<Vec<u8>, StepError> {
        self.store
            .get_range(&self.object(), range)
            .await
            .map_err(|e| self.read_error(e))
    }

    /// Reads the whole input into memory (for decoders that need it all).
    pub async fn read_all(&self) -> Result<Vec<u8>, StepError> {
        let body = self.stream().await?;
        body.collect()
            .await
            .map(|data| data.into_bytes().to_vec())
            .map_err(|e| StepError::Input(e.to_string()))
    }

    /// Copies the input to a local file (for tools that need a seekable
    /// file), returning its size.
    pub async fn spool_to(&self, path: &Path) -> Result<u64, StepError> {
        let mut body = self.stream().await?;
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| StepError::Input(format!("creating {}: {e}", path.display())))?;
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| StepError::Input(e.to_string()))?;
            size += chunk.len() as u64;
            file.write_all(&chunk)
                .await
                .map_err(|e| StepError::Input(format!("writing {}: {e}", path.display())))?;
        }
        file.flush()
            .await
            .map_err(|e| StepError::Input(format!("writing {}: {e}", path.display())))?;
        Ok(size)
    }
}

/// Ranged reads of the input, for parsers that jump (ISO BMFF's `moov`).
#[async_trait::async_trait]
impl crate::bmff::RangeSource for JobInput {
    async fn read_range(&self, range: std::ops::Range<u64>) -> Result<Vec<u8>, String> {
        JobInput::read_range(self, range)
            .await
            .map_err(|e| e.to_string())
    }
}
