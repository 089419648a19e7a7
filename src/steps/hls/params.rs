//! hls-package's params and the ladder they give a source. Pure.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The x264 presets, fastest first.
const PRESETS: [&str; 9] = [
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
];

/// A ladder rung: a target height, written `720`, `"720"` or `"720p"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Value")]
pub struct Height(pub u32);

impl TryFrom<Value> for Height {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let height = match &value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.strip_suffix('p').unwrap_or(s).parse().ok(),
            _ => None,
        };
        match height {
            Some(h @ 64..=4320) if h % 2 == 0 => Ok(Height(h as u32)),
            _ => Err(format!(
                "ladder heights are even numbers from 64 to 4320 (720, \"720\" or \"720p\"), got {value}"
            )),
        }
    }
}

/// hls-package's params.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HlsParams {
    /// Target heights, e.g. `["1080","720","360"]`; never upscaled.
    pub ladder: Vec<Height>,
    /// Target segment length in seconds.
    #[serde(default = "default_segment")]
    pub segment: f64,
    /// x264 preset.
    #[serde(default = "default_preset")]
    pub preset: String,
    /// x264 constant rate factor (0–51, lower is better).
    #[serde(default = "default_crf")]
    pub crf: u32,
    /// Peak video bitrate per rendition in kbit/s at 1080 lines, scaled by
    /// height for the others; 0 leaves CRF unconstrained.
    #[serde(default = "default_max_kbps")]
    pub max_kbps_1080: u32,
    /// AAC bitrate in kbit/s (stereo).
    #[serde(default = "default_audio_kbps")]
    pub audio_kbps: u32,
    /// Encoder threads. Fixed rather than the machine's core count because
    /// x264's output depends on it: the same recipe must give the same bytes
    /// on every Lambda size.
    #[serde(default = "default_threads")]
    pub threads: u32,
    /// No job starts with less than this left before the invocation deadline.
    #[serde(default = "default_min_seconds")]
    pub min_seconds: u64,
    /// Seconds of input one ffmpeg run encodes, rounded down to whole
    /// segments: a longer input is encoded in chunks of this length. Part
    /// of the recipe (the chunks' cuts change the bytes), so a constant by
    /// default, not derived from the function's size.
    #[serde(default = "default_chunk")]
    pub chunk_seconds: u64,
    /// Whether each rendition gets an I-frame playlist, listed in the
    /// master (`EXT-X-I-FRAME-STREAM-INF`).
    #[serde(default = "default_iframes")]
    pub iframes: bool,
}

fn default_segment() -> f64 {
    6.0
}
fn default_preset() -> String {
    "veryfast".into()
}
fn default_crf() -> u32 {
    23
}
fn default_max_kbps() -> u32 {
    6000
}
fn default_audio_kbps() -> u32 {
    128
}
fn default_threads() -> u32 {
    2
}
fn default_iframes() -> bool {
    true
}
fn default_min_seconds() -> u64 {
    60
}
/// Ten 6 s segments: a minute of the default 1080p ladder is about 72
/// CPU-seconds of x264 on noisy content (`chunk::CPU_SECONDS_PER_SECOND_1080_LADDER`).
fn default_chunk() -> u64 {
    60
}

impl HlsParams {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, String> {
        let params: HlsParams = serde_json::from_value(Value::Object(params.clone()))
            .map_err(|e| format!("hls-package params: {e}"))?;
        params.check()?;
        Ok(params)
    }

    /// The segment length in whole milliseconds, as every cut is made.
    pub fn segment_ms(&self) -> u64 {
        (self.segment * 1000.0).round() as u64
    }

    /// The chunk length in milliseconds.
    pub fn chunk_ms(&self) -> u64 {
        self.chunk_seconds * 1000
    }

    fn check(&self) -> Result<(), String> {
        if self.ladder.is_empty() || self.ladder.len() > 8 {
            return Err("hls-package params: ladder needs 1 to 8 heights".into());
        }
        let mut seen = self.ladder.clone();
        seen.sort_by_key(|h| h.0);
        seen.dedup();
        if seen.len() != self.ladder.len() {
            return Err("hls-package params: ladder heights must differ".into());
        }
        if !(1.0..=60.0).contains(&self.segment) {
            return Err(format!(
                "hls-package params: segment is 1 to 60 seconds, got {}",
                self.segment
            ));
        }
        if !PRESETS.contains(&self.preset.as_str()) {
            return Err(format!(
                "hls-package params: preset is one of {}, got {:?}",
                PRESETS.join(", "),
                self.preset
            ));
        }
        if self.crf > 51 {
            return Err(format!(
                "hls-package params: crf is 0 to 51, got {}",
                self.crf
            ));
        }
        if !(32..=512).contains(&self.audio_kbps) {
            return Err(format!(
                "hls-package params: audio_kbps is 32 to 512, got {}",
                self.audio_kbps
            ));
        }
        if !(1..=super::chunk::MAX_CHUNK_SECONDS).contains(&self.chunk_seconds) {
            return Err(format!(
                "hls-package params: chunk_seconds is 1 to {}, got {}",
                super::chunk::MAX_CHUNK_SECONDS,
                self.chunk_seconds
            ));
        }
        if !(1..=16).contains(&self.threads) {
            return Err(format!(
                "hls-package params: threads is 1 to 16, got {}",
                self.threads
            ));
        }
        Ok(())
    }
}

/// One rendition of the ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendition {
    pub height: u32,
    /// Peak video bitrate in kbit/s, if capped.
    pub max_kbps: Option<u32>,
}

impl Rendition {
    /// The rendition's directory in the job's prefix: `720p`.
    pub fn name(&self) -> String {
        format!("{}p", self.height)
    }
}

/// The renditions for a source `source_height` lines tall (as displayed):
/// the ladder's heights at or below it, tallest first; a source shorter
/// than every rung gets one rendition at its own (even) height. Pure.
pub fn plan_renditions(params: &HlsParams, source_height: u32) -> Vec<Rendition> {
    let mut heights: Vec<u32> = params
        .ladder
        .iter()
        .map(|h| h.0)
        .filter(|&h| h <= source_height)
        .collect();
    if heights.is_empty() {
        heights.push((source_height & !1).max(2));
    }
    heights.sort_unstable_by(|a, b| b.cmp(a));
    heights
        .into_iter()
        .map(|height| Rendition {
            height,
            max_kbps: (params.max_kbps_1080 > 0)
                .then(|| (params.max_kbps_1080 as u64 * height as u64 / 1080).max(200) as u32),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(value: Value) -> Result<HlsParams, String> {
        HlsParams::from_params(value.as_object().unwrap())
    }

    #[test]
    fn ladder_heights_in_three_spellings_and_defaults() {
        let p = params(json!({"ladder": ["1080", "720p", 360]})).unwrap();
        assert_eq!(p.ladder, [Height(1080), Height(720), Height(360)]);
        assert_eq!((p.segment, p.crf, p.threads), (6.0, 23, 2));
        assert_eq!(p.preset, "veryfast");
    }

    #[test]
    fn bad_params_are_named() {
        for (value, expected) in [
            (json!({}), "missing field `ladder`"),
            (json!({"ladder": []}), "1 to 8 heights"),
            (json!({"ladder": ["720", "720p"]}), "must differ"),
            (json!({"ladder": ["721"]}), "even numbers"),
            (json!({"ladder": ["big"]}), "even numbers"),
            (
                json!({"ladder": [720], "segment": 0.5}),
                "segment is 1 to 60",
            ),
            (
                json!({"ladder": [720], "preset": "instant"}),
                "preset is one of",
            ),
            (json!({"ladder": [720], "crf": 60}), "crf is 0 to 51"),
            (json!({"ladder": [720], "threads": 0}), "threads is 1 to 16"),
            (
                json!({"ladder": [720], "codec": "av1"}),
                "unknown field `codec`",
            ),
        ] {
            let err = params(value.clone()).unwrap_err();
            assert!(err.contains(expected), "{value}: {err}");
        }
    }

    #[test]
    fn renditions_never_upscale() {
        let p = params(json!({"ladder": [360, 1080, 720]})).unwrap();
        let heights = |source| -> Vec<u32> {
            plan_renditions(&p, source)
                .iter()
                .map(|r| r.height)
                .collect()
        };
        assert_eq!(heights(2160), [1080, 720, 360]);
        assert_eq!(heights(720), [720, 360]);
        assert_eq!(heights(719), [360]);
        assert_eq!(heights(241), [240]);
        let r = plan_renditions(&p, 1080);
        assert_eq!(r[0].name(), "1080p");
        assert_eq!(r[0].max_kbps, Some(6000));
        assert_eq!(r[2].max_kbps, Some(2000));
    }
}
