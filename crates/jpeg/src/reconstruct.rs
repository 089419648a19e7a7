//! What follows a block's coefficients: its pixels at a reduced scale
//! through the IDCT, and YCbCr → RGB.
//!
//! The square IDCTs (1×1, 2×2, 4×4 and 8×8 pixels from a block) and the
//! colour conversion are jpeg-decoder 0.3's (its `idct.rs` and
//! `decoder.rs`: stb_image's 8×8, Dugad and Ahuja's 4×4 and 2×2), ported
//! so that a file whose components share one sampling rate decodes to
//! jpeg-decoder's pixels. A subsampled component is decoded at a larger
//! scale than the luma instead of upsampled after (libjpeg's
//! `DCT_h_scaled_size`): a 4:2:2 chroma block gives twice as many pixels
//! across as down, which takes the rectangular IDCTs, `idct_separable`.
//! The arithmetic wraps where jpeg-decoder's does (`Wrapping<i32>`), so a
//! hostile file cannot make it panic either.

use super::syntax::UNZIGZAG;

/// The last zigzag position a `width`×`height` IDCT reads (each 1, 2, 4
/// or 8): the coefficients after it are skipped.
pub(super) fn last_needed(width: usize, height: usize) -> u32 {
    (0..64)
        .filter(|&k| {
            let natural = UNZIGZAG[k] as usize;
            natural / 8 < height && natural % 8 < width
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

/// The block's `width`×`height` pixels (each 1, 2, 4 or 8) from its
/// dequantised coefficients (natural order), into `out` with rows
/// `stride` apart.
pub(super) fn idct(
    (width, height): (usize, usize),
    coefficients: &[i32; 64],
    stride: usize,
    out: &mut [u8],
) {
    match (width, height) {
        (1, 1) => out[0] = clamp(coefficients[0].wrapping_add(128 * 8) / 8),
        (2, 2) => idct_2x2(coefficients, stride, out),
        (4, 4) => idct_4x4(coefficients, stride, out),
        (8, 8) => idct_8x8(coefficients, stride, out),
        _ => idct_separable((width, height), coefficients, stride, out),
    }
}

/// stb_image's 8×8 IDCT as jpeg-decoder's scalar path has it
/// (`dequantize_and_idct_block_8x8_inner`): columns, then rows, each
/// pass on eight lanes at once (all columns, then all rows) so that the
/// compiler can use vector registers. The scalar code's shortcuts for a
/// column or row whose AC terms are all zero give what the butterfly
/// gives for them, so taking none changes no pixel.
fn idct_8x8(c: &[i32; 64], stride: usize, out: &mut [u8]) {
    // Row k of the coefficients: lane i is column i's k-th term.
    let rows: [Lanes; 8] = std::array::from_fn(|k| lanes(|i| c[8 * k + i]));
    // The constants scale by 1 << 12: back down, keeping two bits.
    let (xs, ts) = butterfly(&rows, 512);
    let mut temp = [[0i32; 8]; 8];
    for k in 0..4 {
        temp[k] = lanes(|i| xs[k][i].wrapping_add(ts[3 - k][i]) >> 10);
        temp[7 - k] = lanes(|i| xs[k][i].wrapping_sub(ts[3 - k][i]) >> 10);
    }
    // Transposed: lane r is row r's k-th term.
    let columns: [Lanes; 8] = std::array::from_fn(|k| lanes(|r| temp[r][k]));
    // 1 << 12 from the constants, 1 << 2 kept from the columns, 1 << 3
    // from the two passes' sqrt(8) each: 17 bits, rounded, and 128 added.
    let (xs, ts) = butterfly(&columns, 65536 + (128 << 17));
    let mut pixels = [[0u8; 8]; 8];
    for k in 0..4 {
        let (left, right) = (
            lanes(|r| xs[k][r].wrapping_add(ts[3 - k][r]) >> 17),
            lanes(|r| xs[k][r].wrapping_sub(ts[3 - k][r]) >> 17),
        );
        for r in 0..8 {
            pixels[r][k] = clamp(left[r]);
            pixels[r][7 - k] = clamp(right[r]);
        }
    }
    for (r, row) in pixels.iter().enumerate() {
        out[r * stride..][..8].copy_from_slice(row);
    }
}

/// Eight lanes of one term.
type Lanes = [i32; 8];

/// Lane by lane, as plain loops over arrays, which the compiler turns
/// into vector operations.
#[inline(always)]
fn lanes(mut f: impl FnMut(usize) -> i32) -> Lanes {
    let mut out = [0i32; 8];
    for (i, lane) in out.iter_mut().enumerate() {
        *lane = f(i);
    }
    out
}

#[inline(always)]
fn add(a: Lanes, b: Lanes) -> Lanes {
    lanes(|i| a[i].wrapping_add(b[i]))
}

#[inline(always)]
fn sub(a: Lanes, b: Lanes) -> Lanes {
    lanes(|i| a[i].wrapping_sub(b[i]))
}

#[inline(always)]
fn mul(a: Lanes, k: i32) -> Lanes {
    lanes(|i| a[i].wrapping_mul(k))
}

/// stb_image's 8-point butterfly on eight lanes: `s[k]` holds each lane's
/// k-th input. The even part (`x0..x3`, `x_scale` added) and the odd part
/// (`t0..t3`), combined by the caller as `x[k] ± t[3 - k]`.
#[inline(always)]
fn butterfly(s: &[Lanes; 8], x_scale: i32) -> ([Lanes; 4], [Lanes; 4]) {
    const K: [i32; 12] = [
        f2f(0.5411961),
        f2f(-1.847759065),
        f2f(0.765366865),
        f2f(1.175875602),
        f2f(-0.899976223),
        f2f(-2.562915447),
        f2f(-1.961570560),
        f2f(-0.390180644),
        f2f(0.298631336),
        f2f(2.053119869),
        f2f(3.072711026),
        f2f(1.501321110),
    ];
    let p1 = mul(add(s[2], s[6]), K[0]);
    let t2 = add(p1, mul(s[6], K[1]));
    let t3 = add(p1, mul(s[2], K[2]));
    let t0 = lanes(|i| s[0][i].wrapping_add(s[4][i]).wrapping_shl(12));
    let t1 = lanes(|i| s[0][i].wrapping_sub(s[4][i]).wrapping_shl(12));
    let scale = |a: Lanes| lanes(|i| a[i].wrapping_add(x_scale));
    let xs = [
        scale(add(t0, t3)),
        scale(add(t1, t2)),
        scale(sub(t1, t2)),
        scale(sub(t0, t3)),
    ];
    let (o0, o1, o2, o3) = (s[7], s[5], s[3], s[1]);
    let p3 = add(o0, o2);
    let p4 = add(o1, o3);
    let p5 = mul(add(p3, p4), K[3]);
    let p1 = add(p5, mul(add(o0, o3), K[4]));
    let p2 = add(p5, mul(add(o1, o2), K[5]));
    let p3 = mul(p3, K[6]);
    let p4 = mul(p4, K[7]);
    let ts = [
        add(add(mul(o0, K[8]), p1), p3),
        add(add(mul(o1, K[9]), p2), p4),
        add(add(mul(o2, K[10]), p2), p3),
        add(add(mul(o3, K[11]), p1), p4),
    ];
    (xs, ts)
}

/// The IDCT of a block's top-left `height`×`width` coefficients, each
/// side 1, 2, 4 or 8: the block's picture sampled at the centres of a
/// `width`×`height` grid (libjpeg's reduced IDCTs give the same), for the
/// rectangular sizes a subsampled component needs. Row by row through
/// the `width`-point transform, then column by column through the
/// `height`-point one, in fixed point at 12 bits (`SEPARABLE`), 64-bit
/// so that no coefficient a file can hold overflows.
fn idct_separable((width, height): (usize, usize), c: &[i32; 64], stride: usize, out: &mut [u8]) {
    const PASS1_BITS: u32 = 2;
    let (across, down) = (
        &SEPARABLE[width.trailing_zeros() as usize],
        &SEPARABLE[height.trailing_zeros() as usize],
    );
    let mut rows = [0i64; 64];
    for v in 0..height {
        for x in 0..width {
            let sum: i64 = (0..width)
                .map(|u| c[v * 8 + u] as i64 * across[x][u] as i64)
                .sum();
            rows[v * 8 + x] = (sum + (1 << (11 - PASS1_BITS))) >> (12 - PASS1_BITS);
        }
    }
    const FINAL_BITS: u32 = 12 + PASS1_BITS;
    let round = (1i64 << (FINAL_BITS - 1)) + (128i64 << FINAL_BITS);
    for y in 0..height {
        for x in 0..width {
            let sum: i64 = (0..height)
                .map(|v| rows[v * 8 + x] * down[y][v] as i64)
                .sum();
            out[y * stride + x] = ((sum + round) >> FINAL_BITS).clamp(0, 255) as u8;
        }
    }
}

/// For n = 1, 2, 4 and 8: the n-point IDCT's matrix, `[x][u]` =
/// C(u)/2 · cos((2x + 1)uπ / 2n) with C(0) = 1/√2, at 12 bits. The two
/// halves' 1/2 and the two C(0)s give a DC coefficient of D the pixel
/// D/8, at every size.
static SEPARABLE: std::sync::LazyLock<[[[i32; 8]; 8]; 4]> = std::sync::LazyLock::new(|| {
    std::array::from_fn(|log| {
        let n = 1usize << log;
        std::array::from_fn(|x| {
            std::array::from_fn(|u| {
                if x >= n || u >= n {
                    return 0;
                }
                let c = if u == 0 {
                    std::f64::consts::FRAC_1_SQRT_2
                } else {
                    1.0
                };
                let angle = (2 * x + 1) as f64 * u as f64 * std::f64::consts::PI / (2 * n) as f64;
                (c / 2.0 * angle.cos() * 4096.0).round() as i32
            })
        })
    })
});

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

/// jpeg-decoder's YCbCr → RGB (`decoder.rs`), fixed point at 20 bits: the
/// definition `ycbcr_row_to_rgb` is held to.
#[cfg(test)]
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

/// `ycbcr_to_rgb` over a row (`out`: three bytes a pixel), by tables:
/// the same integers, as y·2²⁰ is a whole multiple of the shift, so
/// `(y·2²⁰ + t) >> 20` is `y + (t >> 20)`, and each term of `t` depends
/// on one of Cb and Cr.
pub(super) fn ycbcr_row_to_rgb(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    let t = &*COLOUR_TABLES;
    for (((y, cb), cr), px) in y.iter().zip(cb).zip(cr).zip(out.chunks_exact_mut(3)) {
        let (y, cb, cr) = (*y as i32, *cb as usize, *cr as usize);
        px[0] = (y + t.r_cr[cr]).clamp(0, 255) as u8;
        px[1] = (y + ((t.g_cb[cb] + t.g_cr[cr]) >> 20)).clamp(0, 255) as u8;
        px[2] = (y + t.b_cb[cb]).clamp(0, 255) as u8;
    }
}

struct ColourTables {
    /// R − Y by Cr, B − Y by Cb (shifted); G's two terms (unshifted,
    /// the rounding in Cb's).
    r_cr: [i32; 256],
    b_cb: [i32; 256],
    g_cb: [i32; 256],
    g_cr: [i32; 256],
}

static COLOUR_TABLES: std::sync::LazyLock<ColourTables> = std::sync::LazyLock::new(|| {
    const SHIFT: i32 = 20;
    let f2f = |x: f32| (x * (1 << SHIFT) as f32 + 0.5) as i32;
    let half = 1 << (SHIFT - 1);
    ColourTables {
        r_cr: std::array::from_fn(|c| (half + f2f(1.40200) * (c as i32 - 128)) >> SHIFT),
        b_cb: std::array::from_fn(|c| (half + f2f(1.77200) * (c as i32 - 128)) >> SHIFT),
        g_cb: std::array::from_fn(|c| half - f2f(0.34414) * (c as i32 - 128)),
        g_cr: std::array::from_fn(|c| -f2f(0.71414) * (c as i32 - 128)),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables give `ycbcr_to_rgb`'s integers, for every Cb and Cr
    /// with the Ys where clamping and rounding turn.
    #[test]
    fn the_row_conversion_is_the_pixel_conversion() {
        let ys = [0u8, 1, 2, 16, 100, 127, 128, 129, 200, 235, 253, 254, 255];
        for cb in 0..=255u8 {
            for cr in 0..=255u8 {
                let row = ys.len();
                let mut out = vec![0u8; row * 3];
                ycbcr_row_to_rgb(&ys, &[cb; 13], &[cr; 13], &mut out);
                for (x, &y) in ys.iter().enumerate() {
                    let (r, g, b) = ycbcr_to_rgb(y, cb, cr);
                    assert_eq!(out[x * 3..x * 3 + 3], [r, g, b], "{y} {cb} {cr}");
                }
            }
        }
    }
}
