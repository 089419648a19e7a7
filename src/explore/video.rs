//! The explorer's long videos: `hls-package` and `hls-chunk` as steps
//! whose outputs are functions of their input's bytes alone, so that the
//! split's real machinery (its execution started by the handler, chunk
//! jobs, the join, the hand-on of every version at the end) runs over
//! them. An input is long when the first byte of its SHA-256 is under
//! [`LONG_BELOW`]: it splits into [`CHUNKS`] chunks. The package's first
//! segment, whole or joined, is [`output_of`] its input, the file a
//! chained recipe reads: so a chained job's key is the same whether its
//! package was split or not.

use serde_json::{Map, Value};

use super::probe::{output_of, ExploreProbe};
use crate::key::sha256_hex;
use crate::simulate::write_one_segment;
use crate::step::{ChunkSpan, InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::hls::chunk_job::{ChunkParams, CHUNK_STEP};

/// The chunks a long input splits into.
pub const CHUNKS: u32 = 3;
/// Inputs whose SHA-256 begins with a byte under this are long.
pub const LONG_BELOW: u8 = 0xa0;
/// The file of a package a chained recipe reads: its first segment.
pub const FIRST_SEGMENT: &str = "144p/seg-00000.ts";

/// Whether `bytes` are a long video's.
pub fn is_long(bytes: &[u8]) -> bool {
    u8::from_str_radix(&sha256_hex(bytes)[..2], 16).unwrap_or(u8::MAX) < LONG_BELOW
}

/// What segment `index` of a package of `input` holds: the first is
/// [`output_of`] the input.
fn segment_of(input: &[u8], index: u32) -> Vec<u8> {
    match index {
        0 => output_of(input),
        _ => format!("segment {index} of {}", sha256_hex(input)).into_bytes(),
    }
}

/// `hls-package`: splits a long input, and runs a short one whole (its one
/// segment), each run checked by the probe (its claim held).
#[derive(Clone)]
pub struct ExplorePackage {
    pub probe: ExploreProbe,
}

#[async_trait::async_trait]
impl Step for ExplorePackage {
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
        let input = context.input.read_range(0..context.input.head.size).await?;
        if !is_long(&input) {
            return Ok(None);
        }
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
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let _run = self.probe.begin(context).await?;
        let input = context.input.read_range(0..context.input.head.size).await?;
        outputs
            .put_bytes(FIRST_SEGMENT, "video/mp2t", segment_of(&input, 0))
            .await
    }
}

/// `hls-chunk`: one segment of its span and its summary, for the join;
/// its run checked by the probe.
#[derive(Clone)]
pub struct ExploreChunk {
    pub probe: ExploreProbe,
}

#[async_trait::async_trait]
impl Step for ExploreChunk {
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
        let _run = self.probe.begin(context).await?;
        let input = context.input.read_range(0..context.input.head.size).await?;
        let bytes = segment_of(&input, params.index);
        write_one_segment(outputs, params.index, bytes).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn some_of_the_worlds_contents_are_long_and_some_short() {
        let long: Vec<bool> = (0..3)
            .map(|n| is_long(format!("content {n}").as_bytes()))
            .collect();
        assert_eq!(long, [true, false, true]);
    }
}
