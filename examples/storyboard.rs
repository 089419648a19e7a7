//! The `storyboard` step on a package in a local directory, for
//! `bench/storyboard.sh`:
//!
//!     storyboard PACKAGE_DIR OUT_DIR PARAMS_JSON
//!
//! Puts the package's files (as `examples/hls_package` writes them, with
//! its `package.json`) in an in-memory store, each with its SHA-256 as S3
//! keeps it, and runs the step on `package.json` exactly as a chained job
//! runs it: the segments it needs read beside the index and checked,
//! ffmpeg (`MEDIAONCE_FFMPEG`, PATH) decoding its pieces. Writes the
//! sheets and `storyboard.vtt` into OUT_DIR and prints one JSON line: the
//! interval the step chose (seconds), the cues, sheets and bytes written.

use std::path::Path;
use std::process::ExitCode;

use mediaonce::fingerprint::fingerprint;
use mediaonce::key::Recipe;
use mediaonce::lease::SystemClock;
use mediaonce::step::{JobInput, JobOutputs, Step, StepContext};
use mediaonce::steps::hls::index::PackageIndex;
use mediaonce::steps::storyboard::{Board, Storyboard};
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::{ObjectRef, ObjectStore};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [package, out, params] = args.as_slice() else {
        eprintln!("usage: storyboard PACKAGE_DIR OUT_DIR PARAMS_JSON");
        return ExitCode::from(2);
    };
    match run(Path::new(package), Path::new(out), params).await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("storyboard: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every file under `dir`, by its path relative to `root`.
fn files(root: &Path, dir: &Path, into: &mut Vec<(String, Vec<u8>)>) -> Result<(), String> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            files(root, &path, into)?;
        } else {
            let name = path.strip_prefix(root).expect("under root");
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            into.push((name.to_string_lossy().into_owned(), bytes));
        }
    }
    Ok(())
}

async fn run(package: &Path, out: &Path, params: &str) -> Result<String, String> {
    let objects = InMemoryObjects::new();
    let mut all = Vec::new();
    files(package, package, &mut all)?;
    for (name, bytes) in &all {
        objects.insert("out", &format!("pkg/{name}"), bytes, true);
    }
    let store = ObjectStore::new(objects.clone());
    let index = ObjectRef {
        bucket: "out".into(),
        key: "pkg/package.json".into(),
        version_id: None,
        if_match: None,
    };
    let head = store
        .head(&index)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the package has no package.json")?;
    let input = JobInput::new(store.clone(), head.clone(), fingerprint(&head));
    let params: serde_json::Value = serde_json::from_str(params).map_err(|e| e.to_string())?;
    let recipe = Recipe::from_value(&serde_json::json!({
        "step": "storyboard", "version": 1, "params": params
    }))
    .map_err(|e| e.to_string())?;
    let step = Storyboard::from_lookup(|name| std::env::var(name).ok());
    let parsed = step.params(&recipe.params)?;
    let index_bytes = objects
        .bytes("out", "pkg/package.json")
        .ok_or("the package has no package.json")?;
    let interval_ms = Board::plan(&PackageIndex::parse(&index_bytes)?, &parsed).interval_ms;
    let context = StepContext {
        job_key: "bench",
        recipe: &recipe,
        input: &input,
        deadline_ms: None,
        clock: &SystemClock,
    };
    let mut outputs = JobOutputs::new(store, "out", "board/");
    step.run(&parsed, &context, &mut outputs)
        .await
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let mut bytes = 0;
    let mut sheets = 0;
    for file in outputs.files() {
        let data = objects
            .bytes("out", &format!("board/{}", file.name))
            .ok_or("an output went missing")?;
        bytes += data.len();
        sheets += usize::from(!file.name.ends_with(".vtt"));
        std::fs::write(out.join(&file.name), &data).map_err(|e| e.to_string())?;
    }
    let vtt = std::fs::read_to_string(out.join("storyboard.vtt")).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "interval": interval_ms as f64 / 1000.0,
        "cues": vtt.matches(" --> ").count(),
        "sheets": sheets,
        "bytes": bytes,
    })
    .to_string())
}
