//! `probe`: what an object is. Streams it once, never holding it whole:
//! its size and SHA-256, its media type from magic bytes, and an image's
//! width and height. Writes `probe.json`.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::fingerprint::FingerprintSource;
use crate::step::{JobOutputs, Step, StepContext, StepError};

/// How much of the object's start is kept for sniffing: JPEG dimensions sit
/// after the EXIF block, which may be up to 64 KiB, and then some.
const SNIFF_BYTES: usize = 256 * 1024;

pub struct Probe;

/// The content of `probe.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeReport {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    pub size: u64,
    pub sha256: String,
    pub content_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
}

/// The media type and image dimensions of an object, from its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sniffed {
    pub content_type: String,
    pub dimensions: Option<(u64, u64)>,
}

/// Sniffs a media type from magic bytes. Pure.
pub fn sniff(start: &[u8]) -> Sniffed {
    let content_type = infer::get(start)
        .map(|kind| kind.mime_type().to_string())
        .unwrap_or_else(|| "application/octet-stream".to_string());
    let dimensions = if content_type.starts_with("image/") {
        imagesize::blob_size(start)
            .ok()
            .map(|size| (size.width as u64, size.height as u64))
    } else {
        None
    };
    Sniffed {
        content_type,
        dimensions,
    }
}

#[async_trait::async_trait]
impl Step for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn check_params(
        &self,
        params: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        match params.keys().next() {
            Some(unknown) => Err(format!("probe takes no params, got {unknown:?}")),
            None => Ok(()),
        }
    }

    async fn run(
        &self,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let input = context.input;
        let mut body = input.stream().await?;
        let mut hasher = Sha256::new();
        let mut start = Vec::with_capacity(SNIFF_BYTES.min(input.head.size as usize));
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| StepError::Input(e.to_string()))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            if start.len() < SNIFF_BYTES {
                let take = (SNIFF_BYTES - start.len()).min(chunk.len());
                start.extend_from_slice(&chunk[..take]);
            }
        }
        let sha256 = hex::encode(hasher.finalize());
        if input.fingerprint.source == FingerprintSource::Sha256Checksum
            && sha256 != input.fingerprint.input_hash
        {
            return Err(StepError::Integrity {
                expected: input.fingerprint.input_hash.clone(),
                actual: sha256,
            });
        }
        let sniffed = sniff(&start);
        let report = ProbeReport {
            bucket: input.head.bucket.clone(),
            key: input.head.key.clone(),
            version_id: input.head.version_id.clone(),
            size,
            sha256,
            content_type: sniffed.content_type,
            width: sniffed.dimensions.map(|d| d.0),
            height: sniffed.dimensions.map(|d| d.1),
        };
        let mut json =
            serde_json::to_vec_pretty(&report).map_err(|e| StepError::Failed(e.to_string()))?;
        json.push(b'\n');
        outputs
            .put_bytes("probe.json", "application/json", json)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1×1 PNG, 3×2 by its IHDR here.
    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        bytes.extend_from_slice(&width.to_be_bytes());
        bytes.extend_from_slice(&height.to_be_bytes());
        bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        bytes
    }

    #[test]
    fn png_type_and_dimensions() {
        let sniffed = sniff(&png(3, 2));
        assert_eq!(sniffed.content_type, "image/png");
        assert_eq!(sniffed.dimensions, Some((3, 2)));
    }

    #[test]
    fn gif_dimensions() {
        let gif = b"GIF89a\x05\x00\x07\x00\x00\x00\x00";
        let sniffed = sniff(gif);
        assert_eq!(sniffed.content_type, "image/gif");
        assert_eq!(sniffed.dimensions, Some((5, 7)));
    }

    #[test]
    fn unknown_bytes_are_octet_stream() {
        let sniffed = sniff(b"hello world");
        assert_eq!(sniffed.content_type, "application/octet-stream");
        assert_eq!(sniffed.dimensions, None);
    }

    #[test]
    fn mp4_is_video_without_dimensions() {
        let mp4 = b"\0\0\0\x18ftypisom\0\0\0\0isomiso2";
        let sniffed = sniff(mp4);
        assert_eq!(sniffed.content_type, "video/mp4");
        assert_eq!(sniffed.dimensions, None);
    }
}
