//! The input of a job: the object version that was headed and keyed, read
//! only as those bytes. When the handler has read them already (to hash
//! them, or for another job of the same record), the step gets that copy:
//! no second GET.

use std::io::SeekFrom;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::local::{Keep, LoadError, Loaded, LocalCopy, ObjectBytes};
use super::StepError;
use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::store::{ErrorKind, GetError, ObjectRef, ObjectStore};

/// The input object version of a job.
#[derive(Debug, Clone)]
pub struct JobInput {
    bytes: Arc<ObjectBytes>,
    pub head: ObjectHead,
    pub fingerprint: Fingerprint,
    /// Set when a read found the object replaced since the head: whatever
    /// the step makes of that error, its job must not be finished.
    replaced: Arc<AtomicBool>,
}

impl JobInput {
    /// An input read straight from the store, as its step asks.
    pub fn new(store: ObjectStore, head: ObjectHead, fingerprint: Fingerprint) -> Self {
        let bytes = ObjectBytes::new(store, head, Keep::Nothing, &std::env::temp_dir());
        JobInput::of(Arc::new(bytes), fingerprint)
    }

    /// An input whose bytes the record's jobs share.
    pub(crate) fn of(bytes: Arc<ObjectBytes>, fingerprint: Fingerprint) -> Self {
        JobInput {
            head: bytes.head.clone(),
            bytes,
            fingerprint,
            replaced: Arc::default(),
        }
    }

    /// The version that was headed and keyed; every read is pinned to its
    /// ETag (`If-Match`), so no byte of another object reaches the step.
    pub fn object(&self) -> ObjectRef {
        self.bytes.object()
    }

    /// Whether a read found the object replaced since it was keyed.
    pub fn was_replaced(&self) -> bool {
        self.replaced.load(Ordering::SeqCst)
    }

    /// Whether the bytes are in a local file already ([`JobInput::spool_to`]
    /// links it rather than writing a copy).
    pub fn is_in_file(&self) -> bool {
        self.bytes
            .if_loaded()
            .is_some_and(|loaded| matches!(loaded.copy, LocalCopy::File(_)))
    }

    fn read_error(&self, err: GetError) -> StepError {
        if err.kind == ErrorKind::PreconditionFailed {
            self.replaced.store(true, Ordering::SeqCst);
        }
        StepError::Input(err.to_string())
    }

    /// Every byte, read once for the record, checked against the input hash
    /// when the job is keyed by content: a job never runs on bytes other
    /// than those its key names.
    async fn loaded(&self) -> Result<Arc<Loaded>, StepError> {
        let loaded = self
            .bytes
            .load()
            .await
            .map_err(|LoadError { message, replaced }| {
                if replaced {
                    self.replaced.store(true, Ordering::SeqCst);
                }
                StepError::Input(message)
            })?;
        let source = self.fingerprint.source;
        if source.is_content() && loaded.sha256 != self.fingerprint.input_hash {
            return Err(StepError::Integrity {
                expected: self.fingerprint.input_hash.clone(),
                actual: loaded.sha256.clone(),
                keyed_by: source.as_str(),
            });
        }
        Ok(loaded)
    }

    /// The SHA-256 of every byte of the input (read once, and not again if
    /// the handler read them to key the job).
    pub async fn sha256(&self) -> Result<String, StepError> {
        Ok(self.loaded().await?.sha256.clone())
    }

    /// Streams the exact version the job is keyed on.
    pub async fn stream(&self) -> Result<ByteStream, StepError> {
        if self.bytes.keeps_copy() {
            let loaded = self.loaded().await?;
            match &loaded.copy {
                LocalCopy::Memory(bytes) => return Ok(ByteStream::from(bytes.clone())),
                LocalCopy::File(file) => {
                    return ByteStream::from_path(&file.path)
                        .await
                        .map_err(|e| StepError::Input(format!("{}: {e}", file.path.display())))
                }
                LocalCopy::None => {}
            }
        }
        self.bytes
            .store()
            .get(&self.object())
            .await
            .map_err(|e| self.read_error(e))
    }

    /// Reads `range` of the input (end exclusive, within its size): from the
    /// record's copy when there is one, else one ranged GET.
    pub async fn read_range(&self, range: std::ops::Range<u64>) -> Result<Vec<u8>, StepError> {
        if let Some(loaded) = self.bytes.if_loaded() {
            let end = range.end.min(self.head.size);
            let start = range.start.min(end);
            match &loaded.copy {
                LocalCopy::Memory(bytes) => {
                    return Ok(bytes[start as usize..end as usize].to_vec());
                }
                LocalCopy::File(file) => return read_file_range(&file.path, start..end).await,
                LocalCopy::None => {}
            }
        }
        self.bytes
            .store()
            .get_range(&self.object(), range)
            .await
            .map_err(|e| self.read_error(e))
    }

    /// The whole input in memory (for decoders that need it all), shared
    /// with the record's copy when there is one.
    pub async fn bytes(&self) -> Result<Bytes, StepError> {
        if self.bytes.keeps_copy() {
            let loaded = self.loaded().await?;
            if let LocalCopy::Memory(bytes) = &loaded.copy {
                return Ok(bytes.clone());
            }
        }
        let body = self.stream().await?;
        body.collect()
            .await
            .map(|data| data.into_bytes())
            .map_err(|e| StepError::Input(e.to_string()))
    }

    /// Reads the whole input into memory.
    pub async fn read_all(&self) -> Result<Vec<u8>, StepError> {
        Ok(self.bytes().await?.to_vec())
    }

    /// Reads the file at `relative` beside the input (in the input's
    /// "directory": `derived/<key>/360p/seg-00000.ts` beside
    /// `derived/<key>/package.json`), whole, and checks it has the `size`
    /// and SHA-256 (hex) that the input names for it: a step chained to an
    /// index reads nothing its key does not cover. A file missing or
    /// other than named fails the read as a replaced input does: retried,
    /// and the job not finished whatever the step makes of the error.
    pub async fn read_beside(
        &self,
        relative: &str,
        size: u64,
        sha256: &str,
    ) -> Result<Vec<u8>, StepError> {
        let input = self.object();
        let dir = input.key.rfind('/').map_or("", |at| &input.key[..=at]);
        let beside = ObjectRef {
            bucket: input.bucket.clone(),
            key: format!("{dir}{relative}"),
            version_id: None,
            if_match: None,
        };
        let body = self.bytes.store().get(&beside).await.map_err(|err| {
            self.replaced.store(true, Ordering::SeqCst);
            StepError::Input(format!("{beside}, beside the input: {err}"))
        })?;
        let bytes = body
            .collect()
            .await
            .map_err(|e| StepError::Input(format!("{beside}: {e}")))?
            .into_bytes()
            .to_vec();
        let actual = crate::key::sha256_hex(&bytes);
        if bytes.len() as u64 != size || actual != sha256 {
            self.replaced.store(true, Ordering::SeqCst);
            return Err(StepError::Input(format!(
                "{beside} holds {} bytes hashing to {actual}, not the {size} bytes hashing to \
                 {sha256} the input names",
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    /// Puts the input in a local file (for tools that need a seekable
    /// file), returning its size: a hard link to the record's copy when it
    /// is a file on the same file system, else a copy.
    pub async fn spool_to(&self, path: &Path) -> Result<u64, StepError> {
        let writing = |e: std::io::Error| StepError::Input(format!("{}: {e}", path.display()));
        if self.bytes.keeps_copy() {
            let loaded = self.loaded().await?;
            match &loaded.copy {
                LocalCopy::File(file) => {
                    if std::fs::hard_link(&file.path, path).is_err() {
                        tokio::fs::copy(&file.path, path).await.map_err(writing)?;
                    }
                    return Ok(self.head.size);
                }
                LocalCopy::Memory(bytes) => {
                    tokio::fs::write(path, bytes).await.map_err(writing)?;
                    return Ok(self.head.size);
                }
                LocalCopy::None => {}
            }
        }
        let mut body = self.stream().await?;
        let mut file = tokio::fs::File::create(path).await.map_err(writing)?;
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| StepError::Input(e.to_string()))?;
            size += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(writing)?;
        }
        file.flush().await.map_err(writing)?;
        Ok(size)
    }
}

async fn read_file_range(path: &Path, range: std::ops::Range<u64>) -> Result<Vec<u8>, StepError> {
    let failed = |e: std::io::Error| StepError::Input(format!("{}: {e}", path.display()));
    let mut file = tokio::fs::File::open(path).await.map_err(failed)?;
    file.seek(SeekFrom::Start(range.start))
        .await
        .map_err(failed)?;
    let mut buffer = vec![0; (range.end - range.start) as usize];
    file.read_exact(&mut buffer).await.map_err(failed)?;
    Ok(buffer)
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
