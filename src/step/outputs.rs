//! Where a job's outputs go: named files under its prefix, each recorded
//! with its size and SHA-256 for the manifest, which is written last.

use std::collections::BTreeMap;
use std::path::Path;

use aws_sdk_s3::primitives::ByteStream;
use serde_json::Value;

use super::StepError;
use crate::fingerprint::ContentHasher;
use crate::store::{ObjectHeaders, ObjectStore};

/// The file a job writes last; its presence means the outputs are complete.
pub const MANIFEST_NAME: &str = "_manifest.json";

/// CopyObject calls of one [`JobOutputs::copy_in`] in flight at once.
const COPIES_AT_ONCE: usize = 16;

/// An output copied in from another job's ([`JobOutputs::copy_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyIn {
    pub bucket: String,
    pub key: String,
    /// Its manifest entry here.
    pub file: OutputFile,
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
            sha256: crate::key::sha256_hex(&bytes),
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

    /// Copies other jobs' outputs in, each as its `file` (its name here,
    /// and the size and SHA-256 the other job's manifest records):
    /// server-side, from its bucket and key (outputs never change under
    /// their key), a few at a time.
    pub async fn copy_in(&mut self, copies: Vec<CopyIn>) -> Result<(), StepError> {
        use futures::StreamExt;
        for copy in &copies {
            check_output_name(&copy.file.name)?;
        }
        let (store, bucket, prefix) = (&self.store, &self.bucket, &self.prefix);
        let copied: Vec<Result<OutputFile, StepError>> = futures::stream::iter(copies)
            .map(|CopyIn { bucket: from_bucket, key, file }| async move {
                let from = crate::store::ObjectRef {
                    bucket: from_bucket.clone(),
                    key: key.clone(),
                    version_id: None,
                    if_match: None,
                };
                let to = format!("{prefix}{}", file.name);
                let headers = output_headers(&file.name);
                match store.copy(&from, bucket, &to, headers).await {
                    Ok(()) => Ok(file),
                    Err(e) => Err(StepError::Output {
                        name: file.name.clone(),
                        message: format!("copying s3://{from_bucket}/{key}: {e}"),
                    }),
                }
            })
            .buffer_unordered(COPIES_AT_ONCE)
            .collect()
            .await;
        for file in copied {
            let file = file?;
            self.written.insert(file.name.clone(), file);
        }
        Ok(())
    }

    async fn upload(
        &mut self,
        file: OutputFile,
        content_type: &str,
        body: ByteStream,
    ) -> Result<(), StepError> {
        let key = format!("{}{}", self.prefix, file.name);
        self.store
            .put(
                &self.bucket,
                &key,
                ObjectHeaders {
                    content_type,
                    cache_control: Some(IMMUTABLE),
                },
                body,
                Some(&file.sha256),
            )
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
        let sha256 = crate::key::sha256_hex(&bytes);
        self.store
            .put(
                &self.bucket,
                &key,
                output_headers(MANIFEST_NAME),
                ByteStream::from(bytes),
                Some(&sha256),
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

/// The size and SHA-256 of a file, streamed through [`ContentHasher`]: an
/// output's manifest entry, and `mediaonce upload`'s input hash.
pub(crate) async fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = ContentHasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok((hasher.size(), hasher.finish()))
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

/// Every output's `Cache-Control`: a job's files never change under its
/// key (the same input and recipe write the same bytes), so a browser or
/// CDN may keep them for a year without asking again; the manifest too.
/// DESIGN.md, "Serving": what a re-run after collection by another build
/// does to this.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The headers an output named `name` is written with: its content type
/// and [`IMMUTABLE`].
pub fn output_headers(name: &str) -> ObjectHeaders<'static> {
    ObjectHeaders {
        content_type: content_type(name),
        cache_control: Some(IMMUTABLE),
    }
}

/// The `Content-Type` an output is written with, by its extension.
pub fn content_type(name: &str) -> &'static str {
    match Path::new(name).extension().and_then(|e| e.to_str()) {
        Some("m3u8") => "application/vnd.apple.mpegurl",
        Some("ts") => "video/mp2t",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        Some("avif") => "image/avif",
        Some("json") => "application/json",
        Some("vtt") => "text/vtt",
        _ => "application/octet-stream",
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
    fn content_types_by_extension() {
        assert_eq!(content_type("master.m3u8"), "application/vnd.apple.mpegurl");
        assert_eq!(content_type("720p/seg-00000.ts"), "video/mp2t");
        assert_eq!(content_type("thumb-320.jpg"), "image/jpeg");
        assert_eq!(content_type("probe.json"), "application/json");
        assert_eq!(content_type("storyboard.vtt"), "text/vtt");
        assert_eq!(content_type("blob"), "application/octet-stream");
    }
}
