//! `probe`: what an object is, from as few bytes as it takes. One ranged
//! GET of its first 256 KiB gives its media type (magic bytes) and an
//! image's width and height; an MP4/MOV/M4A is then read box by box
//! ([`crate::bmff`]): the brand, duration and every track from `moov`,
//! wherever it sits, never the media data. Writes `probe.json`.
//!
//! The SHA-256 in the report is S3's full-object checksum when the upload
//! carried one. With `{"verify": true}` probe streams the whole object once
//! instead, reports the hash of the bytes it read, and fails with an
//! integrity error when they differ from S3's checksum.

use serde::Serialize;

use crate::bmff::{self, MovieInfo};
use crate::fingerprint::{ContentHasher, Fingerprint, FingerprintSource, ObjectHead};
use crate::step::{JobInput, JobOutputs, Step, StepContext, StepError};
/// How much of the object's start is read for sniffing: JPEG dimensions sit
/// after the EXIF block, which may be up to 64 KiB, and then some; a
/// faststart MP4's `moov` often fits too.
pub const SNIFF_BYTES: u64 = 256 * 1024;

pub struct Probe;

/// The content of `probe.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256_source: Option<Sha256Source>,
    pub content_type: String,
    /// An image's size, or a movie's first video track's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
    /// Brand, duration and tracks of an MP4/MOV/M4A.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub movie: Option<MovieInfo>,
}

impl ProbeReport {
    fn new(
        head: &ObjectHead,
        sha256: Option<String>,
        sha256_source: Option<Sha256Source>,
        sniffed: Sniffed,
        movie: Option<MovieInfo>,
    ) -> Self {
        ProbeReport {
            bucket: head.bucket.clone(),
            key: head.key.clone(),
            version_id: head.version_id.clone(),
            size: head.size,
            sha256,
            sha256_source,
            content_type: sniffed.content_type,
            width: sniffed.dimensions.map(|d| d.0),
            height: sniffed.dimensions.map(|d| d.1),
            movie,
        }
    }
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

/// The hash of a stream, for `verify`. Pure: fed chunks, it keeps the
/// running SHA-256 and the size.
#[derive(Default)]
pub struct ProbeReader {
    hasher: ContentHasher,
}

impl ProbeReader {
    pub fn feed(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
    }

    /// The SHA-256 of the bytes fed, or an integrity error when the input
    /// hash is S3's SHA-256 of the bytes and they hash to something else.
    pub fn verify(self, fingerprint: &Fingerprint) -> Result<String, StepError> {
        let sha256 = self.hasher.finish();
        if fingerprint.source == FingerprintSource::Sha256Checksum
            && sha256 != fingerprint.input_hash
        {
            return Err(StepError::Integrity {
                expected: fingerprint.input_hash.clone(),
                actual: sha256,
            });
        }
        Ok(sha256)
    }

    pub fn size(&self) -> u64 {
        self.hasher.size()
    }
}

/// Probe's params.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeParams {
    /// Stream the whole object and hash it (default: only S3's checksum).
    #[serde(default)]
    pub verify: bool,
}

impl ProbeParams {
    pub fn from_params(
        params: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::Object(params.clone()))
            .map_err(|e| format!("probe params: {e}"))
    }
}

/// Where the report's `sha256` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sha256Source {
    /// S3's full-object `x-amz-checksum-sha256`, not recomputed.
    S3Checksum,
    /// Computed from every byte (`verify`), and equal to S3's if it had one.
    Computed,
}

#[async_trait::async_trait]
impl Step for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }

    type Params = ProbeParams;

    fn params(
        &self,
        params: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ProbeParams, String> {
        ProbeParams::from_params(params)
    }

    async fn run(
        &self,
        params: &ProbeParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let report = probe(context.input, *params).await?;
        let mut json =
            serde_json::to_vec_pretty(&report).map_err(|e| StepError::Failed(e.to_string()))?;
        json.push(b'\n');
        outputs
            .put_bytes("probe.json", "application/json", json)
            .await
    }
}

/// Probes one input: a ranged read of its start, the movie boxes if it is
/// one, and the whole object only when `verify` asks for it.
pub async fn probe(input: &JobInput, params: ProbeParams) -> Result<ProbeReport, StepError> {
    let size = input.head.size;
    let start = input.read_range(0..size.min(SNIFF_BYTES)).await?;
    let mut sniffed = sniff(&start);
    let movie = if bmff::looks_like_movie(&start) {
        let movie = bmff::read_movie(input, size, &start)
            .await
            .map_err(|e| super::movie_error(e, "unreadable MP4/MOV"))?;
        if sniffed.content_type == "application/octet-stream" {
            // A QuickTime file from before `ftyp` existed.
            sniffed.content_type = "video/quicktime".into();
        }
        if let Some(video) = movie.video() {
            sniffed.dimensions = video
                .width
                .zip(video.height)
                .map(|(w, h)| (w as u64, h as u64));
        }
        Some(movie)
    } else {
        None
    };
    let (sha256, sha256_source) = if params.verify {
        let mut body = input.stream().await?;
        let mut reader = ProbeReader::default();
        while let Some(chunk) = body.next().await {
            reader.feed(&chunk.map_err(|e| StepError::Input(e.to_string()))?);
        }
        if reader.size() != size {
            return Err(StepError::Input(format!(
                "read {} bytes, but HeadObject said {size}",
                reader.size()
            )));
        }
        let computed = reader.verify(&input.fingerprint)?;
        (Some(computed), Some(Sha256Source::Computed))
    } else if input.fingerprint.source == FingerprintSource::Sha256Checksum {
        (
            Some(input.fingerprint.input_hash.clone()),
            Some(Sha256Source::S3Checksum),
        )
    } else {
        (None, None)
    };
    Ok(ProbeReport::new(
        &input.head,
        sha256,
        sha256_source,
        sniffed,
        movie,
    ))
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
    fn the_reader_hashes_what_streamed_past_in_chunks() {
        let bytes = png(640, 480);
        let mut reader = ProbeReader::default();
        for chunk in bytes.chunks(3) {
            reader.feed(chunk);
        }
        assert_eq!(reader.size(), bytes.len() as u64);
        let sha256 = reader
            .verify(&fingerprint_of(&bytes, FingerprintSource::Sha256Checksum))
            .unwrap();
        assert_eq!(sha256, crate::key::sha256_hex(&bytes));
    }

    #[test]
    fn bytes_that_differ_from_the_sha256_checksum_are_an_integrity_error() {
        let mut reader = ProbeReader::default();
        reader.feed(b"what S3 gave us");
        let err = reader
            .verify(&fingerprint_of(
                b"what S3 promised",
                FingerprintSource::Sha256Checksum,
            ))
            .unwrap_err();
        assert!(matches!(err, StepError::Integrity { .. }), "{err}");
        assert!(err.to_string().starts_with("integrity error"));
        // A version/ETag fingerprint is not a hash of the bytes: nothing to compare.
        let mut reader = ProbeReader::default();
        reader.feed(b"what S3 gave us");
        assert!(reader
            .verify(&fingerprint_of(b"other", FingerprintSource::VersionEtag))
            .is_ok());
    }

    #[test]
    fn params_are_verify_or_nothing() {
        let params = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(
            ProbeParams::from_params(&params(serde_json::json!({}))),
            Ok(ProbeParams { verify: false })
        );
        assert_eq!(
            ProbeParams::from_params(&params(serde_json::json!({"verify": true}))),
            Ok(ProbeParams { verify: true })
        );
        let err = ProbeParams::from_params(&params(serde_json::json!({"deep": 1}))).unwrap_err();
        assert!(err.contains("unknown field `deep`"), "{err}");
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
