//! HEIC and AVIF inputs: HEIF files written by tests/common/heif.rs around
//! tiles the pinned ffmpeg codes, decoded by the thumbnail step's HEIF path
//! (the container read here, the tiles decoded by ffmpeg).

mod common;

use common::heif::{alpha_tile, heif, pattern_tile, tile, Codec, Display};
use common::media::{clip, ffmpeg};
use mediaonce::step::StepError;
use mediaonce::steps::thumbnail::{decode_heif, DEFAULT_MAX_PIXELS};

fn near(got: [u8; 3], want: [u8; 3], tolerance: u8) -> bool {
    got.iter()
        .zip(want)
        .all(|(&g, w)| g.abs_diff(w) <= tolerance)
}

fn pixel(image: &image::DynamicImage, x: u32, y: u32) -> [u8; 3] {
    image.to_rgb8().get_pixel(x, y).0
}

/// Four 64 px tiles, red, lime, blue, yellow in reading order, in a grid
/// cut to 100 × 90 (the right and bottom tiles overhang, as an iPhone's
/// do).
fn four_tiles(codec: Codec) -> Vec<Vec<u8>> {
    ["red", "lime", "blue", "yellow"]
        .iter()
        .map(|colour| tile(codec, colour, 64))
        .collect()
}

const RED: [u8; 3] = [255, 0, 0];
const LIME: [u8; 3] = [0, 255, 0];
const BLUE: [u8; 3] = [0, 0, 255];
const YELLOW: [u8; 3] = [255, 255, 0];

#[tokio::test]
async fn a_heic_grid_is_put_together_cut_and_turned() {
    let ffmpeg = ffmpeg();
    let upright = heif(
        Codec::Hevc,
        &four_tiles(Codec::Hevc),
        64,
        2,
        (100, 90),
        &Display::default(),
    );
    let image = decode_heif(&upright, DEFAULT_MAX_PIXELS, &ffmpeg, None)
        .await
        .unwrap();
    assert_eq!((image.width(), image.height()), (100, 90));
    for (x, y, want) in [
        (10, 10, RED),
        (90, 10, LIME),
        (10, 80, BLUE),
        (90, 80, YELLOW),
    ] {
        let got = pixel(&image, x, y);
        assert!(near(got, want, 12), "({x}, {y}): {got:?}, want {want:?}");
    }

    // A quarter turn anticlockwise (irot 1): lime comes to the top left.
    let turned = heif(
        Codec::Hevc,
        &four_tiles(Codec::Hevc),
        64,
        2,
        (100, 90),
        &Display {
            rotate: 1,
            ..Display::default()
        },
    );
    let image = decode_heif(&turned, DEFAULT_MAX_PIXELS, &ffmpeg, None)
        .await
        .unwrap();
    assert_eq!((image.width(), image.height()), (90, 100));
    for (x, y, want) in [
        (10, 10, LIME),
        (80, 10, YELLOW),
        (10, 90, RED),
        (80, 90, BLUE),
    ] {
        let got = pixel(&image, x, y);
        assert!(
            near(got, want, 12),
            "turned ({x}, {y}): {got:?}, want {want:?}"
        );
    }
}

#[tokio::test]
async fn an_avif_grid_is_put_together_and_mirrored() {
    let ffmpeg = ffmpeg();
    let mirrored = heif(
        Codec::Av1,
        &four_tiles(Codec::Av1),
        64,
        2,
        (100, 90),
        &Display {
            mirror: Some(0),
            ..Display::default()
        },
    );
    let image = decode_heif(&mirrored, DEFAULT_MAX_PIXELS, &ffmpeg, None)
        .await
        .unwrap();
    assert_eq!((image.width(), image.height()), (100, 90));
    // Left and right swap.
    for (x, y, want) in [
        (10, 10, LIME),
        (90, 10, RED),
        (10, 80, YELLOW),
        (90, 80, BLUE),
    ] {
        let got = pixel(&image, x, y);
        assert!(near(got, want, 12), "({x}, {y}): {got:?}, want {want:?}");
    }
}

#[tokio::test]
async fn a_display_p3_heic_comes_out_in_srgb_by_its_profile_or_its_code_points() {
    let ffmpeg = ffmpeg();
    // P3 (200, 120, 60) is sRGB (213, 115, 42) by the primaries' matrices
    // (as in the thumbnail's colour tests); the codec's rounding adds a few.
    let coded = tile(Codec::Hevc, "0xC8783C", 64);
    let icc = moxcms::ColorProfile::new_display_p3().encode().unwrap();
    for (name, display) in [
        (
            "icc",
            Display {
                icc: Some(icc),
                ..Display::default()
            },
        ),
        (
            // P3-D65 primaries (12), sRGB's curve (13), BT.601 matrix, limited range.
            "nclx",
            Display {
                nclx: Some((12, 13, 6, false)),
                ..Display::default()
            },
        ),
    ] {
        let file = heif(
            Codec::Hevc,
            std::slice::from_ref(&coded),
            64,
            1,
            (64, 64),
            &display,
        );
        let image = decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap();
        let got = pixel(&image, 32, 32);
        assert!(near(got, [213, 115, 42], 5), "{name}: {got:?}");
    }
    // Untagged: taken as sRGB.
    let file = heif(Codec::Hevc, &[coded], 64, 1, (64, 64), &Display::default());
    let image = decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
        .await
        .unwrap();
    let got = pixel(&image, 32, 32);
    assert!(near(got, [200, 120, 60], 5), "untagged: {got:?}");
}

fn unprocessable(err: StepError) -> String {
    match err {
        StepError::Unprocessable(message) => message,
        other => panic!("a permanent failure, not {other:?}"),
    }
}

#[tokio::test]
async fn bad_heif_files_fail_permanently_naming_the_problem() {
    let ffmpeg = ffmpeg();
    let file = heif(
        Codec::Hevc,
        &four_tiles(Codec::Hevc),
        64,
        2,
        (100, 90),
        &Display::default(),
    );
    // Over the pixel limit: refused before ffmpeg runs (the 4 tiles decode
    // 128 × 128 pixels).
    let err = decode_heif(&file, 128 * 128 - 1, &ffmpeg, None)
        .await
        .unwrap_err();
    let message = unprocessable(err);
    assert!(message.contains("MEDIAONCE_MAX_PIXELS"), "{message}");

    // Cut short inside the coded tiles: ffmpeg decodes less than the grid.
    let cut = &file[..file.len() - 200];
    let message = unprocessable(
        decode_heif(cut, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap_err(),
    );
    assert!(
        message.contains("HEIC") || message.contains("ffmpeg"),
        "{message}"
    );

    // Tiles whose bytes are not HEVC.
    let mut junk = file.clone();
    let mdat = junk.windows(4).position(|w| w == b"mdat").unwrap() + 4;
    for b in &mut junk[mdat..] {
        *b = 0x5a;
    }
    let message = unprocessable(
        decode_heif(&junk, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap_err(),
    );
    assert!(message.contains("undecodable image"), "{message}");

    // No meta box at all.
    let message = unprocessable(
        decode_heif(&file[..24], DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap_err(),
    );
    assert!(message.contains("HEIC file"), "{message}");
}

#[tokio::test]
async fn files_libheif_writes_decode_as_imagemagick_decodes_them() {
    // tests/data/libheif-96x64.{heic,avif}: a 96 × 64 PNG of four
    // quadrants (red, lime, blue, and (200, 120, 60)) saved by ImageMagick
    // 6.9.11 through libheif 1.15.1 (x265 and aom), `-quality 90`; the
    // colours are what ImageMagick (libde265, dav1d/aom) decodes them to.
    let ffmpeg = ffmpeg();
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for name in ["libheif-96x64.heic", "libheif-96x64.avif"] {
        let file = std::fs::read(data.join(name)).unwrap();
        let image = decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap();
        assert_eq!((image.width(), image.height()), (96, 64), "{name}");
        for (x, y, want) in [
            (20, 10, [254, 0, 0]),
            (70, 10, [0, 254, 2]),
            (20, 50, [0, 0, 254]),
            (70, 50, [199, 120, 59]),
        ] {
            let got = pixel(&image, x, y);
            assert!(
                near(got, want, 4),
                "{name} ({x}, {y}): {got:?}, want {want:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_grid_naming_one_tile_over_and_over_is_refused_before_copying_it() {
    let ffmpeg = ffmpeg();
    // A busy first tile and three flat ones; then every grid cell is made
    // to name the busy one (item 1): four copies of it would be more bytes
    // than the whole file, which is what a hostile file would do at scale.
    let mut tiles = four_tiles(Codec::Hevc);
    tiles[0] = pattern_tile(Codec::Hevc, 64);
    let mut file = heif(Codec::Hevc, &tiles, 64, 2, (100, 90), &Display::default());
    let dimg = file.windows(4).position(|w| w == b"dimg").unwrap() + 4;
    // from (item 5), count (4), then the four tile ids.
    for i in 0..4 {
        let at = dimg + 4 + 2 * i;
        file[at..at + 2].copy_from_slice(&1u16.to_be_bytes());
    }
    let message = unprocessable(
        decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap_err(),
    );
    assert!(
        message.contains("more bytes than the file holds"),
        "{message}"
    );
}

#[tokio::test]
async fn the_alpha_image_becomes_the_pictures_alpha() {
    let ffmpeg = ffmpeg();
    for codec in [Codec::Hevc, Codec::Av1] {
        // The colour grid's alpha, as a grid of its own: each tile a level.
        let alpha: Vec<Vec<u8>> = [255, 192, 96, 32]
            .iter()
            .map(|&level| alpha_tile(codec, level, 64))
            .collect();
        let file = heif(
            codec,
            &four_tiles(codec),
            64,
            2,
            (100, 90),
            &Display {
                alpha: Some(alpha),
                ..Display::default()
            },
        );
        let image = decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap();
        assert!(image.color().has_alpha(), "{codec:?}: {:?}", image.color());
        let rgba = image.to_rgba8();
        for (x, y, colour, level) in [
            (10, 10, RED, 255),
            (90, 10, LIME, 192),
            (10, 80, BLUE, 96),
            (90, 80, YELLOW, 32),
        ] {
            let [r, g, b, a] = rgba.get_pixel(x, y).0;
            assert!(
                near([r, g, b], colour, 12),
                "{codec:?} ({x}, {y}): {:?}",
                [r, g, b]
            );
            assert!(
                a.abs_diff(level) <= 3,
                "{codec:?} ({x}, {y}): alpha {a}, want {level}"
            );
        }
    }

    // Premultiplied (`prem`): half-transparent red stored as dark red is
    // shown red; the same file without `prem` is dark red.
    for premultiplied in [true, false] {
        let file = heif(
            Codec::Av1,
            &[tile(Codec::Av1, "0x800000", 64)],
            64,
            1,
            (64, 64),
            &Display {
                alpha: Some(vec![alpha_tile(Codec::Av1, 128, 64)]),
                premultiplied,
                ..Display::default()
            },
        );
        let image = decode_heif(&file, DEFAULT_MAX_PIXELS, &ffmpeg, None)
            .await
            .unwrap();
        let [r, g, b, a] = image.to_rgba8().get_pixel(32, 32).0;
        let want = if premultiplied { RED } else { [128, 0, 0] };
        assert!(
            near([r, g, b], want, 16),
            "prem {premultiplied}: {:?}",
            [r, g, b]
        );
        assert!(a.abs_diff(128) <= 3, "prem {premultiplied}: alpha {a}");
    }
}

/// ffmpeg's AVIF muxer writes an alpha image (a second stream) as libavif
/// does: a writer other than this repository's test one.
#[tokio::test]
async fn an_avif_with_alpha_from_ffmpegs_muxer() {
    let ffmpeg = ffmpeg();
    let png = clip(
        "half-transparent.png",
        &[
            "-f",
            "lavfi",
            "-i",
            "color=c=red:s=96x64:d=1,format=rgba,geq=r=255:g=0:b=0:a='if(lt(X,48),255,64)'",
            "-frames:v",
            "1",
        ],
    );
    let avif = clip(
        "half-transparent.avif",
        &[
            "-i",
            png.to_str().unwrap(),
            "-filter_complex",
            "[0:v]split[c][a];[c]format=yuv420p[c1];[a]alphaextract,format=gray[a1]",
            "-map",
            "[c1]",
            "-map",
            "[a1]",
            "-c:v",
            "libaom-av1",
            "-still-picture",
            "1",
            "-cpu-used",
            "8",
        ],
    );
    let bytes = std::fs::read(avif).unwrap();
    let image = decode_heif(&bytes, DEFAULT_MAX_PIXELS, &ffmpeg, None)
        .await
        .unwrap();
    assert_eq!((image.width(), image.height()), (96, 64));
    let rgba = image.to_rgba8();
    for (x, level) in [(10, 255), (80, 64)] {
        let [r, g, b, a] = rgba.get_pixel(x, 32).0;
        assert!(near([r, g, b], RED, 16), "({x}, 32): {:?}", [r, g, b]);
        assert!(a.abs_diff(level) <= 3, "({x}, 32): alpha {a}, want {level}");
    }
}
