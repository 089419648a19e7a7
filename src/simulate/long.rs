//! Long videos in the simulated month (`--long-videos`): an `hls-package`
//! recipe whose long inputs split into chunk jobs, as the real step's do,
//! with steps that only count their runs: the split's execution (started
//! by the real handler, moved on by [`super::machine`]'s model of the
//! state machine), its chunk tasks, the join and the hand-ons of the
//! versions all go through the real handler.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::step::{ChunkSpan, InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::hls::chunk_job::{
    ChunkParams, ChunkSegments, RenditionSegments, CHUNK_STEP, SEGMENTS_FILE,
};
use crate::steps::hls::playlist::SegmentSummary;

/// The chunks a long video splits into.
pub const CHUNKS: u32 = 4;
/// The long videos' recipe.
pub const RECIPE: &str = "hls-long";

/// The recipe: `hls-package` by name (chunk messages need it), run by
/// [`SimPackage`].
pub fn recipe() -> Value {
    serde_json::json!({"name": RECIPE, "step": "hls-package", "version": 1,
                       "params": {"ladder": [144]}})
}

/// What the long videos came to.
#[derive(Debug, Default)]
pub struct LongVideos {
    /// Runs of a short input's package, and of chunks.
    pub runs: AtomicU64,
    pub chunk_runs: AtomicU64,
    /// The jobs split (by key), each counted once however often split.
    pub split: Mutex<HashSet<String>>,
}

/// `hls-package` as the simulation runs it: an input is long when the
/// first byte of its hash is under `share` of 256 (the same content is
/// always the same length); a long one splits into [`CHUNKS`] chunks, a
/// short one runs here and counts.
pub struct SimPackage {
    pub share: f64,
    pub videos: Arc<LongVideos>,
    pub crash: super::CrashDice,
}

#[async_trait::async_trait]
impl Step for SimPackage {
    type Params = ();

    fn name(&self) -> &'static str {
        "hls-package"
    }

    fn params(&self, _params: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    fn input_use(&self, _params: &()) -> InputUse {
        InputUse::Ranges
    }

    async fn split(
        &self,
        _params: &(),
        context: &StepContext<'_>,
    ) -> Result<Option<Vec<ChunkSpan>>, StepError> {
        let hash = &context.input.fingerprint.input_hash;
        let first = u8::from_str_radix(hash.get(..2).unwrap_or("ff"), 16).unwrap_or(255);
        if f64::from(first) >= self.share * 256.0 {
            return Ok(None);
        }
        self.videos
            .split
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(context.job_key.to_string());
        Ok(Some(
            (0..CHUNKS)
                .map(|index| ChunkSpan {
                    index,
                    start_ms: u64::from(index) * 60_000,
                    end_ms: (index + 1 < CHUNKS).then_some(u64::from(index + 1) * 60_000),
                })
                .collect(),
        ))
    }

    async fn run(
        &self,
        _params: &(),
        context: &StepContext<'_>,
        _outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.videos.runs.fetch_add(1, Ordering::Relaxed);
        tokio::task::yield_now().await;
        self.crash.roll(context.job_key);
        Ok(())
    }
}

/// `hls-chunk` as the simulation runs it: counts, and writes one segment
/// and its summary, timed by the chunk's place, for the join.
pub struct SimChunk {
    pub videos: Arc<LongVideos>,
    pub crash: super::CrashDice,
}

#[async_trait::async_trait]
impl Step for SimChunk {
    type Params = ChunkParams;

    fn name(&self) -> &'static str {
        CHUNK_STEP
    }

    fn params(&self, params: &Map<String, Value>) -> Result<ChunkParams, String> {
        ChunkParams::from_params(params)
    }

    fn input_use(&self, _params: &ChunkParams) -> InputUse {
        InputUse::Ranges
    }

    async fn run(
        &self,
        params: &ChunkParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.videos.chunk_runs.fetch_add(1, Ordering::Relaxed);
        tokio::task::yield_now().await;
        self.crash.roll(context.job_key);
        write_one_segment(outputs, params.index, context.job_key.as_bytes().to_vec()).await
    }
}

/// A simulated chunk's output, as the join reads it: its one segment
/// (`144p/seg-<index>.ts`, `bytes`) of two frames, a minute on the
/// timeline per chunk, and `segments.json` summarizing it.
pub(crate) async fn write_one_segment(
    outputs: &mut JobOutputs,
    index: u32,
    bytes: Vec<u8>,
) -> Result<(), StepError> {
    let name = format!("seg-{index:05}.ts");
    let first_pts = 900_000 + u64::from(index) * 60 * 90_000;
    let summary = SegmentSummary {
        name: name.clone(),
        bytes: bytes.len() as u64,
        first_pts,
        last_pts: first_pts + 3_000,
        frames: 2,
        intervals: BTreeMap::from([(3_000, 1)]),
        opens_on_keyframe: true,
        codecs: "avc1.64001f".into(),
        width: 256,
        height: 144,
        keyframe_bytes: None,
    };
    let listing = ChunkSegments {
        renditions: vec![RenditionSegments {
            name: "144p".into(),
            segments: vec![summary],
        }],
    };
    outputs
        .put_bytes(&format!("144p/{name}"), "video/mp2t", bytes)
        .await?;
    let json = serde_json::to_vec(&listing).expect("summaries serialize");
    outputs
        .put_bytes(SEGMENTS_FILE, "application/json", json)
        .await
}
