//! What an MPEG-TS segment of ours holds, measured: its size, its video
//! frames' presentation times, whether it opens on a keyframe, its H.264
//! profile, level and picture size (from the first sequence parameter set)
//! and its AAC frames. The playlists are written from these measurements,
//! not from the muxer's estimates, so a package written in one run and one
//! joined from chunks describe their segments the same way.
//!
//! It reads the segments ffmpeg's MPEG-TS muxer writes (PAT, one program,
//! one PES per video access unit, ADTS audio); anything else is an error
//! naming what was wrong, never a panic. Timestamps are 90 kHz and assumed
//! not to wrap (2^33 ticks: 26.5 hours). Pure.

/// A transport stream packet's size.
const PACKET: usize = 188;

/// ISO/IEC 13818-1 stream types.
const STREAM_H264: u8 = 0x1B;
const STREAM_AAC_ADTS: u8 = 0x0F;

/// PTS ticks per second.
pub const TICKS_PER_SECOND: u64 = 90_000;

/// AAC frames carry 1024 samples per channel (AAC-LC, what ffmpeg's `aac`
/// encoder writes).
pub const AAC_FRAME_SAMPLES: u64 = 1024;

/// An H.264 stream's format, from its sequence parameter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoFormat {
    pub profile_idc: u8,
    /// The constraint_set flags byte.
    pub constraints: u8,
    pub level_idc: u8,
    /// The cropped picture size.
    pub width: u32,
    pub height: u32,
}

impl VideoFormat {
    /// The RFC 6381 codec string: `avc1.64001f`.
    pub fn codec(&self) -> String {
        format!(
            "avc1.{:02x}{:02x}{:02x}",
            self.profile_idc, self.constraints, self.level_idc
        )
    }
}

/// An AAC stream's format, from its first ADTS header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioFormat {
    /// MPEG-4 audio object type (2: AAC-LC).
    pub object_type: u8,
    pub sample_rate: u32,
    pub channels: u8,
}

impl AudioFormat {
    /// The RFC 6381 codec string: `mp4a.40.2`.
    pub fn codec(&self) -> String {
        format!("mp4a.40.{}", self.object_type)
    }
}

/// One segment, measured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    /// The file's size: what a client downloads.
    pub bytes: u64,
    /// Each video frame's PTS, in presentation order.
    pub video_pts: Vec<u64>,
    /// The first video access unit holds an IDR picture.
    pub starts_with_keyframe: bool,
    pub video: Option<VideoFormat>,
    pub audio: Option<AudioFormat>,
    /// The first audio PES's PTS.
    pub audio_pts: Option<u64>,
    /// ADTS frames in the segment.
    pub audio_frames: u64,
    /// Where the first video access unit's last packet ends, when that
    /// unit is an IDR picture: bytes `0..keyframe_end` hold the PAT, the
    /// PMT and one keyframe, a stream of their own (an I-frame playlist's
    /// byte range). Audio packets the muxer interleaved with the
    /// keyframe's are inside it.
    pub keyframe_end: Option<u64>,
}

impl Segment {
    /// The earliest video frame's PTS.
    pub fn first_pts(&self) -> Option<u64> {
        self.video_pts.first().copied()
    }
}

/// Measures a segment, or says what is wrong with it.
pub fn read_segment(bytes: &[u8]) -> Result<Segment, String> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(PACKET) {
        return Err(format!(
            "{} bytes is not a whole number of 188-byte packets",
            bytes.len()
        ));
    }
    let mut pmt_pid = None;
    let mut streams: Vec<(u8, u16)> = Vec::new();
    let mut video = Pes::default();
    let mut audio = Pes::default();
    let mut segment = Segment {
        bytes: bytes.len() as u64,
        ..Segment::default()
    };
    // Video PES starts seen (video is known only once the PMT is read, so
    // the tables come before the first), and where the first one's last
    // packet ends.
    let mut video_starts = 0u32;
    let mut first_unit_end = 0u64;
    for (index, packet) in bytes.chunks(PACKET).enumerate() {
        if packet[0] != 0x47 {
            return Err(format!("packet {index} has no sync byte"));
        }
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
        let kind = streams.iter().find(|(_, p)| *p == pid).map(|(t, _)| *t);
        if pid == 0 && start && pmt_pid.is_none() {
            pmt_pid = Some(first_program_pid(section(payload)?)?);
        } else if Some(pid) == pmt_pid && start && streams.is_empty() {
            streams = pmt_streams(section(payload)?)?;
        } else if kind == Some(STREAM_H264) {
            if start {
                video.finish(|pes| take_video(pes, &mut segment))?;
                video_starts += 1;
            }
            if video_starts == 1 {
                first_unit_end = (index as u64 + 1) * PACKET as u64;
            }
            video.push(start, payload);
        } else if kind == Some(STREAM_AAC_ADTS) {
            if start {
                audio.finish(|pes| take_audio(pes, &mut segment))?;
            }
            audio.push(start, payload);
        }
    }
    video.finish(|pes| take_video(pes, &mut segment))?;
    audio.finish(|pes| take_audio(pes, &mut segment))?;
    if pmt_pid.is_none() {
        return Err("no program association table".into());
    }
    if streams.is_empty() {
        return Err("no program map table".into());
    }
    segment.video_pts.sort_unstable();
    if segment.starts_with_keyframe {
        segment.keyframe_end = Some(first_unit_end);
    }
    Ok(segment)
}

/// One elementary stream's PES packet, gathered across TS packets.
#[derive(Default)]
struct Pes {
    bytes: Vec<u8>,
    started: bool,
}

impl Pes {
    fn push(&mut self, start: bool, payload: &[u8]) {
        if start {
            self.started = true;
        }
        // Bytes before the stream's first PES start belong to a PES of an
        // earlier segment: not ours to read.
        if self.started {
            self.bytes.extend_from_slice(payload);
        }
    }

    fn finish(&mut self, take: impl FnOnce(&[u8]) -> Result<(), String>) -> Result<(), String> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        let pes = std::mem::take(&mut self.bytes);
        take(&pes)
    }
}

/// A PES packet's PTS and elementary-stream bytes.
fn pes_parts(pes: &[u8]) -> Result<(Option<u64>, &[u8]), String> {
    if pes.len() < 9 || pes[..3] != [0, 0, 1] {
        return Err("a PES packet without its start code".into());
    }
    let header_length = pes[8] as usize;
    let es = pes
        .get(9 + header_length..)
        .ok_or("a PES header longer than its packet")?;
    let pts = if pes[7] & 0x80 != 0 {
        let p = pes.get(9..14).ok_or("a PES header cut inside its PTS")?;
        Some(
            ((p[0] as u64 >> 1) & 0x07) << 30
                | (p[1] as u64) << 22
                | (p[2] as u64 >> 1) << 15
                | (p[3] as u64) << 7
                | (p[4] as u64 >> 1),
        )
    } else {
        None
    };
    Ok((pts, es))
}

/// One video access unit: its PTS, and for the first, its keyframe and SPS.
fn take_video(pes: &[u8], segment: &mut Segment) -> Result<(), String> {
    let (pts, es) = pes_parts(pes)?;
    let pts = pts.ok_or("a video access unit without a PTS")?;
    let first = segment.video_pts.is_empty();
    segment.video_pts.push(pts);
    if first {
        for nal in nal_units(es) {
            match nal.first().map(|h| h & 0x1F) {
                Some(5) => segment.starts_with_keyframe = true,
                Some(7) if segment.video.is_none() => {
                    segment.video = Some(read_sps(&unescape(&nal[1..]))?);
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// ADTS frames of one audio PES: counted, and the first one's format.
fn take_audio(pes: &[u8], segment: &mut Segment) -> Result<(), String> {
    let (pts, mut es) = pes_parts(pes)?;
    if segment.audio_pts.is_none() {
        segment.audio_pts = pts;
    }
    while !es.is_empty() {
        if es.len() < 7 || es[0] != 0xFF || es[1] & 0xF0 != 0xF0 {
            return Err("audio that is not ADTS frames".into());
        }
        let length =
            ((es[3] as usize & 0x03) << 11) | (es[4] as usize) << 3 | (es[5] as usize >> 5);
        if length < 7 || length > es.len() {
            return Err(format!(
                "an ADTS frame of {length} bytes in {} bytes",
                es.len()
            ));
        }
        if segment.audio.is_none() {
            const RATES: [u32; 13] = [
                96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000,
                7350,
            ];
            let rate_index = (es[2] >> 2) & 0x0F;
            segment.audio = Some(AudioFormat {
                object_type: (es[2] >> 6) + 1,
                sample_rate: *RATES
                    .get(rate_index as usize)
                    .ok_or(format!("ADTS sampling frequency index {rate_index}"))?,
                channels: ((es[2] & 0x01) << 2) | (es[3] >> 6),
            });
        }
        segment.audio_frames += 1;
        es = &es[length..];
    }
    Ok(())
}

/// A PSI section after its pointer field.
fn section(payload: &[u8]) -> Result<&[u8], String> {
    let pointer = *payload.first().ok_or("an empty PSI payload")? as usize;
    let section = payload
        .get(1 + pointer..)
        .filter(|s| s.len() >= 3)
        .ok_or("a PSI pointer past its packet")?;
    let length = (u16::from_be_bytes([section[1] & 0x0F, section[2]])) as usize;
    section
        .get(..3 + length)
        .filter(|s| s.len() >= 12)
        .ok_or_else(|| "a PSI section longer than its packet".into())
}

/// The PID of the first program's PMT in a PAT section.
fn first_program_pid(pat: &[u8]) -> Result<u16, String> {
    // Header (8 bytes), then 4-byte entries, then the CRC.
    pat[8..pat.len() - 4]
        .chunks_exact(4)
        .find(|e| u16::from_be_bytes([e[0], e[1]]) != 0)
        .map(|e| u16::from_be_bytes([e[2] & 0x1F, e[3]]))
        .ok_or_else(|| "a PAT without a program".into())
}

/// (stream type, PID) of each elementary stream in a PMT section.
fn pmt_streams(pmt: &[u8]) -> Result<Vec<(u8, u16)>, String> {
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
    if streams.is_empty() {
        return Err("a PMT without streams".into());
    }
    Ok(streams)
}

/// The NAL units of an Annex B byte stream, without their start codes.
fn nal_units(es: &[u8]) -> Vec<&[u8]> {
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
    let mut units = Vec::with_capacity(starts.len());
    for (n, &start) in starts.iter().enumerate() {
        let mut end = starts.get(n + 1).map_or(es.len(), |next| next - 3);
        // Back over zeros before the next start code (its 4-byte form).
        while end > start && es[end - 1] == 0 {
            end -= 1;
        }
        if end > start {
            units.push(&es[start..end]);
        }
    }
    units
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

/// Reads bits most significant first, and Exp-Golomb codes; `None` past
/// the end.
struct Bits<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> Option<u32> {
        let byte = self.bytes.get(self.at / 8)?;
        self.at += 1;
        Some(((byte >> (7 - (self.at - 1) % 8)) & 1) as u32)
    }

    fn bits(&mut self, n: u32) -> Option<u32> {
        (0..n).try_fold(0, |value, _| Some((value << 1) | self.bit()?))
    }

    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        Some(((1u64 << zeros) - 1 + self.bits(zeros)? as u64) as u32)
    }

    fn se(&mut self) -> Option<i32> {
        let code = self.ue()? as i64;
        Some(if code % 2 == 1 {
            (code + 1) / 2
        } else {
            -(code / 2)
        } as i32)
    }
}

/// Profile, level and cropped picture size from an H.264 SPS's RBSP
/// (ITU-T H.264 7.3.2.1.1).
fn read_sps(rbsp: &[u8]) -> Result<VideoFormat, String> {
    sps_fields(rbsp).ok_or_else(|| "a sequence parameter set cut short".into())
}

fn sps_fields(rbsp: &[u8]) -> Option<VideoFormat> {
    let mut b = Bits { bytes: rbsp, at: 0 };
    let profile_idc = b.bits(8)? as u8;
    let constraints = b.bits(8)? as u8;
    let level_idc = b.bits(8)? as u8;
    b.ue()?; // seq_parameter_set_id
    let mut chroma_format = 1;
    if [100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135].contains(&profile_idc) {
        chroma_format = b.ue()?;
        if chroma_format == 3 {
            b.bit()?; // separate_colour_plane_flag
        }
        b.ue()?; // bit_depth_luma_minus8
        b.ue()?; // bit_depth_chroma_minus8
        b.bit()?; // qpprime_y_zero_transform_bypass_flag
        if b.bit()? == 1 {
            // seq_scaling_matrix_present_flag: skip each list present.
            let lists = if chroma_format == 3 { 12 } else { 8 };
            for i in 0..lists {
                if b.bit()? == 1 {
                    let size = if i < 6 { 16 } else { 64 };
                    let (mut last, mut next) = (8i32, 8i32);
                    for _ in 0..size {
                        if next != 0 {
                            next = (last + b.se()? + 256) % 256;
                        }
                        if next != 0 {
                            last = next;
                        }
                    }
                }
            }
        }
    }
    b.ue()?; // log2_max_frame_num_minus4
    match b.ue()? {
        0 => {
            b.ue()?; // log2_max_pic_order_cnt_lsb_minus4
        }
        1 => {
            b.bit()?;
            b.se()?;
            b.se()?;
            for _ in 0..b.ue()? {
                b.se()?;
            }
        }
        _ => {}
    }
    b.ue()?; // max_num_ref_frames
    b.bit()?; // gaps_in_frame_num_value_allowed_flag
    let width_mbs = b.ue()? + 1;
    let height_map_units = b.ue()? + 1;
    let frame_mbs_only = b.bit()?;
    if frame_mbs_only == 0 {
        b.bit()?; // mb_adaptive_frame_field_flag
    }
    b.bit()?; // direct_8x8_inference_flag
    let (mut crop_x, mut crop_y) = (0, 0);
    if b.bit()? == 1 {
        let (left, right, top, bottom) = (b.ue()?, b.ue()?, b.ue()?, b.ue()?);
        // Crop units (Table 6-1): chroma subsampling, and fields.
        let (sub_width, sub_height) = match chroma_format {
            0 => (1, 1),
            1 => (2, 2),
            2 => (2, 1),
            _ => (1, 1),
        };
        crop_x = sub_width * (left + right);
        crop_y = sub_height * (2 - frame_mbs_only) * (top + bottom);
    }
    let width = (width_mbs * 16).checked_sub(crop_x)?;
    let height = ((2 - frame_mbs_only) * height_map_units * 16).checked_sub(crop_y)?;
    Some(VideoFormat {
        profile_idc,
        constraints,
        level_idc,
        width,
        height,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TS packet: sync, PID, payload start, payload only, stuffed with
    /// an adaptation field to 188 bytes.
    fn packet(pid: u16, start: bool, payload: &[u8]) -> Vec<u8> {
        assert!(payload.len() <= 183);
        let stuffing = 184 - payload.len();
        let mut p = vec![
            0x47,
            (if start { 0x40 } else { 0 }) | (pid >> 8) as u8,
            pid as u8,
        ];
        if stuffing == 0 {
            p.push(0x10);
        } else {
            p.push(0x30);
            p.push((stuffing - 1) as u8);
            if stuffing > 1 {
                p.push(0);
                p.extend(std::iter::repeat_n(0xFF, stuffing - 2));
            }
        }
        p.extend_from_slice(payload);
        assert_eq!(p.len(), PACKET);
        p
    }

    fn psi(table_id: u8, body: &[u8]) -> Vec<u8> {
        let length = body.len() + 5 + 4;
        let mut s = vec![
            0,
            table_id,
            0xB0 | (length >> 8) as u8,
            length as u8,
            0,
            1,
            0xC1,
            0,
            0,
        ];
        s.extend_from_slice(body);
        s.extend_from_slice(&[0, 0, 0, 0]); // CRC, not checked
        s
    }

    fn pes(stream_id: u8, pts: u64, es: &[u8]) -> Vec<u8> {
        let mut p = vec![0, 0, 1, stream_id, 0, 0, 0x80, 0x80, 5];
        p.extend_from_slice(&[
            0x21 | ((pts >> 29) & 0x0E) as u8,
            (pts >> 22) as u8,
            0x01 | ((pts >> 14) & 0xFE) as u8,
            (pts >> 7) as u8,
            0x01 | ((pts << 1) & 0xFE) as u8,
        ]);
        p.extend_from_slice(es);
        p
    }

    /// x264's SPS for 1920x1080 High 4.0 (the pinned ffmpeg's, from a
    /// 1080p rendition), with its NAL header.
    const SPS_1080: &[u8] = &[
        0x67, 0x64, 0x00, 0x28, 0xac, 0xd9, 0x40, 0x78, 0x02, 0x27, 0xe5, 0xc0, 0x44, 0x00, 0x00,
        0x03, 0x00, 0x04, 0x00, 0x00, 0x03, 0x00, 0xf0, 0x3c, 0x60, 0xc6, 0x58,
    ];

    fn adts(frames: usize) -> Vec<u8> {
        // AAC-LC, 48 kHz (index 3), stereo, 10-byte frames.
        let frame = [0xFF, 0xF1, 0x4C, 0x80, 0x01, 0x5F, 0xFC, 1, 2, 3];
        frame.repeat(frames)
    }

    fn stream(video_pts: &[u64], keyframe: bool) -> Vec<u8> {
        let mut ts = packet(0, true, &psi(0, &[0, 1, 0xF0, 0x00]));
        ts.extend(packet(
            0x1000,
            true,
            &psi(
                2,
                &[
                    0xE1, 0x00, 0xF0, 0, 0x1B, 0xE1, 0x00, 0xF0, 0, 0x0F, 0xE1, 0x01, 0xF0, 0,
                ],
            ),
        ));
        for (i, &pts) in video_pts.iter().enumerate() {
            let mut es = vec![0, 0, 0, 1, 0x09, 0xF0];
            if i == 0 {
                es.extend([0, 0, 0, 1]);
                es.extend_from_slice(SPS_1080);
            }
            es.extend([0, 0, 1, if keyframe && i == 0 { 0x65 } else { 0x41 }, 0x88]);
            ts.extend(packet(0x100, true, &pes(0xE0, pts, &es)));
        }
        let audio = pes(0xC0, 126_000, &adts(12));
        ts.extend(packet(0x101, true, &audio[..100]));
        ts.extend(packet(0x101, false, &audio[100..]));
        ts
    }

    #[test]
    fn a_segment_measured() {
        // Decode order with a B-frame: presentation order comes back sorted.
        let segment = read_segment(&stream(&[126_000, 135_000, 129_000], true)).unwrap();
        assert_eq!(segment.video_pts, [126_000, 129_000, 135_000]);
        assert_eq!(segment.first_pts(), Some(126_000));
        assert!(segment.starts_with_keyframe);
        let video = segment.video.unwrap();
        assert_eq!((video.width, video.height), (1920, 1080));
        assert_eq!(video.codec(), "avc1.640028");
        let audio = segment.audio.unwrap();
        assert_eq!(audio.codec(), "mp4a.40.2");
        assert_eq!((audio.sample_rate, audio.channels), (48_000, 2));
        assert_eq!(segment.audio_frames, 12);
        assert_eq!(segment.audio_pts, Some(126_000));
        assert_eq!(segment.bytes, 7 * 188);

        // The keyframe's range: the tables and its one packet, not the
        // frames after it.
        assert_eq!(segment.keyframe_end, Some(3 * 188));

        let no_key = read_segment(&stream(&[0], false)).unwrap();
        assert!(!no_key.starts_with_keyframe);
        assert_eq!(no_key.keyframe_end, None);
    }

    #[test]
    fn a_keyframe_range_runs_to_its_units_last_packet_past_interleaved_audio() {
        let mut ts = stream(&[], true);
        // stream() with no frames: PAT, PMT, two audio packets.
        assert_eq!(ts.len(), 4 * 188);
        let mut es = vec![0, 0, 0, 1, 0x09, 0xF0, 0, 0, 0, 1];
        es.extend_from_slice(SPS_1080);
        es.extend([0, 0, 1, 0x65]);
        es.extend(std::iter::repeat_n(0x88, 300));
        let unit = pes(0xE0, 900_000, &es);
        ts.extend(packet(0x100, true, &unit[..180]));
        ts.extend(packet(0x101, true, &pes(0xC0, 130_000, &adts(2))));
        ts.extend(packet(0x100, false, &unit[180..]));
        ts.extend(packet(
            0x100,
            true,
            &pes(0xE0, 903_000, &[0, 0, 1, 0x41, 0x88]),
        ));
        let segment = read_segment(&ts).unwrap();
        assert!(segment.starts_with_keyframe);
        assert_eq!(segment.keyframe_end, Some(7 * 188));
    }

    #[test]
    fn broken_segments_are_named_not_panicked_on() {
        let good = stream(&[0, 3000], true);
        assert!(read_segment(&good[..100])
            .unwrap_err()
            .contains("not a whole number of 188-byte packets"));
        let mut unsynced = good.clone();
        unsynced[188] = 0;
        assert_eq!(
            read_segment(&unsynced).unwrap_err(),
            "packet 1 has no sync byte"
        );
        assert_eq!(
            read_segment(&good[188..]).unwrap_err(),
            "no program association table"
        );
        // Every cut of the SPS is an error, not a panic.
        for cut in 4..SPS_1080.len() {
            let _ = read_sps(&unescape(&SPS_1080[1..cut]));
        }
        // Every single-byte corruption of every packet: never a panic.
        for at in (0..good.len()).step_by(7) {
            let mut bad = good.clone();
            bad[at] ^= 0xA5;
            let _ = read_segment(&bad);
        }
    }
}
