//! A fragmented file's duration: its `mfra` index points at the last
//! `moof`, whose `tfdt` start plus its `trun` sample durations is each
//! track's end. Lenient: an index that does not add up is left out.

use super::boxes::{child, children, Cursor};
use super::BmffError;

/// The bodies of a fragmented file's `mfra` box and of the last `moof` it
/// points to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FragmentIndex {
    pub mfra: Vec<u8>,
    pub last_moof: Vec<u8>,
}

/// Each track's default sample duration from `moov/mvex/trex`.
pub(super) fn sample_duration_defaults(moov: &[u8]) -> std::collections::HashMap<u32, u32> {
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
pub(super) fn parse_tfra(mfra: &[u8]) -> Vec<(u32, Vec<(u64, u64)>)> {
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
pub(super) fn last_moof_offset(mfra: &[u8]) -> Option<u64> {
    parse_tfra(mfra)
        .iter()
        .flat_map(|(_, entries)| entries.iter().map(|&(_, offset)| offset))
        .max()
}

/// Per track, where its last fragment ends, in the track's timescale: the
/// fragment's decode time (`tfdt`, else the index's time for it) plus the
/// durations of its samples (`trun`, else `tfhd`'s or `trex`'s default).
pub(super) fn fragment_end_ticks(
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

pub(super) fn traf_end(
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
