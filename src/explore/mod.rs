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
mod gated;
mod probe;
pub mod sched;
mod video;
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

/// The fewest steps before quiescence with which `options`' seed still
/// breaks `invariant` (a shorter trace to read: the first steps of a seed
/// are the same whatever the count, and quiescence follows them). A
/// bisection, so the smallest it finds may not be the least when a
/// shorter run passes by luck; at most `options.steps`.
pub fn shrink(options: &ExploreOptions, invariant: &str) -> u64 {
    smallest(options.steps, |steps| {
        run(ExploreOptions {
            steps,
            ..options.clone()
        })
        .violation
        .is_some_and(|v| v.invariant == invariant)
    })
}

/// The smallest `n` in `0..=most` for which `fails(n)`, by bisection,
/// given that `fails(most)`: each step keeps a failing upper bound.
fn smallest(most: u64, fails: impl Fn(u64) -> bool) -> u64 {
    let (mut passes, mut failing) = (None::<u64>, most);
    loop {
        let low = passes.map_or(0, |p| p + 1);
        if low >= failing {
            return failing;
        }
        let middle = low + (failing - low) / 2;
        if fails(middle) {
            failing = middle;
        } else {
            passes = Some(middle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::smallest;

    #[test]
    fn bisection_finds_the_first_failing_count() {
        for first in [0, 1, 7, 99, 100] {
            assert_eq!(smallest(100, |n| n >= first), first);
        }
    }

    #[test]
    fn bisection_keeps_a_failing_bound_when_failures_are_not_monotone() {
        // Fails at 30 and from 80 on: whatever it returns fails.
        let fails = |n: u64| n == 30 || n >= 80;
        assert!(fails(smallest(100, fails)));
    }
}
