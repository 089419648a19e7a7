//! `probe`: what an object is, from as few bytes as it takes. One ranged
//! GET of its first 256 KiB gives its media type (magic bytes) and an
//! image's width and height; an MP4/MOV/M4A is then read box by box
//! ([`crate::bmff`]): the brand, duration and every track from `moov`,
//! wherever it sits, never the media data. Writes `probe.json`.
//!
//! The SHA-256 in the report is the job's input hash when that is a hash of
//! the content (S3's full-object checksum, or one mediaonce computed). With
//! `{"verify": true}` probe hashes every byte (the read that keys the job,
//! when the identity is `auto` or `content`: not a second one), reports
//! that, and fails with an integrity error when it differs from the
//! content hash the job is keyed on.

use serde::Serialize;

use crate::bmff::{self, MovieInfo};
use crate::step::{InputUse, JobInput, JobOutputs, Step, StepContext, StepError};
/// How much of the object's start is read for sniffing: JPEG dimensions sit
/// after the EXIF block, which may be up to 64 KiB, and then some; a
/// faststart MP4's `moov` often fits too.
pub const SNIFF_BYTES: u64 = 256 * 1024;

pub struct Probe;

/// The content of `probe.json`: what the bytes are, and nothing of who
/// uploaded them. One job's outputs serve every upload of the same bytes,
/// so they must be a function of the input bytes and the recipe alone: no
/// bucket, key or version id (one user's upload path shown to another, and
/// a chained job's key depending on which upload ran first), and no record
/// of where the hash came from (S3's checksum for one upload, mediaonce's
/// for another: the same hash, the same job).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub size: u64,
    /// The content's SHA-256, when the job is keyed by it or `verify`
    /// computed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
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
    fn new(size: u64, sha256: Option<String>, sniffed: Sniffed, movie: Option<MovieInfo>) -> Self {
        ProbeReport {
            size,
            sha256,
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

    fn input_use(&self, params: &ProbeParams) -> InputUse {
        if params.verify {
            InputUse::Stream
        } else {
            InputUse::Ranges
        }
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
    let sha256 = if params.verify {
        Some(input.sha256().await?)
    } else if input.fingerprint.source.is_content() {
        Some(input.fingerprint.input_hash.clone())
    } else {
        None
    };
    Ok(ProbeReport::new(size, sha256, sniffed, movie))
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
