//! A small MPEG-TS reader for checking `hls-package`'s segments without
//! ffprobe (the pinned static ffmpeg ships none, and its MPEG-TS demuxer
//! crashes in its static glibc's iconv unless `GCONV_PATH` leads nowhere):
//! packets, PAT → PMT → the elementary streams'
//! types, the first H.264 sequence parameter set of the video stream (read
//! for the coded picture size), each video frame's PTS and IDR flag, and
//! each AAC frame's PTS from its PES's PTS and the ADTS headers after it.

/// What a segment carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// ISO/IEC 13818-1 stream types in PMT order: 0x1B H.264, 0x0F AAC (ADTS).
    pub stream_types: Vec<u8>,
    /// The displayed size from the first SPS of the H.264 stream, if any.
    pub video_size: Option<(u32, u32)>,
    /// RFC 6381's `avc1.PPCCLL` from the same SPS's first three bytes.
    pub video_codec: Option<String>,
    /// Every video PES's PTS (90 kHz), sorted: the frames' presentation
    /// times.
    pub video_pts: Vec<u64>,
    /// Whether each video PES, in stream order, holds an IDR slice.
    pub idr: Vec<bool>,
    /// Every AAC frame's PTS (90 kHz): its PES's PTS plus 1,024 samples
    /// for each ADTS frame before it in the PES.
    pub audio_pts: Vec<u64>,
    /// The ADTS sample rate, if any audio.
    pub audio_rate: Option<u32>,
}

impl Segment {
    pub fn has_h264(&self) -> bool {
        self.stream_types.contains(&0x1B)
    }

    pub fn has_aac(&self) -> bool {
        self.stream_types.contains(&0x0F)
    }
}

const PACKET: usize = 188;

/// Reads a transport stream; panics with the reason on a malformed one.
pub fn read_segment(bytes: &[u8]) -> Segment {
    assert!(
        !bytes.is_empty() && bytes.len().is_multiple_of(PACKET),
        "{} bytes is not a whole number of 188-byte packets",
        bytes.len()
    );
    let mut pmt_pid = None;
    let mut streams: Vec<(u8, u16)> = Vec::new();
    let mut video_units: Vec<Vec<u8>> = Vec::new();
    let mut pes = Vec::new();
    let mut audio_units: Vec<Vec<u8>> = Vec::new();
    let mut audio_pes = Vec::new();
    for (index, packet) in bytes.chunks(PACKET).enumerate() {
        assert_eq!(packet[0], 0x47, "packet {index} has no sync byte");
        let start = packet[1] & 0x40 != 0;
        let pid = u16::from_be_bytes([packet[1] & 0x1F, packet[2]]);
        let adaptation = (packet[3] >> 4) & 0b11;
        let mut at = 4;
        if adaptation & 0b10 != 0 {
            at += 1 + packet[4] as usize;
        }
        if adaptation & 0b01 == 0 || at >= PACKET {
            continue;
        }
        let payload = &packet[at..];
        if pid == 0 && start && pmt_pid.is_none() {
            pmt_pid = Some(first_program_pid(section(payload)));
        } else if Some(pid) == pmt_pid && start && streams.is_empty() {
            streams = pmt_streams(section(payload));
        } else {
            let kind = streams.iter().find(|(_, p)| *p == pid).map(|(t, _)| *t);
            let (units, open) = match kind {
                Some(0x1B) => (&mut video_units, &mut pes),
                Some(0x0F) => (&mut audio_units, &mut audio_pes),
                _ => continue,
            };
            if start || !open.is_empty() {
                if start && !open.is_empty() {
                    units.push(std::mem::take(open));
                }
                open.extend_from_slice(payload);
            }
        }
    }
    if !pes.is_empty() {
        video_units.push(pes);
    }
    if !audio_pes.is_empty() {
        audio_units.push(audio_pes);
    }
    let mut audio_pts = Vec::new();
    let mut audio_rate = None;
    for unit in &audio_units {
        let pts = pes_pts(unit);
        let mut es = pes_payload(unit);
        let mut k = 0;
        while es.len() >= 7 {
            assert!(es[0] == 0xFF && es[1] & 0xF0 == 0xF0, "no ADTS sync word");
            let rate = ADTS_RATES[((es[2] >> 2) & 0x0F) as usize];
            audio_rate = Some(rate);
            let length =
                ((es[3] as usize & 0x03) << 11) | (es[4] as usize) << 3 | (es[5] as usize) >> 5;
            assert!(length >= 7 && length <= es.len(), "an ADTS frame cut short");
            audio_pts.push(pts + k * 1024 * 90_000 / rate as u64);
            k += 1;
            es = &es[length..];
        }
        assert!(es.is_empty(), "bytes after the last ADTS frame");
    }
    let video_pes = video_units.first().cloned().unwrap_or_default();
    let mut video_pts: Vec<u64> = video_units.iter().map(|unit| pes_pts(unit)).collect();
    video_pts.sort_unstable();
    let idr = video_units
        .iter()
        .map(|unit| {
            nal_units(pes_payload(unit)).any(|nal| nal.first().is_some_and(|h| h & 0x1F == 5))
        })
        .collect();
    assert!(pmt_pid.is_some(), "no program association table");
    assert!(!streams.is_empty(), "no program map table");
    let sps = (!video_pes.is_empty()).then(|| {
        let es = pes_payload(&video_pes);
        let sps = nal_units(es)
            .find(|nal| nal.first().is_some_and(|h| h & 0x1F == 7))
            .expect("no sequence parameter set in the first video PES");
        unescape(&sps[1..])
    });
    let video_size = sps.as_deref().map(sps_size);
    let video_codec = sps.map(|s| format!("avc1.{:02x}{:02x}{:02x}", s[0], s[1], s[2]));
    Segment {
        stream_types: streams.iter().map(|(t, _)| *t).collect(),
        video_size,
        video_codec,
        video_pts,
        idr,
        audio_pts,
        audio_rate,
    }
}

/// ADTS's sampling frequency index (ISO/IEC 14496-3, 1.6.3.4).
const ADTS_RATES: [u32; 16] = [
    96_000, 88_200, 64_000, 48_000, 44_100, 32_000, 24_000, 22_050, 16_000, 12_000, 11_025, 8_000,
    7_350, 1, 1, 1,
];

/// A PSI section after its pointer field.
fn section(payload: &[u8]) -> &[u8] {
    let pointer = payload[0] as usize;
    let section = &payload[1 + pointer..];
    let length = (u16::from_be_bytes([section[1] & 0x0F, section[2]])) as usize;
    &section[..3 + length]
}

/// The PID of the first program's PMT in a PAT section.
fn first_program_pid(pat: &[u8]) -> u16 {
    // Header (8 bytes), then 4-byte entries, then the CRC.
    let entries = &pat[8..pat.len() - 4];
    entries
        .chunks(4)
        .find(|e| u16::from_be_bytes([e[0], e[1]]) != 0)
        .map(|e| u16::from_be_bytes([e[2] & 0x1F, e[3]]))
        .expect("a PAT without a program")
}

/// (stream type, PID) of each elementary stream in a PMT section.
fn pmt_streams(pmt: &[u8]) -> Vec<(u8, u16)> {
    let info_length = (u16::from_be_bytes([pmt[10] & 0x0F, pmt[11]])) as usize;
    let mut at = 12 + info_length;
    let end = pmt.len() - 4;
    let mut streams = Vec::new();
    while at + 5 <= end {
        let kind = pmt[at];
        let pid = u16::from_be_bytes([pmt[at + 1] & 0x1F, pmt[at + 2]]);
        let es_info = (u16::from_be_bytes([pmt[at + 3] & 0x0F, pmt[at + 4]])) as usize;
        streams.push((kind, pid));
        at += 5 + es_info;
    }
    streams
}

/// A PES packet's PTS (it must have one).
fn pes_pts(pes: &[u8]) -> u64 {
    assert!(pes[7] & 0x80 != 0, "a PES without a PTS");
    let p = &pes[9..14];
    ((p[0] as u64 >> 1) & 0x07) << 30
        | (p[1] as u64) << 22
        | (p[2] as u64 >> 1) << 15
        | (p[3] as u64) << 7
        | (p[4] as u64 >> 1)
}

/// The elementary stream bytes of a PES packet.
fn pes_payload(pes: &[u8]) -> &[u8] {
    assert_eq!(&pes[..3], [0, 0, 1], "no PES start code");
    let header_length = pes[8] as usize;
    &pes[9 + header_length..]
}

/// The NAL units of an Annex B byte stream, without their start codes.
fn nal_units(es: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 <= es.len() {
        if es[i..i + 3] == [0, 0, 1] {
            starts.push(i + 3);
            i += 3;
        } else {
            i += 1;
        }
    }
    let ends: Vec<usize> = starts
        .iter()
        .skip(1)
        .map(|&s| {
            // Back over the next start code, and a zero before it (4-byte form).
            let mut end = s - 3;
            while end > 0 && es[end - 1] == 0 {
                end -= 1;
            }
            end
        })
        .chain(std::iter::once(es.len()))
        .collect();
    starts.into_iter().zip(ends).map(move |(s, e)| &es[s..e])
}

/// A NAL unit's RBSP: emulation-prevention bytes (00 00 03) removed.
fn unescape(nal: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(nal.len());
    let mut zeros = 0;
    for &byte in nal {
        if zeros >= 2 && byte == 3 {
            zeros = 0;
            continue;
        }
        zeros = if byte == 0 { zeros + 1 } else { 0 };
        out.push(byte);
    }
    out
}

/// Reads bits most significant first, and Exp-Golomb codes.
struct Bits<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> u32 {
        let byte = self.bytes[self.at / 8];
        let bit = (byte >> (7 - self.at % 8)) & 1;
        self.at += 1;
        bit as u32
    }

    fn bits(&mut self, n: u32) -> u32 {
        (0..n).fold(0, |value, _| (value << 1) | self.bit())
    }

    fn ue(&mut self) -> u32 {
        let mut zeros = 0;
        while self.bit() == 0 {
            zeros += 1;
        }
        (1 << zeros) - 1 + self.bits(zeros)
    }

    fn se(&mut self) -> i32 {
        let code = self.ue() as i64;
        (if code % 2 == 1 {
            (code + 1) / 2
        } else {
            -(code / 2)
        }) as i32
    }
}

/// The cropped picture size in an H.264 SPS (ITU-T H.264 7.3.2.1.1).
fn sps_size(rbsp: &[u8]) -> (u32, u32) {
    let mut b = Bits { bytes: rbsp, at: 0 };
    let profile = b.bits(8);
    b.bits(16); // constraint flags, level
    b.ue(); // seq_parameter_set_id
    let mut chroma_format = 1;
    if [100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135].contains(&profile) {
        chroma_format = b.ue();
        if chroma_format == 3 {
            b.bit(); // separate_colour_plane_flag
        }
        b.ue(); // bit_depth_luma_minus8
        b.ue(); // bit_depth_chroma_minus8
        b.bit(); // qpprime_y_zero_transform_bypass_flag
        if b.bit() == 1 {
            // seq_scaling_matrix_present_flag: skip each list present.
            let lists = if chroma_format == 3 { 12 } else { 8 };
            for i in 0..lists {
                if b.bit() == 1 {
                    let size = if i < 6 { 16 } else { 64 };
                    let (mut last, mut next) = (8i32, 8i32);
                    for _ in 0..size {
                        if next != 0 {
                            next = (last + b.se() + 256) % 256;
                        }
                        if next != 0 {
                            last = next;
                        }
                    }
                }
            }
        }
    }
    b.ue(); // log2_max_frame_num_minus4
    match b.ue() {
        0 => {
            b.ue(); // log2_max_pic_order_cnt_lsb_minus4
        }
        1 => {
            b.bit();
            b.se();
            b.se();
            for _ in 0..b.ue() {
                b.se();
            }
        }
        _ => {}
    }
    b.ue(); // max_num_ref_frames
    b.bit(); // gaps_in_frame_num_value_allowed_flag
    let width_mbs = b.ue() + 1;
    let height_map_units = b.ue() + 1;
    let frame_mbs_only = b.bit();
    if frame_mbs_only == 0 {
        b.bit(); // mb_adaptive_frame_field_flag
    }
    b.bit(); // direct_8x8_inference_flag
    let (mut crop_x, mut crop_y) = (0, 0);
    if b.bit() == 1 {
        let (left, right, top, bottom) = (b.ue(), b.ue(), b.ue(), b.ue());
        // 4:2:0 and 4:2:2 halve the chroma width; 4:2:0 its height too.
        let unit_x = if chroma_format == 1 || chroma_format == 2 {
            2
        } else {
            1
        };
        let unit_y = (if chroma_format == 1 { 2 } else { 1 }) * (2 - frame_mbs_only);
        crop_x = (left + right) * unit_x;
        crop_y = (top + bottom) * unit_y;
    }
    let width = width_mbs * 16 - crop_x;
    let height = height_map_units * 16 * (2 - frame_mbs_only) - crop_y;
    (width, height)
}
