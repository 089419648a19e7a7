//! The markers before a JPEG's scan (ITU T.81 B.2): the frame, the
//! Huffman and quantisation tables, the restart interval, the scan header.
//! Only what `scaled` and `coefficients` read: 8-bit samples, one scan
//! holding every component in the frame's order, all 64 coefficients at
//! once.

/// One marker segment: its marker, the whole segment (from its 0xFF), and
/// the body after the length.
pub(super) struct Segment<'a> {
    pub marker: u8,
    pub bytes: &'a [u8],
    pub body: &'a [u8],
}

/// The segments after SOI, one at a time, up to and including the first
/// SOS (the entropy-coded data starts at `at` after it).
pub(super) struct Segments<'a> {
    jpeg: &'a [u8],
    pub at: usize,
}

impl<'a> Segments<'a> {
    /// `None` if the bytes do not start with SOI.
    pub fn new(jpeg: &'a [u8]) -> Option<Self> {
        (jpeg.get(0..2)? == [0xFF, 0xD8]).then_some(Segments { jpeg, at: 2 })
    }

    /// The next segment; `None` at anything that is not one (a standalone
    /// marker such as EOI included: none belongs before the scan).
    pub fn next_segment(&mut self) -> Option<Segment<'a>> {
        let jpeg = self.jpeg;
        if jpeg.get(self.at)? != &0xFF {
            return None;
        }
        // Fill bytes may come before a marker (T.81 B.1.1.2).
        while jpeg.get(self.at + 1)? == &0xFF {
            self.at += 1;
        }
        let marker = jpeg[self.at + 1];
        if matches!(marker, 0x00 | 0x01 | 0xD0..=0xD9) {
            return None;
        }
        let len = u16::from_be_bytes([*jpeg.get(self.at + 2)?, *jpeg.get(self.at + 3)?]) as usize;
        if len < 2 {
            return None;
        }
        let bytes = jpeg.get(self.at..self.at + 2 + len)?;
        self.at += 2 + len;
        Some(Segment {
            marker,
            bytes,
            body: &bytes[4..],
        })
    }
}

/// A frame component, with the tables the scan gives it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Component {
    pub id: u8,
    /// Sampling factors, 1 to 4.
    pub h: usize,
    pub v: usize,
    /// Quantisation table, 0 to 3.
    pub quant: usize,
    /// Huffman tables as `Tables` indexes them: DC 0 to 3, AC 4 to 7.
    pub dc: usize,
    pub ac: usize,
}

/// A frame header (SOFn): 8-bit samples only.
pub(super) struct Frame {
    pub width: usize,
    pub height: usize,
    pub components: Vec<Component>,
}

impl Frame {
    /// `None` for 12-bit samples, a height left to a DNL marker, or factors
    /// or table numbers out of range.
    pub fn parse(body: &[u8]) -> Option<Frame> {
        if body.first()? != &8 {
            return None;
        }
        let height = u16::from_be_bytes([*body.get(1)?, *body.get(2)?]) as usize;
        let width = u16::from_be_bytes([*body.get(3)?, *body.get(4)?]) as usize;
        let n = *body.get(5)? as usize;
        let mut components = Vec::with_capacity(n);
        for i in 0..n {
            let c = body.get(6 + 3 * i..9 + 3 * i)?;
            let (h, v, quant) = ((c[1] >> 4) as usize, (c[1] & 15) as usize, c[2] as usize);
            if !(1..=4).contains(&h) || !(1..=4).contains(&v) || quant > 3 {
                return None;
            }
            components.push(Component {
                id: c[0],
                h,
                v,
                quant,
                dc: 0,
                ac: 4,
            });
        }
        (width > 0 && height > 0 && n > 0).then_some(Frame {
            width,
            height,
            components,
        })
    }

    /// The largest sampling factors.
    pub fn max_sampling(&self) -> (usize, usize) {
        let hmax = self.components.iter().map(|c| c.h).max().unwrap_or(1);
        let vmax = self.components.iter().map(|c| c.v).max().unwrap_or(1);
        (hmax, vmax)
    }

    /// MCUs across and down an interleaved scan.
    pub fn mcus(&self) -> (usize, usize) {
        let (hmax, vmax) = self.max_sampling();
        (
            self.width.div_ceil(8 * hmax),
            self.height.div_ceil(8 * vmax),
        )
    }

    /// Reads a scan header (SOS) that holds every component in the
    /// frame's order and all 64 coefficients in one pass (a sequential
    /// file's only scan), and gives the components its table selectors.
    pub fn read_scan(&mut self, body: &[u8]) -> Option<()> {
        let n = *body.first()? as usize;
        if n != self.components.len() || body.get(1 + 2 * n..4 + 2 * n)? != [0, 63, 0] {
            return None;
        }
        for (i, c) in self.components.iter_mut().enumerate() {
            let (id, selectors) = (body[1 + 2 * i], body[2 + 2 * i]);
            let (dc, ac) = ((selectors >> 4) as usize, (selectors & 15) as usize);
            if c.id != id || dc > 3 || ac > 3 {
                return None;
            }
            (c.dc, c.ac) = (dc, 4 + ac);
        }
        Some(())
    }
}

/// One table of a DHT segment: its index (DC 0 to 3, AC 4 to 7), the
/// number of codes of each length (1 to 16), and the symbols in code order.
pub(super) struct TableSpec<'a> {
    pub index: usize,
    pub counts: [u8; 16],
    pub symbols: &'a [u8],
}

/// The tables of a DHT segment; `None` if it is malformed.
pub(super) fn huffman_tables(body: &[u8]) -> Option<Vec<TableSpec<'_>>> {
    let mut tables = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (class, id) = ((rest[0] >> 4) as usize, (rest[0] & 15) as usize);
        if class > 1 || id > 3 {
            return None;
        }
        let counts: [u8; 16] = rest.get(1..17)?.try_into().ok()?;
        let n: usize = counts.iter().map(|&c| c as usize).sum();
        tables.push(TableSpec {
            index: class * 4 + id,
            counts,
            symbols: rest.get(17..17 + n)?,
        });
        rest = &rest[17 + n..];
    }
    Some(tables)
}

/// Natural (row-major) index of each zigzag position (T.81 Figure A.6).
pub(super) const UNZIGZAG: [u8; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// The tables of a DQT segment, by table number, in natural (row-major)
/// order; `None` if it is malformed.
pub(super) fn quantisation_tables(body: &[u8]) -> Option<Vec<(usize, [u16; 64])>> {
    let mut tables = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (precision, id) = (rest[0] >> 4, (rest[0] & 15) as usize);
        let size = match precision {
            0 => 64,
            1 => 128,
            _ => return None,
        };
        let values = rest.get(1..1 + size)?;
        if id > 3 {
            return None;
        }
        let mut table = [0u16; 64];
        for (k, &natural) in UNZIGZAG.iter().enumerate() {
            table[natural as usize] = if precision == 0 {
                values[k] as u16
            } else {
                u16::from_be_bytes([values[2 * k], values[2 * k + 1]])
            };
        }
        tables.push((id, table));
        rest = &rest[1 + size..];
    }
    Some(tables)
}

/// How much coarser than the picture the coarsest component is sampled,
/// across and down (4:2:0 gives (2, 2), 4:1:1 (4, 1), 4:4:4 and greyscale
/// (1, 1)), read from the first frame header of any coding process; `None`
/// when the header before it cannot be read.
pub fn subsampling(jpeg: &[u8]) -> Option<(usize, usize)> {
    let mut segments = Segments::new(jpeg)?;
    let frame = loop {
        let segment = segments.next_segment()?;
        if matches!(segment.marker, 0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF) {
            break Frame::parse(segment.body)?;
        }
    };
    let (hmax, vmax) = frame.max_sampling();
    let ratio = |max: usize, factor: usize| max.div_ceil(factor);
    Some(frame.components.iter().fold((1, 1), |(h, v), c| {
        (h.max(ratio(hmax, c.h)), v.max(ratio(vmax, c.v)))
    }))
}
