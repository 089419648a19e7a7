//! I-frame playlists and caching headers, on the emulators: a package's
//! master lists an `EXT-X-I-FRAME-STREAM-INF` per rendition that passes
//! RFC 8216bis' attribute rules (this test's own reader) and video.js'
//! m3u8-parser; every byte range of every I-frame playlist, cut out of its
//! segment, is a transport stream that ffmpeg decodes to exactly one
//! picture, a keyframe, at the playlist's time; and every file of the job,
//! the manifest too, is served with the immutable `Cache-Control`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::media::{clock_clip, ffmpeg};
use common::ts::read_segment;
use common::{Options, Pipeline};
use mediaonce::handler::Outcome;
use mediaonce::step::IMMUTABLE;

/// One tag's attributes as RFC 8216bis 4.2 writes them, checked: names of
/// `[A-Z0-9-]`, none twice, each value a quoted string, a decimal
/// integer, a resolution, a decimal float or an enumerated string.
fn attributes(list: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = list;
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=').expect("NAME=value");
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-'),
            "attribute name {name:?} in {list}"
        );
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').expect("a closing quote");
            (format!("\"{}\"", &quoted[..end]), &quoted[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        assert!(
            out.insert(name.to_string(), value).is_none(),
            "{name} twice in {list}"
        );
        assert!(
            after.is_empty() || after.starts_with(','),
            "junk after {name}: {after}"
        );
        rest = after.strip_prefix(',').unwrap_or(after);
    }
    out
}

fn is_integer(value: &str) -> bool {
    !value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit())
}

fn is_quoted(value: &str) -> bool {
    value.len() >= 2 && value.starts_with('"') && value.ends_with('"')
}

fn is_resolution(value: &str) -> bool {
    value
        .split_once('x')
        .is_some_and(|(w, h)| is_integer(w) && is_integer(h))
}

fn is_float(value: &str) -> bool {
    value
        .split_once('.')
        .map_or(is_integer(value), |(i, f)| is_integer(i) && is_integer(f))
}

fn unquoted(value: &str) -> &str {
    value.trim_matches('"')
}

/// The master's variants and I-frame streams, each checked against RFC
/// 8216bis 4.4.6.2 and 4.4.6.3: `(attributes, URI)`.
#[allow(clippy::type_complexity)]
fn read_master(
    text: &str,
) -> (
    Vec<(BTreeMap<String, String>, String)>,
    Vec<(BTreeMap<String, String>, String)>,
) {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("#EXTM3U"));
    let (mut variants, mut iframes) = (Vec::new(), Vec::new());
    let mut pending = None;
    for line in lines {
        if let Some(list) = line.strip_prefix("#EXT-X-STREAM-INF:") {
            let a = attributes(list);
            assert!(!a.contains_key("URI"), "{line}");
            assert!(is_float(&a["FRAME-RATE"]), "{line}");
            pending = Some(a);
        } else if let Some(list) = line.strip_prefix("#EXT-X-I-FRAME-STREAM-INF:") {
            let a = attributes(list);
            for forbidden in ["FRAME-RATE", "AUDIO", "SUBTITLES", "CLOSED-CAPTIONS"] {
                assert!(!a.contains_key(forbidden), "{forbidden} in {line}");
            }
            assert!(is_quoted(&a["URI"]), "{line}");
            let uri = unquoted(&a["URI"]).to_string();
            iframes.push((a, uri));
        } else if !line.starts_with('#') && !line.is_empty() {
            let a = pending.take().expect("a URI line after EXT-X-STREAM-INF");
            variants.push((a, line.to_string()));
        }
    }
    for (a, _) in variants.iter().chain(&iframes) {
        assert!(is_integer(&a["BANDWIDTH"]), "{a:?}");
        assert!(is_integer(&a["AVERAGE-BANDWIDTH"]), "{a:?}");
        assert!(is_quoted(&a["CODECS"]), "{a:?}");
        assert!(is_resolution(&a["RESOLUTION"]), "{a:?}");
    }
    (variants, iframes)
}

/// An I-frame playlist's entries, checked: `(duration, length, offset,
/// URI)`, each `#EXTINF` followed by its `#EXT-X-BYTERANGE`.
fn read_iframe_playlist(text: &str) -> Vec<(f64, u64, u64, String)> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("#EXTM3U"));
    assert!(text.contains("\n#EXT-X-I-FRAMES-ONLY\n"), "{text}");
    assert!(text.ends_with("#EXT-X-ENDLIST\n"), "{text}");
    let version: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-VERSION:"))
        .expect("a version")
        .parse()
        .unwrap();
    assert!(version >= 4, "EXT-X-BYTERANGE needs version 4: {text}");
    let target: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-TARGETDURATION:"))
        .expect("a target duration")
        .parse()
        .unwrap();
    let mut entries = Vec::new();
    let (mut duration, mut range) = (None, None);
    for line in lines {
        if let Some(v) = line.strip_prefix("#EXTINF:") {
            duration = Some(v.trim_end_matches(',').parse::<f64>().unwrap());
        } else if let Some(v) = line.strip_prefix("#EXT-X-BYTERANGE:") {
            assert!(duration.is_some(), "a byte range before its #EXTINF");
            let (length, offset) = v.split_once('@').expect("an explicit offset");
            range = Some((length.parse().unwrap(), offset.parse().unwrap()));
        } else if !line.starts_with('#') && !line.is_empty() {
            let d = duration.take().expect("an entry without #EXTINF");
            assert!(d.round() <= target, "{d} s over the target {target}");
            let (length, offset) = range.take().expect("an entry without its byte range");
            entries.push((d, length, offset, line.to_string()));
        }
    }
    entries
}

/// Whether `range` bytes of `segment` end exactly where its first video
/// access unit does: the range's last packet is video, and the next
/// video packet after it starts a new PES (a range a packet short or
/// long is neither). The video PID is the one whose PES starts carry
/// stream id 0xE0.
fn ends_with_first_unit(segment: &[u8], range: usize) -> bool {
    let packets: Vec<&[u8]> = segment.chunks(188).collect();
    let pid = |p: &[u8]| (u16::from(p[1] & 0x1F) << 8) | u16::from(p[2]);
    let starts = |p: &[u8]| p[1] & 0x40 != 0;
    fn payload(p: &[u8]) -> &[u8] {
        let at = if p[3] & 0x20 != 0 {
            5 + p[4] as usize
        } else {
            4
        };
        &p[at.min(188)..]
    }
    let Some(video) = packets
        .iter()
        .find(|p| starts(p) && payload(p).starts_with(&[0, 0, 1, 0xE0]))
        .map(|p| pid(p))
    else {
        return false;
    };
    let last_inside = packets[..range / 188]
        .last()
        .is_some_and(|p| pid(p) == video);
    let next_video = packets[range / 188..].iter().find(|p| pid(p) == video);
    last_inside && next_video.is_none_or(|p| starts(p))
}

/// video.js' m3u8-parser's reading of `path`: its manifest, and no
/// warning.
fn m3u8_parser(path: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/m3u8.mjs");
    let out = Command::new("node")
        .arg(&script)
        .arg(path)
        .output()
        .expect("node (scripts/reference_tools.sh installs it and tests/js)");
    assert!(
        out.status.success(),
        "m3u8-parser on {}: {} (run scripts/reference_tools.sh)",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        parsed["warnings"],
        serde_json::json!([]),
        "{}",
        path.display()
    );
    parsed["manifest"].clone()
}

/// The pictures ffmpeg decodes from a transport stream: `(pts_time,
/// is a keyframe)` each, from its `showinfo` filter.
fn decoded_pictures(ts: &Path) -> Vec<(f64, bool)> {
    let out = Command::new(ffmpeg())
        // The static ffmpeg's MPEG-TS demuxer: see common::hls::play.
        .env("GCONV_PATH", "/nonexistent")
        .args(["-hide_banner", "-nostdin", "-loglevel", "info", "-copyts"])
        .args(["-f", "mpegts", "-i"])
        .arg(ts)
        .args(["-map", "0:v:0", "-vf", "showinfo", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    log.lines()
        .filter(|l| l.contains("Parsed_showinfo") && l.contains(" n:"))
        .map(|l| {
            let field = |name: &str| {
                let at = l.find(name).unwrap_or_else(|| panic!("{name} in {l}")) + name.len();
                l[at..].split_whitespace().next().unwrap().to_string()
            };
            (
                field("pts_time:").parse().unwrap(),
                field("iskey:") == "1" && field("type:") == "I",
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_lists_iframe_playlists_whose_ranges_are_one_keyframe_each() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[360,240],"segment":2,"preset":"ultrafast","min_seconds":5}}]"#
                .into(),
        ),
        separate_output_bucket: true,
        ..Options::default()
    })
    .await;
    let bytes = std::fs::read(clock_clip()).unwrap();
    p.put("clips/clock.mp4", &bytes, true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap().clone();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let prefix = format!("derived/{}/", job.job_key);
    let scratch = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("iframes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let mut files = BTreeMap::new();
    for key in p.output_keys(&prefix).await {
        let name = key[prefix.len()..].to_string();
        let bytes = p.output(&key).await;
        let path = scratch.join(name.replace('/', "_"));
        std::fs::write(&path, &bytes).unwrap();
        files.insert(name, (bytes, path));
    }

    let master = String::from_utf8(files["master.m3u8"].0.clone()).unwrap();
    let (variants, iframes) = read_master(&master);
    let uris: Vec<&str> = iframes.iter().map(|(_, uri)| uri.as_str()).collect();
    assert_eq!(uris, ["360p/iframes.m3u8", "240p/iframes.m3u8"], "{master}");
    let parsed = m3u8_parser(&files["master.m3u8"].1);
    let parsed_uris: Vec<&str> = parsed["iFramePlaylists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["uri"].as_str().unwrap())
        .collect();
    assert_eq!(parsed_uris, uris);
    assert_eq!(parsed["playlists"].as_array().unwrap().len(), 2);

    for ((iframe, uri), (variant, _)) in iframes.iter().zip(&variants) {
        // The same picture as its variant, without the sound.
        assert_eq!(iframe["RESOLUTION"], variant["RESOLUTION"]);
        let video_codec = unquoted(&variant["CODECS"]).split(',').next().unwrap();
        assert_eq!(unquoted(&iframe["CODECS"]), video_codec, "{master}");
        let rendition = uri.trim_end_matches("/iframes.m3u8");
        let (text, path) = &files[uri.as_str()];
        let entries = read_iframe_playlist(std::str::from_utf8(text).unwrap());
        let media = std::str::from_utf8(&files[&format!("{rendition}/index.m3u8")].0).unwrap();
        assert_eq!(entries.len(), 4, "{media}");
        assert_eq!(entries.len(), media.matches("#EXTINF").count());

        let parsed = m3u8_parser(path);
        assert_eq!(parsed["iFramesOnly"], true);
        let segments = parsed["segments"].as_array().unwrap();
        assert_eq!(segments.len(), entries.len());

        let mut playlist_time = 0.0;
        let mut first_pts = None;
        let (mut range_bytes, mut seconds) = (0u64, 0f64);
        for (i, (duration, length, offset, name)) in entries.iter().enumerate() {
            assert_eq!(segments[i]["byterange"]["length"], *length);
            assert_eq!(segments[i]["byterange"]["offset"], *offset);
            assert_eq!(segments[i]["uri"], name.as_str());
            let segment = &files[&format!("{rendition}/{name}")].0;
            assert_eq!(*offset, 0, "from the segment's PAT");
            assert!(
                *length < segment.len() as u64 && length % 188 == 0,
                "{name}: {length} of {} bytes",
                segment.len()
            );
            assert!(
                ends_with_first_unit(segment, *length as usize),
                "{name}: {length} bytes is not its first access unit's end"
            );
            assert!(!ends_with_first_unit(segment, *length as usize - 188));
            let cut = scratch.join(format!("{rendition}-range-{i}.ts"));
            std::fs::write(&cut, &segment[..*length as usize]).unwrap();
            let pictures = decoded_pictures(&cut);
            assert_eq!(pictures.len(), 1, "{name}'s range: {pictures:?}");
            let (pts, keyframe) = pictures[0];
            assert!(keyframe, "{name}'s range decodes to a non-key picture");
            // At the playlist's time: the segment's first frame.
            let whole = read_segment(segment);
            assert_eq!(
                (pts * 90_000.0).round() as u64,
                whole.video_pts[0],
                "{name}"
            );
            let first = *first_pts.get_or_insert(pts);
            assert!(
                (pts - first - playlist_time).abs() < 0.001,
                "{name}: picture at {pts} s, playlist at {playlist_time} s"
            );
            playlist_time += duration;
            range_bytes += length;
            seconds += duration;
        }
        let average: f64 = iframe["AVERAGE-BANDWIDTH"].parse().unwrap();
        assert!(
            (average - range_bytes as f64 * 8.0 / seconds).abs() <= 1.0,
            "{average} for {range_bytes} bytes in {seconds} s"
        );
        let peak: u64 = iframe["BANDWIDTH"].parse().unwrap();
        assert!(peak as f64 >= average - 1.0);
    }

    // Every file of the job, and the manifest, is served immutable: what
    // a browser and CloudFront cache for a year.
    assert!(files.contains_key("_manifest.json"));
    for key in p.output_keys(&prefix).await {
        let head =
            p.s3.head_object()
                .bucket(&p.output_bucket)
                .key(&key)
                .send()
                .await
                .unwrap();
        assert_eq!(head.cache_control(), Some(IMMUTABLE), "{key}");
    }
}
