//! A deterministic explorer of mediaonce's coordination (issue 39;
//! DESIGN.md, "The explorer"): the real handler and sweep on the in-memory
//! clients, every ledger and object call held at a gate until a seeded
//! scheduler chooses it ([`sched`]), with users uploading, overwriting and
//! deleting, SQS delivering (visibility, redelivery, duplicates, the
//! dead-letter queue), workers crashing at any call and the clock jumping
//! past leases and graces. The invariants are checked after every step and
//! at quiescence ([`check`]); a failure is its seed, its step, the
//! invariant and each actor's last actions, and the same seed replays the
//! same run.

pub mod check;
mod probe;
pub mod sched;
mod world;

pub use world::{explore, Bucket, ExploreOptions, ExploreReport, Violation};

/// Runs one exploration on a runtime of its own, on this thread (every
/// actor a task of it): the same options, the same run.
pub fn run(options: ExploreOptions) -> ExploreReport {
    // Paused: tokio's clock moves only when every task waits on a timer,
    // which the explorer never lets happen, so no timeout or sleep of the
    // handler depends on how fast the host runs.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
        .block_on(explore(options))
}
