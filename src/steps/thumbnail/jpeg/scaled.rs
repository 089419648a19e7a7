//! A sequential JPEG at 1/8, 1/4 or 1/2 scale, decoding only the
//! coefficients the scaled IDCT reads.
//!
//! A thumbnail of a big photo is decoded at a reduced scale through the
//! DCT (shrink-on-load): at 1/8 each 8×8 block becomes one pixel (its DC
//! coefficient), at 1/4 a 2×2 from the first 5 coefficients in zigzag
//! order, at 1/2 a 4×4 from the first 25. jpeg-decoder decodes, stores and
//! dequantises all 64 coefficients of every block whatever the scale, and
//! its bit reader takes a byte at a time; on a camera photo (~10 MB of
//! entropy-coded data at 12 MP) that was most of the thumbnail's time.
//! This module still reads every Huffman code (a code's length is known
//! only by reading it), but past the last coefficient the scale needs,
//! an AC code and its extra bits are skipped in one table lookup, with
//! nothing stored (libjpeg's `coef_limit` does the same), and the bit
//! reader takes eight bytes at a time when none is 0xFF.
//!
//! What follows the coefficients is jpeg-decoder's arithmetic, ported in
//! `reconstruct` (its reduced IDCTs, its "fancy" chroma upsampling, its
//! fixed-point YCbCr → RGB), so the pixels are jpeg-decoder's: the tests
//! compare them byte for byte, or within one level where jpeg-decoder's
//! own SIMD colour conversion rounds differently from its scalar one.
//!
//! It reads the common shape only: one sequential Huffman scan (SOF0 or
//! SOF1) holding every component, 8-bit samples, greyscale or YCbCr or RGB,
//! each component sampled at the full or half rate on each axis, restart
//! markers in order, EOI after the scan. Anything else, and any stream it
//! finds damaged (a code no table holds, a coefficient past the block's
//! end, a restart marker out of place, data that ends early), comes back
//! as `None`, and jpeg-decoder decodes the file as before: a surprise costs
//! time, never a different result.

use super::entropy::{Bits, Huffman, LUT_BITS};
use super::reconstruct::{idct, last_needed, ycbcr_to_rgb, Plane};
use super::syntax::{huffman_tables, quantisation_tables, Frame, Segments, UNZIGZAG};

/// A JPEG's pixels at a reduced scale: `ceil(width × eighths / 8)` ×
/// `ceil(height × eighths / 8)`, one byte a pixel for greyscale, three
/// (RGB) otherwise.
pub(in crate::steps::thumbnail) struct Scaled {
    pub width: u32,
    pub height: u32,
    pub grey: bool,
    pub pixels: Vec<u8>,
}

/// The JPEG at `eighths`/8 of its size (`eighths`: 1, 2 or 4), or `None`
/// when it is not the shape this module reads or its stream is damaged
/// (then jpeg-decoder decodes it). `size` is the width and height the
/// caller read from the header and checked against the pixel limit: a
/// frame of any other size is not decoded (were the two parsers ever to
/// find different frames, the unchecked one would not be allocated).
pub(in crate::steps::thumbnail) fn decode(
    jpeg: &[u8],
    eighths: usize,
    size: (u32, u32),
) -> Option<Scaled> {
    if !matches!(eighths, 1 | 2 | 4) {
        return None;
    }
    let header = Header::parse(jpeg)?;
    if (header.frame.width, header.frame.height) != (size.0 as usize, size.1 as usize) {
        return None;
    }
    let planes = planes(jpeg, &header, eighths)?;
    Some(header.pixels(&planes, eighths))
}

/// What the markers before the scan say.
struct Header {
    /// The frame, its components given their tables by the scan.
    frame: Frame,
    /// The quantisation tables, in natural order.
    quant: [Option<[u16; 64]>; 4],
    tables: [Option<Huffman>; 8],
    restart_interval: usize,
    /// Three channels stored as RGB, not YCbCr.
    rgb: bool,
    /// Where the entropy-coded data starts.
    data: usize,
}

impl Header {
    fn parse(jpeg: &[u8]) -> Option<Header> {
        let mut segments = Segments::new(jpeg)?;
        let mut quant: [Option<[u16; 64]>; 4] = [None; 4];
        let mut tables: [Option<Huffman>; 8] = Default::default();
        let mut frame: Option<Frame> = None;
        let (mut restart_interval, mut jfif, mut adobe) = (0, false, None);
        loop {
            let segment = segments.next_segment()?;
            let body = segment.body;
            match segment.marker {
                // Sequential, Huffman-coded: baseline and extended.
                0xC0 | 0xC1 if frame.is_none() => frame = Some(Frame::parse(body)?),
                // Progressive, lossless, arithmetic-coded, hierarchical; a
                // second frame; a height left to a DNL marker.
                0xC0..=0xC3 | 0xC5..=0xCF | 0xDC => return None,
                0xC4 => {
                    for spec in huffman_tables(body)? {
                        tables[spec.index] = Some(Huffman::new(&spec)?);
                    }
                }
                0xDB => {
                    for (id, table) in quantisation_tables(body)? {
                        quant[id] = Some(table);
                    }
                }
                0xDD => {
                    restart_interval = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize
                }
                0xE0 if body.starts_with(b"JFIF\0") => jfif = true,
                0xEE if body.starts_with(b"Adobe") => adobe = Some(*body.get(11)?),
                0xDA => {
                    let mut frame = frame?;
                    frame.read_scan(body)?;
                    for c in &frame.components {
                        tables[c.dc].as_ref()?;
                        tables[c.ac].as_ref()?;
                        quant[c.quant]?;
                    }
                    // How jpeg-decoder tells RGB from YCbCr
                    // (`determine_color_transform`).
                    let ids: Vec<u8> = frame.components.iter().map(|c| c.id).collect();
                    let rgb = match ids.as_slice() {
                        [_] => false,
                        [1, 2, 3] => false,
                        [82, 71, 66] => true,
                        [1, 34, 35] | [114, 103, 98] => return None,
                        [_, _, _] if jfif => false,
                        [_, _, _] => match adobe {
                            Some(0) => true,
                            None | Some(1) => false,
                            Some(_) => return None,
                        },
                        _ => return None, // CMYK, YCCK, two channels.
                    };
                    let header = Header {
                        frame,
                        quant,
                        tables,
                        restart_interval,
                        rgb,
                        data: segments.at,
                    };
                    return header.supported().then_some(header);
                }
                _ => {}
            }
        }
    }

    /// Whether the components' sampling is what `pixels` upsamples: each
    /// at the full or half rate of the largest, and the 1/8 image at
    /// least 2×2 (jpeg-decoder treats a one-pixel side differently).
    fn supported(&self) -> bool {
        let (hmax, vmax) = self.frame.max_sampling();
        let rate =
            |max: usize, factor: usize| max.is_multiple_of(factor) && matches!(max / factor, 1 | 2);
        let upsampled = self.frame.components.len() == 1
            || self
                .frame
                .components
                .iter()
                .all(|c| rate(hmax, c.h) && rate(vmax, c.v));
        upsampled && self.frame.width.div_ceil(8) >= 2 && self.frame.height.div_ceil(8) >= 2
    }

    /// Component `i`'s pixels as a plane at `eighths`/8 scale.
    fn plane<'a>(&self, planes: &'a [Vec<u8>], i: usize, eighths: usize) -> Plane<'a> {
        let c = &self.frame.components[i];
        let (hmax, vmax) = self.frame.max_sampling();
        let (mcus_x, _) = self.frame.mcus();
        Plane {
            data: &planes[i],
            width: (self.frame.width * c.h * eighths).div_ceil(hmax * 8),
            height: (self.frame.height * c.v * eighths).div_ceil(vmax * 8),
            stride: mcus_x * c.h * eighths,
        }
    }

    /// Upsampled and converted as jpeg-decoder does.
    fn pixels(&self, planes: &[Vec<u8>], eighths: usize) -> Scaled {
        let width = (self.frame.width * eighths).div_ceil(8);
        let height = (self.frame.height * eighths).div_ceil(8);
        let pixels = if self.frame.components.len() == 1 {
            let plane = self.plane(planes, 0, eighths);
            plane
                .data
                .chunks(plane.stride)
                .take(height)
                .flat_map(|row| &row[..width])
                .copied()
                .collect()
        } else if self.rgb {
            self.rows(planes, eighths, |[r, g, b], out| {
                for (x, px) in out.chunks_exact_mut(3).enumerate() {
                    px.copy_from_slice(&[r[x], g[x], b[x]]);
                }
            })
        } else {
            self.rows(planes, eighths, |[y, cb, cr], out| {
                for (x, px) in out.chunks_exact_mut(3).enumerate() {
                    let (r, g, b) = ycbcr_to_rgb(y[x], cb[x], cr[x]);
                    px.copy_from_slice(&[r, g, b]);
                }
            })
        };
        Scaled {
            width: width as u32,
            height: height as u32,
            grey: self.frame.components.len() == 1,
            pixels,
        }
    }

    /// The three channels' rows, upsampled, each handed to `write` with
    /// the output row (three bytes a pixel) it fills.
    fn rows(
        &self,
        planes: &[Vec<u8>],
        eighths: usize,
        mut write: impl FnMut([&[u8]; 3], &mut [u8]),
    ) -> Vec<u8> {
        let width = (self.frame.width * eighths).div_ceil(8);
        let height = (self.frame.height * eighths).div_ceil(8);
        let (hmax, vmax) = self.frame.max_sampling();
        let channels: Vec<(Plane, usize, usize)> = (0..3)
            .map(|i| {
                let c = &self.frame.components[i];
                (self.plane(planes, i, eighths), hmax / c.h, vmax / c.v)
            })
            .collect();
        let mut lines = vec![vec![0u8; width + 2 * hmax]; 3];
        let mut pixels = vec![0u8; width * height * 3];
        for (row, out) in pixels.chunks_exact_mut(width * 3).enumerate() {
            for ((plane, h, v), line) in channels.iter().zip(lines.iter_mut()) {
                plane.upsample_row(*h, *v, row, width, line);
            }
            write(
                [&lines[0][..width], &lines[1][..width], &lines[2][..width]],
                out,
            );
        }
        pixels
    }
}

/// Each component's pixels at `eighths`/8 scale, block by block through
/// the reduced IDCT, in planes of the scan's blocks (MCU padding
/// included); `None` if the stream is damaged.
fn planes(jpeg: &[u8], header: &Header, eighths: usize) -> Option<Vec<Vec<u8>>> {
    let components = &header.frame.components;
    let interleaved = components.len() > 1;
    let (mcus_x, mcus_y) = header.frame.mcus();
    let mut planes: Vec<Vec<u8>> = components
        .iter()
        .map(|c| vec![0u8; mcus_x * c.h * mcus_y * c.v * eighths * eighths])
        .collect();
    let mut predictors = vec![0i16; components.len()];
    let mut bits = Bits::new(jpeg.get(header.data..)?);
    let tables: Vec<(&Huffman, &Huffman, &[u16; 64])> = components
        .iter()
        .map(|c| {
            (
                header.tables[c.dc].as_ref().expect("checked in parse"),
                header.tables[c.ac].as_ref().expect("checked in parse"),
                header.quant[c.quant].as_ref().expect("checked in parse"),
            )
        })
        .collect();
    let last = last_needed(eighths);
    let mut dequantised = [0i32; 64];
    // The blocks in scan order: MCU by MCU when interleaved; otherwise the
    // one component's blocks row by row, without MCU padding (T.81 A.2.2).
    let units: Vec<(usize, usize)> = if interleaved {
        (0..mcus_y)
            .flat_map(|y| (0..mcus_x).map(move |x| (x, y)))
            .collect()
    } else {
        let c = &components[0];
        let (hmax, vmax) = header.frame.max_sampling();
        let blocks_x = (header.frame.width * c.h).div_ceil(hmax).div_ceil(8);
        let blocks_y = (header.frame.height * c.v).div_ceil(vmax).div_ceil(8);
        (0..blocks_y)
            .flat_map(|y| (0..blocks_x).map(move |x| (x, y)))
            .collect()
    };
    for (i, &(x, y)) in units.iter().enumerate() {
        if header.restart_interval > 0 && i > 0 && i % header.restart_interval == 0 {
            bits.restart(((i / header.restart_interval - 1) % 8) as u8)?;
            predictors.iter_mut().for_each(|p| *p = 0);
        }
        for (ci, c) in components.iter().enumerate() {
            let (dc_table, ac_table, quant) = tables[ci];
            let stride = mcus_x * c.h * eighths;
            let (blocks_x, blocks_y) = if interleaved { (c.h, c.v) } else { (1, 1) };
            for by in 0..blocks_y {
                for bx in 0..blocks_x {
                    let mut coefficients = [0i16; 64];
                    decode_block(
                        &mut bits,
                        dc_table,
                        ac_table,
                        &mut predictors[ci],
                        last,
                        &mut coefficients,
                    )?;
                    for n in 0..eighths {
                        for m in 0..eighths {
                            let at = n * 8 + m;
                            dequantised[at] =
                                (coefficients[at] as i32).wrapping_mul(quant[at] as i32);
                        }
                    }
                    let (px, py) = if interleaved {
                        (x * c.h + bx, y * c.v + by)
                    } else {
                        (x, y)
                    };
                    let at = py * eighths * stride + px * eighths;
                    idct(eighths, &dequantised, stride, &mut planes[ci][at..]);
                }
            }
        }
    }
    bits.at_end_of_image().then_some(planes)
}

/// One block: its DC difference, the AC coefficients up to zigzag
/// position `last` into `coefficients` (natural order), and the rest
/// skipped. `None` for what a valid stream never holds.
#[inline]
fn decode_block(
    bits: &mut Bits,
    dc: &Huffman,
    ac: &Huffman,
    predictor: &mut i16,
    last: u32,
    coefficients: &mut [i16; 64],
) -> Option<()> {
    let size = dc.decode(bits)? as u32;
    if size > 11 {
        return None;
    }
    let diff = if size == 0 {
        0
    } else {
        bits.receive_extend(size)
    };
    *predictor = predictor.wrapping_add(diff);
    coefficients[0] = *predictor;
    let mut k = 1u32;
    while k <= last {
        bits.fill();
        let entry = ac.ac[bits.peek(LUT_BITS) as usize];
        if entry.bits > 0 {
            bits.consume(entry.bits as u32);
            match (entry.step, entry.value) {
                (0, _) => return Some(()), // End of block.
                (_, 0) => k += 16,         // Sixteen zeros.
                (step, value) => {
                    k += step as u32 - 1;
                    if k > 63 {
                        return None;
                    }
                    coefficients[UNZIGZAG[k as usize] as usize] = value;
                    k += 1;
                }
            }
            continue;
        }
        let symbol = ac.decode(bits)?;
        let (run, size) = ((symbol >> 4) as u32, (symbol & 15) as u32);
        match (run, size) {
            (0, 0) => return Some(()), // End of block.
            (15, 0) => k += 16,
            (_, 0) => return None, // An EOB run: progressive only.
            _ => {
                k += run;
                if k > 63 {
                    return None;
                }
                coefficients[UNZIGZAG[k as usize] as usize] = bits.receive_extend(size);
                k += 1;
            }
        }
    }
    skip_ac(bits, ac, k)
}

/// Reads past a block's AC coefficients from zigzag position `k`.
#[inline]
fn skip_ac(bits: &mut Bits, table: &Huffman, mut k: u32) -> Option<()> {
    while k < 64 {
        bits.fill();
        let entry = table.skip[bits.peek(LUT_BITS) as usize];
        if entry.bits > 0 {
            // At most 25 bits: within the 32 that `fill` leaves.
            bits.consume(entry.bits as u32);
            if entry.step == 0 {
                return Some(()); // End of block.
            }
            k += entry.step as u32;
            continue;
        }
        let symbol = table.decode(bits)?;
        let (run, size) = ((symbol >> 4) as u32, (symbol & 15) as u32);
        match (run, size) {
            (0, 0) => return Some(()),
            (15, 0) => k += 16,
            (_, 0) => return None, // An EOB run: progressive only.
            _ => {
                bits.fill();
                bits.consume(size);
                k += run + 1;
            }
        }
    }
    // Past 64: a coefficient beyond the block's end. (jpeg-decoder ends
    // the block there, consuming its extra bits or not by which of its
    // two paths read the code: left to it.)
    (k == 64).then_some(())
}

#[cfg(test)]
mod tests {
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
    fn reference(
        jpeg: &[u8],
        eighths: u16,
        transform: Option<ColorTransform>,
    ) -> (u32, u32, Vec<u8>) {
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

    #[test]
    fn ycbcr_as_jpeg_decoder_decodes_it() {
        let samplings = [
            SamplingFactor::R_4_4_4,
            SamplingFactor::R_4_2_2,
            SamplingFactor::R_4_2_0,
            SamplingFactor::R_4_4_0,
            SamplingFactor::F_2_2,
        ];
        for sampling in samplings {
            for (width, height) in SIZES {
                for restart in [0, 3] {
                    let file = jpeg(width, height, false, |e| {
                        e.set_sampling_factor(sampling);
                        e.set_restart_interval(restart);
                    });
                    for eighths in SCALES {
                        let case = format!(
                            "{sampling:?} {width}x{height} restart {restart} at {eighths}/8"
                        );
                        check_ycbcr(&file, eighths, sampling == SamplingFactor::R_4_4_4, &case);
                    }
                }
            }
        }
    }

    fn check_ycbcr(file: &[u8], eighths: u16, unconverted: bool, case: &str) {
        let n = eighths as usize;
        if unconverted {
            // Unconverted, jpeg-decoder gives each row as its three
            // channels one after another (and cannot for subsampled
            // files: its row buffers are wider than the row).
            let header = Header::parse(file).expect(case);
            let planes = planes(file, &header, n).expect(case);
            let (w, _, expected) = reference(file, eighths, Some(ColorTransform::None));
            let ours: Vec<u8> = header
                .rows(&planes, n, |[a, b, c], out| {
                    for (x, px) in out.chunks_exact_mut(3).enumerate() {
                        px.copy_from_slice(&[a[x], b[x], c[x]]);
                    }
                })
                .chunks(3 * w as usize)
                .flat_map(|row| (0..3).flat_map(move |c| row.iter().skip(c).step_by(3)))
                .copied()
                .collect();
            assert!(ours == expected, "{case}: channels differ");
        }
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
            e.set_sampling_factor(SamplingFactor::R_4_2_0)
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
}
