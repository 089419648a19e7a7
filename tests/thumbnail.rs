//! The thumbnail step end to end on the emulators.

mod common;

use std::io::Cursor;

use common::{Options, Pipeline};
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use mediaonce::handler::Outcome;
use mediaonce::step::Manifest;

fn png(width: u32, height: u32) -> Vec<u8> {
    let image = image::RgbaImage::from_fn(width, height, |x, y| {
        image::Rgba([(x * 4) as u8, (y * 5) as u8, 90, 255])
    });
    let mut out = Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[tokio::test]
async fn thumbnails_land_in_the_job_prefix_listed_in_the_manifest() {
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"thumbnail","version":1,"params":{"widths":[16,32],"format":"webp","quality":75}}]"#.into(),
        ),
        ..Options::default()
    })
    .await;
    p.put("photos/a.png", &png(64, 48), true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let key = &job.job_key;
    let manifest: Manifest =
        serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await).unwrap();
    let names: Vec<&str> = manifest.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["thumb-16.webp", "thumb-32.webp"]);
    for (name, size) in [("thumb-16.webp", (16, 12)), ("thumb-32.webp", (32, 24))] {
        let bytes = p.output(&format!("derived/{key}/{name}")).await;
        let decoded =
            image::load_from_memory_with_format(&bytes, image::ImageFormat::WebP).unwrap();
        assert_eq!((decoded.width(), decoded.height()), size, "{name}");
    }
}

#[tokio::test]
async fn a_bomb_fails_its_job_with_a_clear_error() {
    let p = Pipeline::new(Options {
        recipes: Some(r#"[{"step":"thumbnail","version":1,"params":{"widths":[320]}}]"#.into()),
        vars: vec![("MEDIAONCE_MAX_PIXELS", "1000".into())],
        ..Options::default()
    })
    .await;
    p.put("big.png", &png(40, 30), true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap().clone();
    // A bomb stays a bomb: unprocessable at once, not retried, and its
    // message acknowledged (a user's bad file is no operational fault).
    assert_eq!(job.outcome, Outcome::Unprocessable);
    assert!(
        job.reason
            .as_deref()
            .unwrap()
            .contains("over MEDIAONCE_MAX_PIXELS = 1000"),
        "{job:?}"
    );
    assert!(report.response().batch_item_failures.is_empty());
    assert!(p
        .output_keys(&format!("derived/{}/", job.job_key))
        .await
        .is_empty());
    let row = p.row(&job.job_key).await.unwrap();
    assert_eq!((row.failures, row.permanent), (1, true), "{row:?}");
    // Uploaded again: unprocessable by the row, the step does not run again.
    p.put("big copy.png", &png(40, 30), true).await;
    let again = p.handle(p.receive(1).await).await;
    let again = again.jobs().next().unwrap();
    assert_eq!((again.outcome, again.attempt), (Outcome::Unprocessable, 1));
    assert!(
        again
            .reason
            .as_deref()
            .unwrap()
            .starts_with("failed permanently"),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_heic_upload_gets_its_thumbnails_through_ffmpeg() {
    use common::heif::{heif, tile, Codec, Display};
    common::media::ffmpeg();
    let p = Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"thumbnail","version":1,"params":{"widths":[32],"format":"png"}}]"#.into(),
        ),
        ..Options::default()
    })
    .await;
    // A phone's layout: a grid of tiles (red, lime / blue, yellow) cut to
    // 100 × 90, turned a quarter anticlockwise.
    let tiles: Vec<Vec<u8>> = ["red", "lime", "blue", "yellow"]
        .iter()
        .map(|c| tile(Codec::Hevc, c, 64))
        .collect();
    let display = Display {
        rotate: 1,
        ..Display::default()
    };
    let file = heif(Codec::Hevc, &tiles, 64, 2, (100, 90), &display);
    p.put("photos/IMG_0001.HEIC", &file, true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let bytes = p
        .output(&format!("derived/{}/thumb-32.png", job.job_key))
        .await;
    let thumb = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .unwrap()
        .to_rgb8();
    // 90 × 100 upright, so 32 × 36; lime at the top left, blue bottom right.
    assert_eq!(thumb.dimensions(), (32, 36));
    let near =
        |got: [u8; 3], want: [u8; 3]| got.iter().zip(want).all(|(&g, w)| g.abs_diff(w) <= 16);
    assert!(
        near(thumb.get_pixel(3, 3).0, [0, 255, 0]),
        "{:?}",
        thumb.get_pixel(3, 3)
    );
    assert!(
        near(thumb.get_pixel(28, 32).0, [0, 0, 255]),
        "{:?}",
        thumb.get_pixel(28, 32)
    );
}

/// A pipeline whose one recipe is a 32 px AVIF thumbnail at quality 90.
async fn avif_pipeline() -> Pipeline {
    Pipeline::new(Options {
        recipes: Some(
            r#"[{"step":"thumbnail","version":1,"params":{"widths":[32],"format":"avif","quality":90}}]"#
                .into(),
        ),
        ..Options::default()
    })
    .await
}

/// An AVIF output read back through the step's own HEIF path.
async fn read_avif(bytes: &[u8]) -> image::DynamicImage {
    mediaonce::steps::thumbnail::decode_heif(
        bytes,
        mediaonce::steps::thumbnail::DEFAULT_MAX_PIXELS,
        &common::media::ffmpeg(),
        None,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn avif_outputs_are_encoded_by_ffmpeg_and_read_back() {
    common::media::ffmpeg();
    let p = avif_pipeline().await;
    let source = png(64, 48);
    p.put("photos/b.png", &source, true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let key = &job.job_key;
    let manifest: Manifest =
        serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await).unwrap();
    let output = &manifest.outputs[0];
    assert_eq!(output.name, "thumb-32.avif");
    let bytes = p.output(&format!("derived/{key}/thumb-32.avif")).await;
    assert_eq!(&bytes[4..12], b"ftypavif", "an AVIF file");
    // Read back through the step's own HEIF path: 32 × 24, and the colours
    // of the source's matching pixel (x·4, y·5, 90) within the codec's loss.
    let image = read_avif(&bytes).await.to_rgb8();
    assert_eq!(image.dimensions(), (32, 24));
    let got = image.get_pixel(16, 12).0;
    let want = [130u8, 122, 90];
    assert!(
        got.iter().zip(want).all(|(&g, w)| g.abs_diff(w) <= 12),
        "{got:?}, want about {want:?}"
    );
}

#[tokio::test]
async fn an_avif_output_keeps_the_images_transparency() {
    common::media::ffmpeg();
    let p = avif_pipeline().await;
    // Opaque on the left, a quarter opaque on the right.
    let image = image::RgbaImage::from_fn(64, 48, |x, _| {
        image::Rgba([200, 40, 40, if x < 32 { 255 } else { 64 }])
    });
    let mut source = Cursor::new(Vec::new());
    image
        .write_to(&mut source, image::ImageFormat::Png)
        .unwrap();
    p.put("stickers/a.png", source.get_ref(), true).await;
    let report = p.handle(p.receive(1).await).await;
    let job = report.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Ran, "{job:?}");
    let bytes = p
        .output(&format!("derived/{}/thumb-32.avif", job.job_key))
        .await;
    let thumb = read_avif(&bytes).await;
    assert!(thumb.color().has_alpha(), "{:?}", thumb.color());
    let thumb = thumb.to_rgba8();
    for (x, level) in [(4, 255u8), (28, 64)] {
        let [r, g, b, a] = thumb.get_pixel(x, 12).0;
        assert!(a.abs_diff(level) <= 4, "({x}, 12): alpha {a}, want {level}");
        let got = [r, g, b];
        assert!(
            got.iter()
                .zip([200u8, 40, 40])
                .all(|(&g, w)| g.abs_diff(w) <= 16),
            "({x}, 12): {got:?}"
        );
    }
}

/// A JPEG of `width` × `height` made by jpeg-encoder: red grows to the
/// right, green downwards, so a corner's colour says which corner it is.
fn gradient_jpeg(
    width: u32,
    height: u32,
    shape: impl FnOnce(&mut Encoder<&mut Vec<u8>>),
) -> Vec<u8> {
    let mut pixels = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height {
        for x in 0..width {
            pixels.extend_from_slice(&[
                (x * 255 / (width - 1).max(1)) as u8,
                (y * 255 / (height - 1).max(1)) as u8,
                90,
            ]);
        }
    }
    let mut out = Vec::new();
    let mut encoder = Encoder::new(&mut out, 90);
    shape(&mut encoder);
    encoder
        .encode(&pixels, width as u16, height as u16, ColorType::Rgb)
        .unwrap();
    out
}

/// A greyscale JPEG of `width` × `height`: black at the top left, white
/// at the bottom right.
fn grey_jpeg(width: u32, height: u32) -> Vec<u8> {
    let mut pixels = Vec::with_capacity((width * height) as usize);
    for y in 0..height {
        for x in 0..width {
            let (across, down) = (x * 255 / (width - 1), y * 255 / (height - 1));
            pixels.push(((across + down) / 2) as u8);
        }
    }
    let mut out = Vec::new();
    Encoder::new(&mut out, 90)
        .encode(&pixels, width as u16, height as u16, ColorType::Luma)
        .unwrap();
    out
}

/// JPEGs whose sides are not multiples of the reduced scale's block (an
/// iPhone screenshot's 1179 × 2556 among them) in every shape the
/// shrink-on-load paths take (4:2:0, 4:1:1, 4:4:0, progressive, restart
/// markers, greyscale, EXIF-rotated), each thumbnailed at 100, 320 and 640 px (one
/// recipe a width) through the step on the emulators: every job runs, at
/// the width asked and the height in proportion, with its corners where
/// the upright picture has them.
#[tokio::test]
async fn jpegs_of_any_width_thumbnail_at_every_scale() {
    let widths = [100u32, 320, 640];
    let recipes: Vec<String> = widths
        .iter()
        .map(|w| format!(r#"{{"step":"thumbnail","version":1,"params":{{"widths":[{w}]}}}}"#))
        .collect();
    let recipes = format!("[{}]", recipes.join(","));
    type Shape = fn(&mut Encoder<&mut Vec<u8>>);
    let sampled = |f: SamplingFactor| move |e: &mut Encoder<&mut Vec<u8>>| e.set_sampling_factor(f);
    let cases: Vec<(&str, Vec<u8>, (u32, u32))> = vec![
        (
            "screenshot 4:2:0",
            gradient_jpeg(1179, 2556, sampled(SamplingFactor::F_2_2)),
            (1179, 2556),
        ),
        (
            "4:1:1",
            gradient_jpeg(1281, 721, sampled(SamplingFactor::F_4_1)),
            (1281, 721),
        ),
        (
            "4:4:0",
            gradient_jpeg(1001, 667, sampled(SamplingFactor::F_1_2)),
            (1001, 667),
        ),
        (
            "progressive",
            gradient_jpeg(1001, 667, (|e| e.set_progressive(true)) as Shape),
            (1001, 667),
        ),
        (
            "restart 3",
            gradient_jpeg(1001, 667, (|e| e.set_restart_interval(3)) as Shape),
            (1001, 667),
        ),
        ("grey", grey_jpeg(3001, 1999), (3001, 1999)),
        (
            "EXIF 6",
            common::media::with_orientation(&gradient_jpeg(1001, 667, (|_| {}) as Shape), 6),
            (667, 1001),
        ),
    ];
    for (name, jpeg, (w, h)) in &cases {
        // A pipeline (bucket, queue, table) per case: the handler does not
        // delete what it handled, so on a slow machine an earlier case's
        // message could come back into this one's batch.
        let p = Pipeline::new(Options {
            recipes: Some(recipes.clone()),
            ..Options::default()
        })
        .await;
        p.put(&format!("photos/{name}.jpg"), jpeg, true).await;
        let report = p.handle(p.receive(1).await).await;
        assert_eq!(report.jobs().count(), widths.len(), "{name}");
        for job in report.jobs() {
            assert_eq!(job.outcome, Outcome::Ran, "{name}: {job:?}");
            let names = p
                .output_keys(&format!("derived/{}/thumb-", job.job_key))
                .await;
            let [key] = names.as_slice() else {
                panic!("{name}: {names:?}")
            };
            let bytes = p.output(key).await;
            let thumb = mediaonce::steps::thumbnail::decode(&bytes, 1 << 24)
                .unwrap()
                .to_rgb8();
            let width: u32 = key
                .rsplit_once("thumb-")
                .unwrap()
                .1
                .trim_end_matches(".jpg")
                .parse()
                .unwrap();
            let height = (*h as f64 * width as f64 / *w as f64).round() as u32;
            assert_eq!(thumb.dimensions(), (width, height), "{name} at {width}");
            // Upright, red grows to the right and green downwards, but EXIF 6
            // turned the stored picture a quarter clockwise: its stored left
            // edge (no red) is now the top, its bottom (green) the left.
            let (tl, br) = match *name {
                "EXIF 6" => ([0, 255, 90], [255, 0, 90]),
                "grey" => ([0, 0, 0], [255, 255, 255]),
                _ => ([0, 0, 90], [255, 255, 90]),
            };
            let near = |got: [u8; 3], want: [u8; 3]| {
                got.iter().zip(want).all(|(&g, w)| g.abs_diff(w) <= 24)
            };
            let (top_left, bottom_right) = (
                thumb.get_pixel(1, 1).0,
                thumb.get_pixel(width - 2, height - 2).0,
            );
            assert!(
                near(top_left, tl),
                "{name} at {width}: top left {top_left:?}"
            );
            assert!(
                near(bottom_right, br),
                "{name} at {width}: bottom right {bottom_right:?}"
            );
        }
    }
}
