//! `mediaonce simulate`: the reference design's month through the real
//! handler on in-memory clients ([`mediaonce::simulate`]).

use std::process::ExitCode;

use clap::Args;
use mediaonce::simulate::{
    render, render_burst, simulate, simulate_burst, BurstOptions, BurstReport, Prices, SimOptions,
};

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
    /// A video-like pipeline instead of --recipes: probe, hls, poster, and
    /// thumbnails of the poster (a recipe chained to the poster's output).
    #[arg(long)]
    chained: bool,
    /// Share of contents that are long videos: adds an hls-package recipe
    /// whose long inputs split into 4 chunk jobs, joined by the last to
    /// finish (the split, chunk messages and hand-ons through the real
    /// handler; the steps only count).
    #[arg(long, default_value_t = 0.0)]
    long_videos: f64,
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
    /// Also a popular content uploaded this many times (each to its own
    /// key) beside the month, with DynamoDB's contention modelled; 0: none.
    #[arg(long, default_value_t = 0)]
    burst_uploads: u64,
    /// The burst's uploads a second.
    #[arg(long, default_value_t = BurstOptions::default().rate)]
    burst_rate: u64,
    /// How long the burst content's one job runs (ms).
    #[arg(long, default_value_t = BurstOptions::default().run_ms)]
    burst_run_ms: u64,
    /// How long a DynamoDB transaction holds its items (ms).
    #[arg(long, default_value_t = BurstOptions::default().transaction_ms)]
    burst_transaction_ms: u64,
    /// Also print the figures as one JSON object, the last line of stdout
    /// (the burst's under `burst`).
    #[arg(long)]
    json: bool,
}

/// The burst, on a runtime whose clock is paused: its waits are virtual.
fn run_burst(options: &BurstOptions) -> Result<BurstReport, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?
        .block_on(simulate_burst(options))
}

pub fn run(args: SimulateArgs) -> ExitCode {
    let shares = [
        ("--identical", args.identical),
        ("--s3-duplicates", args.s3_duplicates),
        ("--redeliveries", args.redeliveries),
        ("--lambda-retries", args.lambda_retries),
        ("--reprocess-clicks", args.reprocess_clicks),
        ("--crashes", args.crashes),
        ("--long-videos", args.long_videos),
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
        chained: args.chained,
        long_videos: args.long_videos,
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
    if args.burst_rate == 0 {
        return fail("simulate: --burst-rate must be at least 1".into());
    }
    let burst = (args.burst_uploads > 0).then_some(BurstOptions {
        uploads: args.burst_uploads,
        rate: args.burst_rate,
        run_ms: args.burst_run_ms,
        transaction_ms: args.burst_transaction_ms,
        seed: args.seed,
    });
    let burst = match burst.as_ref().map(run_burst).transpose() {
        Ok(burst) => burst,
        Err(e) => return fail(format!("simulate: the burst: {e}")),
    };
    runtime.block_on(async {
        match simulate(&options).await {
            Ok(report) => {
                print!("{}", render(&report));
                if let Some(burst) = &burst {
                    print!("{}", render_burst(burst));
                }
                if args.json {
                    let mut json = match serde_json::to_value(&report) {
                        Ok(json) => json,
                        Err(e) => return fail(format!("simulate: {e}")),
                    };
                    if let (Some(burst), Some(object)) = (&burst, json.as_object_mut()) {
                        match serde_json::to_value(burst) {
                            Ok(value) => object.insert("burst".into(), value),
                            Err(e) => return fail(format!("simulate: {e}")),
                        };
                    }
                    println!("{json}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("simulate: {e}")),
        }
    })
}
