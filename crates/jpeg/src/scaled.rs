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
//! A component at half the luma's sampling rate on an axis is decoded at
//! twice the luma's IDCT size on that axis (libjpeg's `DCT_h_scaled_size`):
//! at 1/2 scale a 4:2:0 chroma block gives 8×8 pixels, a 4:2:2 one 8×4.
//! Every component then comes out at the image's size, nothing is
//! upsampled, and the chroma keeps every sample its blocks hold. The IDCTs
//! and the YCbCr → RGB are jpeg-decoder's arithmetic where it has them,
//! ported in `reconstruct`, so a file whose components share one rate
//! decodes to jpeg-decoder's pixels (the tests compare them byte for
//! byte, or within one level where jpeg-decoder's own SIMD rounds
//! differently from its scalar code); a subsampled file's planes are held
//! to the exact transform of each block instead. The scan is decoded a
//! row of MCUs at a time, each row of the image converted as soon as it
//! is whole: the RGB frame is the only one held.
//!
//! It reads the common shape only: one sequential Huffman scan (SOF0 or
//! SOF1) holding every component, 8-bit samples, greyscale or YCbCr or RGB,
//! each component sampled at the full or half rate on each axis, restart
//! markers in order, EOI after the scan. Anything else, and any stream it
//! finds damaged (a code no table holds, a coefficient past the block's
//! end, a restart marker out of place, data that ends early), comes back
//! as `None`, and jpeg-decoder decodes the file: a surprise costs time, and
//! (for a subsampled file) its chroma is then upsampled, at the larger
//! scale the caller picks for that.

use super::entropy::{Bits, Huffman, LUT_BITS};
use super::reconstruct::{idct, last_needed, ycbcr_row_to_rgb};
use super::syntax::{huffman_tables, quantisation_tables, Frame, Segments, UNZIGZAG};

/// A JPEG's pixels at a reduced scale: `ceil(width × eighths / 8)` ×
/// `ceil(height × eighths / 8)`, one byte a pixel for greyscale, three
/// (RGB) otherwise.
pub struct Scaled {
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
pub fn decode(jpeg: &[u8], eighths: usize, size: (u32, u32)) -> Option<Scaled> {
    if !matches!(eighths, 1 | 2 | 4) {
        return None;
    }
    let header = Header::parse(jpeg)?;
    if (header.frame.width, header.frame.height) != (size.0 as usize, size.1 as usize) {
        return None;
    }
    let (width, height) = header.size(eighths);
    let grey = header.frame.components.len() == 1;
    let channels = if grey { 1 } else { 3 };
    let mut pixels = vec![0u8; width * height * channels];
    let mut rows = pixels.chunks_exact_mut(width * channels);
    header.decode_rows(jpeg, eighths, |samples| {
        let out = rows.next().expect("one output row for each row decoded");
        match samples {
            [grey] => out.copy_from_slice(grey),
            [r, g, b] if header.rgb => {
                for (((r, g), b), px) in r.iter().zip(*g).zip(*b).zip(out.chunks_exact_mut(3)) {
                    px.copy_from_slice(&[*r, *g, *b]);
                }
            }
            [y, cb, cr] => ycbcr_row_to_rgb(y, cb, cr, out),
            _ => unreachable!("one or three components (Header::parse)"),
        }
    })?;
    Some(Scaled {
        width: width as u32,
        height: height as u32,
        grey,
        pixels,
    })
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

    /// Whether the components' sampling is what `planes` decodes: each
    /// at the full or half rate of the largest on each axis, and the 1/8
    /// image at least 2×2 (jpeg-decoder treats a one-pixel side
    /// differently).
    fn supported(&self) -> bool {
        let (hmax, vmax) = self.frame.max_sampling();
        let rate =
            |max: usize, factor: usize| max.is_multiple_of(factor) && matches!(max / factor, 1 | 2);
        let sampled = self.frame.components.len() == 1
            || self
                .frame
                .components
                .iter()
                .all(|c| rate(hmax, c.h) && rate(vmax, c.v));
        sampled && self.frame.width.div_ceil(8) >= 2 && self.frame.height.div_ceil(8) >= 2
    }

    /// The pixels component `i`'s blocks each give at `eighths`/8 scale
    /// (1, 2 or 4), across and down: `eighths` for a component at the
    /// full rate, twice that on an axis where it is at half the rate. So
    /// every component comes out at the image's size, with nothing to
    /// upsample (libjpeg scales a subsampled component's IDCT the same
    /// way, `DCT_h_scaled_size`), and a half-rate chroma keeps every
    /// sample its blocks have down to 1/4 scale.
    fn block_size(&self, i: usize, eighths: usize) -> (usize, usize) {
        let c = &self.frame.components[i];
        let (hmax, vmax) = self.frame.max_sampling();
        (eighths * hmax / c.h, eighths * vmax / c.v)
    }

    /// The image's size at `eighths`/8: each side rounded up (libjpeg).
    fn size(&self, eighths: usize) -> (usize, usize) {
        (
            (self.frame.width * eighths).div_ceil(8),
            (self.frame.height * eighths).div_ceil(8),
        )
    }

    /// The decode's row stride: the MCUs across at `eighths`/8 scale,
    /// the same for every component.
    fn stride(&self, eighths: usize) -> usize {
        let (hmax, _) = self.frame.max_sampling();
        self.frame.mcus().0 * hmax * eighths
    }

    /// The scan's units (T.81 A.2): its MCUs when it interleaves the
    /// components, else the one component's blocks without MCU padding
    /// (A.2.2); how many across and down, and the rows of pixels each
    /// row of them gives at `eighths`/8.
    fn units(&self, eighths: usize) -> (usize, usize, usize) {
        let (hmax, vmax) = self.frame.max_sampling();
        if let [c] = self.frame.components.as_slice() {
            let across = (self.frame.width * c.h).div_ceil(hmax).div_ceil(8);
            let down = (self.frame.height * c.v).div_ceil(vmax).div_ceil(8);
            (across, down, eighths)
        } else {
            let (across, down) = self.frame.mcus();
            (across, down, vmax * eighths)
        }
    }
}

impl Header {
    /// Decodes the scan at `eighths`/8 scale, block by block through each
    /// component's IDCT, a row of units at a time, and hands `row` each
    /// row of the image in order, top to bottom, as its components'
    /// samples (each as wide as the image). `None` if the stream is
    /// damaged, which may be found after rows were handed on.
    fn decode_rows(
        &self,
        jpeg: &[u8],
        eighths: usize,
        mut row: impl FnMut(&[&[u8]]),
    ) -> Option<()> {
        let components = &self.frame.components;
        let interleaved = components.len() > 1;
        let (width, height) = self.size(eighths);
        let stride = self.stride(eighths);
        let (units_x, units_y, band) = self.units(eighths);
        // One row of units' pixels, for each component.
        let mut bands = vec![vec![0u8; stride * band]; components.len()];
        // Each component's tables, block size and the last coefficient it
        // reads.
        let setup: Vec<_> = components
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (w, h) = self.block_size(i, eighths);
                (
                    self.tables[c.dc].as_ref().expect("checked in parse"),
                    self.tables[c.ac].as_ref().expect("checked in parse"),
                    self.quant[c.quant].as_ref().expect("checked in parse"),
                    (w, h),
                    last_needed(w, h),
                )
            })
            .collect();
        let mut predictors = vec![0i16; components.len()];
        let mut bits = Bits::new(jpeg.get(self.data..)?);
        for uy in 0..units_y {
            for ux in 0..units_x {
                let i = uy * units_x + ux;
                if self.restart_interval > 0 && i > 0 && i % self.restart_interval == 0 {
                    bits.restart(((i / self.restart_interval - 1) % 8) as u8)?;
                    predictors.iter_mut().for_each(|p| *p = 0);
                }
                for (ci, c) in components.iter().enumerate() {
                    let (dc_table, ac_table, quant, (w, h), last) = setup[ci];
                    let (blocks_x, blocks_y) = if interleaved { (c.h, c.v) } else { (1, 1) };
                    for by in 0..blocks_y {
                        for bx in 0..blocks_x {
                            let mut dequantised = [0i32; 64];
                            decode_block(
                                &mut bits,
                                (dc_table, ac_table, quant),
                                &mut predictors[ci],
                                last,
                                &mut dequantised,
                            )?;
                            let at = by * h * stride + (ux * blocks_x + bx) * w;
                            idct((w, h), &dequantised, stride, &mut bands[ci][at..]);
                        }
                    }
                }
            }
            for y in (uy * band..(uy + 1) * band).take_while(|&y| y < height) {
                let at = (y - uy * band) * stride;
                let samples: [&[u8]; 3] = std::array::from_fn(|c| {
                    bands.get(c).map_or(&[][..], |band| &band[at..at + width])
                });
                row(&samples[..components.len()]);
            }
        }
        bits.at_end_of_image().then_some(())
    }
}

/// One block: its DC difference, the AC coefficients up to zigzag
/// position `last` dequantised by `quant` into `coefficients` (natural
/// order), and the rest skipped. `None` for what a valid stream never
/// holds.
#[inline]
fn decode_block(
    bits: &mut Bits,
    (dc, ac, quant): (&Huffman, &Huffman, &[u16; 64]),
    predictor: &mut i16,
    last: u32,
    coefficients: &mut [i32; 64],
) -> Option<()> {
    // Natural order's index of zigzag position `k` (< 64).
    let natural = |k: u32| UNZIGZAG[k as usize & 63] as usize & 63;
    let dequantise = |value: i16, at: usize| (value as i32).wrapping_mul(quant[at] as i32);
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
    coefficients[0] = dequantise(*predictor, 0);
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
                    let at = natural(k);
                    coefficients[at] = dequantise(value, at);
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
                let at = natural(k);
                coefficients[at] = dequantise(bits.receive_extend(size), at);
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
    fn exact_idct(
        zigzag: &[i16; 64],
        quant: &[u16; 64],
        (width, height): (usize, usize),
    ) -> Vec<f64> {
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
}
