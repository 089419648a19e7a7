//! The walk over the top-level boxes by ranged reads: `ftyp` and `moov`
//! kept, `mdat` jumped over by its declared size, a fragmented file's index
//! read from its end.

use std::ops::Range;

use super::boxes::{fourcc, parse_header};
use super::fragments::{last_moof_offset, FragmentIndex};
use super::{BmffError, RangeSource, MAX_MOOV_BYTES, MAX_TOP_LEVEL_BOXES, WINDOW_BYTES};

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
    /// Every range of the source the walk read (and the first bytes it was
    /// given): what a demuxer walking the same boxes reads, and so what a
    /// partial copy of the file must hold besides its samples.
    pub ranges: Vec<Range<u64>>,
}

/// A ranged read that must return exactly the bytes asked for, counted.
pub(super) async fn read<S: RangeSource + ?Sized>(
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
    found.ranges.push(range);
    Ok(bytes)
}

/// Reads a fragmented file's index from its end: `mfro` (the last 16
/// bytes) gives the size of `mfra`, whose `tfra` entries give the offset of
/// the last `moof`. Three small reads. `None` when the file has no index or
/// it does not add up: the index is optional, and the duration then stays
/// unknown.
pub(super) async fn read_fragment_index<S: RangeSource + ?Sized>(
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
    if !window.is_empty() {
        found.ranges.push(0..window.len() as u64);
    }
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

pub(super) fn is_top_level_movie_box(kind: &[u8; 4]) -> bool {
    matches!(
        kind,
        b"ftyp" | b"moov" | b"mdat" | b"free" | b"skip" | b"wide" | b"pnot" | b"styp"
    )
}
