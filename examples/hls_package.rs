//! mediaonce's HLS encode on a local file, for `bench/hls_long.sh`:
//!
//!     hls_package INPUT OUT_DIR PARAMS_JSON (whole | split WORKERS | reads)
//!
//! Reads the input's `moov` and encodes it exactly as the `hls-package`
//! step does, without S3 or DynamoDB: `whole` as one ffmpeg run over the
//! whole input, `split` as the recipe's chunks (each its own run, as a
//! chunk job runs it), `WORKERS` of them at once, each in a directory of
//! its own (as each chunk job has its own `/tmp`), their segments then
//! gathered into one package and the playlists written from them. Prints
//! one JSON line: the input's seconds, the chunks, and each run's wall
//! time. `reads` encodes nothing and prints the bytes each chunk's partial
//! copy of the input would hold (`steps::hls::sparse`). ffmpeg is found
//! as the step finds it (`MEDIAONCE_FFMPEG`, PATH).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use mediaonce::steps::ffmpeg::ffmpeg_from;
use mediaonce::steps::hls::{
    encode_span, sparse, write_playlists, Encoding, HlsParams, Rendition, Span,
};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 4 && args[3] == "reads" {
        return report(reads(&args[0], &args[2]).await);
    }
    let workers = match (args.get(3).map(String::as_str), args.get(4)) {
        (Some("whole"), None) => None,
        (Some("split"), Some(n)) => match n.parse::<usize>() {
            Ok(n) if n > 0 => Some(n),
            _ => return usage(),
        },
        _ => return usage(),
    };
    report(run(&args[0], Path::new(&args[1]), &args[2], workers).await)
}

/// Prints a summary on stdout, or the error on stderr.
fn report(result: Result<serde_json::Value, String>) -> ExitCode {
    match result {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("hls_package: {err}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: hls_package INPUT OUT_DIR PARAMS_JSON (whole | split WORKERS | reads)");
    ExitCode::from(2)
}

/// The input's movie and encoding under `params`.
async fn open(
    input: &str,
    params: &str,
) -> Result<(std::fs::File, u64, HlsParams, Encoding), String> {
    let value: serde_json::Value =
        serde_json::from_str(params).map_err(|e| format!("params: {e}"))?;
    let params = HlsParams::from_params(value.as_object().ok_or("params: not an object")?)?;
    let file = std::fs::File::open(input).map_err(|e| format!("{input}: {e}"))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let movie = mediaonce::bmff::read_movie(&file, size, &[])
        .await
        .map_err(|e| format!("{input}: {e}"))?;
    let encoding = Encoding::of(&movie, &params).map_err(|e| e.to_string())?;
    Ok((file, size, params, encoding))
}

/// The bytes of each chunk's partial copy.
async fn reads(input: &str, params: &str) -> Result<serde_json::Value, String> {
    let (file, size, params, encoding) = open(input, params).await?;
    let boxes = mediaonce::bmff::locate_movie(&file, size, &[])
        .await
        .map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    for span in encoding.spans(&params) {
        let copy = sparse::plan_copy(&boxes, size, &span).map_err(|e| e.to_string())?;
        bytes.push(copy.bytes);
    }
    Ok(serde_json::json!({"input_bytes": size, "chunk_bytes": bytes}))
}

async fn run(
    input: &str,
    out: &Path,
    params: &str,
    workers: Option<usize>,
) -> Result<serde_json::Value, String> {
    let (_, _, params, encoding) = open(input, params).await?;
    let spans = match workers {
        None => vec![Span::whole(encoding.plan_ms, params.segment_ms())],
        Some(_) => encoding.spans(&params),
    };
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let out = std::fs::canonicalize(out).map_err(|e| e.to_string())?;
    let package = out.join("package");
    std::fs::create_dir_all(&package).map_err(|e| e.to_string())?;
    let ffmpeg = ffmpeg_from(|name| std::env::var(name).ok());
    // ffmpeg runs in the chunk's directory: the input by its full path.
    let input = std::fs::canonicalize(input).map_err(|e| format!("{input}: {e}"))?;
    let permits = Arc::new(tokio::sync::Semaphore::new(workers.unwrap_or(1)));
    let started = Instant::now();
    let mut runs = Vec::new();
    for span in spans.iter().cloned() {
        let (ffmpeg, params, encoding, input) = (
            ffmpeg.clone(),
            params.clone(),
            encoding.clone(),
            input.clone(),
        );
        let dir = out.join(format!("chunk-{}", span.index)).join("out");
        let permits = permits.clone();
        runs.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.expect("open");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let began = Instant::now();
            encode_span(
                &ffmpeg, &params, &encoding, &span, &input, &dir, None, "bench",
            )
            .await
            .map_err(|e| format!("span {}: {e}", span.index))?;
            Ok::<_, String>((dir, began.elapsed().as_secs_f64()))
        }));
    }
    let mut seconds = Vec::new();
    for run in runs {
        let (dir, took) = run.await.map_err(|e| e.to_string())??;
        gather(&dir, &package, &encoding.renditions)?;
        seconds.push((took * 1000.0).round() / 1000.0);
    }
    let names = encoding.renditions.iter().map(Rendition::name).collect();
    write_playlists(&package, names, params.iframes).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "input_seconds": encoding.plan_ms as f64 / 1000.0,
        "chunks": spans.len(),
        "wall_seconds": started.elapsed().as_secs_f64(),
        "chunk_seconds": seconds,
    }))
}

/// Moves a run's segments into the package.
fn gather(dir: &Path, package: &Path, renditions: &[Rendition]) -> Result<(), String> {
    for rendition in renditions {
        let from = dir.join(rendition.name());
        let to = package.join(rendition.name());
        std::fs::create_dir_all(&to).map_err(|e| e.to_string())?;
        for entry in std::fs::read_dir(&from).map_err(|e| format!("{}: {e}", from.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|e| e == "ts") {
                let name = path.file_name().expect("a file");
                std::fs::rename(&path, to.join(name)).map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}
