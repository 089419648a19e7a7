//! mediaonce's thumbnail code on a local file, for `bench/thumbnail.sh`:
//!
//!     thumbnail INPUT WIDTH OUTPUT [jpeg|png|webp] [QUALITY] [progressive]
//!
//! Decodes, honours EXIF orientation, resizes and encodes exactly as the
//! `thumbnail` step does, without S3 or DynamoDB.

use std::process::ExitCode;

use mediaonce::config::DEFAULT_MAX_PIXELS;
use mediaonce::steps::thumbnail::{decode_for, encode, render, ThumbnailParams};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: thumbnail INPUT WIDTH OUTPUT [jpeg|png|webp] [QUALITY] [progressive]");
        return ExitCode::from(2);
    }
    let (input, width, output) = (&args[0], &args[1], &args[2]);
    let format = args.get(3).map(String::as_str).unwrap_or("jpeg");
    let mut params =
        serde_json::json!({"widths": [width.parse::<u64>().unwrap_or(0)], "format": format});
    // PNG has no quality; the lossy formats default to the step's 82.
    if let Some(quality) = args.get(4) {
        params["quality"] = quality.parse::<u64>().unwrap_or(0).into();
    }
    if let Some(flag) = args.get(5) {
        params["progressive"] = (flag == "progressive").into();
    }
    let params = match ThumbnailParams::parse(params.as_object().expect("an object")) {
        Ok(params) => params,
        Err(problem) => {
            eprintln!("thumbnail: {problem}");
            return ExitCode::from(2);
        }
    };
    let result = std::fs::read(input)
        .map_err(|e| format!("cannot read {input}: {e}"))
        .and_then(|bytes| {
            decode_for(&bytes, DEFAULT_MAX_PIXELS, &params).map_err(|e| e.to_string())
        })
        .and_then(|(image, plans)| {
            let resized = render(&image, &plans[0], params.format).map_err(|e| e.to_string())?;
            encode(&resized, params.encoding()).map_err(|e| e.to_string())
        })
        .and_then(|bytes| {
            std::fs::write(output, bytes).map_err(|e| format!("cannot write {output}: {e}"))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("thumbnail: {problem}");
            ExitCode::FAILURE
        }
    }
}
