//! `package.json`: the package as measured, and nothing else. Each
//! rendition's picture size and its segments in playback order, each with
//! its size, SHA-256, first frame's time (90 kHz, the package's own
//! timeline), duration and keyframe byte range.
//!
//! A step chained to a package names this file as its input. Its job key
//! then covers every segment's bytes, through their hashes here. No
//! playlist does that: a playlist names segments without their bytes. The
//! step reads the segments it needs beside the index, each checked
//! against its hash ([`crate::step::JobInput::read_beside`]). Content
//! only (no job key, input hash or recipe): a package run whole and the
//! same package joined from chunks write the same index, and so does the
//! same package under another recipe that changes no byte. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::playlist::{package_playlists, time_segments, SegmentSummary};

/// The index's file name in the package.
pub const PACKAGE_INDEX: &str = "package.json";

/// The package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageIndex {
    /// Tallest first, as the master lists them.
    pub renditions: Vec<IndexedRendition>,
}

/// One rendition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexedRendition {
    /// Its directory in the package: `360p`.
    pub name: String,
    /// The picture as displayed (rotation applied by the encode).
    pub width: u32,
    pub height: u32,
    pub segments: Vec<IndexedSegment>,
}

/// One segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexedSegment {
    /// Its file name in the rendition's directory.
    pub name: String,
    pub bytes: u64,
    /// Hex.
    pub sha256: String,
    /// Its first frame's presentation time, 90 kHz.
    pub start: u64,
    /// Until the next segment's first frame (the last: its last frame's
    /// end), 90 kHz.
    pub duration: u64,
    /// Bytes `0..keyframe_bytes` hold the tables and the opening keyframe,
    /// when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyframe_bytes: Option<u64>,
}

/// Every text file of a package, `(path, text)`: its playlists
/// ([`package_playlists`], with `iframes` its I-frame playlists) and its
/// index, from its renditions' segment summaries and each segment's
/// SHA-256 by its path. One run of the whole input and a join of chunks
/// write them both through here.
pub fn package_texts(
    renditions: &[(String, Vec<SegmentSummary>)],
    sha256: &BTreeMap<String, String>,
    iframes: bool,
) -> Result<Vec<(String, String)>, String> {
    let mut files = package_playlists(renditions, iframes)?;
    let index = PackageIndex::of(renditions, sha256)?;
    files.push((PACKAGE_INDEX.to_string(), index.to_text()));
    Ok(files)
}

impl IndexedRendition {
    /// The segment showing `pts` (90 kHz): the last one starting at or
    /// before it (the first, before the package's start).
    pub fn segment_at(&self, pts: u64) -> Option<&IndexedSegment> {
        let after = self.segments.partition_point(|s| s.start <= pts);
        self.segments.get(after.saturating_sub(1))
    }
}

impl PackageIndex {
    /// The index of a package's renditions, from their segment summaries
    /// (each in playback order) and each segment's SHA-256 by its path
    /// in the package (`360p/seg-00000.ts`); what is missing is named.
    pub fn of(
        renditions: &[(String, Vec<SegmentSummary>)],
        sha256: &BTreeMap<String, String>,
    ) -> Result<PackageIndex, String> {
        let mut indexed = Vec::with_capacity(renditions.len());
        for (name, summaries) in renditions {
            let timed = time_segments(summaries).map_err(|e| format!("{name}: {e}"))?;
            let first = summaries
                .first()
                .ok_or_else(|| format!("{name}: a rendition without segments"))?;
            let segments = summaries
                .iter()
                .zip(timed)
                .map(|(summary, timed)| {
                    let path = format!("{name}/{}", summary.name);
                    Ok(IndexedSegment {
                        sha256: sha256
                            .get(&path)
                            .cloned()
                            .ok_or_else(|| format!("no SHA-256 for {path}"))?,
                        name: timed.name,
                        bytes: timed.bytes,
                        start: timed.start,
                        duration: timed.duration,
                        keyframe_bytes: summary.keyframe_bytes,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            indexed.push(IndexedRendition {
                name: name.clone(),
                width: first.width,
                height: first.height,
                segments,
            });
        }
        Ok(PackageIndex {
            renditions: indexed,
        })
    }

    /// The file's text: compact JSON and a newline, fields in declaration
    /// order, so the same package always writes the same bytes.
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string(self).expect("an index serializes");
        text.push('\n');
        text
    }

    /// Reads the file, or says what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<PackageIndex, String> {
        let index: PackageIndex =
            serde_json::from_slice(bytes).map_err(|e| format!("{PACKAGE_INDEX}: {e}"))?;
        // Names are read beside the index: plain names, never a path out
        // of the package.
        let plain = |name: &str| {
            !name.is_empty()
                && name != "."
                && name != ".."
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        for rendition in &index.renditions {
            let name = &rendition.name;
            if let Some(bad) = std::iter::once(name)
                .chain(rendition.segments.iter().map(|s| &s.name))
                .find(|n| !plain(n))
            {
                return Err(format!("{PACKAGE_INDEX}: {bad:?} is not a plain file name"));
            }
            if rendition.segments.is_empty() {
                return Err(format!("{PACKAGE_INDEX}: {name} has no segments"));
            }
            if rendition.width == 0 || rendition.height == 0 {
                return Err(format!("{PACKAGE_INDEX}: {name} has no picture size"));
            }
            if rendition
                .segments
                .windows(2)
                .any(|pair| pair[1].start <= pair[0].start)
            {
                return Err(format!(
                    "{PACKAGE_INDEX}: {name}'s segments are out of order"
                ));
            }
        }
        if index.renditions.is_empty() {
            return Err(format!("{PACKAGE_INDEX}: no renditions"));
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(i: u64) -> SegmentSummary {
        SegmentSummary {
            name: format!("seg-{i:05}.ts"),
            bytes: 1000 + i,
            first_pts: 900_000 + i * 180_000,
            last_pts: 900_000 + i * 180_000 + 49 * 3600,
            frames: 50,
            intervals: BTreeMap::from([(3600, 49)]),
            opens_on_keyframe: true,
            codecs: "avc1.64001e".into(),
            width: 640,
            height: 360,
            keyframe_bytes: Some(376),
        }
    }

    #[test]
    fn an_index_names_every_segment_by_its_hash_and_time() {
        let renditions = vec![("360p".to_string(), (0..3).map(summary).collect())];
        let hashes: BTreeMap<String, String> = (0..3)
            .map(|i| (format!("360p/seg-{i:05}.ts"), format!("{i:064x}")))
            .collect();
        let index = PackageIndex::of(&renditions, &hashes).unwrap();
        let text = index.to_text();
        assert!(text.starts_with(
            "{\"renditions\":[{\"name\":\"360p\",\"width\":640,\"height\":360,\"segments\":\
             [{\"name\":\"seg-00000.ts\",\"bytes\":1000,\"sha256\":\"00000"
        ));
        assert!(text.ends_with("\"keyframe_bytes\":376}]}]}\n"), "{text}");
        assert_eq!(PackageIndex::parse(text.as_bytes()).unwrap(), index);
        let rendition = &index.renditions[0];
        assert_eq!(rendition.segments[1].start, 1_080_000);
        assert_eq!(rendition.segments[1].duration, 180_000);
        assert_eq!(rendition.segment_at(0).unwrap().name, "seg-00000.ts");
        assert_eq!(
            rendition.segment_at(1_080_000).unwrap().name,
            "seg-00001.ts"
        );
        assert_eq!(
            rendition.segment_at(1_259_999).unwrap().name,
            "seg-00001.ts"
        );
        assert_eq!(
            rendition.segment_at(9_000_000).unwrap().name,
            "seg-00002.ts"
        );

        let mut missing = hashes.clone();
        missing.remove("360p/seg-00001.ts");
        assert_eq!(
            PackageIndex::of(&renditions, &missing).unwrap_err(),
            "no SHA-256 for 360p/seg-00001.ts"
        );
    }

    #[test]
    fn a_bad_index_says_what_is_wrong() {
        for (text, problem) in [
            ("{", "package.json: EOF"),
            ("{\"renditions\":[]}", "no renditions"),
            (
                "{\"renditions\":[{\"name\":\"a\",\"width\":1,\"height\":1,\"segments\":[]}]}",
                "a has no segments",
            ),
            ("{\"renditions\":[],\"extra\":1}", "unknown field `extra`"),
            (
                "{\"renditions\":[{\"name\":\"..\",\"width\":1,\"height\":1,\"segments\":[]}]}",
                "\"..\" is not a plain file name",
            ),
            (
                "{\"renditions\":[{\"name\":\"a\",\"width\":1,\"height\":1,\"segments\":\
                 [{\"name\":\"../b/x.ts\",\"bytes\":1,\"sha256\":\"0\",\"start\":0,\"duration\":1}]}]}",
                "\"../b/x.ts\" is not a plain file name",
            ),
        ] {
            let err = PackageIndex::parse(text.as_bytes()).unwrap_err();
            assert!(err.contains(problem), "{text}: {err}");
        }
    }
}
