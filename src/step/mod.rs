//! Steps: the work a recipe names, and what a step may use.
//!
//! A step reads one input object version and writes named outputs into its
//! job's prefix, `<output prefix><job key>/`. It must be deterministic (the
//! same input and recipe give the same output bytes) so that a retry, or a
//! stale worker that wakes late, writes identical files.
//!
//! A [`Step`] parses a recipe's params into its own type once, when the
//! configuration is loaded ([`Step::params`]); the result, a [`BoundStep`],
//! is what the handler runs for every job of that recipe.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::key::Recipe;

mod input;
mod local;
mod outputs;
pub mod scratch;

pub use input::JobInput;
pub use local::Keep;
pub(crate) use local::ObjectBytes;
pub(crate) use outputs::hash_file;
pub use outputs::{content_type, CopyIn, JobOutputs, Manifest, OutputFile, MANIFEST_NAME};
// The headers every output is served with: the handler writes them
// through `JobOutputs`; the tests check them.
#[allow(unused_imports)]
pub use outputs::{output_headers, IMMUTABLE};

/// Why a step failed. The message is stored in the job row.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    #[error("invalid params for step {step}: {problem}")]
    InvalidParams { step: String, problem: String },
    #[error("reading the input failed: {0}")]
    Input(String),
    /// The bytes read are not those the job is keyed on (S3's checksum or
    /// a cached hash disagrees with them).
    #[error("integrity error: the object's bytes hash to {actual}, but the job is keyed on {expected} ({keyed_by})")]
    Integrity {
        expected: String,
        actual: String,
        /// Where the expected hash came from: `s3-checksum`, `cached`...
        keyed_by: &'static str,
    },
    #[error("writing output {name} failed: {message}")]
    Output { name: String, message: String },
    /// The input can never be processed (undecodable, truncated, a pixel
    /// bomb, an unsupported format, a lying MP4): no retry can fix it, so
    /// the job is poisoned at once instead of spending more runs.
    #[error("{0}")]
    Unprocessable(String),
    /// Anything else: retried until the attempts cap.
    #[error("{0}")]
    Failed(String),
}

impl StepError {
    /// Whether no retry can fix it: an unprocessable input, or params the
    /// step refuses (a recipe does not change between retries).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            StepError::Unprocessable(_) | StepError::InvalidParams { .. }
        )
    }
}

/// What a step gets to do its work.
pub struct StepContext<'a> {
    pub job_key: &'a str,
    pub recipe: &'a Recipe,
    pub input: &'a JobInput,
    /// The invocation deadline in epoch milliseconds, inside Lambda. A step
    /// that runs long must stop before it (the job fails and is retried).
    pub deadline_ms: Option<u64>,
    /// The worker's clock: the one the deadline is compared with.
    pub clock: &'a dyn crate::lease::Clock,
}

/// How a step reads its input: what lets the handler read it once, hash it
/// as it goes, and hand the same bytes to the step (see
/// [`crate::identity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputUse {
    /// A few ranged reads ([`JobInput::read_range`]): reading every byte to
    /// hash it would cost more than the job.
    Ranges,
    /// Every byte once, in order, keeping none ([`JobInput::sha256`]).
    Stream,
    /// Every byte, held in memory ([`JobInput::bytes`]), for inputs up to
    /// `max_bytes`; a larger one the step refuses without reading it.
    Memory { max_bytes: u64 },
    /// Every byte, from a local file ([`JobInput::spool_to`]), for inputs
    /// up to `max_bytes`; a larger one the step reads by ranges (a long
    /// video's split) or spools itself.
    File { max_bytes: u64 },
}

impl InputUse {
    /// Whether a run over an input of `size` bytes reads all of them.
    pub fn reads_whole(self, size: u64) -> bool {
        match self {
            InputUse::Ranges => false,
            InputUse::Memory { max_bytes } | InputUse::File { max_bytes } => size <= max_bytes,
            InputUse::Stream => true,
        }
    }
}

/// A unit of work a recipe can name.
#[async_trait::async_trait]
pub trait Step: Send + Sync + 'static {
    /// A recipe's params as this step reads them.
    type Params: Send + Sync + 'static;

    /// The name recipes use.
    fn name(&self) -> &'static str;

    /// Parses and checks a recipe's params, once, when the configuration is
    /// loaded: a bad recipe fails at start-up rather than on every message.
    fn params(&self, params: &Map<String, Value>) -> Result<Self::Params, String>;

    /// How long a run may take at most, declared so that no run starts
    /// that the invocation deadline would cut off.
    fn time_needed(&self, _params: &Self::Params) -> Duration {
        Duration::ZERO
    }

    /// How a run with these params reads its input. A step that reads
    /// every byte anyway says so, and `auto` identity keys its jobs by a
    /// hash of the content computed on that same read.
    fn input_use(&self, _params: &Self::Params) -> InputUse {
        InputUse::Ranges
    }

    /// The chunks a run over this input is split into, each a job of its
    /// own run elsewhere and joined into this job's outputs (DESIGN.md,
    /// "Chunked HLS"); `None` (the default): the job runs here, whole.
    /// Asked only when the job could hand chunks on (it has a queue).
    async fn split(
        &self,
        _params: &Self::Params,
        _context: &StepContext<'_>,
    ) -> Result<Option<Vec<ChunkSpan>>, StepError> {
        Ok(None)
    }

    /// Runs the step, writing its outputs. The manifest is written after.
    async fn run(
        &self,
        params: &Self::Params,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError>;
}

/// One chunk of a split job: a span of the input's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Its place, from 0.
    pub index: u32,
    pub start_ms: u64,
    /// `None`: the input's end.
    pub end_ms: Option<u64>,
}

/// A recipe's step with its params parsed: what the handler runs.
#[async_trait::async_trait]
pub trait BoundStep: Send + Sync {
    /// The step's name.
    fn name(&self) -> &'static str;

    /// [`Step::time_needed`] for these params.
    fn time_needed(&self) -> Duration;

    /// [`Step::input_use`] for these params.
    fn input_use(&self) -> InputUse;

    /// [`Step::split`] with these params.
    async fn split(&self, context: &StepContext<'_>) -> Result<Option<Vec<ChunkSpan>>, StepError>;

    /// [`Step::run`] with these params.
    async fn run(
        &self,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError>;
}

/// A step whatever its params' type: what a registry holds.
pub trait AnyStep: Send + Sync {
    fn name(&self) -> &'static str;

    /// Parses `params` for this step: the step bound to them.
    fn bind(&self, params: &Map<String, Value>) -> Result<Arc<dyn BoundStep>, String>;
}

impl<S: Step> AnyStep for Arc<S> {
    fn name(&self) -> &'static str {
        Step::name(self.as_ref())
    }

    fn bind(&self, params: &Map<String, Value>) -> Result<Arc<dyn BoundStep>, String> {
        let params = self.params(params)?;
        Ok(Arc::new(Bound {
            step: self.clone(),
            params,
        }))
    }
}

/// A step and its parsed params.
struct Bound<S: Step> {
    step: Arc<S>,
    params: S::Params,
}

#[async_trait::async_trait]
impl<S: Step> BoundStep for Bound<S> {
    fn name(&self) -> &'static str {
        self.step.name()
    }

    fn time_needed(&self) -> Duration {
        self.step.time_needed(&self.params)
    }

    fn input_use(&self) -> InputUse {
        self.step.input_use(&self.params)
    }

    async fn split(&self, context: &StepContext<'_>) -> Result<Option<Vec<ChunkSpan>>, StepError> {
        self.step.split(&self.params, context).await
    }

    async fn run(
        &self,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.step.run(&self.params, context, outputs).await
    }
}

impl std::fmt::Debug for dyn AnyStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnyStep({})", self.name())
    }
}

impl std::fmt::Debug for dyn BoundStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BoundStep({})", self.name())
    }
}
