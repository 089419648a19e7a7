//! What follows a block's coefficients, as jpeg-decoder 0.3 does it (its
//! `idct.rs`, `upsampler.rs` and `decoder.rs`): the reduced IDCTs that
//! give a block at 1/8, 1/4 or 1/2 scale (from stb_image and libjpeg),
//! "fancy" chroma upsampling, and fixed-point YCbCr → RGB. Ported so that
//! `scaled` gives jpeg-decoder's pixels; the arithmetic wraps where
//! jpeg-decoder's does (`Wrapping<i32>`), so a hostile file cannot make
//! it panic either.

use super::syntax::UNZIGZAG;

/// The last zigzag position an `n`×`n` IDCT reads (n = 1, 2 or 4): the
/// coefficients after it are skipped.
pub(super) fn last_needed(n: usize) -> u32 {
    (0..64)
        .filter(|&k| {
            let natural = UNZIGZAG[k] as usize;
            natural / 8 < n && natural % 8 < n
        })
        .max()
        .unwrap_or(0) as u32
}

/// jpeg-decoder's `stbi_f2f`: a constant in 12-bit fixed point (its f32
/// and this f64 give the same integers for the constants used here).
const fn f2f(x: f64) -> i32 {
    (x * 4096.0 + 0.5) as i32
}

fn clamp(x: i32) -> u8 {
    x.clamp(0, 255) as u8
}

/// The block's `n`×`n` pixels (n = 1, 2 or 4) from its dequantised
/// coefficients (natural order), into `out` with rows `stride` apart.
pub(super) fn idct(n: usize, coefficients: &[i32; 64], stride: usize, out: &mut [u8]) {
    match n {
        1 => out[0] = clamp(coefficients[0].wrapping_add(128 * 8) / 8),
        2 => idct_2x2(coefficients, stride, out),
        _ => idct_4x4(coefficients, stride, out),
    }
}

fn idct_2x2(c: &[i32; 64], stride: usize, out: &mut [u8]) {
    const SCALE_BITS: u32 = 3;
    let round = (1 << (SCALE_BITS - 1)) + (128 << SCALE_BITS);
    let (x0, x2) = (c[0].wrapping_add(c[8]), c[0].wrapping_sub(c[8]));
    let (x1, x3) = (c[1].wrapping_add(c[9]), c[1].wrapping_sub(c[9]));
    let (x0, x2) = (x0.wrapping_add(round), x2.wrapping_add(round));
    out[0] = clamp(x0.wrapping_add(x1) >> SCALE_BITS);
    out[1] = clamp(x0.wrapping_sub(x1) >> SCALE_BITS);
    out[stride] = clamp(x2.wrapping_add(x3) >> SCALE_BITS);
    out[stride + 1] = clamp(x2.wrapping_sub(x3) >> SCALE_BITS);
}

fn idct_4x4(c: &[i32; 64], stride: usize, out: &mut [u8]) {
    const CONST_BITS: u32 = 12;
    const PASS1_BITS: u32 = 2;
    const FINAL_BITS: u32 = CONST_BITS + PASS1_BITS + 3;
    let mut temp = [0i32; 16];
    for i in 0..4 {
        let (s0, s1, s2, s3) = (c[i], c[i + 8], c[i + 16], c[i + 24]);
        let x0 = s0.wrapping_add(s2).wrapping_shl(PASS1_BITS);
        let x2 = s0.wrapping_sub(s2).wrapping_shl(PASS1_BITS);
        let p1 = s1.wrapping_add(s3).wrapping_mul(f2f(0.541196100));
        let t0 = p1
            .wrapping_add(s3.wrapping_mul(f2f(-1.847759065)))
            .wrapping_add(512)
            >> (CONST_BITS - PASS1_BITS);
        let t2 = p1
            .wrapping_add(s1.wrapping_mul(f2f(0.765366865)))
            .wrapping_add(512)
            >> (CONST_BITS - PASS1_BITS);
        temp[i] = x0.wrapping_add(t2);
        temp[i + 12] = x0.wrapping_sub(t2);
        temp[i + 4] = x2.wrapping_add(t0);
        temp[i + 8] = x2.wrapping_sub(t0);
    }
    for i in 0..4 {
        let (s0, s1, s2, s3) = (
            temp[i * 4],
            temp[i * 4 + 1],
            temp[i * 4 + 2],
            temp[i * 4 + 3],
        );
        let x0 = s0.wrapping_add(s2).wrapping_shl(CONST_BITS);
        let x2 = s0.wrapping_sub(s2).wrapping_shl(CONST_BITS);
        let p1 = s1.wrapping_add(s3).wrapping_mul(f2f(0.541196100));
        let t0 = p1.wrapping_add(s3.wrapping_mul(f2f(-1.847759065)));
        let t2 = p1.wrapping_add(s1.wrapping_mul(f2f(0.765366865)));
        let round = (1 << (FINAL_BITS - 1)) + (128 << FINAL_BITS);
        let (x0, x2) = (x0.wrapping_add(round), x2.wrapping_add(round));
        let row = &mut out[i * stride..][..4];
        row[0] = clamp(x0.wrapping_add(t2) >> FINAL_BITS);
        row[3] = clamp(x0.wrapping_sub(t2) >> FINAL_BITS);
        row[1] = clamp(x2.wrapping_add(t0) >> FINAL_BITS);
        row[2] = clamp(x2.wrapping_sub(t0) >> FINAL_BITS);
    }
}

/// One component's pixels at a reduced scale.
pub(super) struct Plane<'a> {
    pub data: &'a [u8],
    /// Its size at that scale (jpeg-decoder's component `size`), and the
    /// row stride (its blocks across, MCU padding included).
    pub width: usize,
    pub height: usize,
    pub stride: usize,
}

impl Plane<'_> {
    /// Row `row` of the output, upsampled by `h` × `v` (1 or 2 each) with
    /// jpeg-decoder's filters (`upsampler.rs`: triangle "fancy"
    /// upsampling, as libjpeg's).
    pub fn upsample_row(&self, h: usize, v: usize, row: usize, out_width: usize, out: &mut [u8]) {
        let near = if v == 2 { row / 2 } else { row };
        // The other row the vertical filter blends in: the one above for
        // even output rows, below for odd, clamped at the edges.
        let far = if v == 2 {
            if row.is_multiple_of(2) {
                near.saturating_sub(1)
            } else {
                (near + 1).min(self.height - 1)
            }
        } else {
            near
        };
        let near = &self.data[near * self.stride..];
        let far = &self.data[far * self.stride..];
        let w = self.width;
        match (h, v) {
            (1, 1) => out[..out_width].copy_from_slice(&near[..out_width]),
            (2, _) if w == 1 => {
                let value = if v == 2 {
                    ((3 * near[0] as u32 + far[0] as u32 + 2) >> 2) as u8
                } else {
                    near[0]
                };
                out[..2].fill(value);
            }
            (2, 1) => {
                let input = near;
                out[0] = input[0];
                out[1] = ((input[0] as u32 * 3 + input[1] as u32 + 2) >> 2) as u8;
                for i in 1..w - 1 {
                    let sample = 3 * input[i] as u32 + 2;
                    out[i * 2] = ((sample + input[i - 1] as u32) >> 2) as u8;
                    out[i * 2 + 1] = ((sample + input[i + 1] as u32) >> 2) as u8;
                }
                out[(w - 1) * 2] = ((input[w - 1] as u32 * 3 + input[w - 2] as u32 + 2) >> 2) as u8;
                out[(w - 1) * 2 + 1] = input[w - 1];
            }
            (1, 2) => {
                for i in 0..out_width {
                    out[i] = ((3 * near[i] as u32 + far[i] as u32 + 2) >> 2) as u8;
                }
            }
            _ => {
                let mut t1 = 3 * near[0] as u32 + far[0] as u32;
                out[0] = ((t1 + 2) >> 2) as u8;
                for i in 1..w {
                    let t0 = t1;
                    t1 = 3 * near[i] as u32 + far[i] as u32;
                    out[i * 2 - 1] = ((3 * t0 + t1 + 8) >> 4) as u8;
                    out[i * 2] = ((3 * t1 + t0 + 8) >> 4) as u8;
                }
                out[w * 2 - 1] = ((t1 + 2) >> 2) as u8;
            }
        }
    }
}

/// jpeg-decoder's YCbCr → RGB (`decoder.rs`), fixed point at 20 bits.
pub(super) fn ycbcr_to_rgb(y: u8, cb: u8, cr: u8) -> (u8, u8, u8) {
    const SHIFT: i32 = 20;
    const fn f2f(x: f32) -> i32 {
        (x * (1 << SHIFT) as f32 + 0.5) as i32
    }
    let clamp = |v: i32| (v >> SHIFT).clamp(0, 255) as u8;
    let y = y as i32 * (1 << SHIFT) + (1 << (SHIFT - 1));
    let (cb, cr) = (cb as i32 - 128, cr as i32 - 128);
    (
        clamp(y + f2f(1.40200) * cr),
        clamp(y - f2f(0.34414) * cb - f2f(0.71414) * cr),
        clamp(y + f2f(1.77200) * cb),
    )
}
