#!/usr/bin/env python3
"""The explorer's power, measured (issue 39): each known coordination
defect re-introduced as a small patch to a copy of HEAD, and
`mediaonce explore` run on fresh seeds against it. Prints a table: the
defect, where it came from, whether a seed caught it, which seed, and
after how many steps.

    scripts/explore_mutations.py [--seeds 40] [--steps 300] [--first SEED] [--only TEXT]

A defect the explorer misses names an actor or a choice its scheduler
lacks. Builds share `target/mutations`, so only the patched crate is
compiled again each time.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# (name, where it came from, file, text, replacement[, the world it is
# explored in: flags that pin what the seed would choose, and --steps])
MUTATIONS = [
    (
        "the collector deletes what a version references",
        "references issue (collector and adder)",
        "src/handler/collect.rs",
        "        if row.deletes_started_at_ms.is_some() {\n            return Ok(None);\n        }\n        let job_key",
        "        if row.deletes_started_at_ms.is_some() || true {\n            return Ok(None);\n        }\n        let job_key",
    ),
    (
        "a collection hands a job that never finished back as done",
        "issue 37, defect 1",
        "src/ledger/collection.rs",
        "Some(status @ (JobStatus::Done | JobStatus::Running | JobStatus::Failed)) => status,",
        "Some(JobStatus::Done | JobStatus::Running | JobStatus::Failed) => JobStatus::Done,",
    ),
    (
        "the ETag is taken for the identity of the bytes",
        "issue 37, defect 3",
        "src/references.rs",
        "(self.etag_md5 && other.etag_md5).then_some(false)",
        "Some(false)",
    ),
    (
        "a delete in a versioning-suspended bucket releases nothing",
        "issue 37, defect 4",
        "src/handler/record.rs",
        "EventKind::DeleteMarker if version.is_unversioned() => {",
        "EventKind::DeleteMarker if version.is_unversioned() && false => {",
    ),
    (
        "a hint without the bytes releases jobs of bytes still held",
        "references issue (stale delete hints)",
        "src/references.rs",
        ".is_none_or(|was| was.same_as(held) != Some(false));",
        ".is_none_or(|_| false);",
    ),
    (
        "a release marks nothing for the sweep",
        "references issue (marks)",
        "src/ledger/memory.rs",
        "        row.free_mark = Some(nonce.to_string());",
        "        let _ = nonce;",
    ),
    (
        "a release keeps its reference items",
        "references issue (items)",
        "src/ledger/memory.rs",
        "            refs.remove(&(job_key.clone(), row_key.clone()));",
        "            let _ = (&refs, job_key);",
    ),
    (
        "a stopped collection's job is given back as done",
        "issue 37 (never done without its files)",
        "src/ledger/mod.rs",
        "        JobStatus::Collecting => Verdict::TakeOver,",
        "        JobStatus::Collecting => Verdict::Done,",
    ),
    (
        "a live lease is taken over",
        "claims (leases)",
        "src/ledger/mod.rs",
        "JobStatus::Running if is_live(row.lease_until_ms, now_ms) => Verdict::Busy,",
        "JobStatus::Running if is_live(row.lease_until_ms, now_ms) => Verdict::TakeOver,",
    ),
    (
        "a mark's settle time is not waited for",
        "references issue (marks racing releases)",
        "src/handler/references.rs",
        "pub const MARK_SETTLE_MS: u64 = 16 * 60 * 1000;",
        "pub const MARK_SETTLE_MS: u64 = 0;",
    ),
    (
        "a finish is not fenced by its owner",
        "claims (fencing)",
        "src/ledger/memory.rs",
        "        finish: Finish<'_>,\n        now_ms: u64,\n    ) -> Result<Conditional<()>, LedgerError> {\n"
        "        let mut rows = self.rows();\n        let Some(row) = rows.get_mut(&claim.job_key) else {\n"
        "            return Ok(Conditional::Rejected(None));\n        };\n"
        "        if row.owner != claim.owner || row.status != JobStatus::Running {",
        "        finish: Finish<'_>,\n        now_ms: u64,\n    ) -> Result<Conditional<()>, LedgerError> {\n"
        "        let mut rows = self.rows();\n        let Some(row) = rows.get_mut(&claim.job_key) else {\n"
        "            return Ok(Conditional::Rejected(None));\n        };\n"
        "        if row.status != JobStatus::Running {",
    ),
    (
        "a busy message comes back when the lease ends by the busy worker's clock",
        "issue 39 (found by the explorer: clock skew)",
        "src/handler/busy.rs",
        "        busy_until_ms.saturating_add(margin_ms),",
        "        busy_until_ms.saturating_add(margin_ms * 0),",
    ),
    (
        "a version's row is written over a concurrent hint's (no gen condition)",
        "references issue (hints reconciled with S3)",
        "src/ledger/memory.rs",
        "            None => current.is_none(),\n            Some(gen) => current.is_some_and(|row| row.gen == gen),",
        "            None => true,\n            Some(_) => true,",
    ),
    (
        "an abandoned row is collected without reading its references",
        "issue 39 (found by the explorer: versioned buckets)",
        "src/handler/collect.rs",
        "        if row.deletes_started_at_ms.is_some() {\n            return Ok(None);\n        }\n        let job_key",
        "        if row.free_mark.is_none() || row.deletes_started_at_ms.is_some() {\n            return Ok(None);\n        }\n        let job_key",
    ),
    (
        "a run skipped for one upload's replaced bytes is shared by another upload of them",
        "issue 39 (found by the explorer: chained recipes)",
        "src/handler/job/mod.rs",
        "        } else if report.outcome == Outcome::Skipped {",
        "        } else if report.outcome == Outcome::Skipped && false {",
    ),
    (
        "a takeover whose input is replaced deletes the row that names its files",
        "issue 39 (found by the explorer: contention and crashes)",
        "src/handler/job/mod.rs",
        "let (given_up, how) = if claim.attempt > 1 || !outputs.files().is_empty() {",
        "let (given_up, how) = if false && (claim.attempt > 1 || !outputs.files().is_empty()) {",
    ),
    (
        "a split's hold whose execution never started is kept for good",
        "issue 39 (found by the explorer: splits)",
        "src/handler/collect.rs",
        "            Some(_) => {}",
        "            Some(_) => return Ok(true),",
    ),
    (
        "a stale execution's tasks change the job",
        "issue 38 (a stale end, finding 5)",
        "src/handler/split/mod.rs",
        "row.status == JobStatus::Running && row.execution.as_deref() == Some(execution)",
        "row.status == JobStatus::Running",
    ),
    (
        "a chunk runs the recipe configured, not the one its execution claimed",
        "issue 38 (a recipe edited mid-split, finding 2)",
        "src/handler/split/chunk.rs",
        "    let recipe = ChunkParams::recipe(package, span.index, span.start_ms, span.end_ms);",
        "    let package = app.config.recipes.iter().find(|r| r.name == name).map_or(package, |r| &r.recipe);\n"
        "    let recipe = ChunkParams::recipe(package, span.index, span.start_ms, span.end_ms);",
    ),
    (
        "a chunk reads only the claimant's version",
        "issue 38 (the coordinating upload deleted, finding 7)",
        "src/handler/split/chunk.rs",
        "    for version in holders.into_iter().filter_map(|holder| holder.version) {",
        "    for version in holders.into_iter().filter_map(|holder| holder.version).filter(|_| false) {",
    ),
    (
        "a split's end hands no version on",
        "issue 38 (every upload gets its event)",
        "src/handler/split/end.rs",
        "    for version in holders.into_iter().filter_map(|holder| holder.version) {",
        "    for version in holders.into_iter().filter_map(|holder| holder.version).filter(|_| false) {",
    ),
    (
        "refs rebuild references only a version's root jobs",
        "issue 39 (found by the explorer: a legacy table, a chained recipe)",
        "src/handler/rebuild.rs",
        "        self.done_downstream(done_roots, &mut reports, &mut wanted, rebuilt)\n            .await?;",
        "        let _ = done_roots;",
        ["--legacy", "yes", "--chained", "yes", "--steps", "60"],
    ),
    (
        "a version whose claim meets a collection of a split job waits for its execution",
        "issue 39 (found by the explorer: splits)",
        "src/handler/job/mod.rs",
        "if row.execution.is_some() && row.status == crate::ledger::JobStatus::Running =>",
        "if row.execution.is_some() =>",
        ["--split", "yes", "--steps", "100"],
    ),
    (
        "a failed run's job is given back as done",
        "issue 37, defect 1 (the finish)",
        "src/ledger/mod.rs",
        "        JobStatus::Failed => Verdict::TakeOver,",
        "        JobStatus::Failed => Verdict::Done,",
    ),
]


def run(cmd, cwd, env=None, check=True):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--first", type=int, default=None)
    parser.add_argument("--only", default="", help="only the defects whose name contains this")
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = args.first if args.first is not None else int.from_bytes(os.urandom(4), "big")
    target = os.path.join(repo, "target", "mutations")
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    work = tempfile.mkdtemp(prefix="explore-mutations-")
    copy = os.path.join(work, "repo")
    run(["git", "worktree", "add", "--detach", copy, "HEAD"], repo)
    rows = []
    seeds = ["--seed", str(first), "--seeds", str(args.seeds), "--keep-going"]

    def explored(world):
        # The seeds in `world` (its own --steps, or the table's).
        steps = [] if "--steps" in world else ["--steps", str(args.steps)]
        return [*seeds, *steps, *world]
    broke = re.compile(r"seed (\d+) broke \"([^\"]+)\" at step (\d+)")
    try:
        # The code as it is, on the same seeds: a seed that breaks an
        # invariant there is the explorer's finding (or its oracle's
        # error), not a mutation's; it is left out below.
        build = run(["cargo", "build", "-q", "--features", "testing", "--bin", "mediaonce"], copy, env, check=False)
        if build.returncode != 0:
            sys.exit(f"HEAD does not build:\n{build.stderr}")
        baselines = {}

        def known_for(world):
            # The code as it is, on the same seeds in the same world.
            if world not in baselines:
                # The tree as it is (a mutation before was put back).
                run(["cargo", "build", "-q", "--features", "testing", "--bin", "mediaonce"], copy, env)
                baseline = run([os.path.join(target, "debug", "mediaonce"), "explore", *explored(world)],
                               copy, env, check=False)
                baselines[world] = {m.group(1): (m.group(2), m.group(3))
                                    for m in broke.finditer(baseline.stderr)}
                for seed, (invariant, step) in baselines[world].items():
                    print(f"baseline {' '.join(world)}: seed {seed} breaks \"{invariant}\" at step {step} "
                          "without any mutation", file=sys.stderr)
            return baselines[world]

        known_for(())
        for mutation in MUTATIONS:
            name, origin, path, text, replacement = mutation[:5]
            world = tuple(mutation[5]) if len(mutation) > 5 else ()
            if args.only not in name:
                continue
            if world:
                origin = f"{origin}; explored with {' '.join(world)}"
            file = os.path.join(copy, path)
            original = open(file).read()
            if original.count(text) != 1:
                rows.append((name, origin, "patch does not apply", "", ""))
                continue
            known = known_for(world)
            open(file, "w").write(original.replace(text, replacement))
            build = run(["cargo", "build", "-q", "--features", "testing", "--bin", "mediaonce"], copy, env, check=False)
            if build.returncode != 0:
                rows.append((name, origin, "does not build", "", ""))
            else:
                explore = run(
                    [os.path.join(target, "debug", "mediaonce"), "explore", *explored(world)],
                    copy, env, check=False,
                )
                caught = next(
                    (m for m in broke.finditer(explore.stderr)
                     if known.get(m.group(1)) != (m.group(2), m.group(3))),
                    None,
                )
                if caught:
                    rows.append((name, origin, f"caught: {caught.group(2)}", caught.group(1), caught.group(3)))
                else:
                    rows.append((name, origin, f"missed in {args.seeds} seeds", "", ""))
            open(file, "w").write(original)
            print(f"{name}: {rows[-1][2]}", file=sys.stderr, flush=True)
    finally:
        run(["git", "worktree", "remove", "--force", copy], repo, check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"Seeds from {first}, {args.seeds} of {args.steps} steps each (unless a row's world says).")
    for world, known in baselines.items():
        for seed, (invariant, step) in sorted(known.items()):
            print(f"Without any mutation ({' '.join(world) or 'any world'}), seed {seed} breaks "
                  f"\"{invariant}\" at step {step}: left out.")
    print()
    print("| defect | from | result | seed | step |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    caught = sum(1 for row in rows if row[2].startswith("caught"))
    print(f"\n{caught} of {len(rows)} caught.")


if __name__ == "__main__":
    main()
