//! `mediaonce simulate`: the reference design's month through the real
//! handler on in-memory clients ([`mediaonce::simulate`]).

use std::process::ExitCode;

use clap::Args;
use mediaonce::simulate::{render, simulate, Prices, SimOptions};

use super::fail;

#[derive(Args)]
pub struct SimulateArgs {
    /// Uploads in the month.
    #[arg(long, default_value_t = 100_000)]
    uploads: u64,
    /// Share of uploads byte-identical to an earlier one (drawn with a
    /// popularity skew: a content uploaded k times is k times as likely).
    #[arg(long, default_value_t = 0.09)]
    identical: f64,
    /// Share of notifications S3 sends twice (a new message id).
    #[arg(long, default_value_t = 0.03)]
    s3_duplicates: f64,
    /// Share of messages SQS delivers again while the first attempt still
    /// runs (the same message id).
    #[arg(long, default_value_t = 0.02)]
    redeliveries: f64,
    /// Share of batches Lambda invokes again, whole (new request id).
    #[arg(long, default_value_t = 0.01)]
    lambda_retries: f64,
    /// Share of uploads whose user presses "reprocess" (a new message).
    #[arg(long, default_value_t = 0.05)]
    reprocess_clicks: f64,
    /// Share of step runs whose worker dies before finishing (its lease
    /// must pass before a takeover).
    #[arg(long, default_value_t = 0.002)]
    crashes: f64,
    /// Recipes per upload.
    #[arg(long, default_value_t = 1)]
    recipes: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Lambda GB-seconds of one step run (a transcode: 1769 MB for ~30 s).
    #[arg(long, default_value_t = 50.0)]
    gb_seconds_per_run: f64,
    /// USD per Lambda GB-second (arm64).
    #[arg(long, default_value_t = Prices::default().lambda_gb_second)]
    price_gb_second: f64,
    /// USD per million DynamoDB write request units (on demand).
    #[arg(long, default_value_t = Prices::default().dynamodb_write_million)]
    price_write_million: f64,
    /// USD per million DynamoDB read request units (on demand).
    #[arg(long, default_value_t = Prices::default().dynamodb_read_million)]
    price_read_million: f64,
    /// USD per thousand S3 PUT requests.
    #[arg(long, default_value_t = Prices::default().s3_put_thousand)]
    price_s3_put_thousand: f64,
    /// USD per thousand S3 GET and HEAD requests.
    #[arg(long, default_value_t = Prices::default().s3_get_thousand)]
    price_s3_get_thousand: f64,
    /// Also print the figures as one JSON object, the last line of stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SimulateArgs) -> ExitCode {
    let shares = [
        ("--identical", args.identical),
        ("--s3-duplicates", args.s3_duplicates),
        ("--redeliveries", args.redeliveries),
        ("--lambda-retries", args.lambda_retries),
        ("--reprocess-clicks", args.reprocess_clicks),
        ("--crashes", args.crashes),
    ];
    for (flag, share) in shares {
        if !(0.0..=1.0).contains(&share) {
            return fail(format!(
                "simulate: {flag} must be between 0 and 1, not {share}"
            ));
        }
    }
    let options = SimOptions {
        uploads: args.uploads,
        identical: args.identical,
        s3_duplicates: args.s3_duplicates,
        redeliveries: args.redeliveries,
        lambda_retries: args.lambda_retries,
        reprocess_clicks: args.reprocess_clicks,
        crashes: args.crashes,
        recipes: args.recipes.max(1),
        seed: args.seed,
        gb_seconds_per_run: args.gb_seconds_per_run,
        price: Prices {
            lambda_gb_second: args.price_gb_second,
            dynamodb_write_million: args.price_write_million,
            dynamodb_read_million: args.price_read_million,
            s3_put_thousand: args.price_s3_put_thousand,
            s3_get_thousand: args.price_s3_get_thousand,
        },
    };
    // One thread: the same seed gives the same month (the message tasks
    // and the two invocations of a redelivery interleave in one order).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("simulate: cannot start the async runtime: {e}")),
    };
    runtime.block_on(async {
        match simulate(&options).await {
            Ok(report) => {
                print!("{}", render(&report));
                if args.json {
                    match serde_json::to_string(&report) {
                        Ok(json) => println!("{json}"),
                        Err(e) => return fail(format!("simulate: {e}")),
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("simulate: {e}")),
        }
    })
}
