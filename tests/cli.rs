//! The command line run as a user would: `mediaonce key`, `mediaonce simulate`.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const HASH: &str = "d3ed8df4538a400c1f7ccc64fe52aa6daeb113ee220407cd17e35adeb810e3b1";

fn mediaonce(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mediaonce runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn key_prints_the_reference_key() {
    let out = mediaonce(
        &[
            "key",
            "--input-hash",
            HASH,
            "--recipe",
            r#"{"params":{"｡half":"h264","tab\tkey":"🎬 clap","height":[]},"version":3,"step":"captions"}"#,
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "43f8b3439bf791d05d1956e6568c1a7fee92da46c564f1ff12509e3e5dcb23ed\n"
    );
}

#[test]
fn bad_recipes_exit_2_naming_the_problem() {
    let cases = [
        ("[]", "must be a JSON object"),
        ("{", "not valid JSON"),
        (r#"{"version":1,"params":{}}"#, "no \"step\""),
        (
            r#"{"step":"probe","version":0,"params":{}}"#,
            "positive integer",
        ),
        (
            r#"{"step":"probe","version":1,"params":[]}"#,
            "\"params\" must be a JSON object",
        ),
    ];
    for (recipe, needle) in cases {
        let out = mediaonce(&["key", "--input-hash", HASH, "--recipe", recipe], "");
        assert_eq!(out.status.code(), Some(2), "{recipe}");
        assert!(
            text(&out.stderr).contains(needle),
            "{recipe}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn jsonl_prints_one_key_per_line_in_order() {
    let vectors = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/seed-job-keys.jsonl"),
    )
    .expect("reference vectors");
    let expected: Vec<String> = vectors
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["job_key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let out = mediaonce(&["key", "--jsonl"], &vectors);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(got, expected);
}

#[test]
fn jsonl_names_the_bad_line() {
    let input = format!(
        "{{\"input_hash\":\"{HASH}\",\"recipe_json\":\"{{\\\"step\\\":\\\"probe\\\",\\\"version\\\":1,\\\"params\\\":{{}}}}\"}}\n\
         {{\"input_hash\":\"{HASH}\",\"recipe_json\":\"{{\\\"step\\\":\\\"probe\\\",\\\"version\\\":-1,\\\"params\\\":{{}}}}\"}}\n"
    );
    let out = mediaonce(&["key", "--jsonl"], &input);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "the good line's key is printed"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("positive integer"),
        "{err}"
    );
}

#[test]
fn empty_input_hash_exits_2() {
    let out = mediaonce(
        &[
            "key",
            "--input-hash",
            "",
            "--recipe",
            r#"{"step":"probe","version":1,"params":{}}"#,
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("input hash is empty"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn simulate_prints_the_month_and_its_json_last() {
    let out = mediaonce(
        &[
            "simulate",
            "--uploads",
            "2000",
            "--crashes",
            "0.01",
            "--json",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("runs keyed by message id"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON last");
    for key in [
        "uploads",
        "deliveries",
        "runs_by_message_id",
        "runs_by_content",
        "unique_jobs",
        "runs_cut_short_by_crashes",
        "dynamodb_calls",
    ] {
        assert!(report[key].is_u64(), "{key}: {report}");
    }
    let n = |key: &str| report[key].as_u64().unwrap();
    assert_eq!(n("uploads"), 2000);
    assert_eq!(
        n("runs_by_content"),
        n("unique_jobs") + n("runs_cut_short_by_crashes")
    );
    assert!(n("runs_by_message_id") > n("runs_by_content"));

    let bad = mediaonce(&["simulate", "--identical", "1.5"], "");
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("--identical must be between 0 and 1"));
}

#[test]
fn simulate_adds_a_popular_content_burst_under_burst() {
    let out = mediaonce(
        &[
            "simulate",
            "--uploads",
            "200",
            "--burst-uploads",
            "300",
            "--burst-rate",
            "300",
            "--json",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Burst: 300 uploads of one content"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON last");
    let burst = &report["burst"];
    for key in [
        "dead_lettered",
        "conflicts_retried",
        "throttles_retried",
        "refs_mismatches",
        "uncounted_versions",
        "step_runs",
    ] {
        assert!(burst[key].is_u64(), "{key}: {burst}");
    }
    assert_eq!(burst["uploads"], 300);
    assert_eq!(burst["step_runs"], 1);
    assert!(burst["write_units_per_upload"].as_f64().unwrap() > 0.0);

    let bad = mediaonce(
        &["simulate", "--burst-uploads", "1", "--burst-rate", "0"],
        "",
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("--burst-rate must be at least 1"));
}
