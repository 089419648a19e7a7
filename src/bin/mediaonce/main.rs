//! The mediaonce command line: job keys, the handler run locally, job rows,
//! and uploads keyed by content.

mod explore;
mod progress;
mod refs;
mod simulate;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use clap::{Parser, Subcommand};
use mediaonce::config::{Config, ENV_RECIPES, ENV_TABLE};
use mediaonce::key::{check_input_hash, job_key, Recipe};
use mediaonce::lease::{Clock, SystemClock};
use mediaonce::ledger::Ledger;
use mediaonce::steps::StepRegistry;
use mediaonce::upload::{UploadOptions, DEFAULT_PART_SIZE, MIN_PART_SIZE, SINGLE_PUT_MAX};
use mediaonce::Outcome;
use mediaonce::{handle_batch, App, Invocation};

#[derive(Parser)]
#[command(
    name = "mediaonce",
    version,
    about = "Idempotent media jobs keyed by content hash"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the job key of an input hash and a recipe.
    Key {
        /// The input hash (mediaonce's are 64 lowercase hex digits).
        #[arg(long, required_unless_present = "jsonl", conflicts_with = "jsonl")]
        input_hash: Option<String>,
        /// The recipe JSON: {"step": ..., "version": ..., "params": {...}}.
        #[arg(long, required_unless_present = "jsonl", conflicts_with = "jsonl")]
        recipe: Option<String>,
        /// Read lines {"input_hash": ..., "recipe_json": ...} from stdin, print one key per line.
        #[arg(long)]
        jsonl: bool,
    },
    /// Print a job's row as JSON (exit 1 when there is none), and, for a
    /// long video split by Step Functions, its execution's status and the
    /// Map's chunks (`split_progress`). Needs MEDIAONCE_TABLE.
    Status {
        /// The job key.
        job_key: String,
    },
    /// Make a failed or poisoned job claimable again (its attempts reset).
    /// Needs MEDIAONCE_TABLE.
    Retry {
        /// The job key.
        job_key: String,
    },
    /// Print, for every configured recipe that matches the object's key, the
    /// job it is keyed to, the job's status and references, its output
    /// prefix and its manifest's files, as JSON. Needs the handler's
    /// configuration (MEDIAONCE_TABLE, MEDIAONCE_OUTPUT_BUCKET, ...).
    Outputs {
        /// The object: s3://bucket/key.
        object: String,
        /// A version of it (default: the current one).
        #[arg(long)]
        version_id: Option<String>,
    },
    /// Run the object's matching recipes (or the one given) now, in-process,
    /// exactly as the handler would for its upload: keyed, claimed, run or
    /// reused, referenced. Prints one JSON line per job; pressing it twice
    /// runs once. Exit 1 unless every job ran or was reused.
    Reprocess {
        /// The object: s3://bucket/key.
        object: String,
        /// A version of it (default: the current one).
        #[arg(long)]
        version_id: Option<String>,
        /// Only this recipe, {"step": ..., "version": ..., "params": {...}},
        /// instead of the configured ones.
        #[arg(long)]
        recipe: Option<String>,
    },
    /// Collect every job due now: nothing references it and its grace
    /// (MEDIAONCE_GC_GRACE_SECS) has passed. Prints one JSON line per job
    /// with the objects deleted. Needs the handler's configuration.
    Gc {
        /// List what would be deleted; touch nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Send every object under s3://bucket[/prefix] to the job queue as the
    /// notification S3 would have sent for it (ten to a SendMessageBatch),
    /// so the deployed function runs the configured recipes over objects
    /// already there. Running it twice costs only reused jobs.
    Backfill {
        /// Where the objects are: s3://bucket or s3://bucket/prefix.
        location: String,
        /// The job queue.
        #[arg(long)]
        queue_url: String,
        /// Count the objects; send nothing.
        #[arg(long)]
        dry_run: bool,
        /// Resume after this key (the summary of a stopped run names it).
        #[arg(long)]
        start_after: Option<String>,
    },
    /// References of objects uploaded before references were counted:
    /// `rebuild` them, then `seal` the counts. Needs the handler's
    /// configuration.
    Refs {
        #[command(subcommand)]
        command: refs::RefsCommand,
    },
    /// Play a month of uploads (the reference design's mix by default)
    /// through the real handler on in-memory clients with a virtual clock,
    /// and compare the runs keyed by message id with mediaonce's.
    Simulate(simulate::SimulateArgs),
    /// Explore interleavings: the real handler and sweep on in-memory
    /// clients, every call's turn chosen by a seeded scheduler, with
    /// uploads, deletes, redeliveries, crashes and clock jumps; the
    /// invariants checked after every step. A failure prints its seed.
    Explore(explore::ExploreArgs),
    /// Upload a file so that its jobs are keyed by its content: one PUT
    /// carrying its SHA-256 (which S3 verifies and keeps) up to 5 GiB, else
    /// a multipart upload (a worker then hashes it once). Prints the input
    /// hash and the version id; progress goes to stderr.
    Upload {
        /// The file to upload.
        file: PathBuf,
        /// Where to: s3://bucket/key.
        destination: String,
        /// Files larger than this many bytes go up in parts (at most, and
        /// by default, 5 GiB: S3's largest single PUT).
        #[arg(long, default_value_t = SINGLE_PUT_MAX)]
        multipart_threshold: u64,
        /// The part size of a multipart upload, in bytes (at least 5 MiB).
        #[arg(long, default_value_t = DEFAULT_PART_SIZE)]
        part_size: u64,
        /// No progress on stderr.
        #[arg(long)]
        quiet: bool,
    },
    /// Run the handler in-process on an SQS event JSON file; print the
    /// SqsBatchResponse JSON as the last line of stdout.
    Invoke {
        /// The SQS event file, as Lambda would deliver it.
        #[arg(long)]
        event: PathBuf,
        /// After the logs, a short table of the batch on stderr (the
        /// default when stderr is a terminal).
        #[arg(long)]
        pretty: bool,
        /// The invocation's deadline, SECS from now, as a function timeout
        /// sets it in Lambda (1 to 900): jobs that would not finish are
        /// deferred, ffmpeg is stopped before it, claims' leases end with
        /// it. Default: no deadline.
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=900))]
        timeout: Option<u64>,
    },
}

/// Exit code of a bad input (a bad recipe, a bad hash).
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Key {
            input_hash,
            recipe,
            jsonl,
        } => {
            if jsonl {
                keys_from_jsonl()
            } else {
                let (hash, recipe) = (input_hash.unwrap_or_default(), recipe.unwrap_or_default());
                match key_of(&hash, &recipe) {
                    Ok(key) => {
                        println!("{key}");
                        ExitCode::SUCCESS
                    }
                    Err(problem) => {
                        eprintln!("mediaonce key: {problem}");
                        ExitCode::from(EXIT_BAD_INPUT)
                    }
                }
            }
        }
        Command::Invoke {
            event,
            pretty,
            timeout,
        } => invoke(&event, pretty, timeout),
        Command::Outputs { object, version_id } => outputs(&object, version_id),
        Command::Gc { dry_run } => gc(dry_run),
        Command::Refs { command } => refs::run(command),
        Command::Simulate(args) => simulate::run(args),
        Command::Explore(args) => explore::run_seeds(args),
        Command::Backfill {
            location,
            queue_url,
            dry_run,
            start_after,
        } => backfill(&location, queue_url, dry_run, start_after),
        Command::Reprocess {
            object,
            version_id,
            recipe,
        } => reprocess(&object, version_id, recipe),
        Command::Upload {
            file,
            destination,
            multipart_threshold,
            part_size,
            quiet,
        } => upload(
            &file,
            &destination,
            UploadOptions {
                single_put_max: multipart_threshold,
                part_size,
            },
            quiet,
        ),
        Command::Status { job_key } => with_ledger(|ledger| async move {
            match ledger.get(&job_key).await {
                Ok(Some(row)) => {
                    let mut json = serde_json::to_value(&row).unwrap_or_default();
                    if let Some(execution) = &row.execution {
                        json["split_progress"] = split_progress(execution).await;
                    }
                    match serde_json::to_string_pretty(&json) {
                        Ok(json) => {
                            println!("{json}");
                            ExitCode::SUCCESS
                        }
                        Err(e) => fail(format!("cannot print the row: {e}")),
                    }
                }
                Ok(None) => fail(format!(
                    "there is no job {job_key} in table {}",
                    ledger.table()
                )),
                Err(e) => fail(e.to_string()),
            }
        }),
        Command::Retry { job_key } => with_ledger(|ledger| async move {
            match ledger.retry(&job_key, SystemClock.now_ms()).await {
                Ok(was) => {
                    println!(
                        "job {job_key} is claimable again: it had failed {} time(s) in {} run(s){}; last error: {}",
                        was.failures,
                        was.attempts,
                        if was.permanent { ", permanently" } else { "" },
                        was.error.as_deref().unwrap_or("none recorded")
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e.to_string()),
            }
        }),
    }
}

/// A split's execution as Step Functions tells it: its status and the
/// Map's counts (or why they could not be read).
async fn split_progress(execution: &str) -> serde_json::Value {
    use mediaonce::executions::{ExecutionClient, SfnExecutions};
    let sdk = mediaonce::aws::load_sdk_config().await;
    let executions = SfnExecutions::new(aws_sdk_sfn::Client::new(&sdk));
    let status = match executions.describe_execution(execution).await {
        Ok(Some(status)) => serde_json::json!(status),
        Ok(None) => serde_json::json!("NOT_FOUND"),
        Err(e) => return serde_json::json!({"execution": execution, "error": e.to_string()}),
    };
    match executions.execution_progress(execution).await {
        Ok(progress) => {
            let mut json = serde_json::json!({"execution": execution, "status": status});
            if let (Some(json), serde_json::Value::Object(counts)) =
                (json.as_object_mut(), serde_json::json!(progress))
            {
                json.extend(counts);
            }
            json
        }
        Err(e) => {
            serde_json::json!({"execution": execution, "status": status, "error": e.to_string()})
        }
    }
}

fn fail(message: String) -> ExitCode {
    eprintln!("mediaonce: {message}");
    ExitCode::FAILURE
}

/// Runs `work` with the ledger of MEDIAONCE_TABLE (its references in
/// MEDIAONCE_REFS_TABLE, by default `<MEDIAONCE_TABLE>-refs`).
fn with_ledger<F, Fut>(work: F) -> ExitCode
where
    F: FnOnce(Ledger) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    let table = match std::env::var(ENV_TABLE) {
        Ok(table) if !table.trim().is_empty() => table,
        _ => {
            return fail(format!(
                "{ENV_TABLE}: is required (the DynamoDB table of job claims)"
            ))
        }
    };
    block_on(async {
        let sdk = mediaonce::aws::load_sdk_config().await;
        let refs_table = std::env::var(mediaonce::config::ENV_REFS_TABLE)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| mediaonce::config::default_refs_table(&table));
        work(Ledger::dynamodb_with_refs(
            mediaonce::aws::dynamodb_client(&sdk),
            table,
            refs_table,
        ))
        .await
    })
}

fn key_of(input_hash: &str, recipe_json: &str) -> Result<String, String> {
    check_input_hash(input_hash)?;
    let recipe = Recipe::from_json(recipe_json).map_err(|e| e.to_string())?;
    Ok(job_key(input_hash, &recipe.hash()))
}

fn keys_from_jsonl() -> ExitCode {
    #[derive(serde::Deserialize)]
    struct Line {
        input_hash: String,
        recipe_json: String,
    }
    let stdin = std::io::stdin();
    let mut out = String::new();
    for (index, line) in stdin.lock().lines().enumerate() {
        let number = index + 1;
        let result = line
            .map_err(|e| format!("cannot read: {e}"))
            .and_then(|text| {
                serde_json::from_str::<Line>(&text)
                    .map_err(|e| format!("not a {{\"input_hash\", \"recipe_json\"}} object: {e}"))
            })
            .and_then(|line| key_of(&line.input_hash, &line.recipe_json));
        match result {
            Ok(key) => {
                out.push_str(&key);
                out.push('\n');
            }
            Err(problem) => {
                print!("{out}");
                eprintln!("mediaonce key: line {number}: {problem}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    print!("{out}");
    ExitCode::SUCCESS
}

fn invoke(path: &PathBuf, pretty: bool, timeout_secs: Option<u64>) -> ExitCode {
    // Logs go to stderr; stdout carries the response.
    mediaonce::logging::init(std::io::stderr);
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => return fail(format!("invoke: cannot read {}: {e}", path.display())),
    };
    let event: SqsEvent = match serde_json::from_str(&text) {
        Ok(event) => event,
        Err(e) => {
            return fail(format!(
                "invoke: {} is not an SQS event: {e}",
                path.display()
            ))
        }
    };
    block_on(async {
        let app = match App::from_env(StepRegistry::builtin()).await {
            Ok(app) => Arc::new(app),
            Err(e) => return fail(format!("invoke: {e}")),
        };
        // The deadline is counted from here, once the function is ready,
        // as Lambda counts it from the invocation's start.
        let deadline_ms = timeout_secs.map(|secs| app.now_ms() + secs * 1_000);
        let invocation = Invocation {
            request_id: format!("cli-{}", std::process::id()),
            deadline_ms,
            timeout_ms: None,
        };
        let report = handle_batch(app, event, invocation).await;
        if pretty || std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            eprint!("{}", report.summary());
        }
        match serde_json::to_string(&report.response()) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("invoke: cannot print the response: {e}")),
        }
    })
}

fn outputs(location: &str, version_id: Option<String>) -> ExitCode {
    let Some((bucket, key)) = s3_object(location) else {
        return fail(format!(
            "outputs: {location:?} is not an s3://bucket/key object"
        ));
    };
    // Logs go to stderr; stdout carries the JSON.
    mediaonce::logging::init(std::io::stderr);
    block_on(async {
        let app = match App::from_env(StepRegistry::builtin()).await {
            Ok(app) => app,
            Err(e) => return fail(format!("outputs: {e}")),
        };
        let object = mediaonce::store::ObjectRef {
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id,
            if_match: None,
        };
        let found = match app.outputs_of(&object).await {
            Ok(found) => found,
            Err(e) => return fail(format!("outputs: {e}")),
        };
        // The tree for the operator's eyes; the JSON for scripts.
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            eprint!("{}", mediaonce::render_tree(&found));
        }
        match serde_json::to_string_pretty(&found) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("outputs: {e}")),
        }
    })
}

fn reprocess(location: &str, version_id: Option<String>, recipe: Option<String>) -> ExitCode {
    let Some((bucket, key)) = s3_object(location) else {
        return fail(format!(
            "reprocess: {location:?} is not an s3://bucket/key object"
        ));
    };
    mediaonce::logging::init(std::io::stderr);
    let steps = StepRegistry::builtin();
    let config = match &recipe {
        // The one recipe, for every key, instead of the configured ones.
        Some(json) => Config::from_lookup(
            |name| {
                if name == ENV_RECIPES {
                    Some(format!("[{json}]"))
                } else {
                    std::env::var(name).ok()
                }
            },
            &steps,
        ),
        None => Config::from_env(&steps),
    };
    let config = match config {
        Ok(config) => config,
        Err(e) => return fail(format!("reprocess: {e}")),
    };
    // The notification S3 would have sent for the object.
    let body =
        mediaonce::backfill::created_notification(bucket, key, version_id.as_deref(), None, None);
    let mut message = aws_lambda_events::event::sqs::SqsMessage::default();
    message.message_id = Some(format!("reprocess-{}", std::process::id()));
    message.body = Some(body);
    let mut event = SqsEvent::default();
    event.records = vec![message];
    block_on(async {
        let app = match App::from_config(config).await {
            Ok(app) => Arc::new(app),
            Err(e) => return fail(format!("reprocess: {e}")),
        };
        let invocation = Invocation {
            request_id: format!("reprocess-{}", std::process::id()),
            deadline_ms: None,
            timeout_ms: None,
        };
        let report = handle_batch(app, event, invocation).await;
        let mut all_done = true;
        for job in report.jobs() {
            all_done &= matches!(job.outcome, Outcome::Ran | Outcome::Reused);
            match serde_json::to_string(job) {
                Ok(line) => println!("{line}"),
                Err(e) => return fail(format!("reprocess: {e}")),
            }
        }
        if let Some(error) = report.messages.iter().find_map(|m| m.error.clone()) {
            return fail(format!("reprocess: {error}"));
        }
        if report.jobs().next().is_none() {
            return fail(format!("reprocess: no recipe matches {location}"));
        }
        if all_done {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

fn gc(dry_run: bool) -> ExitCode {
    mediaonce::logging::init(std::io::stderr);
    block_on(async {
        let app = match App::from_env(StepRegistry::builtin()).await {
            Ok(app) => app,
            Err(e) => return fail(format!("gc: {e}")),
        };
        match app.collect_due(dry_run).await {
            Ok(sweep) => {
                // One JSON line per job, collected or failed; the failures
                // after the rest, so a script reads every outcome.
                let failures = sweep.failures.iter().map(|failure| {
                    serde_json::json!({
                        "job_key": failure.job_key,
                        "outcome": "failed",
                        "error": failure.error,
                    })
                });
                let lines = sweep
                    .collected
                    .iter()
                    .map(serde_json::to_value)
                    .chain(failures.map(Ok));
                for line in lines {
                    match line {
                        Ok(line) => println!("{line}"),
                        Err(e) => return fail(format!("gc: {e}")),
                    }
                }
                eprintln!(
                    "gc: {} job(s) {}, {} object(s), {} failed",
                    sweep.collected.len(),
                    if dry_run {
                        "due (dry run)"
                    } else {
                        "collected"
                    },
                    sweep.objects(),
                    sweep.failures.len()
                );
                if sweep.failures.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => fail(format!("gc: {e}")),
        }
    })
}

fn backfill(
    location: &str,
    queue_url: String,
    dry_run: bool,
    start_after: Option<String>,
) -> ExitCode {
    let Some(rest) = location.strip_prefix("s3://").filter(|r| !r.is_empty()) else {
        return fail(format!(
            "backfill: {location:?} is not an s3://bucket[/prefix] location"
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let options = mediaonce::backfill::BackfillOptions {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        queue_url,
        dry_run,
        start_after,
    };
    block_on(async {
        let sdk = mediaonce::aws::load_sdk_config().await;
        let s3 = mediaonce::aws::s3_client(&sdk);
        let sqs = mediaonce::aws::sqs_client(&sdk);
        let counts = Arc::new(mediaonce::backfill::BackfillProgress::default());
        let shown = progress::show_counts(counts.clone(), dry_run);
        let result = mediaonce::backfill::backfill(&s3, &sqs, &options, &counts).await;
        shown.stop();
        match result {
            Ok(summary) => {
                eprintln!(
                    "backfill: {} object(s) listed, {} message(s) sent{}{}",
                    summary.listed,
                    summary.sent,
                    if dry_run { " (dry run)" } else { "" },
                    summary
                        .last_key
                        .as_deref()
                        .map(|k| format!("; last key {k:?}"))
                        .unwrap_or_default()
                );
                match serde_json::to_string(&summary) {
                    Ok(json) => {
                        println!("{json}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(format!("backfill: {e}")),
                }
            }
            Err(e) => fail(format!("backfill: {e}")),
        }
    })
}

/// `s3://bucket/key` split, when it is one.
fn s3_object(location: &str) -> Option<(&str, &str)> {
    location
        .strip_prefix("s3://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(bucket, key)| !bucket.is_empty() && !key.is_empty())
}

fn upload(
    file: &std::path::Path,
    destination: &str,
    options: UploadOptions,
    quiet: bool,
) -> ExitCode {
    let Some((bucket, key)) = s3_object(destination) else {
        return fail(format!(
            "upload: {destination:?} is not an s3://bucket/key destination"
        ));
    };
    if options.single_put_max > SINGLE_PUT_MAX {
        return fail(format!(
            "upload: --multipart-threshold is at most {SINGLE_PUT_MAX} bytes (5 GiB, S3's largest single PUT)"
        ));
    }
    if options.part_size < MIN_PART_SIZE {
        return fail(format!(
            "upload: --part-size is at least {MIN_PART_SIZE} bytes (5 MiB, S3's smallest part)"
        ));
    }
    let total = match std::fs::metadata(file) {
        Ok(metadata) => metadata.len(),
        Err(e) => return fail(format!("upload: cannot read {}: {e}", file.display())),
    };
    block_on(async {
        let sdk = mediaonce::aws::load_sdk_config().await;
        let client = mediaonce::aws::s3_client(&sdk);
        let progress = Arc::new(mediaonce::upload::Progress::default());
        let shown = (!quiet).then(|| progress::show(progress.clone(), total));
        let result =
            mediaonce::upload::upload(&client, file, bucket, key, options, progress.clone()).await;
        if let Some(shown) = shown {
            match &result {
                Ok(_) => shown.finish(progress.sent(), total),
                Err(_) => shown.abandon(),
            }
        }
        match result {
            Ok(uploaded) => {
                println!("input_hash: {}", uploaded.input_hash);
                println!(
                    "version_id: {}",
                    uploaded.version_id.as_deref().unwrap_or("null")
                );
                match uploaded.parts {
                    None => println!(
                        "identity: s3-checksum (S3 verified and keeps the SHA-256: no worker reads the object to key it)"
                    ),
                    Some(parts) => println!(
                        "identity: computed ({parts} parts: S3's SHA-256 is composite, so a worker hashes the object once)"
                    ),
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("upload: {e}")),
        }
    })
}

/// Runs a future to completion on a new runtime.
fn block_on(work: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(work),
        Err(e) => fail(format!("cannot start the async runtime: {e}")),
    }
}
