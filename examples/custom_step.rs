//! A Lambda function with a step of its own beside the built-in ones.
//!
//! `line-count` counts the lines of a text upload and writes
//! `lines.json`; recipes name it like any built-in step:
//!
//! ```sh
//! MEDIAONCE_RECIPES='[{"step":"line-count","version":1,"params":{"max_bytes":1048576},"match":{"suffix":".txt"}}]'
//! ```
//!
//! Build it for Lambda with `cargo lambda build --release --arm64 --example
//! custom_step`; everything else (claims, keys, reuse, retries, partial
//! batch responses) is mediaonce's.

use mediaonce::{InputUse, JobOutputs, Step, StepContext, StepError, StepRegistry};
use serde_json::{Map, Value};

/// Counts the lines of a text object.
struct LineCount;

/// `line-count`'s params, parsed once when the configuration is loaded.
struct LineCountParams {
    /// Larger objects are refused before reading.
    max_bytes: u64,
}

#[async_trait::async_trait]
impl Step for LineCount {
    type Params = LineCountParams;

    fn name(&self) -> &'static str {
        "line-count"
    }

    fn params(&self, params: &Map<String, Value>) -> Result<LineCountParams, String> {
        let max_bytes = match params.get("max_bytes") {
            None => 1 << 20,
            Some(value) => value
                .as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("max_bytes is a positive whole number, got {value}"))?,
        };
        if let Some(unknown) = params.keys().find(|k| *k != "max_bytes") {
            return Err(format!("unknown param {unknown:?} (expected max_bytes)"));
        }
        Ok(LineCountParams { max_bytes })
    }

    /// It reads every byte into memory: under `MEDIAONCE_IDENTITY=auto` its
    /// jobs are keyed by a hash of the content, computed on that same read.
    fn input_use(&self, params: &LineCountParams) -> InputUse {
        InputUse::Memory {
            max_bytes: params.max_bytes,
        }
    }

    async fn run(
        &self,
        params: &LineCountParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let input = context.input;
        if input.head.size > params.max_bytes {
            // No retry makes it smaller: poisoned at once.
            return Err(StepError::Unprocessable(format!(
                "{} bytes, over max_bytes = {}",
                input.head.size, params.max_bytes
            )));
        }
        // Read once, pinned to the bytes the job key names (the handler's
        // copy when it read them to key the job).
        let bytes = input.bytes().await?;
        let lines = bytes.iter().filter(|&&b| b == b'\n').count();
        let report = serde_json::json!({"bytes": bytes.len(), "lines": lines});
        outputs
            .put_bytes(
                "lines.json",
                "application/json",
                report.to_string().into_bytes(),
            )
            .await
    }
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let mut steps = StepRegistry::builtin();
    steps.register(LineCount);
    mediaonce::run(steps).await
}
