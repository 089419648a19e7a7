//! Box headers, a bounds-checked cursor over a box's bytes, and a box's
//! children: every size checked against the bytes that hold it.

use super::BmffError;

/// A box header: its type, where its body starts and where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BoxHeader {
    pub(super) kind: [u8; 4],
    pub(super) header_len: u64,
    /// `None`: the box runs to the end of its container (size 0).
    pub(super) size: Option<u64>,
}

/// Parses a box header from the start of `bytes`; `Ok(None)` when more
/// bytes are needed than `bytes` holds.
pub(super) fn parse_header(bytes: &[u8]) -> Result<Option<BoxHeader>, BmffError> {
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

pub(super) fn fourcc(kind: &[u8]) -> String {
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

/// A bounds-checked reader over one box's bytes: every read that would run
/// past the end is an error naming the box and the field.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    /// Where the next read starts.
    pub(super) at: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8], path: &'a str) -> Self {
        Cursor { bytes, at: 0, path }
    }

    pub(super) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], BmffError> {
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

    pub(super) fn skip(&mut self, n: usize, field: &str) -> Result<(), BmffError> {
        self.take(n, field).map(|_| ())
    }

    pub(super) fn u8(&mut self, field: &str) -> Result<u8, BmffError> {
        Ok(self.take(1, field)?[0])
    }

    pub(super) fn u16(&mut self, field: &str) -> Result<u16, BmffError> {
        Ok(u16::from_be_bytes(self.take(2, field)?.try_into().unwrap()))
    }

    pub(super) fn u32(&mut self, field: &str) -> Result<u32, BmffError> {
        Ok(u32::from_be_bytes(self.take(4, field)?.try_into().unwrap()))
    }

    pub(super) fn u64(&mut self, field: &str) -> Result<u64, BmffError> {
        Ok(u64::from_be_bytes(self.take(8, field)?.try_into().unwrap()))
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// A full box's version byte and flags.
    pub(super) fn version(&mut self) -> Result<u8, BmffError> {
        let version = self.u8("version")?;
        self.skip(3, "flags")?;
        Ok(version)
    }

    /// A v0 32-bit or v1 64-bit field; the all-ones value means unknown.
    pub(super) fn sized(&mut self, version: u8, field: &str) -> Result<Option<u64>, BmffError> {
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
pub(super) type Child<'a> = ([u8; 4], &'a [u8]);

pub(super) fn children<'a>(bytes: &'a [u8], parent: &str) -> Result<Vec<Child<'a>>, BmffError> {
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

pub(super) fn child<'a>(boxes: &[Child<'a>], kind: &[u8; 4]) -> Option<&'a [u8]> {
    boxes.iter().find(|(k, _)| k == kind).map(|(_, body)| *body)
}
