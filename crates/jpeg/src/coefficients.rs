//! A baseline JPEG's quantised coefficients, read back from the one
//! interleaved scan jpeg-encoder writes, so that `optimize` and
//! `progressive` can write the same coefficients again in fewer bytes.
//! Not a decoder: nothing is dequantised or transformed, so whatever is
//! written from these coefficients decodes to the very same pixels.
//!
//! It reads only that shape (SOF0, one scan of every component, no
//! restart markers, EOI right after the scan); anything else is `None`.

use super::entropy::{Bits, Huffman};
use super::syntax::{huffman_tables, Frame, Segments};

/// One component's blocks, each 64 coefficients in zigzag order, on the
/// grid the interleaved scan's MCUs cover (padding blocks included).
pub(super) struct Plane {
    /// Blocks across the grid: MCUs across times the component's `h`.
    pub stride: usize,
    /// Blocks across and down that hold the component's own samples: what
    /// a scan of this component alone covers (T.81 A.2.2).
    pub width: usize,
    pub height: usize,
    pub blocks: Vec<[i16; 64]>,
}

/// A baseline JPEG taken apart: the segments before its scan, its frame
/// and its coefficients.
pub(super) struct Baseline<'a> {
    /// Every segment between SOI and the scan, in order, but the Huffman
    /// tables (DHT) and the scan header: the frame header (SOF0) is
    /// among them.
    pub segments: Vec<&'a [u8]>,
    /// The scan header (SOS), whole.
    pub scan_header: &'a [u8],
    /// With the scan's table selectors.
    pub frame: Frame,
    /// By component, in the frame's order.
    pub planes: Vec<Plane>,
}

impl<'a> Baseline<'a> {
    /// `None` if `jpeg` is not a whole baseline file of the shape above.
    pub fn read(jpeg: &'a [u8]) -> Option<Self> {
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
                // Other frames, DNL, restart intervals.
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
        // One component is one block an MCU, whatever its factors say
        // (T.81 A.2.2); jpeg-encoder writes it 1×1, so read only that.
        if let [c] = &frame.components[..] {
            (c.h == 1 && c.v == 1).then_some(())?;
        }
        let (hmax, vmax) = frame.max_sampling();
        let (mcus_x, mcus_y) = frame.mcus();
        let mut planes: Vec<Plane> = frame
            .components
            .iter()
            .map(|c| {
                let samples_w = (frame.width * c.h).div_ceil(hmax);
                let samples_h = (frame.height * c.v).div_ceil(vmax);
                Plane {
                    stride: mcus_x * c.h,
                    width: samples_w.div_ceil(8),
                    height: samples_h.div_ceil(8),
                    blocks: vec![[0; 64]; mcus_x * c.h * mcus_y * c.v],
                }
            })
            .collect();

        let mut bits = Bits::new(jpeg.get(segments.at..)?);
        let mut predictions = vec![0i32; frame.components.len()];
        for mcu_y in 0..mcus_y {
            for mcu_x in 0..mcus_x {
                for (ci, c) in frame.components.iter().enumerate() {
                    let dc = tables[c.dc].as_ref()?;
                    let ac = tables[c.ac].as_ref()?;
                    let plane = &mut planes[ci];
                    for y in 0..c.v {
                        for x in 0..c.h {
                            let at = (mcu_y * c.v + y) * plane.stride + mcu_x * c.h + x;
                            let block = &mut plane.blocks[at];
                            let size = dc.decode(&mut bits)?;
                            if size > 11 {
                                return None;
                            }
                            bits.fill();
                            predictions[ci] += receive_extend(&mut bits, size);
                            block[0] = i16::try_from(predictions[ci]).ok()?;
                            read_ac(&mut bits, ac, block)?;
                        }
                    }
                }
            }
        }
        // After the scan: padding, then EOI.
        if !bits.at_end_of_image() {
            return None;
        }
        Some(Baseline {
            segments: kept,
            scan_header: scan_header.bytes,
            frame,
            planes,
        })
    }
}

/// A block's 63 AC coefficients; `None` if they run past the block.
fn read_ac(bits: &mut Bits, table: &Huffman, block: &mut [i16; 64]) -> Option<()> {
    let mut k = 1;
    while k < 64 {
        let rs = table.decode(bits)?;
        let (run, size) = ((rs >> 4) as usize, rs & 15);
        if size == 0 {
            if run == 15 {
                k += 16;
                continue;
            }
            return Some(()); // End of block.
        }
        k += run;
        bits.fill();
        *block.get_mut(k)? = receive_extend(bits, size) as i16;
        k += 1;
    }
    (k == 64).then_some(())
}

/// `size` extra bits as a signed value; 0 for no bits.
fn receive_extend(bits: &mut Bits, size: u8) -> i32 {
    if size == 0 {
        0
    } else {
        bits.receive_extend(size as u32) as i32
    }
}

/// Calls `visit` with each block of a scan of `components` (indexes into
/// the frame's), in the scan's order: MCU by MCU when it holds more than
/// one (padding blocks included), else the component's own blocks row by
/// row (T.81 A.2).
pub(super) fn for_each_block(
    frame: &Frame,
    planes: &[Plane],
    components: &[usize],
    mut visit: impl FnMut(usize, &[i16; 64]),
) {
    if let [ci] = components {
        let plane = &planes[*ci];
        for y in 0..plane.height {
            for x in 0..plane.width {
                visit(*ci, &plane.blocks[y * plane.stride + x]);
            }
        }
        return;
    }
    let (mcus_x, mcus_y) = frame.mcus();
    for mcu_y in 0..mcus_y {
        for mcu_x in 0..mcus_x {
            for &ci in components {
                let (c, plane) = (&frame.components[ci], &planes[ci]);
                for y in 0..c.v {
                    for x in 0..c.h {
                        let at = (mcu_y * c.v + y) * plane.stride + mcu_x * c.h + x;
                        visit(ci, &plane.blocks[at]);
                    }
                }
            }
        }
    }
}
