//! An input object version's bytes, read at most once for all the jobs of
//! its record: hashed as they stream past and, when a step needs them all,
//! kept (in memory or in a scratch file) so that keying a job by content and
//! running its step cost one GET between them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

use crate::fingerprint::{ContentHasher, ObjectHead};
use crate::store::{ErrorKind, ObjectRef, ObjectStore};

/// Where a record's input bytes are kept once read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Hashed and dropped: no step needs them again.
    Nothing,
    /// In memory, for decoders that take a buffer.
    Memory,
    /// In a file in scratch space, for tools that need a path or seek.
    File,
}

/// Why the bytes could not be read.
#[derive(Debug, Clone)]
pub struct LoadError {
    pub message: String,
    /// The object is no longer the version headed (`If-Match` failed).
    pub replaced: bool,
}

/// The bytes of one object version as read: their SHA-256 and the copy.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub sha256: String,
    pub copy: LocalCopy,
}

#[derive(Debug)]
pub(crate) enum LocalCopy {
    None,
    Memory(Bytes),
    File(ScratchFile),
}

/// A file in scratch space, removed when dropped.
#[derive(Debug)]
pub(crate) struct ScratchFile {
    pub path: PathBuf,
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One object version, read on first need and then shared by the jobs of
/// its record.
#[derive(Debug)]
pub(crate) struct ObjectBytes {
    store: ObjectStore,
    pub head: ObjectHead,
    keep: Keep,
    scratch: PathBuf,
    loaded: OnceCell<Result<Arc<Loaded>, LoadError>>,
}

impl ObjectBytes {
    pub fn new(store: ObjectStore, head: ObjectHead, keep: Keep, scratch: &Path) -> Self {
        ObjectBytes {
            store,
            head,
            keep,
            scratch: scratch.to_path_buf(),
            loaded: OnceCell::new(),
        }
    }

    /// The version read, pinned to the ETag that was headed: no byte of a
    /// later object under the same key can be read as this one's.
    pub fn object(&self) -> ObjectRef {
        ObjectRef {
            bucket: self.head.bucket.clone(),
            key: self.head.key.clone(),
            version_id: self.head.version_id.clone(),
            if_match: Some(self.head.etag.clone()).filter(|etag| !etag.is_empty()),
        }
    }

    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Whether a read of every byte keeps them for the steps.
    pub fn keeps_copy(&self) -> bool {
        self.keep != Keep::Nothing
    }

    /// The bytes if they have been read already.
    pub fn if_loaded(&self) -> Option<&Arc<Loaded>> {
        self.loaded.get().and_then(|result| result.as_ref().ok())
    }

    /// Reads every byte (once: later calls share the result), hashing them
    /// and keeping them as `keep` says.
    pub async fn load(&self) -> Result<Arc<Loaded>, LoadError> {
        self.loaded
            .get_or_init(|| async { self.read().await.map(Arc::new) })
            .await
            .clone()
    }

    async fn read(&self) -> Result<Loaded, LoadError> {
        let object = self.object();
        let failed = |message: String| LoadError {
            message,
            replaced: false,
        };
        let mut sink = match self.keep {
            Keep::Nothing => Sink::Nothing,
            Keep::Memory => Sink::Memory(Vec::with_capacity(
                usize::try_from(self.head.size.min(1 << 30)).unwrap_or(0),
            )),
            Keep::File => {
                crate::step::scratch::ensure_room(&self.scratch, self.head.size, 0)
                    .map_err(failed)?;
                let path = crate::step::scratch::unique_path(&self.scratch, "mediaonce-input");
                let file = tokio::fs::File::create(&path)
                    .await
                    .map_err(|e| failed(format!("creating {}: {e}", path.display())))?;
                Sink::File(file, ScratchFile { path })
            }
        };
        let mut body = self.store.get(&object).await.map_err(|err| LoadError {
            replaced: err.kind == ErrorKind::PreconditionFailed,
            message: err.to_string(),
        })?;
        let mut hasher = ContentHasher::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| failed(format!("reading {object}: {e}")))?;
            hasher.update(&chunk);
            sink.write(&chunk).await.map_err(failed)?;
        }
        if hasher.size() != self.head.size {
            return Err(failed(format!(
                "read {} bytes of {object}, but HeadObject said {}",
                hasher.size(),
                self.head.size
            )));
        }
        Ok(Loaded {
            sha256: hasher.finish(),
            copy: sink.finish().await.map_err(failed)?,
        })
    }
}

/// Where read bytes go.
enum Sink {
    Nothing,
    Memory(Vec<u8>),
    File(tokio::fs::File, ScratchFile),
}

impl Sink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), String> {
        match self {
            Sink::Nothing => Ok(()),
            Sink::Memory(buffer) => {
                buffer.extend_from_slice(chunk);
                Ok(())
            }
            Sink::File(file, scratch) => file
                .write_all(chunk)
                .await
                .map_err(|e| format!("writing {}: {e}", scratch.path.display())),
        }
    }

    async fn finish(self) -> Result<LocalCopy, String> {
        Ok(match self {
            Sink::Nothing => LocalCopy::None,
            Sink::Memory(buffer) => LocalCopy::Memory(Bytes::from(buffer)),
            Sink::File(mut file, scratch) => {
                file.flush()
                    .await
                    .map_err(|e| format!("writing {}: {e}", scratch.path.display()))?;
                LocalCopy::File(scratch)
            }
        })
    }
}
