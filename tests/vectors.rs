//! Every job key the reference TypeScript implementation produced must come
//! out of ours byte for byte: canonical form and key.

use std::path::PathBuf;

use mediaonce::key::{job_key, Recipe};
use serde::Deserialize;

#[derive(Deserialize)]
struct Vector {
    input_hash: String,
    recipe_json: String,
    canonical: String,
    job_key: String,
}

/// `tests/data/seed-job-keys.jsonl` (each line computed by the reference
/// TypeScript implementation: an input hash, a recipe as written, its
/// RFC 8785 form and its job key), unless `MEDIAONCE_VECTORS` names another
/// file.
pub fn vectors_path() -> PathBuf {
    std::env::var_os("MEDIAONCE_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/seed-job-keys.jsonl")
        })
}

fn vectors() -> Vec<Vector> {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading the reference vectors at {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("vector line {}: {e}", i + 1))
        })
        .collect()
}

#[test]
fn every_reference_vector_matches() {
    let vectors = vectors();
    assert!(vectors.len() >= 50, "only {} vectors", vectors.len());
    let mut failures = Vec::new();
    for (i, v) in vectors.iter().enumerate() {
        let recipe =
            Recipe::from_json(&v.recipe_json).unwrap_or_else(|e| panic!("vector {}: {e}", i + 1));
        let canonical = recipe.canonical_json();
        let key = job_key(&v.input_hash, &recipe.hash());
        if canonical != v.canonical || key != v.job_key {
            failures.push(format!(
                "vector {}: canonical {canonical}\n   expected {}\n   key {key} expected {}",
                i + 1,
                v.canonical,
                v.job_key
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn vectors_exercise_characters_outside_the_bmp() {
    // Their UTF-16 order (surrogates, 0xD800..) differs from code point order,
    // so a canonicaliser that sorts Rust strings would get these wrong.
    let astral = vectors()
        .iter()
        .filter(|v| {
            v.canonical.chars().any(|c| c as u32 > 0xFFFF) && v.canonical.contains('\u{FF61}')
        })
        .count();
    assert!(astral > 0, "no vector mixes astral and high-BMP keys");
}
