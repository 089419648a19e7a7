//! `hls-chunk`: one span of an `hls-package` recipe's plan as a job of its
//! own, so that a long input's spans can run in as many invocations as
//! Lambda scales to. Its recipe names the package recipe and the span:
//!
//! ```json
//! {"step": "hls-chunk", "version": 1, "params": {
//!   "package": {"step": "hls-package", "version": 1, "params": {"ladder": [1080, 720, 360]}},
//!   "index": 2, "start_ms": 120000, "end_ms": 180000}}
//! ```
//!
//! so a chunk is keyed like any job (its input hash and this recipe's
//! hash): the same bytes and package recipe give the same chunk keys, and
//! a chunk done is never run again. The run reads the input's `moov` and
//! its span's samples by ranged reads into a sparse copy
//! ([`super::sparse`]), not the whole upload, checks that the input's plan
//! has this span, encodes it ([`super::encode_span`]: the same run as a
//! single job's), and writes only under its own prefix: the segments
//! (`<rendition>/seg-NNNNN.ts`, numbered from the span's place) and
//! `segments.json`, each rendition's [`SegmentSummary`]s, from which the
//! join writes the package's playlists. ffmpeg's own playlists are not
//! kept. A split `hls-package` job sends its chunks as messages
//! (`handler::job`; DESIGN.md, "Chunked HLS").

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::playlist::SegmentSummary;
use super::{encode_span, measure_segments, sparse, upload_dir, Encoding, HlsPackage, HlsParams};
use crate::key::Recipe;
use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::ffmpeg::{refuse_external_data, time_left, ScratchDir, STOP_BEFORE_DEADLINE};
use crate::steps::movie_error;

/// The name of a chunk's recipe step.
pub const CHUNK_STEP: &str = "hls-chunk";

/// The name of the file that lists a chunk's segments.
pub const SEGMENTS_FILE: &str = "segments.json";

/// A chunk recipe's params.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkParams {
    /// The package recipe, and its params parsed.
    pub package: Recipe,
    pub params: HlsParams,
    pub index: u32,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChunkParams {
    package: Value,
    index: u32,
    start_ms: u64,
    end_ms: Option<u64>,
}

impl ChunkParams {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, String> {
        let raw: RawChunkParams = serde_json::from_value(Value::Object(params.clone()))
            .map_err(|e| format!("hls-chunk params: {e}"))?;
        let package = Recipe::from_value(&raw.package)
            .map_err(|e| format!("hls-chunk params: package: {e}"))?;
        if package.step != "hls-package" {
            return Err(format!(
                "hls-chunk params: package is a {:?} recipe, not hls-package",
                package.step
            ));
        }
        let params = HlsParams::from_params(&package.params)?;
        Ok(ChunkParams {
            package,
            params,
            index: raw.index,
            start_ms: raw.start_ms,
            end_ms: raw.end_ms,
        })
    }

    /// The recipe of chunk `index` of `package`, from `start_ms` to
    /// `end_ms` (a span's bounds).
    pub fn recipe(package: &Recipe, index: u32, start_ms: u64, end_ms: Option<u64>) -> Recipe {
        let mut params = Map::new();
        params.insert("package".into(), package.to_value());
        params.insert("index".into(), index.into());
        params.insert("start_ms".into(), start_ms.into());
        params.insert("end_ms".into(), end_ms.map_or(Value::Null, Value::from));
        Recipe {
            step: CHUNK_STEP.to_string(),
            version: 1,
            params,
        }
    }
}

/// What a chunk's `segments.json` holds: each rendition's segments, in
/// order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSegments {
    pub renditions: Vec<RenditionSegments>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenditionSegments {
    /// `1080p`: the rendition's directory.
    pub name: String,
    pub segments: Vec<SegmentSummary>,
}

/// The step: `hls-package`'s ffmpeg and scratch space, one span at a time.
#[derive(Debug, Clone)]
pub struct HlsChunk(pub HlsPackage);

#[async_trait::async_trait]
impl Step for HlsChunk {
    fn name(&self) -> &'static str {
        CHUNK_STEP
    }

    type Params = ChunkParams;

    fn params(&self, params: &Map<String, Value>) -> Result<ChunkParams, String> {
        ChunkParams::from_params(params)
    }

    fn input_use(&self, _params: &ChunkParams) -> InputUse {
        InputUse::Ranges
    }

    fn time_needed(&self, params: &ChunkParams) -> std::time::Duration {
        std::time::Duration::from_secs(params.params.min_seconds) + STOP_BEFORE_DEADLINE
    }

    async fn run(
        &self,
        params: &ChunkParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let input = context.input;
        let size = input.head.size;
        // One walk to the `moov`: the movie, and the reads a copy repeats.
        let unreadable = |e| movie_error(e, "hls-chunk reads MP4/MOV inputs");
        let boxes = crate::bmff::locate_movie(input, size, &[])
            .await
            .map_err(unreadable)?;
        let movie = crate::bmff::parse_boxes(&boxes).map_err(unreadable)?;
        refuse_external_data(&movie, CHUNK_STEP)?;
        let encoding = Encoding::of(&movie, &params.params)?;
        let spans = encoding.spans(&params.params);
        let span = spans
            .iter()
            .find(|s| s.index == params.index)
            .filter(|s| s.start_ms == params.start_ms && s.end_ms == params.end_ms)
            .ok_or_else(|| {
                // Not the input's fault: a plan that changed under a split
                // in flight (a deploy). Retried, then poisoned, never told
                // to the upload as unprocessable.
                StepError::Failed(format!(
                    "chunk {} ({} to {:?} ms) is not a span of this input's plan ({} spans)",
                    params.index,
                    params.start_ms,
                    params.end_ms,
                    spans.len()
                ))
            })?;
        let copy = sparse::plan_copy(&boxes, size, span).map_err(unreadable)?;
        let step = &self.0;
        crate::step::scratch::ensure_room(&step.scratch, copy.bytes, step.scratch_reserve)
            .map_err(StepError::Failed)?;
        let scratch_dir = ScratchDir::create(&step.scratch, context.job_key)?;
        let dir = &scratch_dir.0;
        let out_dir = dir.join("out");
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| StepError::Failed(format!("creating {}: {e}", out_dir.display())))?;
        let copy_path = dir.join("input");
        sparse::write_copy(input, size, &copy, &copy_path).await?;
        encode_span(
            &step.ffmpeg,
            &params.params,
            &encoding,
            span,
            &copy_path,
            &out_dir,
            time_left(context),
            context.job_key,
        )
        .await?;
        let names = encoding.renditions.iter().map(|r| r.name()).collect();
        let dir_for_measure = out_dir.clone();
        let measured = tokio::task::spawn_blocking(move || {
            keep_segments_only(&dir_for_measure)?;
            measure_segments(&dir_for_measure, names).map(|(renditions, _)| renditions)
        })
        .await
        .map_err(|e| StepError::Failed(format!("measuring the segments: {e}")))??;
        let listing = ChunkSegments {
            renditions: measured
                .into_iter()
                .map(|(name, segments)| RenditionSegments { name, segments })
                .collect(),
        };
        let json = serde_json::to_vec(&listing).expect("summaries serialize");
        std::fs::write(out_dir.join(SEGMENTS_FILE), json)
            .map_err(|e| StepError::Failed(format!("writing {SEGMENTS_FILE}: {e}")))?;
        upload_dir(&out_dir, outputs).await
    }
}

/// Removes ffmpeg's playlists from a chunk's output: the join writes the
/// package's from every chunk's segments.
fn keep_segments_only(out_dir: &Path) -> Result<(), StepError> {
    for entry in std::fs::read_dir(out_dir)
        .map_err(|e| StepError::Failed(format!("listing {}: {e}", out_dir.display())))?
    {
        let path = entry.map_err(|e| StepError::Failed(e.to_string()))?.path();
        if path.is_dir() {
            keep_segments_only(&path)?;
        } else if path.extension().is_some_and(|e| e == "m3u8") {
            std::fs::remove_file(&path)
                .map_err(|e| StepError::Failed(format!("removing {}: {e}", path.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_recipe_names_its_package_and_span_and_parses_back() {
        let package = Recipe::from_value(&serde_json::json!({
            "step": "hls-package", "version": 3, "params": {"ladder": [360], "segment": 2}
        }))
        .unwrap();
        let spans = super::super::chunk::plan(10_000, 2_000, 4_000);
        let span = &spans[2];
        let recipe = ChunkParams::recipe(&package, span.index, span.start_ms, span.end_ms);
        assert_eq!(
            recipe.canonical_json(),
            r#"{"params":{"end_ms":null,"index":2,"package":{"params":{"ladder":[360],"segment":2},"step":"hls-package","version":3},"start_ms":8000},"step":"hls-chunk","version":1}"#
        );
        let parsed = ChunkParams::from_params(&recipe.params).unwrap();
        assert_eq!(
            (parsed.index, parsed.start_ms, parsed.end_ms),
            (2, 8000, None)
        );
        assert_eq!(parsed.package, package);
        // Every span its own recipe, so its own key.
        let hashes: std::collections::BTreeSet<String> = spans
            .iter()
            .map(|s| ChunkParams::recipe(&package, s.index, s.start_ms, s.end_ms).hash())
            .collect();
        assert_eq!(hashes.len(), 3);

        let mut not_hls = recipe.params.clone();
        not_hls["package"]["step"] = "thumbnail".into();
        assert!(ChunkParams::from_params(&not_hls)
            .unwrap_err()
            .contains("not hls-package"));
        let mut bad_ladder = recipe.params.clone();
        bad_ladder["package"]["params"]["ladder"] = serde_json::json!([]);
        assert!(ChunkParams::from_params(&bad_ladder)
            .unwrap_err()
            .contains("ladder"));
    }
}
