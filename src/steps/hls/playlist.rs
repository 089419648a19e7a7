//! The package's playlists, written from its segments as measured
//! ([`super::ts`]): each segment's `#EXTINF` from its frames' presentation
//! times, and per variant the attributes Apple's HLS authoring
//! specification asks for: `BANDWIDTH` (the peak segment bit rate),
//! `AVERAGE-BANDWIDTH`, `CODECS`, `RESOLUTION` and `FRAME-RATE`. The same
//! writer serves every package, so two with the same segments have the
//! same playlists whoever encoded them. Pure.
//!
//! Each rendition also gets an I-frame playlist (`iframes.m3u8`,
//! `EXT-X-I-FRAMES-ONLY`): a segment opens on its only keyframe (the
//! encoder forces one at every segment start and no other), so the
//! playlist lists each segment once, with the byte range that holds its
//! PAT, PMT and that keyframe, for the segment's duration. The master
//! lists them with `EXT-X-I-FRAME-STREAM-INF`.
//!
//! A segment is measured once into a [`SegmentSummary`]: what the
//! playlists need of it, small and serializable, so that the playlists of
//! a package whose segments were encoded by several runs (chunk jobs) are
//! written from their summaries by the same functions, to the same text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ts::{Segment, TICKS_PER_SECOND};

/// One segment as the playlists need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSummary {
    /// Its file name in the rendition's directory.
    pub name: String,
    pub bytes: u64,
    /// Its first and last video frames' PTS (90 kHz), in presentation
    /// order, and how many frames.
    pub first_pts: u64,
    pub last_pts: u64,
    pub frames: u64,
    /// How often each interval between consecutive frames occurs.
    pub intervals: BTreeMap<u64, u64>,
    pub opens_on_keyframe: bool,
    /// RFC 6381 codecs (`avc1.64001f,mp4a.40.2`) and the picture size,
    /// from its sequence parameter set and ADTS headers.
    pub codecs: String,
    pub width: u32,
    pub height: u32,
    /// Bytes `0..keyframe_bytes` hold the tables and the opening keyframe
    /// ([`Segment::keyframe_end`]). Absent from the summaries of chunks
    /// done by builds before I-frame playlists: a package joined from
    /// them has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyframe_bytes: Option<u64>,
}

impl SegmentSummary {
    /// The summary of a measured segment, or why it cannot be played.
    pub fn of(name: &str, segment: &Segment) -> Result<Self, String> {
        let (Some(&first_pts), Some(&last_pts)) =
            (segment.video_pts.first(), segment.video_pts.last())
        else {
            return Err(format!("{name} holds no video frame"));
        };
        let video = segment
            .video
            .ok_or_else(|| format!("{name}: no sequence parameter set"))?;
        let mut codecs = video.codec();
        if let Some(audio) = segment.audio {
            codecs.push(',');
            codecs.push_str(&audio.codec());
        }
        let mut intervals = BTreeMap::new();
        for pair in segment.video_pts.windows(2) {
            *intervals.entry(pair[1] - pair[0]).or_default() += 1;
        }
        Ok(SegmentSummary {
            name: name.to_string(),
            bytes: segment.bytes,
            first_pts,
            last_pts,
            frames: segment.video_pts.len() as u64,
            intervals,
            opens_on_keyframe: segment.starts_with_keyframe,
            codecs,
            width: video.width,
            height: video.height,
            keyframe_bytes: segment.keyframe_end,
        })
    }
}

/// The name of each rendition's I-frame playlist, beside its `index.m3u8`.
pub const IFRAME_PLAYLIST: &str = "iframes.m3u8";

/// A package's playlists from its renditions' segment summaries (each in
/// playback order): `(path, text)` of each media playlist
/// (`<rendition>/index.m3u8`), with `iframes` each I-frame playlist
/// (`<rendition>/iframes.m3u8`) when every segment's keyframe range is
/// known, and `master.m3u8`.
pub fn package_playlists(
    renditions: &[(String, Vec<SegmentSummary>)],
    iframes: bool,
) -> Result<Vec<(String, String)>, String> {
    let ranged = iframes
        && renditions
            .iter()
            .all(|(_, segments)| segments.iter().all(|s| s.keyframe_bytes.is_some()));
    let mut files = Vec::with_capacity(2 * renditions.len() + 1);
    let mut variants = Vec::with_capacity(renditions.len());
    let mut iframe_variants = Vec::new();
    for (name, segments) in renditions {
        let timed = time_segments(segments).map_err(|e| format!("{name}: {e}"))?;
        let uri = format!("{name}/index.m3u8");
        let variant = Variant::measure(&uri, segments, &timed)?;
        files.push((uri, media_playlist(&timed)));
        if ranged {
            let keyframes = keyframe_ranges(segments, &timed);
            let uri = format!("{name}/{IFRAME_PLAYLIST}");
            iframe_variants.push(IFrameVariant::measure(&uri, &variant, &keyframes));
            files.push((uri, iframe_playlist(&keyframes)));
        }
        variants.push(variant);
    }
    files.push((
        "master.m3u8".to_string(),
        master_playlist(&variants, &iframe_variants),
    ));
    Ok(files)
}

/// Each segment's keyframe range, timed as its segment: `bytes` is the
/// range's length, from the segment's first byte. Every segment's
/// `keyframe_bytes` is known.
fn keyframe_ranges(segments: &[SegmentSummary], timed: &[Timed]) -> Vec<Timed> {
    segments
        .iter()
        .zip(timed)
        .map(|(segment, timed)| Timed {
            bytes: segment.keyframe_bytes.unwrap_or(segment.bytes),
            ..timed.clone()
        })
        .collect()
}

/// A rendition's I-frame playlist: each segment's keyframe, a byte range
/// from its start (`EXT-X-BYTERANGE`, version 4), lasting until the next.
pub fn iframe_playlist(keyframes: &[Timed]) -> String {
    vod_playlist(keyframes, true)
}

/// One segment of a media playlist: its file name, size and timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub name: String,
    pub bytes: u64,
    /// The first frame's PTS (90 kHz).
    pub start: u64,
    /// Until the next segment's first frame (the last: its last frame's end).
    pub duration: u64,
}

impl Timed {
    fn seconds(&self) -> f64 {
        self.duration as f64 / TICKS_PER_SECOND as f64
    }
}

/// A rendition's segments, in playback order, timed: each lasts until the
/// next one's first frame, the last until its last frame ends (its frame
/// interval taken from the rendition's most common one). Every segment must
/// open on a keyframe and start after the one before it.
pub fn time_segments(segments: &[SegmentSummary]) -> Result<Vec<Timed>, String> {
    let frame = frame_interval(segments).ok_or("a rendition with fewer than two video frames")?;
    let mut timed: Vec<Timed> = Vec::with_capacity(segments.len());
    for segment in segments {
        let (name, start) = (&segment.name, segment.first_pts);
        if !segment.opens_on_keyframe {
            return Err(format!("{name} does not open on a keyframe"));
        }
        if let Some(previous) = timed.last_mut() {
            if start <= previous.start {
                return Err(format!(
                    "{name} starts at PTS {start}, not after {} ({})",
                    previous.start, previous.name
                ));
            }
            previous.duration = start - previous.start;
        }
        timed.push(Timed {
            name: name.clone(),
            bytes: segment.bytes,
            start,
            duration: segment.last_pts + frame - start,
        });
    }
    Ok(timed)
}

/// The most common interval between consecutive frames (the smallest of
/// equally common ones), over all segments.
fn frame_interval(segments: &[SegmentSummary]) -> Option<u64> {
    let mut counts = BTreeMap::<u64, u64>::new();
    for segment in segments {
        for (interval, count) in &segment.intervals {
            *counts.entry(*interval).or_default() += count;
        }
    }
    counts
        .into_iter()
        .filter(|(interval, _)| *interval > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(interval, _)| interval)
}

/// `#EXT-X-TARGETDURATION`: the longest segment, rounded to the nearest
/// second (RFC 8216 4.3.3.1), at least 1.
pub fn target_duration(timed: &[Timed]) -> u64 {
    timed
        .iter()
        .map(|t| (t.duration + TICKS_PER_SECOND / 2) / TICKS_PER_SECOND)
        .max()
        .unwrap_or(0)
        .max(1)
}

/// A VOD media playlist of `timed`, numbered from 0.
pub fn media_playlist(timed: &[Timed]) -> String {
    vod_playlist(timed, false)
}

/// The text of a VOD playlist of `entries`, numbered from 0: with
/// `iframes`, an I-frame playlist, each entry the byte range `0..bytes`
/// of its file (`EXT-X-BYTERANGE` needs version 4).
fn vod_playlist(entries: &[Timed], iframes: bool) -> String {
    let (version, only) = if iframes {
        (4, "#EXT-X-I-FRAMES-ONLY\n")
    } else {
        (3, "")
    };
    let mut text = format!(
        "#EXTM3U\n#EXT-X-VERSION:{version}\n#EXT-X-TARGETDURATION:{}\n#EXT-X-MEDIA-SEQUENCE:0\n\
         #EXT-X-PLAYLIST-TYPE:VOD\n{only}#EXT-X-INDEPENDENT-SEGMENTS\n",
        target_duration(entries)
    );
    for entry in entries {
        text.push_str(&format!("#EXTINF:{:.6},\n", entry.seconds()));
        if iframes {
            text.push_str(&format!("#EXT-X-BYTERANGE:{}@0\n", entry.bytes));
        }
        text.push_str(&entry.name);
        text.push('\n');
    }
    text.push_str("#EXT-X-ENDLIST\n");
    text
}

/// The peak segment bit rate (RFC 8216bis 4.4.6.2's definition, which
/// Apple's authoring specification uses for `BANDWIDTH`): the largest bit
/// rate of any run of consecutive segments lasting 0.5 to 1.5 target
/// durations; the whole playlist's when no run is that long.
pub fn peak_bit_rate(timed: &[Timed]) -> u64 {
    let target = target_duration(timed) * TICKS_PER_SECOND;
    let (low, high) = (target / 2, target + target / 2);
    let mut peak = None::<u64>;
    for first in 0..timed.len() {
        let (mut bytes, mut duration) = (0u64, 0u64);
        for segment in &timed[first..] {
            bytes += segment.bytes;
            duration += segment.duration;
            if duration > high {
                break;
            }
            if duration >= low {
                let rate = bit_rate(bytes, duration);
                peak = Some(peak.map_or(rate, |p| p.max(rate)));
            }
        }
    }
    peak.unwrap_or_else(|| average_bit_rate(timed))
}

/// The whole playlist's bit rate: `AVERAGE-BANDWIDTH`.
pub fn average_bit_rate(timed: &[Timed]) -> u64 {
    bit_rate(
        timed.iter().map(|t| t.bytes).sum(),
        timed.iter().map(|t| t.duration).sum(),
    )
}

/// Bits per second, rounded up.
fn bit_rate(bytes: u64, ticks: u64) -> u64 {
    if ticks == 0 {
        return 0;
    }
    (bytes as u128 * 8 * TICKS_PER_SECOND as u128).div_ceil(ticks as u128) as u64
}

/// One `#EXT-X-STREAM-INF` entry of the master playlist.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// The media playlist, relative to the master.
    pub uri: String,
    pub bandwidth: u64,
    pub average_bandwidth: u64,
    pub codecs: String,
    pub width: u32,
    pub height: u32,
    pub frame_rate: f64,
}

impl Variant {
    /// A rendition's variant, from its segments and their timing.
    pub fn measure(
        uri: &str,
        segments: &[SegmentSummary],
        timed: &[Timed],
    ) -> Result<Variant, String> {
        let first = segments
            .first()
            .ok_or_else(|| format!("{uri}: a rendition without segments"))?;
        let frames: u64 = segments.iter().map(|s| s.frames).sum();
        let duration: u64 = timed.iter().map(|t| t.duration).sum();
        Ok(Variant {
            uri: uri.to_string(),
            bandwidth: peak_bit_rate(timed),
            average_bandwidth: average_bit_rate(timed),
            codecs: first.codecs.clone(),
            width: first.width,
            height: first.height,
            frame_rate: frames as f64 * TICKS_PER_SECOND as f64 / duration.max(1) as f64,
        })
    }
}

/// One `#EXT-X-I-FRAME-STREAM-INF` entry of the master playlist.
#[derive(Debug, Clone, PartialEq)]
pub struct IFrameVariant {
    /// The I-frame playlist, relative to the master.
    pub uri: String,
    /// Peak and average bit rates of the keyframe ranges over their
    /// segments' durations: what fetching every I-frame costs.
    pub bandwidth: u64,
    pub average_bandwidth: u64,
    /// The video codec alone: the ranges are played without sound.
    pub codecs: String,
    pub width: u32,
    pub height: u32,
}

impl IFrameVariant {
    /// The I-frame stream of `variant`'s rendition, from its keyframes.
    pub fn measure(uri: &str, variant: &Variant, keyframes: &[Timed]) -> IFrameVariant {
        let codecs = variant
            .codecs
            .split(',')
            .filter(|codec| codec.starts_with("avc1."))
            .collect::<Vec<_>>()
            .join(",");
        IFrameVariant {
            uri: uri.to_string(),
            bandwidth: peak_bit_rate(keyframes),
            average_bandwidth: average_bit_rate(keyframes),
            codecs,
            width: variant.width,
            height: variant.height,
        }
    }
}

/// The master playlist: `variants` in the order given, then the I-frame
/// streams.
pub fn master_playlist(variants: &[Variant], iframes: &[IFrameVariant]) -> String {
    let mut text = String::from("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    for v in variants {
        text.push_str(&format!(
            "#EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{}\",RESOLUTION={}x{},FRAME-RATE={:.3}\n{}\n",
            v.bandwidth, v.average_bandwidth, v.codecs, v.width, v.height, v.frame_rate, v.uri
        ));
    }
    for v in iframes {
        text.push_str(&format!(
            "#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{}\",RESOLUTION={}x{},URI=\"{}\"\n",
            v.bandwidth, v.average_bandwidth, v.codecs, v.width, v.height, v.uri
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::hls::ts::VideoFormat;

    /// A segment of `frames` frames at 25 fps from `start` seconds, `bytes`
    /// long.
    fn segment(start: f64, frames: u64, bytes: u64) -> Segment {
        let first = (start * 90_000.0).round() as u64;
        Segment {
            bytes,
            video_pts: (0..frames).map(|i| first + i * 3600).collect(),
            starts_with_keyframe: true,
            video: Some(VideoFormat {
                profile_idc: 100,
                constraints: 0,
                level_idc: 30,
                width: 640,
                height: 360,
            }),
            ..Segment::default()
        }
    }

    fn named(segments: Vec<Segment>) -> Vec<SegmentSummary> {
        segments
            .into_iter()
            .enumerate()
            .map(|(i, s)| SegmentSummary::of(&format!("seg-{i:05}.ts"), &s).unwrap())
            .collect()
    }

    #[test]
    fn durations_run_to_the_next_segment_and_the_last_frame_s_end() {
        // 2 s, 2 s and 1 s at 25 fps, starting at 1.4 s (the muxer's offset).
        let segments = named(vec![
            segment(1.4, 50, 1000),
            segment(3.4, 50, 1000),
            segment(5.4, 25, 500),
        ]);
        let timed = time_segments(&segments).unwrap();
        let seconds: Vec<f64> = timed.iter().map(Timed::seconds).collect();
        assert_eq!(seconds, [2.0, 2.0, 1.0]);
        assert_eq!(target_duration(&timed), 2);
        let text = media_playlist(&timed);
        assert_eq!(
            text,
            "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n\
             #EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-INDEPENDENT-SEGMENTS\n\
             #EXTINF:2.000000,\nseg-00000.ts\n#EXTINF:2.000000,\nseg-00001.ts\n\
             #EXTINF:1.000000,\nseg-00002.ts\n#EXT-X-ENDLIST\n"
        );
    }

    #[test]
    fn segments_out_of_order_or_without_a_keyframe_are_refused() {
        let mut segments = named(vec![segment(0.0, 50, 1), segment(2.0, 50, 1)]);
        segments[1].opens_on_keyframe = false;
        assert_eq!(
            time_segments(&segments).unwrap_err(),
            "seg-00001.ts does not open on a keyframe"
        );
        let backwards = named(vec![segment(2.0, 50, 1), segment(0.0, 50, 1)]);
        assert!(time_segments(&backwards)
            .unwrap_err()
            .starts_with("seg-00001.ts starts at PTS 0, not after 180000"));
        let one_frame = named(vec![segment(0.0, 1, 1)]);
        assert!(time_segments(&one_frame).is_err());
        let no_frame = Segment::default();
        assert!(SegmentSummary::of("empty.ts", &no_frame)
            .unwrap_err()
            .contains("holds no video frame"));
    }

    #[test]
    fn peak_is_the_richest_run_of_half_to_one_and_a_half_targets() {
        // 2 s segments (target 2): runs of 1 or 2 segments (2 s to 3 s
        // qualify: one segment; two is 4 s, too long).
        let segments = named(vec![
            segment(0.0, 50, 100_000),
            segment(2.0, 50, 400_000),
            segment(4.0, 50, 100_000),
        ]);
        let timed = time_segments(&segments).unwrap();
        assert_eq!(peak_bit_rate(&timed), 400_000 * 8 / 2);
        assert_eq!(average_bit_rate(&timed), 600_000 * 8 / 6);

        // 1 s segments beside a target of 2 (one 2.4 s segment): runs of
        // one to three 1 s segments qualify.
        let uneven = named(vec![
            segment(0.0, 60, 240_000),
            segment(2.4, 25, 300_000),
            segment(3.4, 25, 0),
        ]);
        let timed = time_segments(&uneven).unwrap();
        assert_eq!(target_duration(&timed), 2);
        assert_eq!(peak_bit_rate(&timed), 300_000 * 8);
    }

    #[test]
    fn a_variant_measured_over_every_segment() {
        let mut first = segment(0.0, 50, 250_000);
        first.audio = Some(crate::steps::hls::ts::AudioFormat {
            object_type: 2,
            sample_rate: 48_000,
            channels: 2,
        });
        let segments = named(vec![first, segment(2.0, 25, 50_000)]);
        let timed = time_segments(&segments).unwrap();
        let variant = Variant::measure("360p/index.m3u8", &segments, &timed).unwrap();
        assert_eq!(variant.codecs, "avc1.64001e,mp4a.40.2");
        assert_eq!((variant.width, variant.height), (640, 360));
        assert_eq!(variant.frame_rate, 25.0);
        assert_eq!(variant.bandwidth, 1_000_000);
        assert_eq!(variant.average_bandwidth, 800_000);
        assert_eq!(
            master_playlist(&[variant], &[]),
            "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-INDEPENDENT-SEGMENTS\n\
             #EXT-X-STREAM-INF:BANDWIDTH=1000000,AVERAGE-BANDWIDTH=800000,\
             CODECS=\"avc1.64001e,mp4a.40.2\",RESOLUTION=640x360,FRAME-RATE=25.000\n\
             360p/index.m3u8\n"
        );
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn summaries_round_trip_and_join_into_the_same_playlists() {
        let summary = |i: u64, start: u64| SegmentSummary {
            name: format!("seg-{i:05}.ts"),
            bytes: 1000 + i,
            first_pts: start,
            last_pts: start + 49 * 3600,
            frames: 50,
            intervals: BTreeMap::from([(3600, 49)]),
            opens_on_keyframe: true,
            codecs: "avc1.64001e".into(),
            width: 640,
            height: 360,
            keyframe_bytes: Some(564),
        };
        let all: Vec<SegmentSummary> = (0..4).map(|i| summary(i, i * 180_000)).collect();
        let text = serde_json::to_string(&all).unwrap();
        let back: Vec<SegmentSummary> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, all);
        // Summaries recorded in two halves (two chunks) and joined write
        // the playlists of the whole.
        let (left, right) = all.split_at(2);
        let joined: Vec<SegmentSummary> = left.iter().chain(right).cloned().collect();
        let files = package_playlists(&[("360p".into(), joined)], true).unwrap();
        assert_eq!(
            files,
            package_playlists(&[("360p".into(), all.clone())], true).unwrap()
        );
        assert_eq!(files[0].0, "360p/index.m3u8");
        assert_eq!(files[1].0, "360p/iframes.m3u8");
        assert_eq!(files[2].0, "master.m3u8");
        assert!(files[0].1.contains("#EXTINF:2.000000,\nseg-00003.ts"));
    }

    #[test]
    fn each_rendition_gets_an_iframe_playlist_of_its_keyframe_ranges() {
        let summary = |i: u64, bytes: u64| SegmentSummary {
            name: format!("seg-{i:05}.ts"),
            bytes: 100_000,
            first_pts: 900_000 + i * 180_000,
            last_pts: 900_000 + i * 180_000 + 49 * 3600,
            frames: 50,
            intervals: BTreeMap::from([(3600, 49)]),
            opens_on_keyframe: true,
            codecs: "avc1.64001e,mp4a.40.2".into(),
            width: 640,
            height: 360,
            keyframe_bytes: Some(bytes),
        };
        let segments = vec![summary(0, 25_000), summary(1, 5_000)];
        let files = package_playlists(&[("360p".into(), segments.clone())], true).unwrap();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["360p/index.m3u8", "360p/iframes.m3u8", "master.m3u8"]
        );
        assert_eq!(
            files[1].1,
            "#EXTM3U\n#EXT-X-VERSION:4\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n\
             #EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-I-FRAMES-ONLY\n#EXT-X-INDEPENDENT-SEGMENTS\n\
             #EXTINF:2.000000,\n#EXT-X-BYTERANGE:25000@0\nseg-00000.ts\n\
             #EXTINF:2.000000,\n#EXT-X-BYTERANGE:5000@0\nseg-00001.ts\n#EXT-X-ENDLIST\n"
        );
        // Peak: the richest 2 s keyframe (25,000 bytes in 2 s); average:
        // 30,000 bytes in 4 s; the video codec alone.
        assert!(files[2].1.ends_with(
            "#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=100000,AVERAGE-BANDWIDTH=60000,\
             CODECS=\"avc1.64001e\",RESOLUTION=640x360,URI=\"360p/iframes.m3u8\"\n"
        ));

        // Turned off, or a segment whose range is unknown (a chunk done by
        // an older build): no I-frame playlist anywhere.
        let off = package_playlists(&[("360p".into(), segments.clone())], false).unwrap();
        let mut unknown = segments.clone();
        unknown[1].keyframe_bytes = None;
        let partial =
            package_playlists(&[("720p".into(), segments), ("360p".into(), unknown)], true)
                .unwrap();
        for files in [off, partial] {
            assert!(files
                .iter()
                .all(|(name, text)| !name.ends_with(IFRAME_PLAYLIST) && !text.contains("I-FRAME")));
        }
    }

    #[test]
    fn a_summary_written_before_keyframe_ranges_still_reads() {
        let old = r#"{"name":"seg-00000.ts","bytes":1,"first_pts":0,"last_pts":3600,
            "frames":2,"intervals":{"3600":1},"opens_on_keyframe":true,
            "codecs":"avc1.64001e","width":640,"height":360}"#;
        let summary: SegmentSummary = serde_json::from_str(old).unwrap();
        assert_eq!(summary.keyframe_bytes, None);
        assert!(!serde_json::to_string(&summary)
            .unwrap()
            .contains("keyframe_bytes"));
    }
}
