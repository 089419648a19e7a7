//! A scan's Huffman-coded bits (ITU T.81 F.2.2): a bit reader that undoes
//! byte stuffing, and table-driven decoding of Huffman codes.

use super::syntax::TableSpec;

/// Bits looked up at once: codes up to this long (nearly all of them)
/// decode in one step, and with their extra bits when both fit.
pub(super) const LUT_BITS: u32 = 10;

/// An AC code resolved by one lookup, with its extra bits.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AcEntry {
    /// The bits to consume, code and extra bits (0: not resolvable in
    /// LUT_BITS; decode the symbol instead).
    pub bits: u8,
    /// How far the coefficient position moves: the run and one for the
    /// coefficient, 16 for sixteen zeros; 0 ends the block.
    pub step: u8,
    /// The coefficient (never 0; 0 for sixteen zeros and end of block).
    pub value: i16,
}

/// An AC code resolved by one lookup for skipping: how many bits it takes
/// with its extra bits, whatever their value.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AcSkip {
    /// The code's length plus its extra bits (0: the code is longer than
    /// LUT_BITS, or an EOB run; decode the symbol instead). At most 25.
    pub bits: u8,
    /// As `AcEntry::step`.
    pub step: u8,
}

/// A DHT table, ready to decode.
pub(super) struct Huffman {
    /// By the next LUT_BITS bits: the code's length (0: longer) and symbol.
    fast: Box<[(u8, u8); 1 << LUT_BITS]>,
    /// For AC tables, by the next LUT_BITS bits: the code and its
    /// coefficient when both fit in them.
    pub ac: Box<[AcEntry; 1 << LUT_BITS]>,
    /// For AC tables, by the next LUT_BITS bits: the code and how many
    /// extra bits follow it, for coefficients read past rather than kept
    /// (a reduced-scale decode skips most of a block's). Codes whose extra
    /// bits do not fit in the lookup are resolved here too, which `ac`
    /// cannot do.
    pub skip: Box<[AcSkip; 1 << LUT_BITS]>,
    /// Canonical decoding of longer codes: the largest code of each length
    /// (-1: none), and what to add to a code to index `symbols`.
    max_code: [i32; 17],
    delta: [i32; 17],
    symbols: Vec<u8>,
}

impl Huffman {
    /// `None` if the table is not a prefix code.
    pub fn new(spec: &TableSpec) -> Option<Self> {
        let (counts, symbols) = (&spec.counts, spec.symbols);
        let mut fast = Box::new([(0u8, 0u8); 1 << LUT_BITS]);
        let mut ac = Box::new([AcEntry::default(); 1 << LUT_BITS]);
        let mut skip = Box::new([AcSkip::default(); 1 << LUT_BITS]);
        let (mut max_code, mut delta) = ([-1i32; 17], [0i32; 17]);
        let (mut code, mut k) = (0u32, 0usize);
        for len in 1..=16u32 {
            let n = counts[len as usize - 1] as usize;
            if n > 0 {
                delta[len as usize] = k as i32 - code as i32;
                max_code[len as usize] = (code + n as u32 - 1) as i32;
            }
            for _ in 0..n {
                let symbol = *symbols.get(k)?;
                if code >= 1 << len {
                    return None; // Over-subscribed: not a prefix code.
                }
                if len <= LUT_BITS {
                    let first = (code << (LUT_BITS - len)) as usize;
                    let (run, size) = (symbol >> 4, symbol & 15);
                    let step = match (run, size) {
                        (0, 0) => Some(0),   // End of block.
                        (15, 0) => Some(16), // Sixteen zeros.
                        (_, 0) => None,      // An EOB run: progressive only.
                        _ => Some(run + 1),
                    };
                    let bits = len + size as u32;
                    for entry in first..first + (1 << (LUT_BITS - len)) {
                        fast[entry] = (len as u8, symbol);
                        if let Some(step) = step {
                            skip[entry] = AcSkip {
                                bits: bits as u8,
                                step,
                            };
                        }
                        // Only when the code and its extra bits fit.
                        if let Some(step) = step.filter(|_| bits <= LUT_BITS) {
                            let extra = (entry as u32 >> (LUT_BITS - bits)) & ((1 << size) - 1);
                            ac[entry] = AcEntry {
                                bits: bits as u8,
                                step,
                                value: if size == 0 {
                                    0
                                } else {
                                    extend(extra, size as u32)
                                },
                            };
                        }
                    }
                }
                code += 1;
                k += 1;
            }
            code <<= 1;
        }
        Some(Huffman {
            fast,
            ac,
            skip,
            max_code,
            delta,
            symbols: symbols[..k].to_vec(),
        })
    }

    /// The next symbol, or `None` for a code the table does not hold.
    #[inline]
    pub fn decode(&self, bits: &mut Bits) -> Option<u8> {
        bits.fill();
        let (len, symbol) = self.fast[bits.peek(LUT_BITS) as usize];
        if len > 0 {
            bits.consume(len as u32);
            return Some(symbol);
        }
        let word = bits.peek(16) as i32;
        for len in LUT_BITS as usize + 1..=16 {
            let code = word >> (16 - len);
            if code <= self.max_code[len] {
                bits.consume(len as u32);
                return self.symbols.get((code + self.delta[len]) as usize).copied();
            }
        }
        None
    }
}

/// Entropy-coded bits, most significant first, with byte stuffing (0xFF
/// 0x00) undone. At a marker (or the end of the data) it feeds zeros and
/// counts them, so reading past the segment is seen afterwards rather
/// than checked on every bit.
pub(super) struct Bits<'a> {
    data: &'a [u8],
    at: usize,
    /// `n` valid bits, from the top.
    acc: u64,
    n: u32,
    /// Zero bits fed after the segment's end (the last of `acc`'s bits).
    fed: u32,
}

impl<'a> Bits<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bits {
            data,
            at: 0,
            acc: 0,
            n: 0,
            fed: 0,
        }
    }

    /// At least 32 bits in `acc` (a code and its extra bits are ≤ 31).
    #[inline]
    pub fn fill(&mut self) {
        if self.n >= 32 {
            return;
        }
        // The common case: eight bytes ahead with no 0xFF among them.
        if let Some(chunk) = self.data.get(self.at..self.at + 8) {
            let word = u64::from_be_bytes(chunk.try_into().expect("eight bytes"));
            let inverted = !word;
            let has_ff =
                inverted.wrapping_sub(0x0101_0101_0101_0101) & !inverted & 0x8080_8080_8080_8080
                    != 0;
            if !has_ff {
                let take = (64 - self.n) / 8;
                let kept = self.n + 8 * take;
                let mask = if kept == 64 {
                    u64::MAX
                } else {
                    !(u64::MAX >> kept)
                };
                self.acc |= (word >> self.n) & mask;
                self.n = kept;
                self.at += take as usize;
                return;
            }
        }
        while self.n <= 56 {
            let byte = match self.data.get(self.at) {
                Some(0xFF) if self.data.get(self.at + 1) == Some(&0) => {
                    self.at += 2;
                    0xFF
                }
                Some(0xFF) | None => {
                    // A marker, or the end: zeros, not consumed.
                    self.fed += 8;
                    0
                }
                Some(&byte) => {
                    self.at += 1;
                    byte
                }
            };
            self.acc |= (byte as u64) << (56 - self.n);
            self.n += 8;
        }
    }

    #[inline]
    pub fn peek(&self, count: u32) -> u32 {
        (self.acc >> (64 - count)) as u32
    }

    #[inline]
    pub fn consume(&mut self, count: u32) {
        self.acc <<= count;
        self.n -= count;
    }

    /// `count` (1 to 16) bits as a signed value (T.81 F.2.2.1).
    #[inline]
    pub fn receive_extend(&mut self, count: u32) -> i16 {
        let value = self.peek(count);
        self.consume(count);
        extend(value, count)
    }

    /// Whether bits past the segment's end were read as data.
    pub fn overran(&self) -> bool {
        self.n < self.fed
    }

    /// Whether the scan's data ended where it should: no bits read past
    /// it, and the next marker is EOI. (After anything else, another scan
    /// say, jpeg-decoder may do more than this module does.)
    pub fn at_end_of_image(&self) -> bool {
        if self.overran() {
            return false;
        }
        let mut at = self.at;
        while let Some(&byte) = self.data.get(at) {
            match (byte, self.data.get(at + 1)) {
                (0xFF, Some(0x00)) => at += 2,
                (0xFF, Some(0xFF)) => at += 1,
                (0xFF, next) => return next == Some(&0xD9),
                _ => at += 1,
            }
        }
        false
    }

    /// Past the restart marker `RSTm` expected next: drops the padding
    /// bits; `None` if that marker is not there.
    pub fn restart(&mut self, m: u8) -> Option<()> {
        if self.overran() {
            return None;
        }
        (self.data.get(self.at..self.at + 2)? == [0xFF, 0xD0 + m]).then_some(())?;
        self.at += 2;
        (self.acc, self.n, self.fed) = (0, 0, 0);
        Some(())
    }
}

/// `count` (1 to 16) extra bits as a signed value (T.81 F.2.2.1, EXTEND).
#[inline]
fn extend(value: u32, count: u32) -> i16 {
    let value = value as i32;
    let value = if value < 1 << (count - 1) {
        value - (1 << count) + 1
    } else {
        value
    };
    value as i16
}
