//! `mediaonce explore`: runs of the deterministic explorer
//! ([`mediaonce::explore`]), one per seed, each replayable by its seed.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use mediaonce::explore::{run, Bucket, ExploreOptions};

use super::fail;

#[derive(Args)]
pub struct ExploreArgs {
    /// The first seed (default: a fresh one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Seeds to run, from the first on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Steps of each run before its quiescence.
    #[arg(long, default_value_t = 400)]
    steps: u64,
    /// Object keys the users write to.
    #[arg(long, default_value_t = 4)]
    keys: u32,
    /// Distinct contents they upload.
    #[arg(long, default_value_t = 3)]
    contents: u32,
    /// The collection grace, in seconds.
    #[arg(long, default_value_t = 0)]
    gc_grace_secs: u64,
    /// The input bucket's versioning: unversioned, suspended, versioned,
    /// or (by default) any, as the seed chooses.
    #[arg(long, default_value = "any")]
    bucket: String,
    /// A chained recipe after the root one: yes, no or either.
    #[arg(long, default_value = "either")]
    chained: String,
    /// Quiescence begins with every key deleted: yes, no or either.
    #[arg(long, default_value = "either")]
    teardown: String,
    /// Some workers' clocks ahead by more than the lease margin: yes, no
    /// or either.
    #[arg(long, default_value = "either")]
    skew_beyond_margin: String,
    /// DynamoDB throttles and transaction conflicts: yes, no or either.
    #[arg(long, default_value = "either")]
    contention: String,
    /// Workers crash three times as often: yes, no or either.
    #[arg(long, default_value = "either")]
    crashy: String,
    /// The root recipe is `hls-package`, whose long inputs split into
    /// chunk jobs run by a Step Functions execution: yes, no or either.
    #[arg(long, default_value = "either")]
    split: String,
    /// The input bucket encrypts with SSE-KMS (no upload's ETag is its
    /// MD5): yes, no or either.
    #[arg(long, default_value = "either")]
    kms: String,
    /// In a versioned bucket, delete markers release what they hide
    /// (MEDIAONCE_RELEASE_ON_DELETE_MARKER=true): yes, no or either.
    #[arg(long, default_value = "either")]
    release_on_marker: String,
    /// The table is from before reference items, and the operator
    /// migrates it (refs rebuild, then refs seal): yes, no or either.
    #[arg(long, default_value = "either")]
    legacy: String,
    /// Print each run's report as one JSON line.
    #[arg(long)]
    json: bool,
    /// Print every action of every run.
    #[arg(long)]
    trace: bool,
    /// Go on past a seed that breaks an invariant (each is printed).
    #[arg(long)]
    keep_going: bool,
    /// For a seed that breaks an invariant: the fewest steps before
    /// quiescence that still break it, and that run's every action.
    #[arg(long)]
    shrink: bool,
}

/// A choice of the world a flag leaves to the seed (`either`) or makes.
fn choice(flag: &str, value: &str) -> Result<Option<bool>, String> {
    match value {
        "either" => Ok(None),
        "yes" => Ok(Some(true)),
        "no" => Ok(Some(false)),
        other => Err(format!(
            "explore: --{flag} must be yes, no or either, not {other:?}"
        )),
    }
}

/// The world the flags make: each choice they leave to the seed `None`.
fn world_of(args: &ExploreArgs, bucket: Option<Bucket>) -> Result<ExploreOptions, String> {
    Ok(ExploreOptions {
        steps: args.steps,
        keys: args.keys,
        contents: args.contents,
        gc_grace_secs: args.gc_grace_secs,
        bucket,
        by_content: None,
        chained: choice("chained", &args.chained)?,
        teardown: choice("teardown", &args.teardown)?,
        skew_beyond_margin: choice("skew-beyond-margin", &args.skew_beyond_margin)?,
        contention: choice("contention", &args.contention)?,
        crashy: choice("crashy", &args.crashy)?,
        split: choice("split", &args.split)?,
        kms: choice("kms", &args.kms)?,
        release_on_marker: choice("release-on-marker", &args.release_on_marker)?,
        legacy: choice("legacy", &args.legacy)?,
        ..ExploreOptions::default()
    })
}

pub fn run_seeds(args: ExploreArgs) -> ExitCode {
    if args.keys == 0 || args.contents == 0 {
        return fail("explore: --keys and --contents must be at least 1".into());
    }
    let bucket = match args.bucket.as_str() {
        "any" => None,
        "unversioned" => Some(Bucket::Unversioned),
        "suspended" => Some(Bucket::Suspended),
        "versioned" => Some(Bucket::Versioned),
        other => {
            return fail(format!(
                "explore: --bucket must be unversioned, suspended, versioned or any, not {other:?}"
            ))
        }
    };
    let world = match world_of(&args, bucket) {
        Ok(world) => world,
        Err(e) => return fail(e),
    };
    let first = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let started = Instant::now();
    let mut steps = 0;
    let mut broken = 0;
    for seed in (0..args.seeds).map(|n| first.wrapping_add(n)) {
        let report = run(ExploreOptions {
            seed,
            ..world.clone()
        });
        steps += report.steps;
        if args.json {
            match serde_json::to_string(&report) {
                Ok(line) => println!("{line}"),
                Err(e) => return fail(format!("explore: {e}")),
            }
        } else {
            let world: Vec<&str> = report
                .world
                .iter()
                .filter(|(_, on)| **on)
                .map(|(name, _)| *name)
                .collect();
            println!(
                "seed {seed} [{}]: {} steps, trace {}, {}",
                world.join(" "),
                report.steps,
                report.trace,
                report
                    .violation
                    .as_ref()
                    .map_or("every invariant held".into(), |v| {
                        format!("step {}: {}: {}", v.step, v.invariant, v.detail)
                    })
            );
        }
        if args.trace {
            for line in &report.log {
                eprintln!("  {line}");
            }
        }
        if let (Some(violation), true) = (&report.violation, args.shrink) {
            let options = report.options.clone();
            let steps = mediaonce::explore::shrink(&options, violation.invariant);
            let shrunk = run(ExploreOptions { steps, ..options });
            eprintln!(
                "mediaonce explore: seed {seed} breaks \"{}\" with {steps} steps (of {}); its actions:",
                violation.invariant, args.steps
            );
            for line in &shrunk.log {
                eprintln!("  {line}");
            }
        }
        if let Some(violation) = &report.violation {
            eprintln!("mediaonce explore: seed {seed} broke \"{}\" at step {}; replay with --seed {seed} --steps {}", violation.invariant, violation.step, args.steps);
            for (actor, actions) in &violation.last_actions {
                eprintln!("  actor {actor}: {}", actions.join(" | "));
            }
            broken += 1;
            if !args.keep_going {
                return ExitCode::FAILURE;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "mediaonce explore: {} seeds from {first}, {steps} steps in {seconds:.1} s ({:.0} steps/s)",
        args.seeds,
        steps as f64 / seconds.max(1e-9)
    );
    if broken > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
