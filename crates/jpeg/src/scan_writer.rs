//! Huffman coding on the way out: a scan's symbols and extra bits as
//! tokens, each table's optimal code for the symbols one scan uses (T.81
//! K.2, limited to 16 bits as libjpeg does), and the bytes of a DHT, the
//! scan header and the coded scan. `optimize` and `progressive` both
//! write their scans through it, so every scan gets tables fitted to it.

/// One piece of a scan's entropy-coded data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Token {
    /// A symbol of Huffman table `table` (DC 0 to 3, AC 4 to 7, as
    /// `entropy::Huffman` numbers them), then `len` extra bits.
    Coded {
        table: u8,
        symbol: u8,
        extra: u16,
        len: u8,
    },
    /// Bits as they are: successive approximation's refinement bits.
    Raw { bits: u16, len: u8 },
}

impl Token {
    /// A value's magnitude category (T.81 F.1.2.1.1) as `symbol`'s low
    /// bits with `high` above them, and its extra bits.
    pub fn value(table: u8, high: u8, value: i32) -> Token {
        let size = 32 - value.unsigned_abs().leading_zeros();
        // Negative values are sent as value - 1 in `size` bits.
        let bits = if value < 0 { value - 1 } else { value };
        Token::Coded {
            table,
            symbol: (high << 4) | size as u8,
            extra: (bits as u32 & ((1u32 << size) - 1)) as u16,
            len: size as u8,
        }
    }
}

/// Appends the scan: a DHT with an optimal table for each table the
/// tokens use (none if they use none), the scan header `sos` (whole,
/// from its marker), and the coded tokens, padded to a byte with ones.
pub(super) fn write_scan(out: &mut Vec<u8>, sos: &[u8], tokens: &[Token]) {
    let mut frequencies = [[0u32; 256]; 8];
    for t in tokens {
        if let Token::Coded { table, symbol, .. } = *t {
            frequencies[table as usize][symbol as usize] += 1;
        }
    }
    let mut dht = Vec::new();
    let mut codes = [[(0u16, 0u8); 256]; 8];
    for (i, f) in frequencies.iter().enumerate() {
        if f.iter().any(|&n| n > 0) {
            let table = optimal_table(f);
            codes[i] = table.codes();
            dht.push(((i / 4) << 4 | (i % 4)) as u8);
            dht.extend_from_slice(&table.counts);
            dht.extend_from_slice(&table.symbols);
        }
    }
    if !dht.is_empty() {
        out.extend_from_slice(&[0xFF, 0xC4]);
        out.extend_from_slice(&((dht.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(&dht);
    }
    out.extend_from_slice(sos);
    let mut writer = BitWriter {
        out,
        acc: 0,
        used: 0,
    };
    for t in tokens {
        match *t {
            Token::Coded {
                table,
                symbol,
                extra,
                len,
            } => {
                let (code, code_len) = codes[table as usize][symbol as usize];
                writer.put(code as u32, code_len);
                writer.put(extra as u32, len);
            }
            Token::Raw { bits, len } => writer.put(bits as u32, len),
        }
    }
    writer.finish();
}

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

/// Writes bits most significant first, stuffing a zero after each 0xFF.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    /// `used` pending bits, in the low end.
    acc: u64,
    used: u32,
}

impl BitWriter<'_> {
    /// The low `len` (at most 16) bits of `value`.
    fn put(&mut self, value: u32, len: u8) {
        let len = len as u32;
        self.acc = (self.acc << len) | (value as u64 & ((1u64 << len) - 1));
        self.used += len;
        while self.used >= 8 {
            self.used -= 8;
            let byte = (self.acc >> self.used) as u8;
            self.out.push(byte);
            if byte == 0xFF {
                self.out.push(0);
            }
        }
    }

    /// Pads the last byte with ones, as T.81 asks.
    fn finish(mut self) {
        if self.used > 0 {
            let pad = 8 - self.used as u8;
            self.put((1 << pad) - 1, pad);
        }
    }
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

    #[test]
    fn values_are_coded_as_t81_says() {
        let coded = |value| match Token::value(4, 2, value) {
            Token::Coded {
                symbol, extra, len, ..
            } => (symbol, extra, len),
            Token::Raw { .. } => unreachable!(),
        };
        assert_eq!(coded(0), (0x20, 0, 0));
        assert_eq!(coded(1), (0x21, 1, 1));
        assert_eq!(coded(-1), (0x21, 0, 1));
        assert_eq!(coded(5), (0x23, 0b101, 3));
        assert_eq!(coded(-5), (0x23, 0b010, 3));
        assert_eq!(coded(-1023), (0x2A, 0, 10));
        assert_eq!(coded(2047), (0x2B, 2047, 11));
    }

    #[test]
    fn bits_are_written_msb_first_with_stuffing_and_padding() {
        let mut out = Vec::new();
        let mut writer = BitWriter {
            out: &mut out,
            acc: 0,
            used: 0,
        };
        writer.put(0b1111_1111, 8);
        writer.put(0b101, 3);
        writer.put(0xFFFF, 16);
        writer.finish();
        // FF (stuffed), 101 + 11111, 11111111 (stuffed), 111 + padding.
        assert_eq!(out, [0xFF, 0x00, 0xBF, 0xFF, 0x00, 0xFF, 0x00]);
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
