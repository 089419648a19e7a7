//! Pipelines: recipes that take their input from another recipe's output
//! file, and the messages that carry a version's pipeline on to another
//! invocation.
//!
//! - [`graph`]: the recipes as a forest, checked once at start-up (names
//!   unique, inputs that exist, no cycle, a chained recipe follows its
//!   root's `match`). Pure.
//! - [`message`]: the hand-on message: the shape of ours that a version's
//!   pipeline travels in through the job queue when the invocation has no
//!   time left for its next jobs. Pure.
//! - [`completion`]: the event published when every job of a version's
//!   pipeline is terminal. Pure.
//!
//! A chained job is keyed like any job: its input hash is the SHA-256 that
//! the upstream job's manifest records for the file it reads, so keying it
//! reads nothing but that manifest, and the same bytes made by two
//! upstream jobs (or uploaded) are one job (DESIGN.md, "Pipelines").

pub mod completion;
pub mod graph;
pub mod message;
pub mod split;

pub use graph::{ChainedInput, Graph, GraphError, Node};
pub use message::{HandOn, HAND_ON_MARKER};
