//! `mediaonce refs`: the references of objects uploaded before reference
//! items ([`mediaonce::App::rebuild_refs`], [`mediaonce::App::seal_refs`]).

use std::process::ExitCode;

use clap::Subcommand;
use mediaonce::steps::StepRegistry;
use mediaonce::App;

use super::{block_on, fail};

#[derive(Subcommand)]
pub enum RefsCommand {
    /// Record the references of every object version under
    /// s3://bucket[/prefix] to the done jobs of its matching recipes (those
    /// this configuration keys, else those it was keyed by before content
    /// identity), one reference item each. Prints one JSON line per version.
    /// Jobs done before reference items stay never collected until
    /// `mediaonce refs seal`. Running it twice changes nothing.
    Rebuild {
        /// Where the objects are: s3://bucket or s3://bucket/prefix.
        location: String,
        /// Say what would be referenced; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Declare the references complete, once every bucket and prefix the
    /// function's objects live in has been rebuilt: every job done before
    /// reference items is marked, and after the grace the sweep collects
    /// those no object references. Prints one JSON line per job.
    Seal {
        /// List the jobs; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn run(command: RefsCommand) -> ExitCode {
    mediaonce::logging::init(std::io::stderr);
    block_on(async {
        let app = match App::from_env(StepRegistry::builtin()).await {
            Ok(app) => app,
            Err(e) => return fail(format!("refs: {e}")),
        };
        match command {
            RefsCommand::Rebuild { location, dry_run } => rebuild(&app, &location, dry_run).await,
            RefsCommand::Seal { dry_run } => seal(&app, dry_run).await,
        }
    })
}

async fn rebuild(app: &App, location: &str, dry_run: bool) -> ExitCode {
    let Some(rest) = location.strip_prefix("s3://").filter(|r| !r.is_empty()) else {
        return fail(format!(
            "refs rebuild: {location:?} is not an s3://bucket[/prefix] location"
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let result = app
        .rebuild_refs(
            bucket,
            prefix,
            dry_run,
            |version| match serde_json::to_string(version) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("mediaonce: refs rebuild: {e}"),
            },
        )
        .await;
    match result {
        Ok(summary) => {
            eprintln!(
                "refs rebuild: {} version(s), {} reference(s){}, {} job(s) not done, {} error(s)",
                summary.versions,
                summary.references,
                if dry_run { " (dry run)" } else { "" },
                summary.not_done,
                summary.errors
            );
            if summary.errors == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(format!("refs rebuild: {e}")),
    }
}

async fn seal(app: &App, dry_run: bool) -> ExitCode {
    match app.seal_refs(dry_run).await {
        Ok(rows) => {
            for row in &rows {
                match serde_json::to_string(row) {
                    Ok(line) => println!("{line}"),
                    Err(e) => return fail(format!("refs seal: {e}")),
                }
            }
            let changed = rows.iter().filter(|r| !r.sealed).count();
            eprintln!(
                "refs seal: {} job(s) {}{}",
                rows.len() - changed,
                if dry_run {
                    "to seal (dry run)"
                } else {
                    "sealed"
                },
                if changed > 0 {
                    format!("; {changed} changed meanwhile: run it again")
                } else {
                    String::new()
                }
            );
            if changed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(format!("refs seal: {e}")),
    }
}
