//! A browser plays what mediaonce serves, as README.md shows it: the
//! README's own player snippet ("Serving to players", read from the file),
//! on a page of its own origin, plays an `hls-package` with hls.js in
//! Debian's headless Chromium, reading the output bucket on LocalStack
//! with the template's CORS rule, and shows the storyboard's tile for the
//! time under the pointer on its seek bar. From an origin the rule does
//! not name, the browser refuses the package: what a new user met before
//! the rule (issue 40).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use aws_sdk_s3::types::{CorsConfiguration, CorsRule};
use common::media::clock_clip;
use common::{Options, Pipeline};
use mediaonce::handler::{JobReport, Outcome};

/// The README's player page: its one `html` block after "Serving to
/// players".
fn readme_player() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("### Serving to players")
        .nth(1)
        .expect("README.md has \"Serving to players\"");
    let block = section
        .split("```html\n")
        .nth(1)
        .expect("a player snippet")
        .split("```")
        .next()
        .unwrap();
    block.to_string()
}

/// Serves `index.html` (`page`) and `hls.min.js` (tests/js's hls.js) on
/// 127.0.0.1, from a thread, until the test ends: the port.
fn serve(page: String) -> u16 {
    let hls = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/node_modules/hls.js/dist/hls.min.js"),
    )
    .expect("hls.js (scripts/reference_tools.sh installs tests/js)");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let (status, kind, body) = match path {
                "/index.html" => ("200 OK", "text/html", page.as_bytes().to_vec()),
                "/hls.min.js" => ("200 OK", "text/javascript", hls.clone()),
                _ => ("404 Not Found", "text/plain", b"not found".to_vec()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    port
}

/// What a viewer of `url` gets, hovering the seek bar at `fraction` of
/// its width (tests/js/player.mjs).
fn watch(url: &str, fraction: f64) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/player.mjs");
    let out = Command::new("node")
        .arg(&script)
        .arg(url)
        .arg(fraction.to_string())
        .output()
        .expect("node (scripts/reference_tools.sh installs it, Chromium and tests/js)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_plays_the_package_and_shows_the_storyboard_from_an_allowed_origin() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"name":"hls","step":"hls-package","version":1,"params":{"ladder":[240],"segment":2,"preset":"ultrafast","min_seconds":5}},
                {"name":"storyboard","step":"storyboard","version":1,"params":{"interval":1},"input":{"recipe":"hls","file":"package.json"}}]"#
                .into(),
        ),
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    p.put(
        "clips/clock.mp4",
        &std::fs::read(clock_clip()).unwrap(),
        true,
    )
    .await;
    let report = p.handle(p.receive(1).await).await;
    let jobs: Vec<&JobReport> = report.jobs().collect();
    assert_eq!(jobs.len(), 2, "{report:?}");
    assert!(jobs.iter().all(|j| j.outcome == Outcome::Ran), "{report:?}");
    let (package, board) = (&jobs[0].job_key, &jobs[1].job_key);

    // The page, on an origin of its own; the README's snippet reading the
    // output bucket (path-style, on LocalStack) and the two jobs.
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let outputs = format!("{endpoint}/{}/derived/", p.output_bucket);
    let snippet = readme_player();
    let placeholder =
        r#"const outputs = "https://d111111abcdef8.cloudfront.net/derived/"; // OutputsUrl"#;
    assert!(snippet.contains(placeholder), "{snippet}");
    let page = snippet
        .replace(
            placeholder,
            &format!(
                "const outputs = \"{outputs}\";\n  \
                 const HLS_JOB_KEY = \"{package}\", STORYBOARD_JOB_KEY = \"{board}\";"
            ),
        )
        .replace(
            r#"<script src="https://cdn.jsdelivr.net/npm/hls.js@1"></script>"#,
            r#"<script src="hls.min.js"></script>"#,
        );
    let port = serve(format!(
        "<!doctype html><html><body>\n{page}</body></html>\n"
    ));
    let origin = format!("http://127.0.0.1:{port}");

    // The output bucket's CORS rule as template.yaml writes it, with the
    // page's origin as `CorsAllowedOrigins` (scripts/template_serving.py
    // holds the template to this rule).
    let rule = CorsRule::builder()
        .set_allowed_methods(Some(vec!["GET".into(), "HEAD".into()]))
        .set_allowed_origins(Some(vec![origin.clone()]))
        .set_allowed_headers(Some(vec!["Range".into()]))
        .set_expose_headers(Some(vec![
            "Content-Length".into(),
            "Content-Range".into(),
            "ETag".into(),
        ]))
        .max_age_seconds(86_400)
        .build()
        .unwrap();
    p.s3.put_bucket_cors()
        .bucket(&p.output_bucket)
        .cors_configuration(
            CorsConfiguration::builder()
                .cors_rules(rule)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();

    // Half way along the bar: 3.5 s of the 7 s clip, the fourth cue,
    // the fourth 256x144 tile of the sheet's first row.
    let seen = watch(&format!("{origin}/index.html"), 0.5);
    let played = seen["played"].as_f64().unwrap();
    assert!(played >= 2.0, "played {played} s: {seen}");
    let duration = seen["duration"].as_f64().unwrap();
    assert!((duration - 7.0).abs() < 0.1, "{seen}");
    assert_eq!(seen["cues"], 7, "{seen}");
    let preview = &seen["preview"];
    assert_eq!(preview["hidden"], false, "{seen}");
    assert_eq!(
        (&preview["width"], &preview["height"]),
        (&"256px".into(), &"144px".into())
    );
    let background = preview["background"].as_str().unwrap();
    assert!(
        background.contains(&format!("{outputs}{board}/storyboard-0.jpg"))
            && background.ends_with("-768px 0px"),
        "{background}"
    );

    // Another origin: the browser refuses the package.
    let elsewhere = watch(&format!("http://localhost:{port}/index.html"), 0.5);
    assert_eq!(elsewhere["played"], -1, "{elsewhere}");
    let errors = elsewhere["errors"].to_string();
    assert!(errors.contains("CORS policy"), "{errors}");
}
