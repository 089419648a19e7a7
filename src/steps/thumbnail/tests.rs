use std::io::Cursor;

use super::*;
use image::{ImageEncoder, Rgba, RgbaImage};
use serde_json::json;

/// Red, green, blue and white corners, so orientation shows.
fn corners(w: u32, h: u32, alpha: u8) -> RgbaImage {
    RgbaImage::from_fn(w, h, |x, y| match (x < w / 2, y < h / 2) {
        (true, true) => Rgba([255, 0, 0, alpha]),
        (false, true) => Rgba([0, 255, 0, alpha]),
        (true, false) => Rgba([0, 0, 255, alpha]),
        (false, false) => Rgba([255, 255, 255, alpha]),
    })
}

fn encoded(image: &RgbaImage, format: image::ImageFormat) -> Vec<u8> {
    if format == image::ImageFormat::Jpeg {
        // `image` is built without JPEG: jpeg-encoder writes the fixtures.
        let rgb = DynamicImage::ImageRgba8(image.clone()).to_rgb8();
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(
                rgb.as_raw(),
                rgb.width() as u16,
                rgb.height() as u16,
                jpeg_encoder::ColorType::Rgb,
            )
            .unwrap();
        return out;
    }
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgba8(image.clone())
        .write_to(&mut out, format)
        .unwrap();
    out.into_inner()
}

/// A JPEG with an EXIF APP1 segment holding only Orientation.
fn jpeg_with_orientation(image: &RgbaImage, orientation: u16) -> Vec<u8> {
    with_exif_orientation(&encoded(image, image::ImageFormat::Jpeg), orientation)
}

/// `jpeg` with an EXIF APP1 segment holding only Orientation, first.
pub(super) fn with_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = b"MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01".to_vec();
    tiff.extend_from_slice(&orientation.to_be_bytes());
    tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn chunk(png: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    png.extend_from_slice(&body);
    png.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// A PNG that declares `w` × `h` and holds almost nothing.
fn png_bomb(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &ihdr);
    // An empty stored zlib stream: a few bytes for 400 megapixels.
    chunk(
        &mut png,
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
        ],
    );
    chunk(&mut png, b"IEND", &[]);
    png
}

fn params(value: Value) -> ThumbnailParams {
    ThumbnailParams::parse(value.as_object().unwrap()).unwrap()
}

fn dominant(pixel: Rgba<u8>) -> usize {
    let [r, g, b, _] = pixel.0;
    if r > 200 && g > 200 && b > 200 {
        3
    } else {
        [r, g, b]
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| **c)
            .unwrap()
            .0
    }
}

#[test]
fn every_input_format_decodes() {
    let image = corners(40, 30, 255);
    let mut gif = Vec::new();
    {
        let mut encoder = image::codecs::gif::GifEncoder::new(&mut gif);
        encoder
            .encode_frame(image::Frame::new(image.clone()))
            .unwrap();
        encoder
            .encode_frame(image::Frame::new(corners(40, 30, 255)))
            .unwrap();
    }
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
        .write_image(image.as_raw(), 40, 30, image::ExtendedColorType::Rgba8)
        .unwrap();
    let inputs = [
        ("jpeg", encoded(&image, image::ImageFormat::Jpeg)),
        ("png", encoded(&image, image::ImageFormat::Png)),
        ("tiff", encoded(&image, image::ImageFormat::Tiff)),
        ("webp", webp),
        ("gif, first frame", gif),
    ];
    for (name, bytes) in inputs {
        let decoded = decode(&bytes, 1_000_000).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((decoded.width(), decoded.height()), (40, 30), "{name}");
        assert_eq!(
            dominant(decoded.to_rgba8().get_pixel(2, 2).to_owned()),
            0,
            "{name}: red top-left"
        );
    }
}

#[test]
fn exif_orientation_is_honoured() {
    let image = corners(40, 20, 255);
    // 6: the camera was turned; the image is shown rotated 90° clockwise.
    let upright = decode(&jpeg_with_orientation(&image, 6), 1_000_000).unwrap();
    assert_eq!((upright.width(), upright.height()), (20, 40));
    let rgba = upright.to_rgba8();
    assert_eq!(
        dominant(*rgba.get_pixel(2, 2)),
        2,
        "blue (was bottom-left) is top-left"
    );
    assert_eq!(
        dominant(*rgba.get_pixel(17, 2)),
        0,
        "red (was top-left) is top-right"
    );
    // 1: as stored.
    let as_is = decode(&jpeg_with_orientation(&image, 1), 1_000_000).unwrap();
    assert_eq!((as_is.width(), as_is.height()), (40, 20));
}

#[test]
fn a_jpeg_shrinks_on_load_upright_and_close_to_a_full_decode() {
    let jpeg = jpeg_with_orientation(&corners(400, 300, 255), 6);
    let params = params(json!({"widths": [40]}));
    let (small, plans) = decode_for(&jpeg, 1_000_000, &params).unwrap();
    // 1/4 scale: 100x75 stored, 75x100 upright; not the full 300x400.
    assert_eq!((small.width(), small.height()), (75, 100));
    assert_eq!((plans[0].width, plans[0].height), (40, 53));
    let shrunk = render(&small, &plans[0], Format::Png).unwrap().to_rgb8();

    let full = decode(&jpeg, 1_000_000).unwrap();
    let full_plan = plan(full.width(), full.height(), &params)[0];
    let reference = render(&full, &full_plan, Format::Png).unwrap().to_rgb8();
    assert_eq!(shrunk.dimensions(), reference.dimensions());
    let diff: u64 = shrunk
        .as_raw()
        .iter()
        .zip(reference.as_raw())
        .map(|(a, b)| a.abs_diff(*b) as u64)
        .sum();
    let mean = diff as f64 / shrunk.as_raw().len() as f64;
    assert!(mean < 6.0, "mean difference {mean}");
    let [r, g, b] = shrunk.get_pixel(2, 2).0;
    assert_eq!(dominant(Rgba([r, g, b, 255])), 2, "blue top-left: upright");

    // Targets near the source size decode in full.
    let (whole, _) = decode_for(
        &jpeg,
        1_000_000,
        &ThumbnailParams::parse(json!({"widths": [200]}).as_object().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!((whole.width(), whole.height()), (300, 400));
    // The bomb check comes first on this path too.
    assert!(decode_for(&png_bomb(20_000, 20_000), 100_000_000, &params).is_err());
}

#[test]
fn shrink_on_load_gives_jpeg_decoders_pixels_at_every_scale() {
    // A busy 4:2:0 picture (the encoder's default), as camera JPEGs are.
    let busy = RgbaImage::from_fn(410, 300, |x, y| {
        let n = (x * 7919 + y * 104_729) % 61;
        Rgba([
            (x % 256) as u8,
            (y % 190 + n) as u8,
            ((x + y) % 190) as u8,
            255,
        ])
    });
    let jpeg = encoded(&busy, image::ImageFormat::Jpeg);
    // 40 px: 1/8 (52 wide); 80 px: 1/4 (103); 150 px: 1/2 (205).
    for (width, eighths) in [(40, 1u16), (80, 2), (150, 4)] {
        let wanted = params(json!({ "widths": [width] }));
        let (image, _) = decode_for(&jpeg, 1_000_000, &wanted).unwrap();
        let mut reference = jpeg_decoder::Decoder::new(Cursor::new(&jpeg[..]));
        reference.read_info().unwrap();
        let (w, h) = reference
            .scale((410 * eighths).div_ceil(8), (300 * eighths).div_ceil(8))
            .unwrap();
        let expected = reference.decode().unwrap();
        assert_eq!(
            (image.width(), image.height()),
            (w as u32, h as u32),
            "at {eighths}/8"
        );
        let ours = image.to_rgb8();
        // Within one level: jpeg-decoder's SIMD colour conversion rounds
        // differently from its scalar one, which mediaonce_jpeg::scaled follows.
        let worst = ours
            .as_raw()
            .iter()
            .zip(&expected)
            .map(|(a, b)| a.abs_diff(*b))
            .max();
        assert!(worst <= Some(1), "at {eighths}/8: off by {worst:?}");
    }
}

#[test]
fn a_bomb_is_refused_before_decoding_and_junk_is_undecodable() {
    let err = decode(&png_bomb(20_000, 20_000), 100_000_000)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("400000000 pixels") && err.contains("MEDIAONCE_MAX_PIXELS"),
        "{err}"
    );
    let err = decode(b"certainly not an image", 100)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("undecodable image"), "{err}");
    let truncated = &encoded(&corners(40, 30, 255), image::ImageFormat::Png)[..60];
    assert!(decode(truncated, 1_000_000)
        .unwrap_err()
        .to_string()
        .starts_with("undecodable image"));
}

#[test]
fn plans_keep_the_aspect_ratio_and_never_upscale_unless_asked() {
    let widths = params(json!({"widths": [320, 1280, 4000]}));
    let sizes: Vec<(u32, u32, u32)> = plan(2000, 1000, &widths)
        .iter()
        .map(|p| (p.name_width, p.width, p.height))
        .collect();
    assert_eq!(
        sizes,
        [(320, 320, 160), (1280, 1280, 640), (4000, 2000, 1000)]
    );
    let up = params(json!({"widths": [4000], "upscale": true}));
    assert_eq!(
        (
            plan(2000, 1000, &up)[0].width,
            plan(2000, 1000, &up)[0].height
        ),
        (4000, 2000)
    );
    assert_eq!(plan(1, 1, &widths)[0].width, 1, "1x1 stays 1x1");

    let contain = params(json!({"width": 300, "height": 300, "fit": "contain"}));
    let p = plan(2000, 1000, &contain)[0];
    assert_eq!((p.width, p.height), (300, 150));
    let cover = params(json!({"width": 300, "height": 300, "fit": "cover"}));
    let p = plan(2000, 1000, &cover)[0];
    assert_eq!((p.width, p.height), (300, 300));
    assert_eq!(p.crop, (500.0, 0.0, 1000.0, 1000.0), "centre square");
}

#[test]
fn outputs_are_deterministic_and_keep_alpha_where_the_format_has_it() {
    let image = DynamicImage::ImageRgba8(corners(64, 48, 128));
    let p = plan(64, 48, &params(json!({"widths": [32]})))[0];
    for format in [Format::Jpeg, Format::Png, Format::Webp] {
        let encoding = Encoding {
            format,
            quality: 80,
            progressive: false,
        };
        let once = encode(&render(&image, &p, format).unwrap(), encoding).unwrap();
        let twice = encode(&render(&image, &p, format).unwrap(), encoding).unwrap();
        assert_eq!(once, twice, "{format:?} is deterministic");
        let back = decode(&once, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!((back.width(), back.height()), (32, 24), "{format:?}");
        assert_eq!(back.color().has_alpha(), format.has_alpha(), "{format:?}");
    }
    // JPEG has no alpha: half-transparent red over white is pink.
    let jpeg = decode(
        &encode(
            &render(&image, &p, Format::Jpeg).unwrap(),
            Encoding {
                format: Format::Jpeg,
                quality: 95,
                progressive: false,
            },
        )
        .unwrap(),
        DEFAULT_MAX_PIXELS,
    )
    .unwrap()
    .to_rgb8();
    let [r, g, b] = jpeg.get_pixel(2, 2).0;
    assert!(
        r > 240 && (100..160).contains(&g) && (100..160).contains(&b),
        "{r} {g} {b}"
    );
}

/// The markers of a JPEG up to its first scan: (marker, segment body).
fn jpeg_segments(jpeg: &[u8]) -> Vec<(u8, Vec<u8>)> {
    assert_eq!(&jpeg[..2], &[0xFF, 0xD8], "starts with SOI");
    let (mut at, mut segments) = (2, Vec::new());
    loop {
        assert_eq!(jpeg[at], 0xFF, "a marker at {at}");
        let marker = jpeg[at + 1];
        let length = u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize;
        segments.push((marker, jpeg[at + 4..at + 2 + length].to_vec()));
        if marker == 0xDA {
            return segments;
        }
        at += 2 + length;
    }
}

#[test]
fn jpegs_are_subsampled_below_90_interleaved_and_carry_no_metadata() {
    // An upload with EXIF (orientation 6: turned a quarter).
    let input = jpeg_with_orientation(&corners(64, 48, 255), 6);
    let image = decode(&input, DEFAULT_MAX_PIXELS).unwrap();
    let p = plan(
        image.width(),
        image.height(),
        &params(json!({"widths": [40]})),
    )[0];
    let out = |quality: u8, progressive: bool| {
        let encoding = Encoding {
            format: Format::Jpeg,
            quality,
            progressive,
        };
        encode(&render(&image, &p, Format::Jpeg).unwrap(), encoding).unwrap()
    };
    // JFIF, the tables, the frame, the scan: no APP1 (EXIF, XMP), APP2
    // (ICC) or COM.
    let markers =
        |segments: &[(u8, Vec<u8>)]| segments.iter().map(|(m, _)| *m).collect::<Vec<u8>>();
    let display_only = |markers: &[u8], frame: u8| {
        markers
            .iter()
            .all(|&m| matches!(m, 0xE0 | 0xDB | 0xC4 | 0xDA) || m == frame)
    };
    for (quality, luma_sampling) in [(82, 0x22), (89, 0x22), (90, 0x11), (100, 0x11)] {
        let segments = jpeg_segments(&out(quality, false));
        let markers = markers(&segments);
        assert!(display_only(&markers, 0xC0), "q{quality}: {markers:x?}");
        let (_, frame) = segments.iter().find(|(m, _)| *m == 0xC0).unwrap();
        let sampling: Vec<u8> = (0..3).map(|c| frame[7 + 3 * c]).collect();
        assert_eq!(sampling, [luma_sampling, 0x11, 0x11], "q{quality}");
        // Interleaved: the one scan holds all three components (some
        // decoders misread 4:2:0 written one component per scan).
        let (_, scan) = segments.last().unwrap();
        assert_eq!(scan[0], 3, "q{quality}: components in the first scan");
    }
    // Progressive: libjpeg's scans (jpeg::progressive), the same pixels
    // as the baseline file, no metadata either.
    let markers = markers(&jpeg_segments(&out(82, true)));
    assert!(display_only(&markers, 0xC2), "{markers:x?}");
    // Stuffing keeps 0xFF 0xDA out of coded data: these are the scans.
    let file = out(82, true);
    assert_eq!(file.windows(2).filter(|w| w == &[0xFF, 0xDA]).count(), 10);
    let back = decode(&file, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!((back.width(), back.height()), (40, 53), "upright");
    let baseline = decode(&out(82, false), DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!(back.as_bytes(), baseline.as_bytes());
}

/// Whether each channel of `got` is within `tolerance` of `want`'s.
fn within(got: [u8; 3], want: [u8; 3], tolerance: u8) -> bool {
    got.iter()
        .zip(want)
        .all(|(g, w)| g.abs_diff(w) <= tolerance)
}

#[test]
fn a_display_p3_upload_comes_out_in_srgb_as_jpeg_and_png() {
    // A flat P3 skin tone, (200, 120, 60): sRGB (213, 115, 42) by the
    // primaries' matrices (colour.rs checks the transform itself).
    let icc = moxcms::ColorProfile::new_display_p3().encode().unwrap();
    let flat = image::RgbImage::from_pixel(64, 48, image::Rgb([200, 120, 60]));
    let mut png = Vec::new();
    let mut encoder = image::codecs::png::PngEncoder::new(&mut png);
    encoder.set_icc_profile(icc.clone()).unwrap();
    encoder
        .write_image(flat.as_raw(), 64, 48, image::ExtendedColorType::Rgb8)
        .unwrap();
    let mut jpeg = Vec::new();
    let mut encoder = jpeg_encoder::Encoder::new(&mut jpeg, 100);
    encoder.add_icc_profile(&icc).unwrap();
    encoder
        .encode(flat.as_raw(), 64, 48, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    // 16 px wide: the JPEG is decoded at 1/2 scale by jpeg-decoder (its
    // profile read there), the PNG in full by `image`.
    let wanted = params(json!({"widths": [16]}));
    for (name, bytes) in [("png", png), ("jpeg", jpeg)] {
        let (image, plans) = decode_for(&bytes, DEFAULT_MAX_PIXELS, &wanted).unwrap();
        let out = render(&image, &plans[0], Format::Png).unwrap().to_rgb8();
        let got = out.get_pixel(8, 6).0;
        assert!(within(got, [213, 115, 42], 3), "{name}: got {got:?}");
    }
}

#[test]
fn cmyk_and_ycck_jpegs_come_out_as_imagemagick_converts_them() {
    // Print assets: C 0, M 160, Y 200, K 30 (a red-orange), written as
    // Adobe writes CMYK (inverted, APP14) and as YCCK. ImageMagick's
    // `-colorspace sRGB` gives (225, 84, 49) for both files.
    let cmyk: Vec<u8> = [0u8, 160, 200, 30].repeat(32 * 32);
    for (color, name) in [
        (jpeg_encoder::ColorType::Cmyk, "cmyk"),
        (jpeg_encoder::ColorType::CmykAsYcck, "ycck"),
    ] {
        let mut jpeg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpeg, 95)
            .encode(&cmyk, 32, 32, color)
            .unwrap();
        let image = decode(&jpeg, DEFAULT_MAX_PIXELS).unwrap().to_rgb8();
        let got = image.get_pixel(16, 16).0;
        assert!(within(got, [225, 84, 49], 2), "{name}: {got:?}");
        // Thumbnails of it take the same path (no DCT scaling of CMYK).
        let wanted = params(json!({"widths": [8]}));
        let (image, plans) = decode_for(&jpeg, DEFAULT_MAX_PIXELS, &wanted).unwrap();
        let out = render(&image, &plans[0], Format::Jpeg).unwrap().to_rgb8();
        let got = out.get_pixel(4, 4).0;
        assert!(within(got, [225, 84, 49], 3), "{name} thumbnail: {got:?}");
    }
}

/// A CMYK ICC profile (an output profile, lut16, XYZ connection space) of
/// a made-up press: paper white in D50, each ink a filter over it, 9 grid
/// points an ink. Written by moxcms; read here by moxcms and, for the
/// reference values below, by lcms2 through ImageMagick.
fn cmyk_profile() -> Vec<u8> {
    use moxcms::*;
    let white = [0.9642f64, 1.0, 0.8249];
    let filters = [
        [0.25, 0.55, 0.9],
        [0.55, 0.25, 0.6],
        [0.95, 0.9, 0.15],
        [0.08, 0.08, 0.08],
    ];
    let grid = 9usize;
    let mut clut = Vec::new();
    for node in 0..grid.pow(4) {
        // The first ink varies slowest, as ICC orders a CLUT.
        let inks = [3, 2, 1, 0].map(|i| (node / grid.pow(i)) % grid);
        for channel in 0..3 {
            let mut v = white[channel];
            for (ink, filter) in inks.iter().zip(filters) {
                let amount = *ink as f64 / (grid - 1) as f64;
                v *= 1.0 - amount * (1.0 - filter[channel]);
            }
            // u1Fixed15: 1.0 is 0x8000.
            clut.push((v * 32768.0).round() as u16);
        }
    }
    let lut = LutDataType {
        num_input_channels: 4,
        num_output_channels: 3,
        num_clut_grid_points: grid as u8,
        matrix: Matrix3d::IDENTITY,
        num_input_table_entries: 2,
        num_output_table_entries: 2,
        input_table: LutStore::Store16([0, 65535].repeat(4)),
        clut_table: LutStore::Store16(clut),
        output_table: LutStore::Store16([0, 65535].repeat(3)),
        lut_type: LutType::Lut16,
    };
    let d50 = Xyzd {
        x: 0.9642,
        y: 1.0,
        z: 0.8249,
    };
    let mut profile = ColorProfile::default();
    profile.color_space = DataColorSpace::Cmyk;
    profile.pcs = DataColorSpace::Xyz;
    profile.profile_class = ProfileClass::ColorSpace;
    profile.white_point = d50;
    profile.media_white_point = Some(d50);
    profile.lut_a_to_b_perceptual = Some(LutWarehouse::Lut(lut));
    profile.encode().unwrap()
}

#[test]
fn a_cmyk_jpeg_with_a_profile_comes_out_as_lcms_converts_it() {
    // Three inks mixes, 16 rows of 96 pixels each (an image over 64 × 64
    // pixels, which is decoded whole); the sRGB lcms2 gives for each
    // (ImageMagick 6.9.11: `convert cmyk.jpg -intent relative -profile
    // srgb.icc`, Ghostscript's sRGB profile), and what ignoring the profile
    // would give instead.
    let mixes: [([u8; 4], [u8; 3], [u8; 3]); 3] = [
        ([0, 160, 200, 30], [255, 139, 124], [225, 84, 49]),
        ([200, 40, 0, 0], [0, 225, 243], [55, 215, 255]),
        ([60, 60, 60, 120], [174, 170, 170], [103, 103, 103]),
    ];
    let inks: Vec<u8> = mixes
        .iter()
        .flat_map(|(ink, ..)| ink.repeat(96 * 16))
        .collect();
    let icc = cmyk_profile();
    for (color, name) in [
        (jpeg_encoder::ColorType::Cmyk, "cmyk"),
        (jpeg_encoder::ColorType::CmykAsYcck, "ycck"),
    ] {
        let mut jpeg = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut jpeg, 100);
        encoder.add_icc_profile(&icc).unwrap();
        encoder.encode(&inks, 96, 48, color).unwrap();
        // In full, and shrunk on load (half size: through the DCT).
        let full = decode(&jpeg, DEFAULT_MAX_PIXELS).unwrap().to_rgb8();
        let wanted = params(json!({"widths": [48], "format": "png"}));
        let (image, plans) = decode_for(&jpeg, DEFAULT_MAX_PIXELS, &wanted).unwrap();
        assert_eq!(image.width(), 48, "{name}: decoded at half size");
        let small = render(&image, &plans[0], Format::Png).unwrap().to_rgb8();
        for (row, (ink, lcms, naive)) in mixes.iter().enumerate() {
            let y = 8 + 16 * row as u32;
            let got = full.get_pixel(16, y).0;
            assert!(
                within(got, *lcms, 2),
                "{name} {ink:?}: {got:?}, lcms {lcms:?}"
            );
            assert!(
                !within(got, *naive, 8),
                "{name} {ink:?}: the profile was applied"
            );
            let got = small.get_pixel(8, y / 2).0;
            assert!(
                within(got, *lcms, 3),
                "{name} {ink:?} shrunk: {got:?}, lcms {lcms:?}"
            );
        }
    }
}

#[test]
fn a_sixteen_bit_gradient_is_resized_at_sixteen_bits() {
    // 1024 columns climbing 4 sixteen-bit steps each: 4096 levels over
    // what 8 bits would hold as 16.
    let gradient = image::ImageBuffer::<image::Rgb<u16>, _>::from_fn(1024, 4, |x, _| {
        let v = 20_000 + 4 * x as u16;
        image::Rgb([v, v, v])
    });
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(
            &gradient
                .as_raw()
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect::<Vec<u8>>(),
            1024,
            4,
            image::ExtendedColorType::Rgb16,
        )
        .unwrap();
    let wanted = params(json!({"widths": [512], "format": "png"}));
    let (image, plans) = decode_for(&png, DEFAULT_MAX_PIXELS, &wanted).unwrap();
    let out = render(&image, &plans[0], Format::Png).unwrap();
    let DynamicImage::ImageRgb16(out) = &out else {
        panic!("a PNG of a 16-bit input stays 16-bit: {:?}", out.color())
    };
    let levels: std::collections::BTreeSet<u16> = out.pixels().map(|p| p.0[0]).collect();
    assert!(levels.len() > 400, "{} levels", levels.len());
    // Still a gradient: each column at or above the one before.
    let row: Vec<u16> = (0..512).map(|x| out.get_pixel(x, 1).0[0]).collect();
    assert!(row.windows(2).all(|w| w[0] <= w[1]), "{row:?}");
    // 8-bit formats reduce it after resizing.
    let encoding = Encoding {
        format: Format::Jpeg,
        quality: 90,
        progressive: false,
    };
    let jpeg = encode(&render(&image, &plans[0], Format::Jpeg).unwrap(), encoding).unwrap();
    assert_eq!(decode(&jpeg, DEFAULT_MAX_PIXELS).unwrap().width(), 512);
}

#[test]
fn params_are_checked_by_name() {
    let err = |v: Value| ThumbnailParams::parse(v.as_object().unwrap()).unwrap_err();
    assert!(err(json!({})).contains("give widths"));
    assert!(err(json!({"widths": []})).contains("non-empty"));
    assert!(err(json!({"widths": [0]})).contains("1 to 65535"));
    assert!(err(json!({"widths": [320, 320]})).contains("not repeat"));
    assert!(err(json!({"widths": [320], "progressive": 1})).contains("true or false"));
    assert!(
        err(json!({"widths": [320], "format": "png", "progressive": true})).contains("jpeg only")
    );
    assert!(err(json!({"widths": [320], "width": 10, "height": 10})).contains("not both"));
    assert!(err(json!({"width": 10})).contains("give widths"));
    assert!(err(json!({"width": 10, "height": 10, "fit": "stretch"})).contains("fit must be"));
    assert!(err(json!({"widths": [320], "fit": "cover"})).contains("fit goes with"));
    assert!(err(json!({"widths": [320], "format": "gif"})).contains("format must be"));
    assert!(err(json!({"widths": [320], "quality": 101})).contains("quality must be"));
    assert!(err(json!({"widths": [320], "format": "png", "quality": 80})).contains("not png"));
    assert!(err(json!({"widths": [320], "upscale": "yes"})).contains("upscale must be"));
    assert!(err(json!({"widths": [320], "sharpen": 1})).contains("unknown param"));
    let ok = params(json!({"widths": [320], "format": "webp", "quality": 70, "upscale": true}));
    assert_eq!(
        (ok.format, ok.quality, ok.upscale),
        (Format::Webp, 70, true)
    );
}

#[test]
fn heic_and_avif_uploads_fail_naming_their_format() {
    // The first box of an iPhone photo and of an AVIF: `ftyp` and a brand.
    let file = |brand: &[u8]| {
        let mut bytes = vec![0, 0, 0, 24];
        bytes.extend_from_slice(b"ftyp");
        bytes.extend_from_slice(brand);
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        bytes.extend_from_slice(b"mif1heic");
        bytes
    };
    let wanted = params(json!({"widths": [320]}));
    for (brand, named) in [
        (&b"heic"[..], "HEIC/HEIF"),
        (b"mif1", "HEIC/HEIF"),
        (b"avif", "AVIF"),
    ] {
        for err in [
            decode(&file(brand), DEFAULT_MAX_PIXELS).unwrap_err(),
            decode_for(&file(brand), DEFAULT_MAX_PIXELS, &wanted).unwrap_err(),
        ] {
            let StepError::Unprocessable(message) = err else {
                panic!("a permanent failure: {err:?}")
            };
            assert!(message.contains(named), "{message}");
        }
    }
    let err = decode(b"plain text, not an image", DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(err.to_string().contains("not JPEG, PNG"), "{err}");
}
