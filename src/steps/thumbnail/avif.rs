//! AVIF outputs: the rendered pixels go to ffmpeg's libaom (still-picture
//! mode) and its AVIF muxer, through the runner in `ffmpeg.rs`. The muxer
//! seeks back to write its boxes, so it writes a file in a scratch
//! directory of the job's own, read back and removed.
//!
//! Output: 8-bit 4:2:0, BT.709 matrix at full range, tagged sRGB (nclx
//! 1/13/1). An image with transparency gets an alpha image too (a second,
//! monochrome AV1 stream, which the muxer writes as the auxiliary alpha
//! item, `auxl` and `auxC`, as libavif does); an opaque one does not.
//! Quality 1–100 maps to libaom's CRF 63–0 (`crf = 63 − 63 × q / 100`,
//! rounded): the default 82 is CRF 11. Speed on this project's 2-core
//! x86_64 machine, `-cpu-used 6`: ~0.17 s at 320 px, ~1.6 s at 1280 px,
//! which is why the step declares time for AVIF recipes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use image::DynamicImage;

use crate::step::StepError;
use crate::steps::ffmpeg::piped::{run, Failure};

/// The CRF libaom gets for a quality from 1 to 100.
pub fn crf(quality: u8) -> u8 {
    let quality = quality.clamp(1, 100) as u32;
    (63 - (63 * quality + 50) / 100) as u8
}

/// Removes a scratch directory however the encode ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Encodes `image` (at 8 bits) as AVIF, with its alpha if any pixel is
/// not opaque.
pub async fn encode(
    image: &DynamicImage,
    quality: u8,
    ffmpeg: &Path,
    time_left: Option<Duration>,
) -> Result<Vec<u8>, StepError> {
    let rgba = image.color().has_alpha().then(|| image.to_rgba8());
    let transparent = rgba
        .as_ref()
        .is_some_and(|rgba| rgba.pixels().any(|p| p.0[3] != 255));
    let (w, h) = (image.width(), image.height());
    let (pixels, pix_fmt) = match rgba {
        Some(rgba) if transparent => (rgba.into_raw(), "rgba"),
        _ => (image.to_rgb8().into_raw(), "rgb24"),
    };
    // The colour to 4:2:0 at full range; the alpha, if any, as a second
    // (grey) stream.
    let colour = "scale=out_color_matrix=bt709:out_range=full,format=yuv420p";
    let filters: Vec<String> = if transparent {
        [
            "-filter_complex".to_string(),
            format!("[0:v]split[c][a];[c]{colour}[colour];[a]alphaextract,format=gray[alpha]"),
            "-map".into(),
            "[colour]".into(),
            "-map".into(),
            "[alpha]".into(),
        ]
        .into()
    } else {
        vec!["-vf".into(), colour.into()]
    };
    let dir = std::env::temp_dir().join(format!("mediaonce-avif-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| StepError::Failed(format!("AVIF scratch {}: {e}", dir.display())))?;
    let scratch = Scratch(dir);
    let out = scratch.0.join("out.avif");
    let args: Vec<String> = [
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostats",
        "-protocol_whitelist",
        "file,pipe",
        "-f",
        "rawvideo",
        "-pix_fmt",
        pix_fmt,
        "-s",
        &format!("{w}x{h}"),
        "-i",
        "pipe:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(filters)
    .chain(
        [
            "-c:v",
            "libaom-av1",
            "-still-picture",
            "1",
            "-crf",
            &crf(quality).to_string(),
            "-cpu-used",
            "6",
            "-row-mt",
            "1",
            "-color_primaries",
            "bt709",
            "-color_trc",
            "iec61966-2-1",
            "-colorspace",
            "bt709",
            "-color_range",
            "pc",
            "-f",
            "avif",
            "-y",
        ]
        .iter()
        .map(|s| s.to_string()),
    )
    .chain([out.display().to_string()])
    .collect();
    run(ffmpeg, &args, &scratch.0, pixels, 0, time_left)
        .await
        .map_err(|e| match e {
            // Our own pixels: a refusal is not the upload's fault.
            Failure::Output(why) => StepError::Failed(format!("AVIF encoding failed: {why}")),
            Failure::Step(e) => e,
        })?;
    std::fs::read(&out)
        .map_err(|e| StepError::Failed(format!("reading the AVIF ffmpeg wrote: {e}")))
}

#[cfg(test)]
mod tests {
    use super::crf;

    #[test]
    fn quality_maps_onto_the_whole_crf_range() {
        assert_eq!(crf(100), 0);
        assert_eq!(crf(1), 62);
        assert_eq!(crf(0), 62);
        assert_eq!(crf(82), 11);
        assert_eq!(crf(50), 31);
    }
}
