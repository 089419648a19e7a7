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
mod tests;
