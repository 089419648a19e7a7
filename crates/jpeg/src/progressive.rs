//! A baseline JPEG's coefficients written again as a progressive JPEG
//! (T.81 G.1.2), with libjpeg's scan script (`jpeg_simple_progression`:
//! spectral selection and successive approximation, ten scans for colour)
//! and optimal Huffman tables fitted to each scan, as libjpeg-turbo always
//! gives progressive files. The pixels are bit-identical to the baseline
//! file's; on the thumbnail bench the file is ~2% smaller than the
//! baseline one with optimal tables.
//!
//! jpeg-encoder writes progressive files too, but with spectral selection
//! only, one scan per component, an end-of-block code for every block (no
//! EOB runs) and the example tables: larger than its baseline files. So
//! the thumbnail's JPEG is encoded baseline and re-coded here. The
//! encoding follows libjpeg's `jcphuff.c`; its comments say where it must.

use super::coefficients::{for_each_block, Baseline};
use super::scan_writer::{write_scan, Token};

/// One scan of the script: the components (indexes into the frame's),
/// the spectral band `start..=end` and the successive-approximation bit
/// positions `high` (the previous scan's `low`; 0 for a first scan) and
/// `low` (the bits below it wait for later scans).
struct Scan {
    components: &'static [usize],
    start: usize,
    end: usize,
    high: u8,
    low: u8,
}

const fn scan(components: &'static [usize], start: usize, end: usize, high: u8, low: u8) -> Scan {
    Scan {
        components,
        start,
        end,
        high,
        low,
    }
}

/// libjpeg's script for YCbCr (jcparam.c, `jpeg_simple_progression`):
/// DC first, a little luma early, chroma in few scans, luma's last bit
/// last "since it's usually largest".
const COLOUR: [Scan; 10] = [
    scan(&[0, 1, 2], 0, 0, 0, 1),
    scan(&[0], 1, 5, 0, 2),
    scan(&[2], 1, 63, 0, 1),
    scan(&[1], 1, 63, 0, 1),
    scan(&[0], 6, 63, 0, 2),
    scan(&[0], 1, 63, 2, 1),
    scan(&[0, 1, 2], 0, 0, 1, 0),
    scan(&[2], 1, 63, 1, 0),
    scan(&[1], 1, 63, 1, 0),
    scan(&[0], 1, 63, 1, 0),
];

/// libjpeg's script for one component.
const GREY: [Scan; 6] = [
    scan(&[0], 0, 0, 0, 1),
    scan(&[0], 1, 5, 0, 2),
    scan(&[0], 6, 63, 0, 2),
    scan(&[0], 1, 63, 2, 1),
    scan(&[0], 0, 0, 1, 0),
    scan(&[0], 1, 63, 1, 0),
];

/// libjpeg's bound on refinement bits held back for an EOB run
/// (`MAX_CORR_BITS`); a decoder needs no such buffer, so any bound works,
/// and libjpeg's keeps the output like its own.
const MAX_CORRECTION_BITS: usize = 1000;

/// An EOB run's longest (T.81 G.1.2.2: EOB14 with 14 bits).
const MAX_EOB_RUN: u32 = 0x7FFF;

/// The progressive JPEG with the same coefficients, or `None` if `jpeg`
/// is not a baseline file of the shape jpeg-encoder writes, with one
/// (grey) or three (colour) components.
pub fn progressive(jpeg: &[u8]) -> Option<Vec<u8>> {
    let baseline = Baseline::read(jpeg)?;
    let script: &[Scan] = match baseline.frame.components.len() {
        1 => &GREY,
        3 => &COLOUR,
        _ => return None,
    };
    let mut out = Vec::with_capacity(jpeg.len());
    out.extend_from_slice(&[0xFF, 0xD8]);
    for segment in &baseline.segments {
        out.extend_from_slice(segment);
        if segment[1] == 0xC0 {
            // The same frame, as SOF2: progressive, Huffman-coded.
            let at = out.len() - segment.len() + 1;
            out[at] = 0xC2;
        }
    }
    let mut tokens = Vec::new();
    for scan in script {
        tokens.clear();
        let dc = scan.start == 0;
        match (dc, scan.high) {
            (true, 0) => dc_first(&baseline, scan, &mut tokens),
            (true, _) => dc_refine(&baseline, scan, &mut tokens),
            (false, 0) => ac_first(&baseline, scan, &mut tokens),
            (false, _) => ac_refine(&baseline, scan, &mut tokens),
        }
        write_scan(&mut out, &scan_header(&baseline, scan), &tokens);
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some(out)
}

/// Table 0 for the first component (luma), 1 for the others, DC and AC,
/// as libjpeg numbers them. Scans are Huffman-coded with the tables the
/// DHT before them defines, so the numbers only name them, and these keep
/// the file like libjpeg's.
fn table(component: usize) -> u8 {
    (component > 0) as u8
}

/// The SOS segment, whole: libjpeg's (jcmarker.c), which names only the
/// tables the scan uses (a DC first scan its DC tables, an AC scan its AC
/// table; a DC refinement none).
fn scan_header(baseline: &Baseline, scan: &Scan) -> Vec<u8> {
    let n = scan.components.len();
    let mut sos = vec![0xFF, 0xDA, 0, (6 + 2 * n) as u8, n as u8];
    for &ci in scan.components {
        let selectors = match (scan.start, scan.high) {
            (0, 0) => table(ci) << 4,
            (0, _) => 0,
            _ => table(ci),
        };
        sos.extend_from_slice(&[baseline.frame.components[ci].id, selectors]);
    }
    sos.extend_from_slice(&[
        scan.start as u8,
        scan.end as u8,
        (scan.high << 4) | scan.low,
    ]);
    sos
}

/// DC's high bits: each block's DC shifted down by `low` (arithmetically,
/// as the decoder shifts it back up), coded as a difference from the
/// previous block's of its component.
fn dc_first(baseline: &Baseline, scan: &Scan, tokens: &mut Vec<Token>) {
    let mut predictions = [0i32; 4];
    let frame = &baseline.frame;
    for_each_block(frame, &baseline.planes, scan.components, |ci, block| {
        let dc = (block[0] >> scan.low) as i32;
        tokens.push(Token::value(table(ci), 0, dc - predictions[ci]));
        predictions[ci] = dc;
    });
}

/// DC's next bit, as it is.
fn dc_refine(baseline: &Baseline, scan: &Scan, tokens: &mut Vec<Token>) {
    let frame = &baseline.frame;
    for_each_block(frame, &baseline.planes, scan.components, |_, block| {
        tokens.push(Token::Raw {
            bits: ((block[0] >> scan.low) & 1) as u16,
            len: 1,
        });
    });
}

/// A band's AC coefficients, shifted down by `low` (magnitudes: T.81
/// G.1.2.2 shifts the absolute value), with runs of blocks that have
/// nothing left in the band sent as one EOB run.
fn ac_first(baseline: &Baseline, scan: &Scan, tokens: &mut Vec<Token>) {
    let mut eob = EobRun::new(scan);
    let ac = eob.table;
    let frame = &baseline.frame;
    for_each_block(frame, &baseline.planes, scan.components, |_, block| {
        let mut run = 0u8;
        for &value in &block[scan.start..=scan.end] {
            let magnitude = (value as i32).abs() >> scan.low;
            if magnitude == 0 {
                run += 1;
                continue;
            }
            eob.flush(tokens);
            while run > 15 {
                tokens.push(Token::value(ac, 15, 0)); // ZRL
                run -= 16;
            }
            let value = if value < 0 { -magnitude } else { magnitude };
            tokens.push(Token::value(ac, run, value));
            run = 0;
        }
        if run > 0 {
            eob.run += 1;
            if eob.run == MAX_EOB_RUN {
                eob.flush(tokens);
            }
        }
    });
    eob.flush(tokens);
}

/// A band's next bit of each AC coefficient (T.81 G.1.2.3): a coefficient
/// that becomes nonzero is coded with its run of still-zero ones and its
/// sign; one that was already nonzero gets its bit raw, after the next
/// code sent (so the decoder, reading that code's run, meets it in order).
fn ac_refine(baseline: &Baseline, scan: &Scan, tokens: &mut Vec<Token>) {
    let mut eob = EobRun::new(scan);
    let ac = eob.table;
    // This block's bits for already-nonzero coefficients, not yet sent.
    let mut pending: Vec<u8> = Vec::with_capacity(64);
    let frame = &baseline.frame;
    for_each_block(frame, &baseline.planes, scan.components, |_, block| {
        let band = &block[scan.start..=scan.end];
        let magnitude = |value: i16| (value as i32).abs() >> scan.low;
        // The last coefficient that becomes nonzero in this scan: past
        // it, zero runs need no ZRL, the block's EOB covers them.
        let last_new = band.iter().rposition(|&v| magnitude(v) == 1);
        let mut run = 0u8;
        for (k, &value) in band.iter().enumerate() {
            let m = magnitude(value);
            if m == 0 {
                run += 1;
                continue;
            }
            while run > 15 && last_new.is_some_and(|last| k <= last) {
                eob.flush(tokens);
                tokens.push(Token::value(ac, 15, 0)); // ZRL
                run -= 16;
                raw_bits(tokens, pending.drain(..));
            }
            if m > 1 {
                // Nonzero before this scan: its bit waits for a code.
                pending.push((m & 1) as u8);
                continue;
            }
            eob.flush(tokens);
            tokens.push(Token::Coded {
                table: ac,
                symbol: (run << 4) | 1,
                extra: (value > 0) as u16,
                len: 1,
            });
            raw_bits(tokens, pending.drain(..));
            run = 0;
        }
        if run > 0 || !pending.is_empty() {
            // The block ends in an EOB; its waiting bits go after it.
            eob.run += 1;
            eob.bits.append(&mut pending);
            if eob.run == MAX_EOB_RUN || eob.bits.len() > MAX_CORRECTION_BITS - 64 + 1 {
                eob.flush(tokens);
            }
        }
    });
    eob.flush(tokens);
}

/// Blocks ending in an EOB not yet sent, and (in refinement scans) the
/// bits of their already-nonzero coefficients, which follow the EOB run.
struct EobRun {
    /// The scan's AC table (as `Token` numbers tables).
    table: u8,
    run: u32,
    bits: Vec<u8>,
}

impl EobRun {
    /// For an AC scan (one component).
    fn new(scan: &Scan) -> Self {
        EobRun {
            table: 4 + table(scan.components[0]),
            run: 0,
            bits: Vec::new(),
        }
    }

    /// Sends the run, if any: EOBn with n = ⌊log2 run⌋ and the run's n
    /// low bits (its top bit is implied), then the waiting bits.
    fn flush(&mut self, tokens: &mut Vec<Token>) {
        if self.run == 0 {
            return;
        }
        let n = 31 - self.run.leading_zeros();
        tokens.push(Token::Coded {
            table: self.table,
            symbol: (n << 4) as u8,
            extra: (self.run & ((1 << n) - 1)) as u16,
            len: n as u8,
        });
        self.run = 0;
        raw_bits(tokens, self.bits.drain(..));
    }
}

fn raw_bits(tokens: &mut Vec<Token>, bits: impl Iterator<Item = u8>) {
    tokens.extend(bits.map(|bit| Token::Raw {
        bits: bit as u16,
        len: 1,
    }));
}

#[cfg(test)]
mod tests {
    use super::super::test_images::{busy_jpeg, busy_jpeg_progressive, pixels, segments};
    use super::*;
    use jpeg_encoder::{ColorType, SamplingFactor};

    /// Each scan's tables (the DHT segments' contents before it, joined),
    /// header and coded data.
    fn coded_scans(jpeg: &[u8]) -> Vec<(Vec<u8>, &[u8], &[u8])> {
        let (mut scans, mut tables) = (Vec::new(), Vec::new());
        for (marker, body, data) in segments(jpeg) {
            match marker {
                0xC4 => tables.extend_from_slice(body),
                0xDA => scans.push((std::mem::take(&mut tables), body, data)),
                _ => {}
            }
        }
        scans
    }

    #[test]
    fn the_same_pixels_as_the_baseline_file() {
        use SamplingFactor::{R_4_2_0, R_4_4_4};
        // Sizes that are and are not whole MCUs (the DC scans cover the
        // MCUs' padding blocks, the AC scans only the component's own),
        // qualities that leave many and few coefficients.
        for (w, h, quality, colour, sampling) in [
            (64, 48, 82, ColorType::Rgb, R_4_2_0),
            (101, 67, 82, ColorType::Rgb, R_4_2_0),
            (99, 33, 95, ColorType::Rgb, R_4_4_4),
            (1, 1, 50, ColorType::Rgb, R_4_2_0),
            (17, 9, 100, ColorType::Rgb, R_4_2_0),
            (320, 213, 30, ColorType::Rgb, R_4_2_0),
            (75, 41, 82, ColorType::Luma, R_4_4_4),
        ] {
            let original = busy_jpeg(w, h, quality, colour, sampling);
            let recoded = progressive(&original).expect("jpeg-encoder's shape");
            assert_eq!(pixels(&recoded), pixels(&original), "{w}x{h} q{quality}");
            let markers: Vec<u8> = segments(&recoded).iter().map(|s| s.0).collect();
            assert!(
                markers.contains(&0xC2) && !markers.contains(&0xC0),
                "{markers:x?}"
            );
        }
    }

    #[test]
    fn libjpegs_scan_script_with_tables_fitted_to_each_scan() {
        let original = busy_jpeg(320, 213, 82, ColorType::Rgb, SamplingFactor::R_4_2_0);
        let recoded = progressive(&original).unwrap();
        let scans = coded_scans(&recoded);
        let bands: Vec<&[u8]> = scans
            .iter()
            .map(|(_, sos, _)| &sos[sos.len() - 3..])
            .collect();
        let script: Vec<[u8; 3]> = COLOUR
            .iter()
            .map(|s| [s.start as u8, s.end as u8, s.high << 4 | s.low])
            .collect();
        assert_eq!(bands, script);
        // Tables before every scan but the DC refinement, which sends its
        // bits as they are.
        let tables: Vec<bool> = scans.iter().map(|(t, _, _)| !t.is_empty()).collect();
        assert_eq!(
            tables,
            [true, true, true, true, true, true, false, true, true, true]
        );
    }

    #[test]
    fn every_scan_as_libjpeg_turbo_writes_it() {
        // The step's 320 px JPEG of bench/thumbnail.sh's photo, and what
        // `jpegtran -progressive -optimize` (libjpeg-turbo 2.1.5, Debian
        // 12) made of it: the same script, Huffman tables fitted to each
        // scan the same way, the same bits. (jpegtran writes each table in
        // a DHT of its own, so the tables are compared by content.)
        let baseline = include_bytes!("../tests/data/photo-320-baseline.jpg");
        let libjpeg = include_bytes!("../tests/data/photo-320-jpegtran-progressive.jpg");
        let ours = progressive(baseline).unwrap();
        let (ours, theirs) = (coded_scans(&ours), coded_scans(libjpeg));
        assert_eq!(ours.len(), 10);
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(a == b, "scan {i} differs");
        }
    }

    #[test]
    fn fewer_bytes_than_jpeg_encoders_progressive_and_its_busy_jpeg() {
        let original = busy_jpeg(320, 213, 82, ColorType::Rgb, SamplingFactor::R_4_2_0);
        let recoded = progressive(&original).unwrap();
        let optimized = super::super::optimize::optimize(&original).unwrap();
        let theirs = busy_jpeg_progressive(320, 213, 82);
        assert!(
            recoded.len() < optimized.len() && optimized.len() < theirs.len(),
            "ours {}, baseline optimised {}, jpeg-encoder's {}",
            recoded.len(),
            optimized.len(),
            theirs.len()
        );
    }

    #[test]
    fn eob_runs_longer_than_one_code_holds() {
        // 46 × 46 blocks, flat: every AC band of every block is empty, one
        // EOB run of 2,116 per AC scan. Then 185 × 185 blocks (34,225 >
        // 0x7FFF), whose runs need two codes.
        for side in [368u16, 1480] {
            let grey = vec![128u8; side as usize * side as usize];
            let mut original = Vec::new();
            jpeg_encoder::Encoder::new(&mut original, 82)
                .encode(&grey, side, side, ColorType::Luma)
                .unwrap();
            let recoded = progressive(&original).unwrap();
            assert_eq!(pixels(&recoded), pixels(&original), "{side}");
        }
    }

    /// One grey row of blocks, for the refinement coder alone.
    fn grey_row(blocks: Vec<[i16; 64]>) -> Baseline<'static> {
        use super::super::coefficients::Plane;
        use super::super::syntax::{Component, Frame};
        let n = blocks.len();
        Baseline {
            segments: Vec::new(),
            scan_header: &[],
            frame: Frame {
                width: 8 * n,
                height: 8,
                components: vec![Component {
                    id: 1,
                    h: 1,
                    v: 1,
                    quant: 0,
                    dc: 0,
                    ac: 4,
                }],
            },
            planes: vec![Plane {
                stride: n,
                width: n,
                height: 1,
                blocks,
            }],
        }
    }

    const LAST_BITS: Scan = scan(&[0], 1, 63, 1, 0);

    fn symbols(tokens: &[Token]) -> Vec<u8> {
        tokens
            .iter()
            .filter_map(|t| match t {
                Token::Coded { symbol, .. } => Some(*symbol),
                Token::Raw { .. } => None,
            })
            .collect()
    }

    #[test]
    fn no_zero_run_code_past_the_last_new_coefficient() {
        // A new coefficient at 1, then 19 zeros and one that was nonzero
        // before: its bit waits for the EOB, which covers the run, where
        // a ZRL would cost a code for nothing.
        let mut block = [0i16; 64];
        (block[1], block[21]) = (1, 3);
        let mut tokens = Vec::new();
        ac_refine(&grey_row(vec![block]), &LAST_BITS, &mut tokens);
        let coded = |symbol, extra, len| Token::Coded {
            table: 4,
            symbol,
            extra,
            len,
        };
        assert_eq!(
            tokens,
            [
                coded(0x01, 1, 1),
                coded(0x00, 0, 0),
                Token::Raw { bits: 1, len: 1 }
            ]
        );
    }

    #[test]
    fn refinement_bits_held_for_an_eob_run_are_bounded_as_libjpeg_bounds_them() {
        // Sixteen blocks of 63 coefficients that were nonzero before: 63
        // bits each wait for the EOB run, and after 15 blocks (945 bits)
        // the run is sent (EOB3 + 7 for 15), then one for the last block.
        let block = [2i16; 64];
        let mut tokens = Vec::new();
        ac_refine(&grey_row(vec![block; 16]), &LAST_BITS, &mut tokens);
        assert_eq!(symbols(&tokens), [0x30, 0x00]);
        assert_eq!(tokens.len(), 2 + 16 * 63);
        assert_eq!(
            tokens[0],
            Token::Coded {
                table: 4,
                symbol: 0x30,
                extra: 7,
                len: 3
            }
        );
    }

    #[test]
    fn other_shapes_come_back_as_none() {
        assert!(progressive(&busy_jpeg_progressive(8, 8, 80)).is_none());
        let mut cmyk = Vec::new();
        jpeg_encoder::Encoder::new(&mut cmyk, 80)
            .encode(&[10, 20, 30, 40].repeat(64), 8, 8, ColorType::Cmyk)
            .unwrap();
        assert!(progressive(&cmyk).is_none(), "four components");
        let original = busy_jpeg(64, 48, 82, ColorType::Rgb, SamplingFactor::R_4_2_0);
        assert!(progressive(&original[..original.len() - 40]).is_none());
        assert!(progressive(b"not a jpeg").is_none());
    }
}
