//! Steps: the work a recipe names, and what a step may use.
//!
//! A step reads one input object version and writes named outputs into its
//! job's prefix, `<output prefix><job key>/`. It must be deterministic (the
//! same input and recipe give the same output bytes) so that a retry, or a
//! stale worker that wakes late, writes identical files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::key::Recipe;
use crate::store::{GetError, GetErrorKind, ObjectRef, ObjectStore};

/// The file a job writes last; its presence means the outputs are complete.
pub const MANIFEST_NAME: &str = "_manifest.json";

/// Why a step failed. The message is stored in the job row.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("invalid params for step {step}: {problem}")]
    InvalidParams { step: String, problem: String },
    #[error("reading the input failed: {0}")]
    Input(String),
    #[error("integrity error: the object's bytes hash to {actual}, but S3's SHA-256 checksum says {expected}")]
    Integrity { expected: String, actual: String },
    #[error("writing output {name} failed: {message}")]
    Output { name: String, message: String },
    /// The input can never be processed (undecodable, truncated, a pixel
    /// bomb, an unsupported format, a lying MP4): no retry can fix it, so
    /// the job is poisoned at once instead of spending more runs.
    #[error("{0}")]
    Unprocessable(String),
    /// Anything else: retried until the attempts cap.
    #[error("{0}")]
    Failed(String),
}

impl StepError {
    /// Whether no retry can fix it: an unprocessable input, or params the
    /// step refuses (a recipe does not change between retries).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            StepError::Unprocessable(_) | StepError::InvalidParams { .. }
        )
    }

    /// For `map_err`: the params the step named rejected, with the problem.
    pub fn invalid_params(step: &str) -> impl FnOnce(String) -> StepError + '_ {
        move |problem| StepError::InvalidParams {
            step: step.to_string(),
            problem,
        }
    }
}

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
        if err.kind == GetErrorKind::PreconditionFailed {
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

/// One file a job wrote, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputFile {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// The job's output prefix: where a step writes, and what it wrote.
#[derive(Debug)]
pub struct JobOutputs {
    store: ObjectStore,
    bucket: String,
    /// `<output prefix><job key>/`
    prefix: String,
    written: BTreeMap<String, OutputFile>,
}

impl JobOutputs {
    pub fn new(store: ObjectStore, bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        JobOutputs {
            store,
            bucket: bucket.into(),
            prefix: prefix.into(),
            written: BTreeMap::new(),
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The files written so far, by name.
    pub fn files(&self) -> Vec<OutputFile> {
        self.written.values().cloned().collect()
    }

    /// Writes an output held in memory.
    pub async fn put_bytes(
        &mut self,
        name: &str,
        content_type: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StepError> {
        check_output_name(name)?;
        let file = OutputFile {
            name: name.to_string(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
        };
        self.upload(file, content_type, ByteStream::from(bytes))
            .await
    }

    /// Writes an output from a local file (large outputs, tools' results).
    pub async fn put_file(
        &mut self,
        name: &str,
        content_type: &str,
        path: &Path,
    ) -> Result<(), StepError> {
        check_output_name(name)?;
        let (size, sha256) = hash_file(path).await.map_err(|e| StepError::Output {
            name: name.to_string(),
            message: format!("reading {}: {e}", path.display()),
        })?;
        let body = ByteStream::from_path(path)
            .await
            .map_err(|e| StepError::Output {
                name: name.to_string(),
                message: e.to_string(),
            })?;
        let file = OutputFile {
            name: name.to_string(),
            size,
            sha256,
        };
        self.upload(file, content_type, body).await
    }

    async fn upload(
        &mut self,
        file: OutputFile,
        content_type: &str,
        body: ByteStream,
    ) -> Result<(), StepError> {
        let key = format!("{}{}", self.prefix, file.name);
        self.store
            .put(&self.bucket, &key, content_type, body)
            .await
            .map_err(|e| StepError::Output {
                name: file.name.clone(),
                message: e.to_string(),
            })?;
        self.written.insert(file.name.clone(), file);
        Ok(())
    }

    /// Writes `_manifest.json`, last: the recipe and every output's name,
    /// size and SHA-256. Deterministic: no times, no ids of the attempt.
    pub async fn write_manifest(&mut self, manifest: &Manifest) -> Result<(), StepError> {
        let mut bytes = serde_json::to_vec_pretty(manifest).map_err(|e| StepError::Output {
            name: MANIFEST_NAME.into(),
            message: e.to_string(),
        })?;
        bytes.push(b'\n');
        let key = format!("{}{}", self.prefix, MANIFEST_NAME);
        self.store
            .put(
                &self.bucket,
                &key,
                "application/json",
                ByteStream::from(bytes),
            )
            .await
            .map_err(|e| StepError::Output {
                name: MANIFEST_NAME.into(),
                message: e.to_string(),
            })
    }
}

/// The content of `_manifest.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub job_key: String,
    pub input_hash: String,
    pub recipe: Value,
    pub outputs: Vec<OutputFile>,
}

async fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buffer[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// Output names are relative paths inside the job's prefix.
fn check_output_name(name: &str) -> Result<(), StepError> {
    let bad = name.is_empty()
        || name == MANIFEST_NAME
        || name.starts_with('/')
        || name
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(StepError::Output {
            name: name.to_string(),
            message: "output names are relative paths without empty, '.' or '..' parts, and _manifest.json is reserved".into(),
        });
    }
    Ok(())
}

/// What a step gets to do its work.
pub struct StepContext<'a> {
    pub job_key: &'a str,
    pub recipe: &'a Recipe,
    pub input: &'a JobInput,
    /// The invocation deadline in epoch milliseconds, inside Lambda. A step
    /// that runs long must stop before it (the job fails and is retried).
    pub deadline_ms: Option<u64>,
    /// Images declaring more pixels are refused before decoding
    /// (`MEDIAONCE_MAX_PIXELS`).
    pub max_pixels: u64,
    /// The worker's clock: the one the deadline is compared with.
    pub clock: &'a dyn crate::lease::Clock,
}

/// A unit of work a recipe can name.
#[async_trait::async_trait]
pub trait Step: Send + Sync {
    /// The name recipes use.
    fn name(&self) -> &'static str;

    /// Checks a recipe's params when the configuration is loaded, so a bad
    /// recipe fails at start-up rather than on every message.
    fn check_params(&self, _params: &serde_json::Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    /// How long a run may take at most, declared so that no run starts
    /// that the invocation deadline would cut off.
    fn time_needed(&self, _params: &serde_json::Map<String, Value>) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Runs the step, writing its outputs. The manifest is written after.
    async fn run(
        &self,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError>;
}

/// Steps by name.
#[derive(Clone, Default)]
pub struct StepRegistry {
    steps: BTreeMap<String, Arc<dyn Step>>,
}

impl StepRegistry {
    /// The built-in steps.
    pub fn builtin() -> Self {
        let mut registry = StepRegistry::default();
        registry.register(Arc::new(crate::steps::probe::Probe));
        registry.register(Arc::new(crate::steps::thumbnail::Thumbnail));
        registry.register(Arc::new(crate::steps::hls::HlsPackage::from_env()));
        registry
    }

    /// Adds a step, replacing one of the same name.
    pub fn register(&mut self, step: Arc<dyn Step>) {
        self.steps.insert(step.name().to_string(), step);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Step>> {
        self.steps.get(name).cloned()
    }

    pub fn names(&self) -> Vec<&str> {
        self.steps.keys().map(String::as_str).collect()
    }
}

impl std::fmt::Debug for StepRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.steps.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_stay_inside_the_prefix() {
        for bad in ["", "/abs", "a//b", "../x", "a/./b", MANIFEST_NAME] {
            assert!(check_output_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["probe.json", "720p/seg-00001.ts", "thumb-320.jpg"] {
            assert!(check_output_name(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn registry_has_probe() {
        assert_eq!(
            StepRegistry::builtin().names(),
            vec!["hls-package", "probe", "thumbnail"]
        );
    }
}
