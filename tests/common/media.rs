//! Clips made by the pinned `ffmpeg` (`make test` points `MEDIAONCE_FFMPEG`
//! at imageio-ffmpeg's static 7.0.2) from its test sources (`testsrc` for
//! pictures, `sine` for sound), generated on first use into cargo's
//! temporary directory for tests and reused after.

use std::path::PathBuf;
use std::process::Command;

/// The ffmpeg the tests make clips with, and hls-package runs by default.
pub fn ffmpeg() -> PathBuf {
    // Found as the step finds it: MEDIAONCE_FFMPEG, else PATH.
    let path = mediaonce::steps::ffmpeg::ffmpeg_from(|name| std::env::var(name).ok());
    let found = Command::new(&path)
        .arg("-version")
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        found,
        "these tests need ffmpeg ({}): run them through `make test`, which installs \
         the pinned build, or set MEDIAONCE_FFMPEG to `scripts/emulators.sh ffmpeg`'s path",
        path.display()
    );
    path
}

/// A clip described by ffmpeg arguments (inputs, codecs, output options;
/// not the output file), made once and cached under `name`.
pub fn clip(name: &str, args: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clips");
    std::fs::create_dir_all(&dir).unwrap();
    // The arguments are part of the file name: change them, get a new clip.
    let tag = &mediaonce::key::sha256_hex(args.join(" ").as_bytes())[..12];
    let path = dir.join(format!("{tag}-{name}"));
    if path.exists() {
        return path;
    }
    // Tests run in parallel: write aside, then rename into place.
    let partial = dir.join(format!(
        ".{tag}-{}-{name}",
        std::process::id() as u64 * 1000 + fastrand::u64(..1000)
    ));
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-y"])
        .args(args)
        .arg(&partial)
        .output()
        .expect("run ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&partial, &path).unwrap();
    path
}

/// Picture and sound: `seconds` of testsrc at `size` and `rate` fps with a
/// 48 kHz sine, H.264 + AAC.
pub fn av_args(size: &str, rate: u32, seconds: u32) -> Vec<String> {
    vec![
        "-f".into(),
        "lavfi".into(),
        "-i".into(),
        format!("testsrc=size={size}:rate={rate}:duration={seconds}"),
        "-f".into(),
        "lavfi".into(),
        "-i".into(),
        format!("sine=frequency=440:sample_rate=48000:duration={seconds}"),
        "-c:v".into(),
        "libx264".into(),
        "-pix_fmt".into(),
        "yuv420p".into(),
        "-preset".into(),
        "ultrafast".into(),
        "-c:a".into(),
        "aac".into(),
        "-b:a".into(),
        "96k".into(),
    ]
}

/// A clip of picture and sound, with extra output options (`-movflags
/// +faststart`, `-f mov`).
pub fn av_clip(name: &str, size: &str, rate: u32, seconds: u32, extra: &[&str]) -> PathBuf {
    let mut args = av_args(size, rate, seconds);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    clip(name, &args)
}

/// 7 s of ffmpeg's `testsrc2` (a moving picture with a clock) and a tone,
/// 640x360 at 25 fps, H.264 and AAC: at 2 s segments, three whole and a
/// short last one.
pub fn clock_clip() -> PathBuf {
    clip(
        "testsrc2-clock-7s.mp4",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=640x360:rate=25:duration=7",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000:duration=7",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "96k",
        ],
    )
}

/// A clip of picture and sound shown rotated: coded 320x240, with the track
/// matrix of a phone held upright (a=0 b=1 c=-1 d=0, as iPhones write it;
/// 90° clockwise on screen, so shown 240x320). ffmpeg 7 writes that matrix
/// when stream-copying an input given `-display_rotation -90` (degrees
/// counter-clockwise).
pub fn upright_phone_clip() -> PathBuf {
    let source = av_clip("landscape.mp4", "320x240", 24, 2, &[]);
    let source = source.display().to_string();
    clip(
        "upright-phone.mp4",
        &["-display_rotation:v:0", "-90", "-i", &source, "-c", "copy"],
    )
}

/// An MP4 of one second of sound and no picture.
pub fn audio_only_mp4() -> Vec<u8> {
    let path = clip(
        "audio-only.mp4",
        &[
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:duration=1",
            "-c:a",
            "aac",
        ],
    );
    std::fs::read(path).unwrap()
}

/// A PNG of noise (incompressible): `width × height × 3` bytes and a little.
pub fn noise_png(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let image = image::RgbImage::from_fn(width, height, |_, _| {
        image::Rgb([rng.u8(..), rng.u8(..), rng.u8(..)])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    image
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("encode png");
    out.into_inner()
}

/// The payload of an EXIF APP1 segment holding only `orientation` (1 to 8),
/// from "Exif\0\0" on.
pub fn exif_orientation(orientation: u16) -> Vec<u8> {
    let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08".to_vec();
    exif.extend_from_slice(&1u16.to_be_bytes()); // one entry
    exif.extend_from_slice(&0x0112u16.to_be_bytes()); // Orientation
    exif.extend_from_slice(&3u16.to_be_bytes()); // SHORT
    exif.extend_from_slice(&1u32.to_be_bytes()); // one value
    exif.extend_from_slice(&orientation.to_be_bytes());
    exif.extend_from_slice(&[0, 0]); // value padding
    exif.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
    exif
}

/// A JPEG with an EXIF APP1 segment holding only `orientation`, placed
/// after its first segment (the JFIF APP0 that cjpeg writes).
pub fn with_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    assert_eq!(&jpeg[..3], &[0xFF, 0xD8, 0xFF], "a JPEG");
    let first_end = 4 + u16::from_be_bytes([jpeg[4], jpeg[5]]) as usize;
    let payload = exif_orientation(orientation);
    let mut out = jpeg[..first_end].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&(payload.len() as u16 + 2).to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[first_end..]);
    out
}
