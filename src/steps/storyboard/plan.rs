//! A storyboard's shape, from its params and the package's index: the
//! interval, the cues and where each one's tile sits on which sheet, the
//! rendition the tiles are cut from, the frame each cue shows, and the
//! WebVTT that points into the sheets. Pure.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::steps::hls::index::{IndexedRendition, PackageIndex};
use crate::steps::hls::ts::TICKS_PER_SECOND;

/// Without an `interval`, a video is cut into at most this many tiles…
pub const AUTO_TILES: u64 = 50;
/// …every whole second at least, and every 18 s at most: a video of up
/// to 15 minutes has at most 50 tiles, a longer one a tile every 18 s
/// (200 an hour), on as many sheets as that takes.
pub const AUTO_MAX_INTERVAL_MS: u64 = 18_000;

/// The WebVTT file's name.
pub const VTT_NAME: &str = "storyboard.vtt";

/// The sheets' image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SheetFormat {
    Jpeg,
    Webp,
}

impl SheetFormat {
    pub fn extension(self) -> &'static str {
        match self {
            SheetFormat::Jpeg => "jpg",
            SheetFormat::Webp => "webp",
        }
    }
}

/// `storyboard`'s params.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoryboardParams {
    /// Seconds between tiles; by default from the duration ([`AUTO_TILES`]).
    #[serde(default)]
    pub interval: Option<f64>,
    /// Tile width in pixels (even); the height follows the picture's
    /// aspect ratio. Never wider than the package's widest rendition.
    #[serde(default = "default_width")]
    pub width: u32,
    /// Tiles per row of a sheet.
    #[serde(default = "default_columns")]
    pub columns: u32,
    /// Rows of a sheet at most: past `columns × rows` tiles, another sheet.
    #[serde(default = "default_rows")]
    pub rows: u32,
    #[serde(default = "default_format")]
    pub format: SheetFormat,
    /// 1 to 100.
    #[serde(default = "default_quality")]
    pub quality: u8,
}

fn default_width() -> u32 {
    256
}
fn default_columns() -> u32 {
    10
}
fn default_rows() -> u32 {
    10
}
fn default_format() -> SheetFormat {
    SheetFormat::Jpeg
}
fn default_quality() -> u8 {
    75
}

impl StoryboardParams {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, String> {
        let params: StoryboardParams = serde_json::from_value(Value::Object(params.clone()))
            .map_err(|e| format!("storyboard params: {e}"))?;
        let refuse = |what: String| Err(format!("storyboard params: {what}"));
        if let Some(interval) = params.interval {
            if !(0.1..=3600.0).contains(&interval) {
                return refuse(format!("interval is 0.1 to 3600 seconds, got {interval}"));
            }
        }
        if !(16..=1920).contains(&params.width) || !params.width.is_multiple_of(2) {
            return refuse(format!(
                "width is an even number of pixels from 16 to 1920, got {}",
                params.width
            ));
        }
        if !(1..=20).contains(&params.columns) || !(1..=20).contains(&params.rows) {
            return refuse(format!(
                "columns and rows are 1 to 20, got {} and {}",
                params.columns, params.rows
            ));
        }
        // WebP's limit, and a sheet a browser decodes without trouble.
        if params.columns * params.width > 16_000 {
            return refuse(format!(
                "columns × width is at most 16000 pixels, got {}",
                params.columns * params.width
            ));
        }
        if !(1..=100).contains(&params.quality) {
            return refuse(format!("quality is 1 to 100, got {}", params.quality));
        }
        Ok(params)
    }
}

/// One cue: a span of the video, and its tile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cue {
    /// Milliseconds from the video's start, end exclusive.
    pub start_ms: u64,
    pub end_ms: u64,
    pub sheet: usize,
    /// The tile's top left corner on its sheet.
    pub x: u32,
    pub y: u32,
}

/// One sheet: its file name and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sheet {
    pub name: String,
    pub width: u32,
    pub height: u32,
}

/// The storyboard of a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    /// The rendition tiles are cut from.
    pub rendition: String,
    /// Its first frame's time (90 kHz): the video's start.
    pub start_pts: u64,
    pub duration_ms: u64,
    pub interval_ms: u64,
    pub tile_width: u32,
    pub tile_height: u32,
    pub cues: Vec<Cue>,
    pub sheets: Vec<Sheet>,
}

/// The rendition tiles are cut from: the smallest at least `width` wide
/// (decoding it costs least and shrinks, never enlarges, the picture), or
/// the widest when none is.
pub fn source_rendition(index: &PackageIndex, width: u32) -> &IndexedRendition {
    let mut by_width: Vec<&IndexedRendition> = index.renditions.iter().collect();
    by_width.sort_by_key(|r| (r.width, r.height));
    by_width
        .iter()
        .find(|r| r.width >= width)
        .or(by_width.last())
        .expect("an index has a rendition")
}

/// An even number of pixels, at least 2.
fn even(pixels: f64) -> u32 {
    ((pixels / 2.0).round() as u32).max(1) * 2
}

/// The default interval for a video of `duration_ms`.
pub fn auto_interval_ms(duration_ms: u64) -> u64 {
    (duration_ms.div_ceil(AUTO_TILES).div_ceil(1000) * 1000).clamp(1000, AUTO_MAX_INTERVAL_MS)
}

impl Board {
    /// The board of `index` under `params`.
    pub fn plan(index: &PackageIndex, params: &StoryboardParams) -> Board {
        let source = source_rendition(index, params.width);
        let first = source
            .segments
            .first()
            .expect("an index's rendition has segments");
        let last = source.segments.last().expect("and a last one");
        let ticks = last.start + last.duration - first.start;
        let duration_ms = (ticks * 1000).div_ceil(TICKS_PER_SECOND).max(1);
        let interval_ms = params
            .interval
            .map(|seconds| (seconds * 1000.0).round() as u64)
            .unwrap_or_else(|| auto_interval_ms(duration_ms));
        let tile_width = params.width.min(source.width & !1).max(2);
        let tile_height = even(tile_width as f64 * source.height as f64 / source.width as f64);
        let count = duration_ms.div_ceil(interval_ms) as usize;
        let per_sheet = (params.columns * params.rows) as usize;
        let columns = params.columns as usize;
        let cues = (0..count)
            .map(|i| {
                let place = i % per_sheet;
                Cue {
                    start_ms: i as u64 * interval_ms,
                    end_ms: ((i as u64 + 1) * interval_ms).min(duration_ms),
                    sheet: i / per_sheet,
                    x: (place % columns) as u32 * tile_width,
                    y: (place / columns) as u32 * tile_height,
                }
            })
            .collect();
        let sheets = (0..count.div_ceil(per_sheet))
            .map(|sheet| {
                let tiles = (count - sheet * per_sheet).min(per_sheet);
                Sheet {
                    name: format!("storyboard-{sheet}.{}", params.format.extension()),
                    width: tiles.min(columns) as u32 * tile_width,
                    height: tiles.div_ceil(columns) as u32 * tile_height,
                }
            })
            .collect();
        Board {
            rendition: source.name.clone(),
            start_pts: first.start,
            duration_ms,
            interval_ms,
            tile_width,
            tile_height,
            cues,
            sheets,
        }
    }

    /// The presentation time (90 kHz) each cue's tile shows: its start.
    pub fn cue_pts(&self, cue: &Cue) -> u64 {
        self.start_pts + cue.start_ms * TICKS_PER_SECOND / 1000
    }

    /// `storyboard.vtt`: a cue per tile, `<sheet>#xywh=x,y,w,h`.
    pub fn vtt(&self) -> String {
        let mut text = String::from("WEBVTT\n");
        for cue in &self.cues {
            text.push_str(&format!(
                "\n{} --> {}\n{}#xywh={},{},{},{}\n",
                timestamp(cue.start_ms),
                timestamp(cue.end_ms),
                self.sheets[cue.sheet].name,
                cue.x,
                cue.y,
                self.tile_width,
                self.tile_height
            ));
        }
        text
    }
}

/// A WebVTT timestamp: `hh:mm:ss.ttt`.
fn timestamp(ms: u64) -> String {
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// The frame showing `pts` among a segment's frames (presentation order):
/// the last at or before it, else the first.
pub fn frame_at(frames: &[u64], pts: u64) -> Option<u64> {
    let after = frames.partition_point(|&f| f <= pts);
    frames.get(after.saturating_sub(1)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::hls::index::IndexedSegment;
    use serde_json::json;

    fn params(value: Value) -> StoryboardParams {
        StoryboardParams::from_params(value.as_object().unwrap()).unwrap()
    }

    /// A package of `seconds` in 6 s segments, at 640x360 and 426x240.
    fn index(seconds: u64) -> PackageIndex {
        let rendition = |name: &str, width, height| IndexedRendition {
            name: name.into(),
            width,
            height,
            segments: (0..seconds.div_ceil(6))
                .map(|i| IndexedSegment {
                    name: format!("seg-{i:05}.ts"),
                    bytes: 1000,
                    sha256: "0".repeat(64),
                    start: 900_000 + i * 540_000,
                    duration: (seconds - i * 6).min(6) * 90_000,
                    keyframe_bytes: Some(376),
                })
                .collect(),
        };
        PackageIndex {
            renditions: vec![rendition("360p", 640, 360), rendition("240p", 426, 240)],
        }
    }

    #[test]
    fn params_have_defaults_and_bounds() {
        let p = params(json!({}));
        assert_eq!(
            (p.interval, p.width, p.columns, p.rows, p.quality),
            (None, 256, 10, 10, 75)
        );
        assert_eq!(p.format, SheetFormat::Jpeg);
        assert_eq!(params(json!({"format": "webp"})).format, SheetFormat::Webp);
        for (bad, problem) in [
            (json!({"width": 255}), "even number"),
            (json!({"interval": 0}), "interval is 0.1 to 3600"),
            (json!({"columns": 0}), "columns and rows"),
            (json!({"columns": 20, "width": 1000}), "at most 16000"),
            (json!({"quality": 0}), "quality is 1 to 100"),
            (json!({"format": "gif"}), "unknown variant"),
            (json!({"tiles": 3}), "unknown field"),
        ] {
            let err = StoryboardParams::from_params(bad.as_object().unwrap()).unwrap_err();
            assert!(err.contains(problem), "{bad}: {err}");
        }
    }

    #[test]
    fn the_default_interval_keeps_a_short_video_near_fifty_tiles() {
        assert_eq!(auto_interval_ms(7_000), 1_000);
        assert_eq!(auto_interval_ms(50_000), 1_000);
        assert_eq!(auto_interval_ms(50_001), 2_000);
        assert_eq!(auto_interval_ms(600_000), 12_000);
        assert_eq!(auto_interval_ms(900_000), 18_000);
        assert_eq!(auto_interval_ms(3 * 3_600_000), 18_000);
        for minutes in 1..=15u64 {
            let ms = minutes * 60_000;
            assert!(
                ms.div_ceil(auto_interval_ms(ms)) <= AUTO_TILES,
                "{minutes} min"
            );
        }
    }

    #[test]
    fn cues_cover_the_video_and_tiles_fill_sheets_row_by_row() {
        // 130 s at 2 s: 65 tiles, one sheet of 10 columns, 7 rows.
        let board = Board::plan(&index(130), &params(json!({"interval": 2})));
        assert_eq!(board.rendition, "240p", "the smallest at least 256 wide");
        assert_eq!((board.tile_width, board.tile_height), (256, 144));
        assert_eq!(board.cues.len(), 65);
        assert_eq!(board.cues[64].end_ms, 130_000);
        assert_eq!(board.cues[11].x, 256);
        assert_eq!(board.cues[11].y, 144);
        assert_eq!(board.sheets.len(), 1);
        assert_eq!(
            (board.sheets[0].width, board.sheets[0].height),
            (2560, 1008)
        );
        assert_eq!(board.cue_pts(&board.cues[3]), 900_000 + 6 * 90_000);

        // 25 min by default: 18 s, 84 tiles; 3 columns by 4 rows a sheet:
        // 7 sheets, the last of 12 tiles.
        let long = Board::plan(&index(1500), &params(json!({"columns": 3, "rows": 4})));
        assert_eq!(long.interval_ms, 18_000);
        assert_eq!(long.cues.len(), 84);
        assert_eq!(long.sheets.len(), 7);
        assert_eq!(long.cues[83].sheet, 6);
        assert_eq!(long.sheets[6].name, "storyboard-6.jpg");
        assert_eq!((long.sheets[6].width, long.sheets[6].height), (768, 576));

        let text = Board::plan(&index(7), &params(json!({"interval": 5}))).vtt();
        assert_eq!(
            text,
            "WEBVTT\n\n00:00:00.000 --> 00:00:05.000\nstoryboard-0.jpg#xywh=0,0,256,144\n\
             \n00:00:05.000 --> 00:00:07.000\nstoryboard-0.jpg#xywh=256,0,256,144\n"
        );
    }

    #[test]
    fn tiles_never_outgrow_the_picture() {
        let narrow = Board::plan(&index(6), &params(json!({"width": 1280})));
        assert_eq!(
            narrow.rendition, "360p",
            "the widest when none is wide enough"
        );
        assert_eq!((narrow.tile_width, narrow.tile_height), (640, 360));
        let small = Board::plan(&index(6), &params(json!({"width": 160})));
        assert_eq!(small.rendition, "240p");
        assert_eq!((small.tile_width, small.tile_height), (160, 90));
    }

    #[test]
    fn a_cue_shows_the_last_frame_at_or_before_its_time() {
        let frames = [100, 200, 300];
        assert_eq!(frame_at(&frames, 50), Some(100));
        assert_eq!(frame_at(&frames, 200), Some(200));
        assert_eq!(frame_at(&frames, 299), Some(200));
        assert_eq!(frame_at(&frames, 999), Some(300));
        assert_eq!(frame_at(&[], 1), None);
    }
}
