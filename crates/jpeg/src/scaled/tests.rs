//! `scaled` held to jpeg-decoder's pixels where its arithmetic is
//! jpeg-decoder's, to the exact transform of each block where a chroma is
//! subsampled, and to what damaged and unsupported files must give.

use super::super::reconstruct::ycbcr_to_rgb;
use super::super::syntax::UNZIGZAG;
use super::*;
use jpeg_decoder::ColorTransform;
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

/// Gradients and noise: every block has a DC of its own and AC codes of
/// every length, to keep or to skip.
fn picture(width: u16, height: u16, channels: usize) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut state = 0x2545_f491_u32;
    (0..w * h * channels)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let (x, y, c) = ((i / channels) % w, (i / channels) / w, i % channels);
            (x * 150 / w + y * 50 / h + c * 12 + (state % 36) as usize).min(255) as u8
        })
        .collect()
}

fn jpeg(
    width: u16,
    height: u16,
    grey: bool,
    set: impl FnOnce(&mut Encoder<&mut Vec<u8>>),
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = Encoder::new(&mut out, 85);
    set(&mut encoder);
    let (pixels, colour) = if grey {
        (picture(width, height, 1), ColorType::Luma)
    } else {
        (picture(width, height, 3), ColorType::Rgb)
    };
    encoder
        .encode(&pixels, width, height, colour)
        .expect("encodes");
    out
}

/// jpeg-decoder at `eighths`/8 scale, its colour transform forced or
/// not.
fn reference(jpeg: &[u8], eighths: u16, transform: Option<ColorTransform>) -> (u32, u32, Vec<u8>) {
    let mut decoder = jpeg_decoder::Decoder::new(jpeg);
    if let Some(transform) = transform {
        decoder.set_color_transform(transform);
    }
    decoder.read_info().expect("a header");
    let info = decoder.info().expect("read");
    let (w, h) = decoder
        .scale(
            (info.width * eighths).div_ceil(8),
            (info.height * eighths).div_ceil(8),
        )
        .expect("scales");
    (w as u32, h as u32, decoder.decode().expect("decodes"))
}

const SIZES: [(u16, u16); 4] = [(203, 157), (64, 48), (9, 17), (17, 9)];

/// `super::decode` with the size from the file's own header, as the
/// caller reads it.
fn decode(jpeg: &[u8], eighths: usize) -> Option<Scaled> {
    let size = Header::parse(jpeg)
        .map(|h| (h.frame.width as u32, h.frame.height as u32))
        .unwrap_or((0, 0));
    super::decode(jpeg, eighths, size)
}
const SCALES: [u16; 3] = [1, 2, 4];

/// Files whose components share one sampling rate decode to
/// jpeg-decoder's pixels at every scale.
#[test]
fn one_rate_ycbcr_as_jpeg_decoder_decodes_it() {
    for (width, height) in SIZES {
        for restart in [0, 3] {
            let file = jpeg(width, height, false, |e| {
                e.set_sampling_factor(SamplingFactor::R_4_4_4);
                e.set_restart_interval(restart);
            });
            for eighths in SCALES {
                let case = format!("4:4:4 {width}x{height} restart {restart} at {eighths}/8");
                check_ycbcr(&file, eighths, &case);
            }
        }
    }
}

/// Each component's samples at `eighths`/8 as `decode_rows` hands
/// them on, a plane each, rows as wide as the image.
fn planes(file: &[u8], header: &Header, eighths: usize) -> Option<Vec<Vec<u8>>> {
    let mut planes = vec![Vec::new(); header.frame.components.len()];
    header.decode_rows(file, eighths, |rows| {
        for (plane, row) in planes.iter_mut().zip(rows) {
            plane.extend_from_slice(row);
        }
    })?;
    let (width, height) = header.size(eighths);
    assert!(planes.iter().all(|p| p.len() == width * height));
    Some(planes)
}

/// The planes interleaved as jpeg-decoder gives an unconverted image:
/// a pixel's three channels together.
fn interleaved(planes: &[Vec<u8>]) -> Vec<u8> {
    (0..planes[0].len())
        .flat_map(|at| (0..3).map(move |c| (at, c)))
        .map(|(at, c)| planes[c][at])
        .collect()
}

fn check_ycbcr(file: &[u8], eighths: u16, case: &str) {
    let n = eighths as usize;
    let header = Header::parse(file).expect(case);
    let planes = planes(file, &header, n).expect(case);
    // Unconverted, jpeg-decoder gives each row as its three channels
    // one after another.
    let (w, _, expected) = reference(file, eighths, Some(ColorTransform::None));
    let ours: Vec<u8> = interleaved(&planes)
        .chunks(3 * w as usize)
        .flat_map(|row| (0..3).flat_map(move |c| row.iter().skip(c).step_by(3)))
        .copied()
        .collect();
    assert!(ours == expected, "{case}: channels differ");
    // jpeg-decoder's YCbCr → RGB has SIMD paths (SSSE3, Neon) that
    // round differently from its scalar one, which is ours: within one
    // level, and rarely off.
    let ours = decode(file, n).expect(case);
    let (w, h, expected) = reference(file, eighths, None);
    assert_eq!(
        (ours.width, ours.height, ours.grey),
        (w, h, false),
        "{case}"
    );
    assert!(
        ours.pixels
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.abs_diff(*b) <= 1),
        "{case}: RGB differs by more than one level"
    );
    let off = ours
        .pixels
        .iter()
        .zip(&expected)
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        off * 20 <= expected.len(),
        "{case}: {off} values off by one"
    );
}

/// A block's `width`×`height` pixels by the definition, in floating
/// point: the picture its top-left coefficients describe, sampled at
/// the centres of a `width`×`height` grid.
fn exact_idct(zigzag: &[i16; 64], quant: &[u16; 64], (width, height): (usize, usize)) -> Vec<f64> {
    let mut natural = [0f64; 64];
    for (k, &at) in UNZIGZAG.iter().enumerate() {
        natural[at as usize] = zigzag[k] as f64 * quant[at as usize] as f64;
    }
    let basis = |x: usize, u: usize, n: usize| {
        let c = if u == 0 {
            std::f64::consts::FRAC_1_SQRT_2
        } else {
            1.0
        };
        c / 2.0 * ((2 * x + 1) as f64 * u as f64 * std::f64::consts::PI / (2 * n) as f64).cos()
    };
    (0..height)
        .flat_map(|y| (0..width).map(move |x| (x, y)))
        .map(|(x, y)| {
            let mut sum = 128.0;
            for v in 0..height {
                for u in 0..width {
                    sum += natural[v * 8 + u] * basis(x, u, width) * basis(y, v, height);
                }
            }
            sum.round().clamp(0.0, 255.0)
        })
        .collect()
}

/// A subsampled file's chroma is decoded at the luma's scale through a
/// larger IDCT, not upsampled: every plane at every scale is the
/// exact transform of its blocks, within the fixed point's level, and
/// the image is those planes converted.
#[test]
fn subsampled_chroma_is_its_blocks_transform_at_the_images_scale() {
    let samplings = [
        (SamplingFactor::R_4_2_2, (2, 1)),
        (SamplingFactor::R_4_2_0, (2, 2)),
        (SamplingFactor::R_4_4_0, (1, 2)),
    ];
    for (sampling, (rh, rv)) in samplings {
        for (width, height) in SIZES {
            let file = jpeg(width, height, false, |e| e.set_sampling_factor(sampling));
            let header = Header::parse(&file).expect("a header");
            let blocks = super::super::coefficients::Baseline::read(&file).expect("baseline");
            for eighths in [1, 2, 4] {
                let case = format!("{sampling:?} {width}x{height} at {eighths}/8");
                let planes = planes(&file, &header, eighths).expect(&case);
                let (width, height) = header.size(eighths);
                for (ci, c) in header.frame.components.iter().enumerate() {
                    let (bw, bh) = header.block_size(ci, eighths);
                    let expected = if ci == 0 {
                        (eighths, eighths)
                    } else {
                        (eighths * rh, eighths * rv)
                    };
                    assert_eq!((bw, bh), expected, "{case}: component {ci}");
                    let quant = header.quant[c.quant].as_ref().expect("a table");
                    let grid = &blocks.planes[ci];
                    let mut worst = 0.0f64;
                    for (b, block) in grid.blocks.iter().enumerate() {
                        let (bx, by) = (b % grid.stride, b / grid.stride);
                        let exact = exact_idct(block, quant, (bw, bh));
                        for y in 0..bh {
                            for x in 0..bw {
                                let (px, py) = (bx * bw + x, by * bh + y);
                                if px < width && py < height {
                                    let ours = planes[ci][py * width + px];
                                    worst = worst.max((ours as f64 - exact[y * bw + x]).abs());
                                }
                            }
                        }
                    }
                    assert!(worst <= 1.0, "{case}: component {ci} off by {worst}");
                }
                let image = decode(&file, eighths).expect(&case);
                let converted: Vec<u8> = interleaved(&planes)
                    .chunks(3)
                    .flat_map(|p| {
                        let (r, g, b) = ycbcr_to_rgb(p[0], p[1], p[2]);
                        [r, g, b]
                    })
                    .collect();
                assert!(
                    image.pixels == converted,
                    "{case}: not the planes converted"
                );
            }
        }
    }
}

/// The 8×8 IDCT a half-rate chroma takes at 1/2 scale is
/// jpeg-decoder's scalar one (stb_image's): a greyscale file decoded
/// whole agrees with jpeg-decoder's, whose SSSE3 and Neon IDCTs round
/// differently from its scalar one, within one level and rarely off.
#[test]
fn the_eight_point_idct_is_jpeg_decoders() {
    for (width, height) in SIZES {
        let file = jpeg(width, height, true, |e| e.set_restart_interval(2));
        let header = Header::parse(&file).expect("a header");
        let ours = planes(&file, &header, 8).expect("decodes").remove(0);
        let expected = reference(&file, 8, None).2;
        assert_eq!(ours.len(), expected.len());
        let off = ours.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert!(
            ours.iter().zip(&expected).all(|(a, b)| a.abs_diff(*b) <= 1)
                && off * 20 <= expected.len(),
            "{width}x{height} at full size: {off} values off"
        );
    }
}

#[test]
fn greyscale_and_rgb_to_the_byte() {
    for (width, height) in SIZES {
        let file = jpeg(width, height, true, |e| e.set_restart_interval(2));
        for eighths in SCALES {
            let ours = decode(&file, eighths as usize).expect("greyscale");
            assert!(ours.grey);
            let expected = reference(&file, eighths, None).2;
            assert!(
                ours.pixels == expected,
                "{width}x{height} greyscale at {eighths}/8"
            );
        }
    }
    // An RGB JPEG (no colour transform), named by its component ids as
    // libjpeg writes one: 'R', 'G', 'B'.
    let mut file = jpeg(203, 157, false, |e| {
        e.set_sampling_factor(SamplingFactor::R_4_4_4)
    });
    let sof = file
        .windows(2)
        .position(|m| m == [0xFF, 0xC0])
        .expect("SOF0");
    let sos = file
        .windows(2)
        .position(|m| m == [0xFF, 0xDA])
        .expect("SOS");
    for (i, id) in b"RGB".iter().enumerate() {
        file[sof + 10 + 3 * i] = *id;
        file[sos + 5 + 2 * i] = *id;
    }
    for eighths in SCALES {
        let ours = decode(&file, eighths as usize).expect("RGB");
        let expected = reference(&file, eighths, None).2;
        assert!(ours.pixels == expected, "RGB at {eighths}/8 differs");
    }
}

#[test]
fn other_shapes_are_left_to_jpeg_decoder() {
    let shapes: [(&str, Vec<u8>); 5] = [
        (
            "progressive",
            jpeg(64, 48, false, |e| e.set_progressive(true)),
        ),
        ("4:1:1, chroma at a quarter", {
            jpeg(64, 48, false, |e| {
                e.set_sampling_factor(SamplingFactor::R_4_1_1)
            })
        }),
        ("one scan per component", {
            jpeg(64, 48, false, |e| e.set_optimized_huffman_tables(true))
        }),
        ("CMYK", {
            let mut out = Vec::new();
            Encoder::new(&mut out, 85)
                .encode(&picture(64, 48, 4), 64, 48, ColorType::Cmyk)
                .expect("encodes");
            out
        }),
        (
            "8 pixels wide: one pixel at 1/8",
            jpeg(8, 48, false, |_| {}),
        ),
    ];
    for (shape, file) in shapes {
        for eighths in SCALES {
            assert!(decode(&file, eighths as usize).is_none(), "{shape}");
        }
        assert!(
            reference(&file, 1, None).2.len() > 1,
            "{shape}: jpeg-decoder reads it"
        );
    }
    let file = jpeg(64, 48, false, |_| {});
    assert!(decode(&file, 8).is_none(), "full size is jpeg-decoder's");
    assert!(
        super::decode(&file, 2, (64, 49)).is_none(),
        "a frame of another size than the caller checked"
    );
}

#[test]
fn damaged_streams_are_left_to_jpeg_decoder() {
    let file = jpeg(203, 157, false, |e| e.set_restart_interval(4));
    assert!(decode(&file, 2).is_some());
    let data = Header::parse(&file).expect("a header").data;
    let eoi = file.len() - 2;

    let cut = [&file[..(data + eoi) / 2], &[0xFF, 0xD9]].concat();
    let rst = file[data..]
        .windows(2)
        .position(|m| m == [0xFF, 0xD0])
        .expect("RST0")
        + data;
    let mut renumbered = file.clone();
    renumbered[rst + 1] = 0xD3;
    let second_scan = [&file[..eoi], &file[data - 14..]].concat();
    for eighths in [1, 2, 4] {
        assert!(decode(&cut, eighths).is_none(), "cut short");
        assert!(
            decode(&renumbered, eighths).is_none(),
            "a restart marker out of order"
        );
        assert!(
            decode(&second_scan, eighths).is_none(),
            "a second scan after the first"
        );
    }

    // Random damage: never a panic, and a result only of the right size.
    let mut state = 0x9e37_79b9_u32;
    for i in 0..600 {
        let mut damaged = file.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let at = data + state as usize % (eoi - data);
            damaged[at] ^= 1 << (state >> 29);
        }
        let eighths = [1, 2, 4][i % 3];
        if let Some(image) = decode(&damaged, eighths) {
            let (w, h) = ((203 * eighths).div_ceil(8), (157 * eighths).div_ceil(8));
            assert_eq!(image.pixels.len(), w * h * 3);
        }
    }
}
