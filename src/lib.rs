//! mediaonce: run each (content, recipe) pair of a media pipeline exactly
//! once, keyed by content hash, claimed in DynamoDB before any work.
//!
//! The modules, from pure to I/O:
//! - [`key`]: recipes, canonical JSON, job keys;
//! - [`event`]: SQS bodies carrying S3 notifications;
//! - [`fifo`]: order within FIFO message groups;
//! - [`fingerprint`]: the input hash of an object version;
//! - [`bmff`]: what an MP4/MOV holds, from its `moov` box alone;
//! - [`lease`]: how long a claim lasts;
//! - [`config`]: configuration from the environment;
//! - [`ledger`]: the claim ledger (DynamoDB, in memory, failure-injecting);
//! - [`faults`]: which calls fail, for failure-injection tests;
//! - [`error`]: the kinds of failed calls callers branch on;
//! - [`store`]: the S3 calls;
//! - [`queue`]: handing busy messages back for when their holder is done;
//! - [`step`] and [`steps`]: the work, and where its outputs go;
//! - [`handler`]: an SQS batch in, a partial batch response out;
//! - [`report`]: what each job and message came to;
//! - [`metrics`]: a batch's metrics in CloudWatch's Embedded Metric Format.
//!
//! DESIGN.md says what is guaranteed and what breaks it.
//!
//! # As a library
//!
//! A function with steps of its own is `fn main` and its steps: implement
//! [`Step`], register it beside the built-in ones, and hand the registry to
//! [`run`]:
//!
//! ```no_run
//! # async fn example() -> Result<(), lambda_runtime::Error> {
//! let mut steps = mediaonce::StepRegistry::builtin();
//! // steps.register(MyStep);
//! mediaonce::run(steps).await
//! # }
//! ```
//!
//! `examples/custom_step.rs` is a whole one. The crate root re-exports what
//! that needs; the public modules are the pure key computation ([`key`],
//! [`fingerprint`]), the configuration ([`config`]), the clients behind
//! traits ([`ledger`], [`store`], [`queue`], [`aws`]), the clock ([`lease`])
//! and the built-in steps ([`steps`]). The in-memory and failure-injecting
//! clients, and the modules the handler is built from, are public only with
//! the `testing` feature, for this crate's tests and fuzz targets: they are
//! not part of the API.

/// A module of the handler's own: public only with the `testing` feature.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        mod $name;
    )*};
}

pub mod aws;
pub mod backfill;
pub mod bus;
pub mod config;
pub mod error;
pub mod executions;
pub mod explore;
pub mod fingerprint;
pub mod identity;
pub mod key;
pub mod lease;
pub mod ledger;
pub mod logging;
pub mod metrics;
pub mod pipeline;
pub mod queue;
pub mod references;
pub mod simulate;
pub mod steps;
pub mod store;
pub mod upload;

internal!(bmff, event, fifo, handler, report, runtime, step);

/// Which calls fail, and the gate every call passes: the
/// failure-injection tests' and the explorer's (`mediaonce explore`).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod faults;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
pub(crate) mod faults;

pub use config::{Config, ConfigError};
pub use handler::{
    handle_batch, render_tree, App, Collected, Invocation, NotReferenced, RebuildSummary,
    RebuiltVersion, RecipeOutputs, SealedRow, StartupError,
};
pub use key::{job_key, Recipe};
pub use report::{BatchReport, BatchUsage, JobReport, MessageReport, Outcome};
pub use runtime::run;
pub use step::{
    InputUse, JobInput, JobOutputs, Manifest, OutputFile, Step, StepContext, StepError,
    MANIFEST_NAME,
};
pub use steps::StepRegistry;
