//! `probe`: what an object is. Streams it once, never holding it whole:
//! its size and SHA-256, its media type from magic bytes, and an image's
//! width and height. Writes `probe.json`.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::fingerprint::{Fingerprint, FingerprintSource, ObjectHead};
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

/// What probe learns from the bytes as they stream past. Pure: fed chunks,
/// it keeps the running SHA-256, the size and the first bytes for sniffing.
#[derive(Default)]
pub struct ProbeReader {
    hasher: Sha256,
    size: u64,
    start: Vec<u8>,
}

impl ProbeReader {
    pub fn feed(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        if self.start.len() < SNIFF_BYTES {
            let take = (SNIFF_BYTES - self.start.len()).min(chunk.len());
            self.start.extend_from_slice(&chunk[..take]);
        }
    }

    /// The report, or an integrity error when the input hash is S3's
    /// SHA-256 of the bytes and the bytes read hash to something else.
    pub fn finish(
        self,
        head: &ObjectHead,
        fingerprint: &Fingerprint,
    ) -> Result<ProbeReport, StepError> {
        let sha256 = hex::encode(self.hasher.finalize());
        if fingerprint.source == FingerprintSource::Sha256Checksum
            && sha256 != fingerprint.input_hash
        {
            return Err(StepError::Integrity {
                expected: fingerprint.input_hash.clone(),
                actual: sha256,
            });
        }
        let sniffed = sniff(&self.start);
        Ok(ProbeReport {
            bucket: head.bucket.clone(),
            key: head.key.clone(),
            version_id: head.version_id.clone(),
            size: self.size,
            sha256,
            content_type: sniffed.content_type,
            width: sniffed.dimensions.map(|d| d.0),
            height: sniffed.dimensions.map(|d| d.1),
        })
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
        let mut reader = ProbeReader::default();
        while let Some(chunk) = body.next().await {
            reader.feed(&chunk.map_err(|e| StepError::Input(e.to_string()))?);
        }
        let report = reader.finish(&input.head, &input.fingerprint)?;
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

    fn fingerprint_of(bytes: &[u8], source: FingerprintSource) -> Fingerprint {
        Fingerprint {
            input_hash: crate::key::sha256_hex(bytes),
            source,
        }
    }

    #[test]
    fn the_reader_reports_what_streamed_past_in_chunks() {
        let bytes = png(640, 480);
        let mut reader = ProbeReader::default();
        for chunk in bytes.chunks(3) {
            reader.feed(chunk);
        }
        let head = ObjectHead {
            bucket: "in".into(),
            key: "a.png".into(),
            ..Default::default()
        };
        let report = reader
            .finish(
                &head,
                &fingerprint_of(&bytes, FingerprintSource::Sha256Checksum),
            )
            .unwrap();
        assert_eq!(report.size, bytes.len() as u64);
        assert_eq!(report.sha256, crate::key::sha256_hex(&bytes));
        assert_eq!((report.width, report.height), (Some(640), Some(480)));
    }

    #[test]
    fn bytes_that_differ_from_the_sha256_checksum_are_an_integrity_error() {
        let mut reader = ProbeReader::default();
        reader.feed(b"what S3 gave us");
        let err = reader
            .finish(
                &ObjectHead::default(),
                &fingerprint_of(b"what S3 promised", FingerprintSource::Sha256Checksum),
            )
            .unwrap_err();
        assert!(matches!(err, StepError::Integrity { .. }), "{err}");
        assert!(err.to_string().starts_with("integrity error"));
        // A version/ETag fingerprint is not a hash of the bytes: nothing to compare.
        let mut reader = ProbeReader::default();
        reader.feed(b"what S3 gave us");
        assert!(reader
            .finish(
                &ObjectHead::default(),
                &fingerprint_of(b"other", FingerprintSource::VersionEtag)
            )
            .is_ok());
    }

    #[test]
    fn only_the_start_is_kept() {
        let mut reader = ProbeReader::default();
        for _ in 0..10 {
            reader.feed(&vec![0u8; 100_000]);
        }
        assert_eq!(reader.start.len(), SNIFF_BYTES);
        assert_eq!(reader.size, 1_000_000);
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
