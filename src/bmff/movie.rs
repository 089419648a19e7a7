//! The pure parse of `ftyp` and `moov` into a [`MovieInfo`]: brand,
//! duration, and per track its codec, size, rotation, timing, bitrate,
//! language and data references.

use serde::Serialize;

use super::boxes::{child, children, fourcc, Child, Cursor};
use super::fragments::{fragment_end_ticks, sample_duration_defaults};
use super::locate::MovieBoxes;
use super::BmffError;

/// What `probe` reports about a movie.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MovieInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_brand: Option<String>,
    pub compatible_brands: Vec<String>,
    /// Seconds, from the movie header (or the fragment header when
    /// fragmented); `None` when the file says it is unknown.
    pub duration: Option<f64>,
    pub fragmented: bool,
    pub tracks: Vec<TrackInfo>,
}

/// One track of a movie.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackInfo {
    pub id: u32,
    /// `video`, `audio`, `subtitle`, `text`, `metadata`, or the handler type.
    pub kind: String,
    /// The sample entry's four-character code: `avc1`, `hvc1`, `mp4a`, ….
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// The RFC 6381 codec string (`avc1.64001f`, `mp4a.40.2`) when the
    /// decoder configuration tells it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codecs: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Clockwise rotation in degrees from the track matrix: 0, 90, 180, 270.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotation: Option<u32>,
    /// Frames per second, from the sample timing (rounded to 1/1000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u16>,
    /// Bits per second: the track's sample bytes over its duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bitrate: Option<u64>,
    pub samples: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The first data reference (`minf/dinf/dref`) that points outside the
    /// file: a `url `, `urn ` or `alis` entry without the self-contained
    /// flag, and where it points. Such a track's samples live elsewhere
    /// (another file, a URL), so no tool should be given it to read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_data: Option<String>,
    /// Ticks per second of the track's media times (`mdhd`).
    #[serde(skip)]
    pub timescale: u32,
}

impl MovieInfo {
    /// The first video track, if any.
    pub fn video(&self) -> Option<&TrackInfo> {
        self.tracks.iter().find(|t| t.kind == "video")
    }

    /// The first audio track, if any.
    pub fn audio(&self) -> Option<&TrackInfo> {
        self.tracks.iter().find(|t| t.kind == "audio")
    }

    /// The first track whose data is referenced outside the file, and
    /// where: `track 2: 'url ' "file:///etc/passwd"`.
    pub fn external_data(&self) -> Option<String> {
        self.tracks.iter().find_map(|t| {
            t.external_data
                .as_ref()
                .map(|reference| format!("track {}: {reference}", t.id))
        })
    }
}

/// Turns what [`locate_movie`] found into a [`MovieInfo`]. Pure. A
/// fragmented file whose `moov` gives no duration gets each track's from
/// its last fragment: that fragment's start plus its samples' durations.
pub fn parse_boxes(boxes: &MovieBoxes) -> Result<MovieInfo, BmffError> {
    let mut movie = parse_movie(boxes.ftyp.as_deref(), &boxes.moov, boxes.fragments)?;
    let Some(index) = &boxes.fragment_index else {
        return Ok(movie);
    };
    let defaults = sample_duration_defaults(&boxes.moov);
    let ends = fragment_end_ticks(index, &defaults);
    for track in &mut movie.tracks {
        if let (None, Some(&end), true) = (track.duration, ends.get(&track.id), track.timescale > 0)
        {
            track.duration = Some(seconds(end, track.timescale));
        }
    }
    if movie.duration.is_none() {
        movie.duration = movie
            .tracks
            .iter()
            .filter_map(|t| t.duration)
            .fold(None, |max: Option<f64>, d| {
                Some(max.map_or(d, |m| m.max(d)))
            });
    }
    Ok(movie)
}

/// Turns the `ftyp` and `moov` bodies into a [`MovieInfo`]. Pure.
pub fn parse_movie(
    ftyp: Option<&[u8]>,
    moov: &[u8],
    fragments: u64,
) -> Result<MovieInfo, BmffError> {
    let (major_brand, compatible_brands) = match ftyp {
        Some(ftyp) => {
            let mut cursor = Cursor::new(ftyp, "ftyp");
            let major = fourcc(cursor.take(4, "major brand")?);
            cursor.skip(4, "minor version")?;
            let mut brands = Vec::new();
            while cursor.remaining() >= 4 {
                let brand = fourcc(cursor.take(4, "compatible brand")?);
                if !brand.trim_matches('\0').is_empty() && !brands.contains(&brand) {
                    brands.push(brand);
                }
            }
            (Some(major), brands)
        }
        None => (None, Vec::new()),
    };
    let boxes = children(moov, "moov")?;
    let (timescale, duration_units) = movie_header(&boxes)?;
    let mut duration = duration_units
        .filter(|&d| d > 0)
        .map(|d| seconds(d, timescale));
    // A fragmented file's movie header may say 0; mvex/mehd has the total.
    if let Some(mvex) = child(&boxes, b"mvex") {
        if let Some(mehd) = child(&children(mvex, "moov/mvex")?, b"mehd") {
            let mut cursor = Cursor::new(mehd, "moov/mvex/mehd");
            let version = cursor.version()?;
            if let Some(total) = cursor.sized(version, "fragment duration")? {
                if duration.is_none() && total > 0 {
                    duration = Some(seconds(total, timescale));
                }
            }
        }
    }
    let mut tracks = Vec::new();
    for (kind, body) in &boxes {
        if kind == b"trak" {
            tracks.push(parse_track(body)?);
        }
    }
    Ok(MovieInfo {
        major_brand,
        compatible_brands,
        duration,
        fragmented: fragments > 0 || child(&boxes, b"mvex").is_some(),
        tracks,
    })
}

pub(super) fn seconds(units: u64, timescale: u32) -> f64 {
    round_to(units as f64 / timescale as f64, 1000.0)
}

pub(super) fn round_to(value: f64, per: f64) -> f64 {
    (value * per).round() / per
}

/// The head `mvhd` and `mdhd` share: the cursor after it, the timescale
/// and the duration (`None`: unknown).
pub(super) fn time_header<'a>(
    body: &'a [u8],
    path: &'a str,
) -> Result<(Cursor<'a>, u32, Option<u64>), BmffError> {
    let mut cursor = Cursor::new(body, path);
    let version = cursor.version()?;
    cursor.sized(version, "creation time")?;
    cursor.sized(version, "modification time")?;
    let timescale = cursor.u32("timescale")?;
    let duration = cursor.sized(version, "duration")?;
    Ok((cursor, timescale, duration))
}

/// The movie header's timescale (never 0) and duration, from the `moov`'s
/// children.
pub(super) fn movie_header(moov: &[Child<'_>]) -> Result<(u32, Option<u64>), BmffError> {
    let mvhd = child(moov, b"mvhd")
        .ok_or_else(|| BmffError::Malformed("'moov' has no 'mvhd' movie header".into()))?;
    let (_, timescale, duration) = time_header(mvhd, "moov/mvhd")?;
    if timescale == 0 {
        return Err(BmffError::Malformed("'moov/mvhd' timescale is 0".into()));
    }
    Ok((timescale, duration))
}

/// The handler type of a track's `mdia` children (`vide`, `soun`, …), if
/// it has a `hdlr`.
pub(super) fn handler_type(mdia: &[Child<'_>]) -> Result<Option<[u8; 4]>, BmffError> {
    let Some(hdlr) = child(mdia, b"hdlr") else {
        return Ok(None);
    };
    let mut cursor = Cursor::new(hdlr, "trak/mdia/hdlr");
    cursor.version()?;
    cursor.skip(4, "pre-defined")?;
    let kind = cursor.take(4, "handler type")?;
    Ok(Some([kind[0], kind[1], kind[2], kind[3]]))
}

pub(super) fn parse_track(trak: &[u8]) -> Result<TrackInfo, BmffError> {
    let boxes = children(trak, "trak")?;
    let tkhd = child(&boxes, b"tkhd")
        .ok_or_else(|| BmffError::Malformed("a 'trak' has no 'tkhd' track header".into()))?;
    let mut cursor = Cursor::new(tkhd, "trak/tkhd");
    let version = cursor.version()?;
    cursor.sized(version, "creation time")?;
    cursor.sized(version, "modification time")?;
    let id = cursor.u32("track id")?;
    cursor.skip(4, "reserved")?;
    cursor.sized(version, "duration")?;
    cursor.skip(8 + 2 + 2 + 2 + 2, "layer, group, volume")?;
    let mut matrix = [0i32; 9];
    for value in matrix.iter_mut() {
        *value = cursor.u32("matrix")? as i32;
    }
    let display_width = cursor.u32("width")? >> 16;
    let display_height = cursor.u32("height")? >> 16;

    let mdia = child(&boxes, b"mdia")
        .ok_or_else(|| BmffError::Malformed(format!("track {id} has no 'mdia' box")))?;
    let mdia = children(mdia, "trak/mdia")?;
    let mdhd = child(&mdia, b"mdhd")
        .ok_or_else(|| BmffError::Malformed(format!("track {id} has no 'mdhd' media header")))?;
    let (mut cursor, timescale, media_duration) = time_header(mdhd, "trak/mdia/mdhd")?;
    let media_duration = media_duration.filter(|&d| d > 0);
    let language = language(cursor.u16("language")?);
    if timescale == 0 {
        return Err(BmffError::Malformed(format!(
            "track {id}: 'mdhd' timescale is 0"
        )));
    }
    let handler = handler_type(&mdia)?.unwrap_or(*b"????");
    let kind = match &handler[..] {
        b"vide" => "video".to_string(),
        b"soun" => "audio".to_string(),
        b"sbtl" | b"subt" => "subtitle".to_string(),
        b"text" => "text".to_string(),
        b"meta" => "metadata".to_string(),
        other => fourcc(other),
    };

    let mut track = TrackInfo {
        id,
        kind,
        codec: None,
        codecs: None,
        duration: media_duration.map(|d| seconds(d, timescale)),
        width: None,
        height: None,
        rotation: None,
        frame_rate: None,
        sample_rate: None,
        channels: None,
        bitrate: None,
        samples: 0,
        language,
        external_data: None,
        timescale,
    };
    if track.kind == "video" {
        track.rotation = rotation(&matrix);
        if display_width > 0 && display_height > 0 {
            track.width = Some(display_width);
            track.height = Some(display_height);
        }
    }
    let Some(minf) = child(&mdia, b"minf") else {
        return Ok(track);
    };
    let minf = children(minf, "trak/mdia/minf")?;
    if let Some(dinf) = child(&minf, b"dinf") {
        if let Some(dref) = child(&children(dinf, "trak/mdia/minf/dinf")?, b"dref") {
            track.external_data = external_reference(dref)?;
        }
    }
    let Some(stbl) = child(&minf, b"stbl") else {
        return Ok(track);
    };
    let stbl = children(stbl, "stbl")?;
    if let Some(stsd) = child(&stbl, b"stsd") {
        parse_sample_description(stsd, &mut track)?;
    }
    let timing = match child(&stbl, b"stts") {
        Some(stts) => Some(parse_stts(stts)?),
        None => None,
    };
    let bytes = match child(&stbl, b"stsz") {
        Some(stsz) => Some(parse_stsz(stsz)?),
        None => None,
    };
    if let Some((samples, ticks)) = timing {
        track.samples = samples;
        if track.kind == "video" && samples > 0 && ticks > 0 {
            track.frame_rate = Some(round_to(
                samples as f64 * timescale as f64 / ticks as f64,
                1000.0,
            ));
        }
        let ticks = media_duration.unwrap_or(ticks);
        if let (Some((_, total)), true) = (bytes, ticks > 0) {
            track.bitrate =
                Some((total as f64 * 8.0 * timescale as f64 / ticks as f64).round() as u64);
        }
    }
    Ok(track)
}

/// The first entry of a `dref` (ISO/IEC 14496-12 8.7.2, QuickTime's data
/// references) that is not self-contained (flag 1), with the location it
/// names (`url `/`urn `: a NUL-terminated string; `alis`: a Mac alias,
/// binary). `None` when every entry is in this file.
pub(super) fn external_reference(dref: &[u8]) -> Result<Option<String>, BmffError> {
    let mut cursor = Cursor::new(dref, "dinf/dref");
    cursor.version()?;
    // Every entry present is looked at, whatever the count says: a reader
    // that trusts a smaller count must still not be handed the others.
    cursor.u32("entry count")?;
    let entries = children(cursor.take(cursor.remaining(), "entries")?, "dinf/dref")?;
    for (kind, body) in entries {
        let mut cursor = Cursor::new(body, "dinf/dref entry");
        cursor.u8("version")?;
        let flags = cursor.take(3, "flags")?;
        if flags[2] & 1 == 1 {
            continue;
        }
        let location = match &kind {
            b"url " | b"urn " => {
                let text = cursor.take(cursor.remaining(), "location")?;
                let text: Vec<&[u8]> = text.split(|&b| b == 0).filter(|t| !t.is_empty()).collect();
                let shown: Vec<String> = text
                    .iter()
                    .map(|t| format!("{:?}", String::from_utf8_lossy(&t[..t.len().min(200)])))
                    .collect();
                shown.join(" ")
            }
            _ => format!("{} bytes", body.len().saturating_sub(4)),
        };
        return Ok(Some(
            format!("'{}' {location}", fourcc(&kind))
                .trim_end()
                .to_string(),
        ));
    }
    Ok(None)
}

/// The ISO 639-2/T code packed in three 5-bit letters; `und` is no answer.
pub(super) fn language(packed: u16) -> Option<String> {
    let letters: String = [10u16, 5, 0]
        .iter()
        .map(|shift| (((packed >> shift) & 0x1f) as u8 + 0x60) as char)
        .collect();
    (letters.chars().all(|c| c.is_ascii_lowercase()) && letters != "und").then_some(letters)
}

/// The clockwise rotation a track matrix applies, if it is a plain one.
pub(super) fn rotation(matrix: &[i32; 9]) -> Option<u32> {
    const ONE: i32 = 0x10000;
    match (matrix[0], matrix[1], matrix[3], matrix[4]) {
        (ONE, 0, 0, ONE) => Some(0),
        (0, ONE, m, 0) if m == -ONE => Some(90),
        (m, 0, 0, n) if m == -ONE && n == -ONE => Some(180),
        (0, m, ONE, 0) if m == -ONE => Some(270),
        _ => None,
    }
}

pub(super) fn parse_sample_description(
    stsd: &[u8],
    track: &mut TrackInfo,
) -> Result<(), BmffError> {
    let mut cursor = Cursor::new(stsd, "stsd");
    cursor.version()?;
    let count = cursor.u32("entry count")?;
    if count == 0 {
        return Ok(());
    }
    let entries = children(&stsd[cursor.at..], "stsd")?;
    let Some((format, entry)) = entries.first() else {
        return Err(BmffError::Malformed(format!(
            "'stsd' of track {} declares {count} entries but holds none",
            track.id
        )));
    };
    let codec = fourcc(format);
    track.codec = Some(codec.clone());
    let mut cursor = Cursor::new(entry, "stsd entry");
    cursor.skip(6 + 2, "reserved, data reference index")?;
    let extensions = match track.kind.as_str() {
        "video" => {
            cursor.skip(16, "pre-defined")?;
            let width = cursor.u16("width")?;
            let height = cursor.u16("height")?;
            cursor.skip(4 + 4 + 4 + 2 + 32 + 2 + 2, "resolution, name, depth")?;
            if width > 0 && height > 0 {
                track.width = Some(width as u32);
                track.height = Some(height as u32);
            }
            &entry[cursor.at..]
        }
        "audio" => {
            // QuickTime sound descriptions carry a version in the first
            // reserved field and grow with it.
            let version = cursor.u16("sound version")?;
            cursor.skip(6, "reserved")?;
            let channels = cursor.u16("channel count")?;
            cursor.skip(2 + 2 + 2, "sample size, reserved")?;
            let rate = cursor.u32("sample rate")? >> 16;
            match version {
                1 => cursor.skip(16, "sound v1 fields")?,
                2 => {
                    cursor.skip(4, "size of struct")?;
                    let rate = f64::from_bits(cursor.u64("sample rate")?);
                    let channels = cursor.u32("channel count")?;
                    cursor.skip(20, "sound v2 fields")?;
                    track.sample_rate =
                        (rate.is_finite() && rate > 0.0 && rate < 1e7).then_some(rate as u32);
                    track.channels = u16::try_from(channels).ok();
                }
                _ => {}
            }
            if version != 2 {
                track.sample_rate = (rate > 0).then_some(rate);
                track.channels = (channels > 0).then_some(channels);
            }
            &entry[cursor.at..]
        }
        _ => return Ok(()),
    };
    // A decoder configuration that does not parse leaves `codecs` unset:
    // the codec is known by its four characters all the same.
    let Ok(extensions) = children(extensions, "sample entry") else {
        return Ok(());
    };
    match format {
        b"avc1" | b"avc3" => {
            track.codecs = child(&extensions, b"avcC").and_then(|avcc| {
                (avcc.len() >= 4)
                    .then(|| format!("{codec}.{:02x}{:02x}{:02x}", avcc[1], avcc[2], avcc[3]))
            });
        }
        b"mp4a" => {
            let config = child(&extensions, b"esds")
                .or_else(|| {
                    // QuickTime nests it in a 'wave' box.
                    let wave = child(&extensions, b"wave")?;
                    child(&children(wave, "wave").ok()?, b"esds")
                })
                .and_then(parse_esds);
            if let Some(config) = config {
                track.codecs = Some(config.codecs);
                track.sample_rate = config.sample_rate.or(track.sample_rate);
                track.channels = config.channels.or(track.channels);
            }
        }
        _ => {}
    }
    Ok(())
}

/// What an `esds` box tells of an MPEG-4 audio track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AudioConfig {
    /// `mp4a.<object type>[.<audio object type>]`
    pub(super) codecs: String,
    pub(super) sample_rate: Option<u32>,
    pub(super) channels: Option<u16>,
}

/// The sampling frequencies an AudioSpecificConfig indexes.
pub(super) const AAC_SAMPLE_RATES: [u32; 13] = [
    96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350,
];

/// Reads an `esds` box: the object type, and from the AudioSpecificConfig
/// the audio object type, sampling rate and channels (the sample entry's
/// own channel count is a fixed 2 in files from many muxers).
pub(super) fn parse_esds(esds: &[u8]) -> Option<AudioConfig> {
    let mut cursor = Cursor::new(esds, "esds");
    cursor.version().ok()?;
    let mut object_type = None;
    // Descriptors nest: ES (3) holds DecoderConfig (4) holds the
    // DecoderSpecificInfo (5).
    while cursor.remaining() > 0 {
        let tag = cursor.u8("descriptor tag").ok()?;
        let mut length = 0usize;
        for _ in 0..4 {
            let byte = cursor.u8("descriptor length").ok()?;
            length = (length << 7) | (byte & 0x7f) as usize;
            if byte & 0x80 == 0 {
                break;
            }
        }
        match tag {
            3 => {
                cursor.skip(2, "ES id").ok()?;
                let flags = cursor.u8("ES flags").ok()?;
                if flags & 0x80 != 0 {
                    cursor.skip(2, "depends on").ok()?;
                }
                if flags & 0x40 != 0 {
                    let url = cursor.u8("URL length").ok()? as usize;
                    cursor.skip(url, "URL").ok()?;
                }
                if flags & 0x20 != 0 {
                    cursor.skip(2, "OCR id").ok()?;
                }
            }
            4 => {
                object_type = Some(cursor.u8("object type").ok()?);
                cursor.skip(12, "decoder config").ok()?;
            }
            5 => {
                let info = cursor.take(length, "decoder specific info").ok()?;
                return Some(audio_specific_config(object_type?, info));
            }
            _ => cursor.skip(length, "descriptor").ok()?,
        }
    }
    object_type.map(|object| AudioConfig {
        codecs: format!("mp4a.{object:x}"),
        sample_rate: None,
        channels: None,
    })
}

/// The start of an MPEG-4 AudioSpecificConfig (ISO 14496-3 1.6.2.1).
pub(super) fn audio_specific_config(object_type: u8, info: &[u8]) -> AudioConfig {
    let mut bits = Bits { bytes: info, at: 0 };
    let mut read = || -> Option<(u32, Option<u32>, Option<u16>)> {
        let mut audio = bits.read(5)?;
        if audio == 31 {
            audio = 32 + bits.read(6)?;
        }
        let index = bits.read(4)?;
        let rate = if index == 15 {
            Some(bits.read(24)?)
        } else {
            AAC_SAMPLE_RATES.get(index as usize).copied()
        };
        let channels = match bits.read(4)? {
            0 => None,
            7 => Some(8),
            n @ 1..=6 => Some(n as u16),
            _ => None,
        };
        Some((audio, rate, channels))
    };
    match read() {
        Some((audio, sample_rate, channels)) => AudioConfig {
            codecs: format!("mp4a.{object_type:x}.{audio}"),
            sample_rate,
            channels,
        },
        None => AudioConfig {
            codecs: format!("mp4a.{object_type:x}"),
            sample_rate: None,
            channels: None,
        },
    }
}

/// Big-endian bits of a byte slice.
pub(super) struct Bits<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn read(&mut self, count: usize) -> Option<u32> {
        let mut value = 0u32;
        for _ in 0..count {
            let byte = *self.bytes.get(self.at / 8)?;
            value = (value << 1) | ((byte >> (7 - self.at % 8)) & 1) as u32;
            self.at += 1;
        }
        Some(value)
    }
}

/// (samples, ticks) from the decoding time-to-sample table.
pub(super) fn parse_stts(stts: &[u8]) -> Result<(u64, u64), BmffError> {
    let mut cursor = Cursor::new(stts, "stts");
    cursor.version()?;
    let count = cursor.u32("entry count")? as usize;
    if count > cursor.remaining() / 8 {
        return Err(BmffError::Malformed(format!(
            "'stts' declares {count} entries but holds only {}",
            cursor.remaining() / 8
        )));
    }
    let (mut samples, mut ticks) = (0u64, 0u64);
    for _ in 0..count {
        let n = cursor.u32("sample count")? as u64;
        let delta = cursor.u32("sample delta")? as u64;
        samples += n;
        // Saturating: a lying table must not overflow into a panic.
        ticks = ticks.saturating_add(n * delta);
    }
    Ok((samples, ticks))
}

/// (samples, total bytes) from the sample size table.
pub(super) fn parse_stsz(stsz: &[u8]) -> Result<(u64, u64), BmffError> {
    let mut cursor = Cursor::new(stsz, "stsz");
    cursor.version()?;
    let constant = cursor.u32("sample size")? as u64;
    let count = cursor.u32("sample count")? as u64;
    if constant != 0 {
        return Ok((count, constant * count));
    }
    if count > (cursor.remaining() / 4) as u64 {
        return Err(BmffError::Malformed(format!(
            "'stsz' declares {count} sample sizes but holds only {}",
            cursor.remaining() / 4
        )));
    }
    let mut total = 0u64;
    for _ in 0..count {
        total += cursor.u32("sample size")? as u64;
    }
    Ok((count, total))
}
