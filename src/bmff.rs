//! ISO base media files (MP4, MOV, M4A): what a movie holds, read from its
//! `ftyp` and `moov` boxes only.
//!
//! Two halves. [`locate_movie`] walks the top-level boxes through ranged
//! reads of any [`RangeSource`], jumping over `mdat` by its declared size, so
//! a `moov` at the end of a multi-gigabyte file costs two or three small
//! reads. [`parse_movie`] is pure: it turns the `ftyp` and `moov` bytes into
//! a [`MovieInfo`]. Every size in the file is checked against the bytes that
//! hold it, so a truncated or lying file is an error naming the box, never a
//! panic or an endless read.

use std::ops::Range;

use serde::Serialize;

/// Bytes read at each top-level box whose header is not already at hand:
/// enough for `ftyp`, a small `moov` and the next header in one request.
pub const WINDOW_BYTES: u64 = 64 * 1024;

/// The largest `moov` read. A two-hour film's is a few megabytes; beyond
/// this the file is refused rather than held in memory.
pub const MAX_MOOV_BYTES: u64 = 64 * 1024 * 1024;

/// Top-level boxes walked before giving up (fragmented files have two per
/// fragment; thousands of tiny boxes are a lie or an attack).
pub const MAX_TOP_LEVEL_BOXES: usize = 100_000;

/// Why a file could not be read as a movie.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmffError {
    #[error("truncated file: {0}")]
    Truncated(String),
    #[error("malformed box: {0}")]
    Malformed(String),
    #[error("not a movie: {0}")]
    NotAMovie(String),
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("reading bytes {start}-{end} failed: {message}")]
    Read {
        start: u64,
        end: u64,
        message: String,
    },
}

impl BmffError {
    /// Whether the file itself is at fault (every error but a failed read):
    /// reading it again gives the same answer.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, BmffError::Read { .. })
    }
}

/// Where [`locate_movie`] reads from: an S3 object, a local file, a slice.
#[async_trait::async_trait]
pub trait RangeSource: Send + Sync {
    /// The bytes in `range`, which never reaches past the source's size.
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String>;
}

#[async_trait::async_trait]
impl RangeSource for [u8] {
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String> {
        self.get(range.start as usize..range.end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("range {range:?} outside {} bytes", self.len()))
    }
}

#[async_trait::async_trait]
impl RangeSource for std::fs::File {
    async fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>, String> {
        use std::os::unix::fs::FileExt;
        // A moov can be 64 MiB: read it on a blocking thread, not a runtime one.
        let file = self.try_clone().map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0u8; (range.end - range.start) as usize];
            file.read_exact_at(&mut buffer, range.start)
                .map_err(|e| e.to_string())?;
            Ok(buffer)
        })
        .await
        .map_err(|e| format!("reading the file: {e}"))?
    }
}

/// The boxes [`parse_movie`] needs, and what finding them cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MovieBoxes {
    pub ftyp: Option<Vec<u8>>,
    pub moov: Vec<u8>,
    /// Top-level `moof` boxes seen: a fragmented file.
    pub fragments: u64,
    /// A fragmented file's random access index and last fragment, if it
    /// ends with one (`mfro`): where its duration comes from.
    pub fragment_index: Option<FragmentIndex>,
    pub reads: u32,
    pub bytes_read: u64,
}

/// The bodies of a fragmented file's `mfra` box and of the last `moof` it
/// points to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FragmentIndex {
    pub mfra: Vec<u8>,
    pub last_moof: Vec<u8>,
}

/// A box header: its type, where its body starts and where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BoxHeader {
    kind: [u8; 4],
    header_len: u64,
    /// `None`: the box runs to the end of its container (size 0).
    size: Option<u64>,
}

/// Parses a box header from the start of `bytes`; `Ok(None)` when more
/// bytes are needed than `bytes` holds.
fn parse_header(bytes: &[u8]) -> Result<Option<BoxHeader>, BmffError> {
    if bytes.len() < 8 {
        return Ok(None);
    }
    let size32 = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    let kind: [u8; 4] = bytes[4..8].try_into().unwrap();
    let (mut header_len, size) = match size32 {
        0 => (8, None),
        1 => {
            if bytes.len() < 16 {
                return Ok(None);
            }
            (
                16,
                Some(u64::from_be_bytes(bytes[8..16].try_into().unwrap())),
            )
        }
        n => (8, Some(n as u64)),
    };
    if &kind == b"uuid" {
        header_len += 16;
        if (bytes.len() as u64) < header_len {
            return Ok(None);
        }
    }
    if let Some(size) = size {
        if size < header_len {
            return Err(BmffError::Malformed(format!(
                "box '{}' declares {size} bytes, less than its {header_len}-byte header",
                fourcc(&kind)
            )));
        }
    }
    Ok(Some(BoxHeader {
        kind,
        header_len,
        size,
    }))
}

/// A ranged read that must return exactly the bytes asked for, counted.
async fn read<S: RangeSource + ?Sized>(
    source: &S,
    range: Range<u64>,
    found: &mut MovieBoxes,
) -> Result<Vec<u8>, BmffError> {
    let bytes = source
        .read_range(range.clone())
        .await
        .map_err(|message| BmffError::Read {
            start: range.start,
            end: range.end,
            message,
        })?;
    if bytes.len() as u64 != range.end - range.start {
        return Err(BmffError::Read {
            start: range.start,
            end: range.end,
            message: format!("got {} bytes", bytes.len()),
        });
    }
    found.reads += 1;
    found.bytes_read += bytes.len() as u64;
    Ok(bytes)
}

/// Reads a fragmented file's index from its end: `mfro` (the last 16
/// bytes) gives the size of `mfra`, whose `tfra` entries give the offset of
/// the last `moof`. Three small reads. `None` when the file has no index or
/// it does not add up: the index is optional, and the duration then stays
/// unknown.
async fn read_fragment_index<S: RangeSource + ?Sized>(
    source: &S,
    size: u64,
    found: &mut MovieBoxes,
) -> Option<FragmentIndex> {
    if size < 16 {
        return None;
    }
    let tail = read(source, size - 16..size, found).await.ok()?;
    if &tail[0..8] != b"\0\0\0\x10mfro" {
        return None;
    }
    let mfra_size = u32::from_be_bytes(tail[12..16].try_into().unwrap()) as u64;
    if !(16..=size.min(MAX_MOOV_BYTES)).contains(&mfra_size) {
        return None;
    }
    let mfra = read(source, size - mfra_size..size, found).await.ok()?;
    let header = parse_header(&mfra).ok()??;
    if &header.kind != b"mfra" || header.size != Some(mfra_size) {
        return None;
    }
    let mfra = mfra[header.header_len as usize..].to_vec();
    let at = last_moof_offset(&mfra)?;
    if at >= size - mfra_size {
        return None;
    }
    let window = read(source, at..size.min(at + WINDOW_BYTES), found)
        .await
        .ok()?;
    let header = parse_header(&window).ok()??;
    let moof_size = header.size?;
    if &header.kind != b"moof" || moof_size > MAX_MOOV_BYTES || moof_size > size - at {
        return None;
    }
    let last_moof = if moof_size <= window.len() as u64 {
        window[header.header_len as usize..moof_size as usize].to_vec()
    } else {
        read(source, at + header.header_len..at + moof_size, found)
            .await
            .ok()?
    };
    Some(FragmentIndex { mfra, last_moof })
}

/// Finds `ftyp` and `moov` among the top-level boxes of a source of `size`
/// bytes. `start` is the source's first bytes if the caller already has
/// them (it saves a read).
pub async fn locate_movie<S: RangeSource + ?Sized>(
    source: &S,
    size: u64,
    start: &[u8],
) -> Result<MovieBoxes, BmffError> {
    let mut found = MovieBoxes::default();
    // The bytes at hand: `window` holds the source's bytes from `window_at`.
    let mut window_at = 0u64;
    let mut window = start[..start.len().min(size as usize)].to_vec();
    let mut offset = 0u64;
    let mut boxes = 0usize;
    let mut mdat = false;

    while offset < size {
        boxes += 1;
        if boxes > MAX_TOP_LEVEL_BOXES {
            return Err(BmffError::TooLarge(format!(
                "more than {MAX_TOP_LEVEL_BOXES} top-level boxes"
            )));
        }
        let in_window = |at: u64, window_at: u64, window: &[u8]| -> Option<usize> {
            (at >= window_at && at - window_at <= window.len() as u64)
                .then(|| (at - window_at) as usize)
        };
        let mut header = match in_window(offset, window_at, &window) {
            Some(i) => parse_header(&window[i..])?,
            None => None,
        };
        if header.is_none() {
            let end = size.min(offset + WINDOW_BYTES);
            window = read(source, offset..end, &mut found).await?;
            window_at = offset;
            header = parse_header(&window)?;
        }
        let Some(header) = header else {
            return Err(BmffError::Truncated(format!(
                "{} bytes at offset {offset} are too few for a box header",
                size - offset
            )));
        };
        let name = fourcc(&header.kind);
        if boxes == 1 && !is_top_level_movie_box(&header.kind) {
            return Err(BmffError::NotAMovie(format!(
                "the file starts with a '{name}' box, not 'ftyp', 'moov' or 'mdat'"
            )));
        }
        let box_size = header.size.unwrap_or(size - offset);
        if box_size > size - offset {
            return Err(BmffError::Truncated(format!(
                "box '{name}' at offset {offset} declares {box_size} bytes, but the file has only {} from there",
                size - offset
            )));
        }
        let body = offset + header.header_len..offset + box_size;
        match &header.kind {
            b"ftyp" | b"moov" => {
                if body.end - body.start > MAX_MOOV_BYTES {
                    return Err(BmffError::TooLarge(format!(
                        "box '{name}' at offset {offset} is {box_size} bytes; the limit is {MAX_MOOV_BYTES}"
                    )));
                }
                let bytes = match (
                    in_window(body.start, window_at, &window),
                    in_window(body.end, window_at, &window),
                ) {
                    (Some(from), Some(to)) => window[from..to].to_vec(),
                    _ => read(source, body.clone(), &mut found).await?,
                };
                if &header.kind == b"ftyp" {
                    found.ftyp.get_or_insert(bytes);
                } else if found.moov.is_empty() {
                    found.moov = bytes;
                } else {
                    return Err(BmffError::Malformed(format!(
                        "a second 'moov' box at offset {offset}"
                    )));
                }
            }
            b"moof" => found.fragments += 1,
            b"mdat" => mdat = true,
            _ => {}
        }
        // A fragmented file's fragments follow its moov; their count is
        // not worth reading every fragment header of a long stream for.
        if !found.moov.is_empty() && (mdat || found.fragments > 0) {
            break;
        }
        offset += box_size;
    }
    if found.moov.is_empty() {
        return Err(BmffError::NotAMovie(
            "no 'moov' box: the file has no movie header (an unfinished recording or upload?)"
                .into(),
        ));
    }
    if found.fragments > 0 {
        found.fragment_index = read_fragment_index(source, size, &mut found).await;
    }
    Ok(found)
}

/// Whether a file's first bytes are those of a movie (MP4, MOV, M4A, 3GP),
/// as opposed to an ISO BMFF still image (HEIF, AVIF) or anything else.
pub fn looks_like_movie(start: &[u8]) -> bool {
    let Ok(Some(header)) = parse_header(start) else {
        return false;
    };
    match &header.kind {
        b"ftyp" => {
            let brand = start.get(header.header_len as usize..header.header_len as usize + 4);
            !matches!(
                brand,
                None | Some(
                    b"heic" | b"heix" | b"hevc" | b"hevx" | b"mif1" | b"msf1" | b"avif" | b"avis"
                )
            )
        }
        kind => is_top_level_movie_box(kind) && kind != b"styp",
    }
}

fn is_top_level_movie_box(kind: &[u8; 4]) -> bool {
    matches!(
        kind,
        b"ftyp" | b"moov" | b"mdat" | b"free" | b"skip" | b"wide" | b"pnot" | b"styp"
    )
}

fn fourcc(kind: &[u8]) -> String {
    kind.iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

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

/// A bounds-checked reader over one box's bytes: every read that would run
/// past the end is an error naming the box and the field.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], path: &'a str) -> Self {
        Cursor { bytes, at: 0, path }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], BmffError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(BmffError::Malformed(format!(
                "'{}' ends before its {field} ({} of {} bytes read, {n} more needed)",
                self.path,
                self.at,
                self.bytes.len()
            )));
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn skip(&mut self, n: usize, field: &str) -> Result<(), BmffError> {
        self.take(n, field).map(|_| ())
    }

    fn u8(&mut self, field: &str) -> Result<u8, BmffError> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &str) -> Result<u16, BmffError> {
        Ok(u16::from_be_bytes(self.take(2, field)?.try_into().unwrap()))
    }

    fn u32(&mut self, field: &str) -> Result<u32, BmffError> {
        Ok(u32::from_be_bytes(self.take(4, field)?.try_into().unwrap()))
    }

    fn u64(&mut self, field: &str) -> Result<u64, BmffError> {
        Ok(u64::from_be_bytes(self.take(8, field)?.try_into().unwrap()))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// A full box's version byte and flags.
    fn version(&mut self) -> Result<u8, BmffError> {
        let version = self.u8("version")?;
        self.skip(3, "flags")?;
        Ok(version)
    }

    /// A v0 32-bit or v1 64-bit field; the all-ones value means unknown.
    fn sized(&mut self, version: u8, field: &str) -> Result<Option<u64>, BmffError> {
        Ok(if version == 1 {
            Some(self.u64(field)?).filter(|&v| v != u64::MAX)
        } else {
            Some(self.u32(field)? as u64).filter(|&v| v != u32::MAX as u64)
        })
    }
}

/// The child boxes in `bytes`, each as (type, body); a child reaching past
/// its parent is an error naming both.
/// A child box: its type and body.
type Child<'a> = ([u8; 4], &'a [u8]);

fn children<'a>(bytes: &'a [u8], parent: &str) -> Result<Vec<Child<'a>>, BmffError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let Some(header) = parse_header(rest)? else {
            return Err(BmffError::Malformed(format!(
                "'{parent}' has {} stray bytes at its end, too few for a box header",
                rest.len()
            )));
        };
        let size = header.size.unwrap_or(rest.len() as u64);
        if size > rest.len() as u64 {
            return Err(BmffError::Malformed(format!(
                "'{parent}/{}' declares {size} bytes, but its parent has only {} left",
                fourcc(&header.kind),
                rest.len()
            )));
        }
        out.push((
            header.kind,
            &rest[header.header_len as usize..size as usize],
        ));
        at += size as usize;
    }
    Ok(out)
}

fn child<'a>(boxes: &[Child<'a>], kind: &[u8; 4]) -> Option<&'a [u8]> {
    boxes.iter().find(|(k, _)| k == kind).map(|(_, body)| *body)
}

/// Reads a movie from a source of `size` bytes whose first bytes, if the
/// caller has them, are `start`: [`locate_movie`], then [`parse_boxes`].
pub async fn read_movie<S: RangeSource + ?Sized>(
    source: &S,
    size: u64,
    start: &[u8],
) -> Result<MovieInfo, BmffError> {
    parse_boxes(&locate_movie(source, size, start).await?)
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

/// Each track's default sample duration from `moov/mvex/trex`.
fn sample_duration_defaults(moov: &[u8]) -> std::collections::HashMap<u32, u32> {
    let mut defaults = std::collections::HashMap::new();
    let Ok(boxes) = children(moov, "moov") else {
        return defaults;
    };
    let Some(Ok(mvex)) = child(&boxes, b"mvex").map(|m| children(m, "mvex")) else {
        return defaults;
    };
    for (kind, trex) in mvex {
        if &kind == b"trex" && trex.len() >= 16 {
            let id = u32::from_be_bytes(trex[4..8].try_into().unwrap());
            let duration = u32::from_be_bytes(trex[12..16].try_into().unwrap());
            defaults.insert(id, duration);
        }
    }
    defaults
}

/// The `tfra` boxes of an `mfra` body: per track, its (time, moof offset)
/// entries. Lenient: a `tfra` that does not add up is left out.
fn parse_tfra(mfra: &[u8]) -> Vec<(u32, Vec<(u64, u64)>)> {
    let Ok(boxes) = children(mfra, "mfra") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (kind, body) in boxes {
        if &kind != b"tfra" {
            continue;
        }
        let mut cursor = Cursor::new(body, "tfra");
        let parsed = (|| -> Result<(u32, Vec<(u64, u64)>), BmffError> {
            let version = cursor.version()?;
            let track = cursor.u32("track id")?;
            let sizes = cursor.u32("field sizes")?;
            let count = cursor.u32("entry count")? as usize;
            // Each entry: time and offset, then traf, trun and sample
            // numbers of 1 to 4 bytes each.
            let numbers: usize = [4, 2, 0]
                .iter()
                .map(|shift| ((sizes >> shift) & 3) as usize + 1)
                .sum();
            let entry = if version == 1 { 16 } else { 8 } + numbers;
            if count > cursor.remaining() / entry {
                return Err(BmffError::Malformed("tfra entries".into()));
            }
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                let (time, offset) = if version == 1 {
                    (cursor.u64("time")?, cursor.u64("moof offset")?)
                } else {
                    (
                        cursor.u32("time")? as u64,
                        cursor.u32("moof offset")? as u64,
                    )
                };
                cursor.skip(numbers, "entry numbers")?;
                entries.push((time, offset));
            }
            Ok((track, entries))
        })();
        if let Ok(parsed) = parsed {
            out.push(parsed);
        }
    }
    out
}

/// The offset of the last `moof` the index names.
fn last_moof_offset(mfra: &[u8]) -> Option<u64> {
    parse_tfra(mfra)
        .iter()
        .flat_map(|(_, entries)| entries.iter().map(|&(_, offset)| offset))
        .max()
}

/// Per track, where its last fragment ends, in the track's timescale: the
/// fragment's decode time (`tfdt`, else the index's time for it) plus the
/// durations of its samples (`trun`, else `tfhd`'s or `trex`'s default).
fn fragment_end_ticks(
    index: &FragmentIndex,
    defaults: &std::collections::HashMap<u32, u32>,
) -> std::collections::HashMap<u32, u64> {
    let mut ends = std::collections::HashMap::new();
    let Some(moof_at) = last_moof_offset(&index.mfra) else {
        return ends;
    };
    let index_times: std::collections::HashMap<u32, u64> = parse_tfra(&index.mfra)
        .into_iter()
        .filter_map(|(track, entries)| {
            let time = entries.iter().find(|&&(_, offset)| offset == moof_at)?.0;
            Some((track, time))
        })
        .collect();
    let Ok(boxes) = children(&index.last_moof, "moof") else {
        return ends;
    };
    for (kind, traf) in boxes {
        if &kind != b"traf" {
            continue;
        }
        if let Ok(Some((track, end))) = traf_end(traf, defaults, &index_times) {
            ends.insert(track, end);
        }
    }
    ends
}

fn traf_end(
    traf: &[u8],
    defaults: &std::collections::HashMap<u32, u32>,
    index_times: &std::collections::HashMap<u32, u64>,
) -> Result<Option<(u32, u64)>, BmffError> {
    let boxes = children(traf, "traf")?;
    let Some(tfhd) = child(&boxes, b"tfhd") else {
        return Ok(None);
    };
    let mut cursor = Cursor::new(tfhd, "tfhd");
    let flags = cursor.u32("version and flags")? & 0xff_ffff;
    let track = cursor.u32("track id")?;
    if flags & 0x01 != 0 {
        cursor.skip(8, "base data offset")?;
    }
    if flags & 0x02 != 0 {
        cursor.skip(4, "sample description index")?;
    }
    let default_duration = if flags & 0x08 != 0 {
        cursor.u32("default sample duration")?
    } else {
        defaults.get(&track).copied().unwrap_or(0)
    };
    let start = match child(&boxes, b"tfdt") {
        Some(tfdt) => {
            let mut cursor = Cursor::new(tfdt, "tfdt");
            let version = cursor.version()?;
            if version == 1 {
                cursor.u64("base media decode time")?
            } else {
                cursor.u32("base media decode time")? as u64
            }
        }
        None => match index_times.get(&track) {
            Some(&time) => time,
            None => return Ok(None),
        },
    };
    let mut total = 0u64;
    for (kind, trun) in &boxes {
        if kind != b"trun" {
            continue;
        }
        let mut cursor = Cursor::new(trun, "trun");
        let flags = cursor.u32("version and flags")? & 0xff_ffff;
        let count = cursor.u32("sample count")? as usize;
        if flags & 0x01 != 0 {
            cursor.skip(4, "data offset")?;
        }
        if flags & 0x04 != 0 {
            cursor.skip(4, "first sample flags")?;
        }
        let fields = [0x100, 0x200, 0x400, 0x800]
            .iter()
            .filter(|&&f| flags & f != 0)
            .count();
        if count > 0 && fields > 0 && count > cursor.remaining() / (4 * fields) {
            return Err(BmffError::Malformed("trun sample count".into()));
        }
        if flags & 0x100 == 0 {
            // Every sample lasts the default: no loop over a lying count.
            total = total.saturating_add(count as u64 * default_duration as u64);
            continue;
        }
        for _ in 0..count {
            let duration = cursor.u32("sample duration")?;
            cursor.skip(4 * (fields - 1), "sample fields")?;
            total = total.saturating_add(duration as u64);
        }
    }
    Ok(Some((track, start.saturating_add(total))))
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
    let mvhd = child(&boxes, b"mvhd")
        .ok_or_else(|| BmffError::Malformed("'moov' has no 'mvhd' movie header".into()))?;
    let mut cursor = Cursor::new(mvhd, "moov/mvhd");
    let version = cursor.version()?;
    cursor.sized(version, "creation time")?;
    cursor.sized(version, "modification time")?;
    let timescale = cursor.u32("timescale")?;
    let duration_units = cursor.sized(version, "duration")?;
    if timescale == 0 {
        return Err(BmffError::Malformed("'moov/mvhd' timescale is 0".into()));
    }
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

fn seconds(units: u64, timescale: u32) -> f64 {
    round_to(units as f64 / timescale as f64, 1000.0)
}

fn round_to(value: f64, per: f64) -> f64 {
    (value * per).round() / per
}

fn parse_track(trak: &[u8]) -> Result<TrackInfo, BmffError> {
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
    let mut cursor = Cursor::new(mdhd, "trak/mdia/mdhd");
    let version = cursor.version()?;
    cursor.sized(version, "creation time")?;
    cursor.sized(version, "modification time")?;
    let timescale = cursor.u32("timescale")?;
    let media_duration = cursor.sized(version, "duration")?.filter(|&d| d > 0);
    let language = language(cursor.u16("language")?);
    if timescale == 0 {
        return Err(BmffError::Malformed(format!(
            "track {id}: 'mdhd' timescale is 0"
        )));
    }
    let handler = match child(&mdia, b"hdlr") {
        Some(hdlr) => {
            let mut cursor = Cursor::new(hdlr, "trak/mdia/hdlr");
            cursor.version()?;
            cursor.skip(4, "pre-defined")?;
            cursor.take(4, "handler type")?.to_vec()
        }
        None => b"????".to_vec(),
    };
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
fn external_reference(dref: &[u8]) -> Result<Option<String>, BmffError> {
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
fn language(packed: u16) -> Option<String> {
    let letters: String = [10u16, 5, 0]
        .iter()
        .map(|shift| (((packed >> shift) & 0x1f) as u8 + 0x60) as char)
        .collect();
    (letters.chars().all(|c| c.is_ascii_lowercase()) && letters != "und").then_some(letters)
}

/// The clockwise rotation a track matrix applies, if it is a plain one.
fn rotation(matrix: &[i32; 9]) -> Option<u32> {
    const ONE: i32 = 0x10000;
    match (matrix[0], matrix[1], matrix[3], matrix[4]) {
        (ONE, 0, 0, ONE) => Some(0),
        (0, ONE, m, 0) if m == -ONE => Some(90),
        (m, 0, 0, n) if m == -ONE && n == -ONE => Some(180),
        (0, m, ONE, 0) if m == -ONE => Some(270),
        _ => None,
    }
}

fn parse_sample_description(stsd: &[u8], track: &mut TrackInfo) -> Result<(), BmffError> {
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
struct AudioConfig {
    /// `mp4a.<object type>[.<audio object type>]`
    codecs: String,
    sample_rate: Option<u32>,
    channels: Option<u16>,
}

/// The sampling frequencies an AudioSpecificConfig indexes.
const AAC_SAMPLE_RATES: [u32; 13] = [
    96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350,
];

/// Reads an `esds` box: the object type, and from the AudioSpecificConfig
/// the audio object type, sampling rate and channels (the sample entry's
/// own channel count is a fixed 2 in files from many muxers).
fn parse_esds(esds: &[u8]) -> Option<AudioConfig> {
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
fn audio_specific_config(object_type: u8, info: &[u8]) -> AudioConfig {
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
struct Bits<'a> {
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
fn parse_stts(stts: &[u8]) -> Result<(u64, u64), BmffError> {
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
fn parse_stsz(stsz: &[u8]) -> Result<(u64, u64), BmffError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A box: size, type, body.
    fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(body);
        out
    }

    fn full(version: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![version, 0, 0, 0];
        out.extend_from_slice(body);
        out
    }

    fn be32(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_be_bytes()).collect()
    }

    fn mvhd(timescale: u32, duration: u32) -> Vec<u8> {
        let mut body = be32(&[0, 0, timescale, duration]);
        body.resize(96, 0);
        bx(b"mvhd", &full(0, &body))
    }

    /// A video track of `frames` frames of `delta` ticks at `timescale`,
    /// each `frame_bytes` long.
    fn video_trak(frames: u32, delta: u32, timescale: u32, frame_bytes: u32) -> Vec<u8> {
        let mut tkhd = be32(&[0, 0, 1, 0, frames * delta, 0, 0, 0, 0]);
        for v in [0x10000u32, 0, 0, 0, 0x10000, 0, 0, 0, 0x4000_0000] {
            tkhd.extend_from_slice(&v.to_be_bytes());
        }
        tkhd.extend(be32(&[640 << 16, 360 << 16]));
        let mut mdhd = be32(&[0, 0, timescale, frames * delta]);
        mdhd.extend_from_slice(&[0x15, 0xc7, 0, 0]); // "eng"
        let hdlr = full(0, &[&be32(&[0])[..], b"vide", &[0; 12], b"\0"].concat());
        let mut entry = vec![0u8; 6];
        entry.extend_from_slice(&1u16.to_be_bytes());
        entry.extend_from_slice(&[0; 16]);
        entry.extend_from_slice(&640u16.to_be_bytes());
        entry.extend_from_slice(&360u16.to_be_bytes());
        entry.extend_from_slice(&[0; 50]);
        entry.extend(bx(b"avcC", &[1, 0x64, 0, 0x1f, 0xff]));
        let stsd = full(0, &[be32(&[1]), bx(b"avc1", &entry)].concat());
        let stts = full(0, &be32(&[1, frames, delta]));
        let stsz = full(0, &be32(&[frame_bytes, frames]));
        let stbl = bx(
            b"stbl",
            &[bx(b"stsd", &stsd), bx(b"stts", &stts), bx(b"stsz", &stsz)].concat(),
        );
        let minf = bx(b"minf", &stbl);
        let mdia = bx(
            b"mdia",
            &[bx(b"mdhd", &full(0, &mdhd)), bx(b"hdlr", &hdlr), minf].concat(),
        );
        bx(b"trak", &[bx(b"tkhd", &full(0, &tkhd)), mdia].concat())
    }

    fn movie(moov_at_end: bool, mdat_len: usize) -> Vec<u8> {
        let ftyp = bx(b"ftyp", b"isom\0\0\x02\0isomiso2avc1mp41");
        let moov = bx(
            b"moov",
            &[mvhd(1000, 10_000), video_trak(250, 512, 12800, 4000)].concat(),
        );
        let mdat = bx(b"mdat", &vec![0xAB; mdat_len]);
        if moov_at_end {
            [ftyp, mdat, moov].concat()
        } else {
            [ftyp, moov, mdat].concat()
        }
    }

    #[test]
    fn data_references_outside_the_file_are_named() {
        let dref = |entries: &[Vec<u8>]| {
            full(
                0,
                &[be32(&[entries.len() as u32]), entries.concat()].concat(),
            )
        };
        let url =
            |flags: u8, location: &[u8]| bx(b"url ", &[&[0, 0, 0, flags][..], location].concat());
        assert_eq!(external_reference(&dref(&[url(1, b"")])).unwrap(), None);
        assert_eq!(
            external_reference(&dref(&[url(1, b""), url(0, b"file:///etc/passwd\0")])).unwrap(),
            Some("'url ' \"file:///etc/passwd\"".into())
        );
        let alias = bx(b"alis", &[0, 0, 0, 0, 1, 2, 3]);
        assert_eq!(
            external_reference(&dref(&[alias])).unwrap(),
            Some("'alis' 3 bytes".into())
        );
        let self_alias = bx(b"alis", &[0, 0, 0, 1]);
        assert_eq!(external_reference(&dref(&[self_alias])).unwrap(), None);
        // An entry shorter than its flags is malformed, not waved through.
        assert!(external_reference(&dref(&[bx(b"url ", &[0])])).is_err());
    }

    async fn info_of(bytes: &[u8]) -> Result<(MovieInfo, MovieBoxes), BmffError> {
        let boxes = locate_movie(bytes, bytes.len() as u64, &[]).await?;
        let info = parse_boxes(&boxes)?;
        Ok((info, boxes))
    }

    #[tokio::test]
    async fn a_movie_reports_brand_duration_and_track() {
        let (info, _) = info_of(&movie(false, 100)).await.unwrap();
        assert_eq!(info.major_brand.as_deref(), Some("isom"));
        assert_eq!(info.compatible_brands, ["isom", "iso2", "avc1", "mp41"]);
        assert_eq!(info.duration, Some(10.0));
        let video = info.video().unwrap();
        assert_eq!(video.codec.as_deref(), Some("avc1"));
        assert_eq!(video.codecs.as_deref(), Some("avc1.64001f"));
        assert_eq!((video.width, video.height), (Some(640), Some(360)));
        assert_eq!(video.frame_rate, Some(25.0));
        assert_eq!(video.samples, 250);
        assert_eq!(video.bitrate, Some(800_000));
        assert_eq!(video.rotation, Some(0));
        assert_eq!(video.language.as_deref(), Some("eng"));
        assert!(info.audio().is_none());
    }

    #[tokio::test]
    async fn a_moov_at_the_end_of_a_large_file_costs_two_reads() {
        let bytes = movie(true, 50 * 1024 * 1024);
        let (info, boxes) = info_of(&bytes).await.unwrap();
        assert_eq!(info.duration, Some(10.0));
        assert_eq!(boxes.reads, 2, "{boxes:?}");
        assert!(boxes.bytes_read < 2 * WINDOW_BYTES);
    }

    #[tokio::test]
    async fn bytes_at_hand_save_the_first_read() {
        let bytes = movie(false, 10);
        let boxes = locate_movie(&bytes[..], bytes.len() as u64, &bytes)
            .await
            .unwrap();
        assert_eq!(boxes.reads, 0);
    }

    #[tokio::test]
    async fn truncated_files_are_errors_naming_the_box() {
        let bytes = movie(true, 1000);
        for cut in [bytes.len() - 1, bytes.len() - 200, 1100, 30, 5] {
            let err = info_of(&bytes[..cut]).await.unwrap_err();
            assert!(
                matches!(err, BmffError::Truncated(_) | BmffError::NotAMovie(_)),
                "cut at {cut}: {err}"
            );
        }
        let err = info_of(&bytes[..bytes.len() - 1]).await.unwrap_err();
        assert!(err.to_string().contains("box 'moov'"), "{err}");
        // Cut in the middle of the mdat of a faststart file.
        let bytes = movie(false, 1000);
        let err = info_of(&bytes[..bytes.len() - 10]).await.unwrap_err();
        assert!(err.to_string().contains("'mdat'"), "{err}");
    }

    #[tokio::test]
    async fn a_file_without_moov_is_not_a_movie() {
        let bytes = [bx(b"ftyp", b"isom\0\0\0\0"), bx(b"mdat", &[0; 10])].concat();
        let err = info_of(&bytes).await.unwrap_err();
        assert!(err.to_string().contains("no 'moov'"), "{err}");
        let err = info_of(b"GIF89a\x05\x00\x07\x00\x00\x00\x00")
            .await
            .unwrap_err();
        assert!(
            matches!(err, BmffError::NotAMovie(_) | BmffError::Malformed(_)),
            "{err}"
        );
    }

    #[tokio::test]
    async fn lying_sizes_are_errors() {
        // A box smaller than its header.
        let mut bytes = movie(false, 10);
        bytes[0..4].copy_from_slice(&4u32.to_be_bytes());
        let err = info_of(&bytes).await.unwrap_err();
        assert!(
            err.to_string().contains("less than its 8-byte header"),
            "{err}"
        );

        // A child reaching past its parent: the first trak's size grown.
        let mut bytes = movie(false, 10);
        let at = find(&bytes, b"trak") - 4;
        let size = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        bytes[at..at + 4].copy_from_slice(&(size + 1000).to_be_bytes());
        let err = info_of(&bytes).await.unwrap_err();
        assert!(err.to_string().contains("'moov/trak' declares"), "{err}");

        // A sample table declaring more entries than it holds.
        let mut bytes = movie(false, 10);
        let at = find(&bytes, b"stts") + 8;
        bytes[at..at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
        let err = info_of(&bytes).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("'stts' declares 1073741824 entries"),
            "{err}"
        );

        // A 64-bit size far past the end.
        let mut bytes = bx(b"ftyp", b"isom\0\0\0\0");
        bytes.extend_from_slice(&1u32.to_be_bytes());
        bytes.extend_from_slice(b"mdat");
        bytes.extend_from_slice(&u64::MAX.to_be_bytes());
        let err = info_of(&bytes).await.unwrap_err();
        assert!(matches!(err, BmffError::Truncated(_)), "{err}");
    }

    #[tokio::test]
    async fn a_huge_moov_is_refused_before_it_is_read() {
        let mut bytes = bx(b"ftyp", b"isom\0\0\0\0");
        bytes.extend_from_slice(&1u32.to_be_bytes());
        bytes.extend_from_slice(b"moov");
        bytes.extend_from_slice(&(MAX_MOOV_BYTES + 100).to_be_bytes());
        bytes.resize(bytes.len() + MAX_MOOV_BYTES as usize + 100 - 16, 0);
        let err = info_of(&bytes).await.unwrap_err();
        assert!(matches!(err, BmffError::TooLarge(_)), "{err}");
    }

    #[test]
    fn every_truncation_of_a_moov_is_an_error_or_a_parse_never_a_panic() {
        let bytes = movie(false, 0);
        let moov_at = find(&bytes, b"moov") + 4;
        let moov_len =
            u32::from_be_bytes(bytes[moov_at - 8..moov_at - 4].try_into().unwrap()) as usize - 8;
        let moov = &bytes[moov_at..moov_at + moov_len];
        for cut in 0..moov.len() {
            let _ = parse_movie(None, &moov[..cut], 0);
        }
        // And every single-byte corruption.
        for at in 0..moov.len() {
            let mut moov = moov.to_vec();
            moov[at] ^= 0xff;
            let _ = parse_movie(None, &moov, 0);
        }
    }

    #[test]
    fn language_and_rotation() {
        assert_eq!(language(0x15c7).as_deref(), Some("eng"));
        assert_eq!(language(0x55c4), None); // und
        const ONE: i32 = 0x10000;
        assert_eq!(rotation(&[0, ONE, 0, -ONE, 0, 0, 0, 0, 0]), Some(90));
        assert_eq!(rotation(&[-ONE, 0, 0, 0, -ONE, 0, 0, 0, 0]), Some(180));
        assert_eq!(rotation(&[0, -ONE, 0, ONE, 0, 0, 0, 0, 0]), Some(270));
        assert_eq!(rotation(&[ONE, ONE, 0, ONE, ONE, 0, 0, 0, 0]), None);
    }

    #[test]
    fn aac_codec_string_rate_and_channels() {
        // ES (3) > DecoderConfig (4, object type 0x40) > specific info (5):
        // AOT 2, frequency index 3 (48 kHz), channel configuration 1.
        let mut esds = vec![0, 0, 0, 0, 3, 25, 0, 1, 0, 4, 17, 0x40, 0x15];
        esds.extend_from_slice(&[0; 11]);
        esds.extend_from_slice(&[5, 2, 0b0001_0001, 0b1000_1000]);
        assert_eq!(
            parse_esds(&esds),
            Some(AudioConfig {
                codecs: "mp4a.40.2".into(),
                sample_rate: Some(48_000),
                channels: Some(1),
            })
        );
        // HE-AAC's escape: AOT 31 + 6 bits.
        let config = audio_specific_config(0x40, &[0b1111_1000, 0b0010_0000, 0, 0]);
        assert_eq!(config.codecs, "mp4a.40.33");
    }

    #[test]
    fn a_fragment_ends_at_its_decode_time_plus_its_samples() {
        let tfhd = bx(b"tfhd", &be32(&[0x08, 1, 512])); // default duration 512
        let tfdt = bx(b"tfdt", &full(0, &be32(&[25_600])));
        // Two samples with their own durations, then a run of defaults.
        let trun = bx(b"trun", &be32(&[0x100, 2, 1000, 1024]));
        let defaults_run = bx(b"trun", &be32(&[0, 3]));
        let traf = [tfhd.clone(), tfdt.clone(), trun, defaults_run].concat();
        let none = std::collections::HashMap::new();
        let no_times = std::collections::HashMap::new();
        assert_eq!(
            traf_end(&traf, &none, &no_times).unwrap(),
            Some((1, 25_600 + 1000 + 1024 + 3 * 512))
        );
        // A count of four billion samples and no per-sample fields: one
        // multiplication, not four billion turns of a loop.
        let lying = [
            tfhd.clone(),
            tfdt.clone(),
            bx(b"trun", &be32(&[0, u32::MAX])),
        ]
        .concat();
        assert_eq!(
            traf_end(&lying, &none, &no_times).unwrap(),
            Some((1, 25_600 + u32::MAX as u64 * 512))
        );
        // Per-sample fields the box does not hold.
        let short = [tfhd, tfdt, bx(b"trun", &be32(&[0x300, 1000, 1]))].concat();
        assert!(traf_end(&short, &none, &no_times).is_err());
    }

    fn find(haystack: &[u8], needle: &[u8]) -> usize {
        haystack
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    }
}
