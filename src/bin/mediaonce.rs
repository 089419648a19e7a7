//! The mediaonce command line: job keys, and the handler run locally.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use clap::{Parser, Subcommand};
use mediaonce::handler::{handle_batch, App, Invocation};
use mediaonce::key::{check_input_hash, job_key, Recipe};
use mediaonce::step::StepRegistry;

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
    /// Run the handler in-process on an SQS event JSON file; print the
    /// SqsBatchResponse JSON as the last line of stdout.
    Invoke {
        /// The SQS event file, as Lambda would deliver it.
        #[arg(long)]
        event: PathBuf,
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
        Command::Invoke { event } => invoke(&event),
    }
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

fn invoke(path: &PathBuf) -> ExitCode {
    // Logs go to stderr; stdout carries the response.
    lambda_runtime::tracing::init_default_subscriber_with_writer(std::io::stderr);
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("mediaonce invoke: cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let event: SqsEvent = match serde_json::from_str(&text) {
        Ok(event) => event,
        Err(e) => {
            eprintln!(
                "mediaonce invoke: {} is not an SQS event: {e}",
                path.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mediaonce invoke: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let app = match App::from_env(StepRegistry::builtin()).await {
            Ok(app) => Arc::new(app),
            Err(e) => {
                eprintln!("mediaonce invoke: {e}");
                return ExitCode::FAILURE;
            }
        };
        let invocation = Invocation {
            request_id: format!("cli-{}", std::process::id()),
            deadline_ms: None,
        };
        let report = handle_batch(app, event, invocation).await;
        match serde_json::to_string(&report.response()) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mediaonce invoke: cannot print the response: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
