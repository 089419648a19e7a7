//! The deterministic explorer (issue 39) in CI: a fixed list of
//! regression seeds and a batch of fresh ones (the first printed, so a
//! failure replays with `mediaonce explore --seed N --steps M --trace`),
//! and the replay itself: the same seed, the same run.

use mediaonce::explore::{run, ExploreOptions};

/// Seeds that broke an invariant with a known defect put back when the
/// mutation table was measured (README "Interleavings, explored"), the
/// explorer's own findings among them. Kept for good; the explorer's world
/// has changed since (what a seed means with it), and these follow the
/// table when it is measured again.
const REGRESSION_SEEDS: &[u64] = &[
    7000, 7001, 7003, 7004, 7005, 7008, 7009, 7017, 7053, 7298, 9081,
];

/// Runs that found a defect in worlds or lengths the fresh seeds draw
/// rarely, each kept as it was found: (seed, steps, a table from before
/// reference items and a chained recipe forced on).
const REGRESSION_RUNS: &[(u64, u64, bool)] = &[
    // A hand-on met a collection of a split job whose execution had not
    // yet closed.
    (40224, 100, false),
    // `refs rebuild` referenced only the root jobs; the seal left the
    // chained ones to the sweep.
    (10, 60, true),
    (16, 60, true),
    (53, 60, true),
];

fn steps() -> u64 {
    std::env::var("EXPLORE_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400)
}

fn options(seed: u64) -> ExploreOptions {
    ExploreOptions {
        seed,
        steps: steps(),
        ..ExploreOptions::default()
    }
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let first = run(options(7));
    let again = run(options(7));
    assert_eq!(first.trace, again.trace);
    assert_eq!(first.log, again.log);
    assert_ne!(run(options(8)).trace, first.trace);
}

/// A replay is another process: nothing may hang on the host's speed or
/// a process's random state (a timer the runtime fires when it turns, a
/// hash map's order). Every seed's every action, twice, compared.
#[test]
fn the_same_seeds_replay_in_another_process() {
    let trace = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mediaonce"))
            .args([
                "explore", "--seed", "100", "--seeds", "12", "--steps", "300",
            ])
            .args(["--keep-going", "--trace"])
            .output()
            .expect("mediaonce explore runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        // The timing line differs, every action must not.
        text.lines()
            .filter(|line| !line.contains(" steps/s)"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let first = trace();
    assert!(first.len() > 12 * 300, "every action printed");
    assert_eq!(first, trace());
}

#[test]
fn every_invariant_holds_on_regression_and_fresh_seeds() {
    let fresh: u64 = std::env::var("EXPLORE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let first = std::env::var("EXPLORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("explore: {fresh} fresh seeds from {first}, every other one of a quarter of the steps (EXPLORE_SEED={first} repeats them)");
    let kept = REGRESSION_RUNS
        .iter()
        .map(|&(seed, steps, legacy)| ExploreOptions {
            seed,
            steps,
            legacy: legacy.then_some(true),
            chained: legacy.then_some(true),
            ..ExploreOptions::default()
        });
    // Every other fresh seed a short run: quiescence comes while more of
    // the world's first objects live (a legacy table's among them).
    let fresh = (0..fresh).map(|n| ExploreOptions {
        steps: if n % 2 == 0 { steps() } else { steps() / 4 },
        ..options(first.wrapping_add(n))
    });
    let runs = REGRESSION_SEEDS
        .iter()
        .copied()
        .map(options)
        .chain(fresh)
        .chain(kept);
    let mut taken = 0;
    for options in runs {
        let (seed, steps) = (options.seed, options.steps);
        let report = run(options);
        taken += report.steps;
        if let Some(violation) = &report.violation {
            for line in &report.log {
                eprintln!("  {line}");
            }
            panic!(
                "seed {seed} broke \"{}\" at step {}: {} (replay: mediaonce explore --seed {seed} --steps {steps} --trace)",
                violation.invariant,
                violation.step,
                violation.detail,
            );
        }
    }
    eprintln!("explore: {taken} steps, every invariant held");
}
