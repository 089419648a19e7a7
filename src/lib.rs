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
//! - [`report`]: what each job and message came to.
//!
//! DESIGN.md says what is guaranteed and what breaks it.

pub mod aws;
pub mod bmff;
pub mod config;
pub mod error;
pub mod event;
pub mod faults;
pub mod fifo;
pub mod fingerprint;
pub mod handler;
pub mod key;
pub mod lease;
pub mod ledger;
pub mod queue;
pub mod report;
pub mod step;
pub mod steps;
pub mod store;
