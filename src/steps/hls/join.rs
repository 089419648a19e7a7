//! The join of a split `hls-package` job: its chunks' segments, in the
//! plan's order, become one package with the same names, playlists and
//! manifest entries as a run of the whole input. Pure: the handler reads
//! the chunks' manifests and `segments.json`, and makes the copies and
//! writes the playlists this plans (DESIGN.md, "Chunked HLS").

use std::collections::{BTreeMap, BTreeSet};

use super::chunk_job::ChunkSegments;
use super::index::package_texts;
use super::playlist::SegmentSummary;
use crate::step::{CopyIn, Manifest};

/// One done chunk's outputs, as read.
#[derive(Debug, Clone)]
pub struct ChunkOutputs {
    /// Where its files are: the bucket, and the key prefix in it
    /// (`…/<chunk key>/`).
    pub bucket: String,
    pub prefix: String,
    pub manifest: Manifest,
    pub segments: ChunkSegments,
}

/// What the join writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinPlan {
    /// Each segment: where it is copied from, and its manifest entry in
    /// the package (the same name under the parent's prefix).
    pub copies: Vec<CopyIn>,
    /// The media playlists, the master and the package's index
    /// ([`super::index`]): (name, text).
    pub playlists: Vec<(String, String)>,
}

/// The package made of `chunks` (in the plan's order), with I-frame
/// playlists when `iframes`, or what is wrong with the chunks: renditions
/// that differ between chunks, a segment that its chunk's manifest does
/// not list, or one named twice.
pub fn plan_join(chunks: &[ChunkOutputs], iframes: bool) -> Result<JoinPlan, String> {
    let Some(first) = chunks.first() else {
        return Err("a split job with no chunk".into());
    };
    let names: Vec<&str> = first
        .segments
        .renditions
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    let mut renditions: Vec<(String, Vec<SegmentSummary>)> = names
        .iter()
        .map(|name| (name.to_string(), Vec::new()))
        .collect();
    let mut copies = Vec::new();
    let mut seen = BTreeSet::new();
    let mut sha256 = BTreeMap::new();
    for (place, chunk) in chunks.iter().enumerate() {
        let theirs: Vec<&str> = chunk
            .segments
            .renditions
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        if theirs != names {
            return Err(format!(
                "chunk {place} has renditions {theirs:?}, chunk 0 {names:?}"
            ));
        }
        for (rendition, (_, joined)) in chunk.segments.renditions.iter().zip(&mut renditions) {
            for segment in &rendition.segments {
                let name = format!("{}/{}", rendition.name, segment.name);
                let file = chunk
                    .manifest
                    .outputs
                    .iter()
                    .find(|file| file.name == name)
                    .ok_or_else(|| {
                        format!("chunk {place}'s manifest does not list its segment {name}")
                    })?;
                if !seen.insert(name.clone()) {
                    return Err(format!("segment {name} is in two chunks"));
                }
                sha256.insert(name.clone(), file.sha256.clone());
                copies.push(CopyIn {
                    bucket: chunk.bucket.clone(),
                    key: format!("{}{name}", chunk.prefix),
                    file: file.clone(),
                });
                joined.push(segment.clone());
            }
        }
    }
    let playlists = package_texts(&renditions, &sha256, iframes)?;
    Ok(JoinPlan { copies, playlists })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::OutputFile;
    use crate::steps::hls::chunk_job::RenditionSegments;
    use crate::steps::hls::index::PackageIndex;

    fn summary(name: &str, first_pts: u64, frames: u64) -> SegmentSummary {
        SegmentSummary {
            name: name.into(),
            bytes: 1_000,
            first_pts,
            last_pts: first_pts + (frames - 1) * 3_000,
            frames,
            intervals: [(3_000, frames - 1)].into(),
            opens_on_keyframe: true,
            codecs: "avc1.64001f".into(),
            width: 320,
            height: 180,
            keyframe_bytes: Some(376),
        }
    }

    fn chunk(index: u64, segments: &[&str]) -> ChunkOutputs {
        let prefix = format!("derived/c{index}/");
        let renditions = vec![RenditionSegments {
            name: "180p".into(),
            segments: segments
                .iter()
                .enumerate()
                .map(|(i, name)| summary(name, 900_000 + (index * 2 + i as u64) * 90_000, 30))
                .collect(),
        }];
        let outputs = segments
            .iter()
            .map(|name| OutputFile {
                name: format!("180p/{name}"),
                size: 1_000,
                sha256: format!("{name}-sha"),
            })
            .collect();
        ChunkOutputs {
            bucket: "out".into(),
            prefix,
            manifest: Manifest {
                job_key: format!("c{index}"),
                input_hash: "h".into(),
                recipe: serde_json::Value::Null,
                outputs,
            },
            segments: ChunkSegments { renditions },
        }
    }

    #[test]
    fn chunks_join_in_order_into_one_package() {
        let chunks = [
            chunk(0, &["seg-00000.ts", "seg-00001.ts"]),
            chunk(1, &["seg-00002.ts", "seg-00003.ts"]),
        ];
        let plan = plan_join(&chunks, true).unwrap();
        let sources: Vec<&str> = plan.copies.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(
            sources,
            [
                "derived/c0/180p/seg-00000.ts",
                "derived/c0/180p/seg-00001.ts",
                "derived/c1/180p/seg-00002.ts",
                "derived/c1/180p/seg-00003.ts"
            ]
        );
        assert_eq!(plan.copies[3].bucket, "out");
        assert_eq!(plan.copies[3].file.name, "180p/seg-00003.ts");
        assert_eq!(plan.copies[3].file.sha256, "seg-00003.ts-sha");
        let names: Vec<&str> = plan.playlists.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "180p/index.m3u8",
                "180p/iframes.m3u8",
                "master.m3u8",
                "package.json"
            ]
        );
        let index = PackageIndex::parse(plan.playlists[3].1.as_bytes()).unwrap();
        let hashes: Vec<&str> = index.renditions[0]
            .segments
            .iter()
            .map(|s| s.sha256.as_str())
            .collect();
        assert_eq!(
            hashes,
            [
                "seg-00000.ts-sha",
                "seg-00001.ts-sha",
                "seg-00002.ts-sha",
                "seg-00003.ts-sha"
            ]
        );
        assert!(plan.playlists[1]
            .1
            .contains("#EXT-X-BYTERANGE:376@0\nseg-00003.ts"));
        let media = &plan.playlists[0].1;
        assert_eq!(media.matches("#EXTINF:1.000000,").count(), 4, "{media}");
        assert!(media.find("seg-00001.ts").unwrap() < media.find("seg-00002.ts").unwrap());
    }

    #[test]
    fn chunks_that_do_not_fit_together_say_why() {
        let mut other = chunk(1, &["seg-00002.ts"]);
        other.segments.renditions[0].name = "360p".into();
        let err = plan_join(&[chunk(0, &["seg-00000.ts"]), other], true).unwrap_err();
        assert!(err.contains("renditions"), "{err}");

        let mut unlisted = chunk(1, &["seg-00002.ts"]);
        unlisted.manifest.outputs.clear();
        let err = plan_join(&[chunk(0, &["seg-00000.ts"]), unlisted], true).unwrap_err();
        assert!(
            err.contains("does not list its segment 180p/seg-00002.ts"),
            "{err}"
        );

        let err = plan_join(
            &[chunk(0, &["seg-00000.ts"]), chunk(1, &["seg-00000.ts"])],
            true,
        )
        .unwrap_err();
        assert!(err.contains("in two chunks"), "{err}");
        assert!(plan_join(&[], true).is_err());
    }
}
