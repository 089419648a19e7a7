//! Optimal Huffman tables for a baseline JPEG, keeping its one interleaved
//! scan (what `jpegtran -optimize` does to a baseline file).
//!
//! jpeg-encoder writes Annex K's example tables, or optimised ones only
//! with one scan per component, which zune-jpeg 0.5.15 (the `image`
//! crate's JPEG decoder) misreads for 4:2:0. So the thumbnail's JPEG is
//! written with the example tables in one interleaved scan, and this
//! module re-codes that scan: it decodes the Huffman symbols (not the
//! pixels: every coefficient and its extra bits stay as they were), counts
//! them, builds each table's optimal code (ITU T.81 Annex K.2, limited to
//! 16 bits as libjpeg does) and writes the same symbols with it. The
//! pixels are bit-identical; the file is ~5-6% smaller.
//!
//! It reads only what jpeg-encoder writes (the one baseline scan, no
//! restart markers); anything else comes back unchanged (`None`), so a
//! surprise costs bytes, never a broken image.

use super::entropy::{Bits, Huffman};
use super::syntax::{huffman_tables, Frame, Segments};

/// A Huffman table as a JPEG's DHT stores it: code counts per length
/// (1 to 16) and the symbols in code order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Table {
    counts: [u8; 16],
    symbols: Vec<u8>,
}

impl Table {
    /// (code, length) for each of the 256 symbols (length 0: absent).
    fn codes(&self) -> [(u16, u8); 256] {
        let mut codes = [(0u16, 0u8); 256];
        let mut code = 0u16;
        let mut k = 0;
        for (i, &count) in self.counts.iter().enumerate() {
            for _ in 0..count {
                if let Some(&symbol) = self.symbols.get(k) {
                    codes[symbol as usize] = (code, i as u8 + 1);
                }
                code = code.wrapping_add(1);
                k += 1;
            }
            code <<= 1;
        }
        codes
    }
}

/// Writes bits MSB first, stuffing a zero after each 0xFF byte.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    acc: u32,
    used: u8,
}

impl BitWriter {
    fn put(&mut self, value: u16, len: u8) {
        for i in (0..len).rev() {
            self.acc = (self.acc << 1) | ((value >> i) & 1) as u32;
            self.used += 1;
            if self.used == 8 {
                let byte = self.acc as u8;
                self.out.push(byte);
                if byte == 0xFF {
                    self.out.push(0);
                }
                self.acc = 0;
                self.used = 0;
            }
        }
    }

    /// Pads the last byte with ones, as T.81 asks.
    fn finish(mut self) -> Vec<u8> {
        if self.used > 0 {
            let pad = 8 - self.used;
            self.put((1u16 << pad) - 1, pad);
        }
        self.out
    }
}

/// One Huffman-coded symbol and the extra bits after it.
#[derive(Clone, Copy)]
struct Token {
    /// Which table: 0..3 DC, 4..7 AC (by table id).
    table: u8,
    symbol: u8,
    extra: u16,
}

/// The JPEG with optimal Huffman tables, or `None` if it is not a baseline
/// file of the shape jpeg-encoder writes (then keep the original).
pub(in crate::steps::thumbnail) fn optimize(jpeg: &[u8]) -> Option<Vec<u8>> {
    let mut segments = Segments::new(jpeg)?;
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut tables: [Option<Huffman>; 8] = Default::default();
    let mut frame: Option<Frame> = None;
    let scan_header = loop {
        let segment = segments.next_segment()?;
        match segment.marker {
            // SOF0 only: baseline.
            0xC0 if frame.is_none() => {
                frame = Some(Frame::parse(segment.body)?);
                kept.push(segment.bytes);
            }
            0xC0..=0xC3 | 0xC5..=0xCF | 0xDC | 0xDD => return None,
            0xC4 => {
                for spec in huffman_tables(segment.body)? {
                    tables[spec.index] = Some(Huffman::new(&spec)?);
                }
            }
            0xDA => break segment,
            _ => kept.push(segment.bytes),
        }
    };
    let mut frame = frame?;
    frame.read_scan(scan_header.body)?;
    let mut bits = Bits::new(jpeg.get(segments.at..)?);
    let (mcus_x, mcus_y) = frame.mcus();
    let blocks: usize = frame.components.iter().map(|c| c.h * c.v).sum();
    let mut tokens = Vec::with_capacity(mcus_x * mcus_y * blocks * 8);
    for _ in 0..mcus_x * mcus_y {
        for c in &frame.components {
            let dc = tables[c.dc].as_ref()?;
            let ac = tables[c.ac].as_ref()?;
            for _ in 0..c.h * c.v {
                let size = dc.decode(&mut bits)?;
                if size > 11 {
                    return None;
                }
                tokens.push(Token {
                    table: c.dc as u8,
                    symbol: size,
                    extra: bits.receive(size as u32),
                });
                let mut k = 1;
                while k < 64 {
                    let rs = ac.decode(&mut bits)?;
                    let (run, size) = (rs >> 4, rs & 15);
                    bits.fill();
                    tokens.push(Token {
                        table: c.ac as u8,
                        symbol: rs,
                        extra: bits.receive(size as u32),
                    });
                    if size == 0 {
                        if run == 15 {
                            k += 16;
                            continue;
                        }
                        break; // End of block.
                    }
                    k += run as usize + 1;
                }
                if k > 64 {
                    return None;
                }
            }
        }
    }
    // After the scan: padding, then EOI.
    if !bits.at_end_of_image() {
        return None;
    }

    let mut frequencies = [[0u32; 256]; 8];
    for t in &tokens {
        frequencies[t.table as usize][t.symbol as usize] += 1;
    }
    let mut optimal: [Option<Table>; 8] = Default::default();
    for (i, f) in frequencies.iter().enumerate() {
        if f.iter().any(|&n| n > 0) {
            optimal[i] = Some(optimal_table(f));
        }
    }
    let codes: Vec<Option<[(u16, u8); 256]>> = optimal
        .iter()
        .map(|t| t.as_ref().map(Table::codes))
        .collect();
    let mut writer = BitWriter::default();
    for t in &tokens {
        let (code, len) = codes[t.table as usize].as_ref()?[t.symbol as usize];
        writer.put(code, len);
        let size = t.symbol & 15;
        writer.put(t.extra, size);
    }
    let data = writer.finish();

    let mut out = Vec::with_capacity(jpeg.len());
    out.extend_from_slice(&[0xFF, 0xD8]);
    for segment in kept {
        out.extend_from_slice(segment);
    }
    let mut dht = Vec::new();
    for (i, table) in optimal.iter().enumerate() {
        if let Some(table) = table {
            dht.push(((i / 4) << 4 | (i % 4)) as u8);
            dht.extend_from_slice(&table.counts);
            dht.extend_from_slice(&table.symbols);
        }
    }
    out.extend_from_slice(&[0xFF, 0xC4]);
    out.extend_from_slice(&((dht.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&dht);
    out.extend_from_slice(scan_header.bytes);
    out.extend_from_slice(&data);
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some(out)
}

/// The optimal code for symbol frequencies, at most 16 bits a code and no
/// code of all ones (T.81 K.2, as libjpeg's `jpeg_gen_optimal_table`).
fn optimal_table(frequencies: &[u32; 256]) -> Table {
    let mut freq = [0i64; 257];
    for (i, &f) in frequencies.iter().enumerate() {
        freq[i] = f as i64;
    }
    // A reserved symbol with one occurrence keeps a code of all ones out.
    freq[256] = 1;
    let mut codesize = [0usize; 257];
    let mut others = [-1i32; 257];
    loop {
        // The two least frequent (ties: the larger symbol first, as libjpeg).
        let least = |skip: i32| {
            let mut found = -1i32;
            let mut v = i64::MAX;
            for (i, &f) in freq.iter().enumerate() {
                if f > 0 && f <= v && i as i32 != skip {
                    v = f;
                    found = i as i32;
                }
            }
            found
        };
        let c1 = least(-1);
        let c2 = least(c1);
        if c2 < 0 {
            break;
        }
        let (c1, c2) = (c1 as usize, c2 as usize);
        freq[c1] += freq[c2];
        freq[c2] = 0;
        let mut c = c1;
        codesize[c] += 1;
        while others[c] >= 0 {
            c = others[c] as usize;
            codesize[c] += 1;
        }
        others[c] = c2 as i32;
        let mut c = c2;
        codesize[c] += 1;
        while others[c] >= 0 {
            c = others[c] as usize;
            codesize[c] += 1;
        }
    }
    let mut bits = [0i32; 33];
    for &size in codesize.iter() {
        if size > 0 {
            bits[size.min(32)] += 1;
        }
    }
    // Limit the lengths to 16 (K.3's adjustment).
    let mut i = 32;
    while i > 16 {
        while bits[i] > 0 {
            let mut j = i - 2;
            while bits[j] == 0 {
                j -= 1;
            }
            bits[i] -= 2;
            bits[i - 1] += 1;
            bits[j + 1] += 2;
            bits[j] -= 1;
        }
        i -= 1;
    }
    // Take the reserved symbol's code (the longest) back out.
    let mut i = 16;
    while bits[i] == 0 {
        i -= 1;
    }
    bits[i] -= 1;
    let mut counts = [0u8; 16];
    for len in 1..=16 {
        counts[len - 1] = bits[len] as u8;
    }
    // Symbols by code length, then by value.
    let mut symbols = Vec::new();
    for len in 1..=32 {
        for (symbol, &size) in codesize.iter().enumerate().take(256) {
            if size == len {
                symbols.push(symbol as u8);
            }
        }
    }
    Table { counts, symbols }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(
        width: u16,
        height: u16,
        quality: u8,
        sampling: jpeg_encoder::SamplingFactor,
    ) -> Vec<u8> {
        // A busy picture: gradients and a checker, so every table is used.
        let pixels: Vec<u8> = (0..height as u32)
            .flat_map(|y| {
                (0..width as u32).flat_map(move |x| {
                    let checker = if (x / 3 + y / 5) % 2 == 0 { 60 } else { 0 };
                    [
                        (x * 7 % 256) as u8,
                        ((y * 3 + checker) % 256) as u8,
                        ((x * y) % 251) as u8,
                    ]
                })
            })
            .collect();
        let mut out = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut out, quality);
        encoder.set_sampling_factor(sampling);
        encoder
            .encode(&pixels, width, height, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        out
    }

    fn pixels(jpeg: &[u8]) -> Vec<u8> {
        jpeg_decoder::Decoder::new(std::io::Cursor::new(jpeg))
            .decode()
            .unwrap()
    }

    #[test]
    fn the_same_pixels_in_fewer_bytes() {
        use jpeg_encoder::SamplingFactor::{R_4_2_0, R_4_4_4};
        // Sizes that are and are not whole MCUs.
        for (w, h, quality, sampling) in [
            (64, 48, 82, R_4_2_0),
            (101, 67, 82, R_4_2_0),
            (99, 33, 95, R_4_4_4),
            (1, 1, 50, R_4_2_0),
            (320, 213, 30, R_4_2_0),
        ] {
            let original = jpeg(w, h, quality, sampling);
            let optimized = optimize(&original).expect("jpeg-encoder's shape");
            assert!(
                optimized.len() < original.len() || w == 1,
                "{w}x{h}: {} -> {}",
                original.len(),
                optimized.len()
            );
            assert_eq!(pixels(&optimized), pixels(&original), "{w}x{h}");
        }
    }

    #[test]
    fn other_shapes_come_back_as_none() {
        let mut progressive = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut progressive, 80);
        encoder.set_progressive(true);
        encoder
            .encode(&[10, 20, 30].repeat(64), 8, 8, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        assert_eq!(optimize(&progressive), None);
        assert_eq!(optimize(b"not a jpeg"), None);
        let original = jpeg(64, 48, 82, jpeg_encoder::SamplingFactor::R_4_2_0);
        // Cut short: no EOI where the scan ends.
        assert_eq!(optimize(&original[..original.len() - 40]), None);
    }

    #[test]
    fn optimal_codes_are_prefix_free_and_at_most_16_bits() {
        // Frequencies from a power law, with a long tail: the lengths
        // would pass 16 bits without the limit.
        let mut frequencies = [0u32; 256];
        for (i, f) in frequencies.iter_mut().enumerate() {
            *f = 1 + (1u32 << 20) / (i as u32 + 1).pow(3);
        }
        let table = optimal_table(&frequencies);
        assert_eq!(table.symbols.len(), 256);
        let codes = table.codes();
        let mut seen: Vec<(u16, u8)> = codes.to_vec();
        for &(code, len) in &seen {
            assert!((1..=16).contains(&len));
            assert_ne!(code as u32, (1u32 << len) - 1, "no code of all ones");
        }
        seen.sort_by_key(|&(c, l)| (l, c));
        for (i, &(a, la)) in seen.iter().enumerate() {
            for &(b, lb) in &seen[i + 1..] {
                // Neither is a prefix of the other.
                assert!(
                    la > lb || (b >> (lb - la)) != a,
                    "{a:b}/{la} prefixes {b:b}/{lb}"
                );
            }
        }
    }
}
