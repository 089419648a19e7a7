//! The thumbnail step's decode and resize against libvips' `vipsthumbnail`,
//! on JPEGs made here by libjpeg-turbo's `cjpeg` and ImageMagick: every
//! sampling factor, greyscale, progressive, restart intervals, CMYK and
//! every EXIF orientation, at sizes that are and are not multiples of 8, 16
//! and 32. Each case must succeed, come out at vips' size, and match vips'
//! pixels (SSIM of each channel ≥ 0.98). Arithmetic-coded files must fail
//! permanently, naming arithmetic coding.
//!
//! `make test` runs a small set; `scripts/thumbnail_vs_vips.sh` runs all of
//! it (`MEDIAONCE_VIPS_CASES=all`) in a release build and prints the table.
//! The tools come from Debian (`libvips-tools`, `imagemagick`,
//! `libjpeg-turbo-progs`); `scripts/reference_tools.sh` installs them, and
//! `make test` runs it.

mod common;
#[path = "common/ssim.rs"]
mod ssim;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mediaonce::config::DEFAULT_MAX_PIXELS;
use mediaonce::step::StepError;
use mediaonce::steps::thumbnail::{decode_for, render, Format, ThumbnailParams};

/// The lowest SSIM of any channel that counts as vips' picture.
const MIN_SSIM: f64 = 0.98;

/// How a test JPEG is made from the source picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Flavour {
    /// Baseline YCbCr with the luma's sampling factors (`cjpeg -sample`):
    /// "2x2" is 4:2:0, "2x1" 4:2:2, "1x2" 4:4:0, "4x1" 4:1:1, "1x1" 4:4:4.
    Sampling(&'static str),
    Grey,
    Progressive,
    /// A restart marker every N MCUs.
    Restart(u32),
    /// ImageMagick's CMYK (Adobe APP14, inverted inks), no profile.
    Cmyk,
    /// A 4:2:0 baseline file with this EXIF orientation (1 to 8).
    Orientation(u16),
}

impl Flavour {
    fn name(self) -> String {
        match self {
            Flavour::Sampling("2x2") => "4:2:0".into(),
            Flavour::Sampling("2x1") => "4:2:2".into(),
            Flavour::Sampling("1x2") => "4:4:0".into(),
            Flavour::Sampling("4x1") => "4:1:1".into(),
            Flavour::Sampling("1x1") => "4:4:4".into(),
            Flavour::Sampling(other) => other.into(),
            Flavour::Grey => "grey".into(),
            Flavour::Progressive => "progressive".into(),
            Flavour::Restart(n) => format!("restart {n}"),
            Flavour::Cmyk => "CMYK".into(),
            Flavour::Orientation(o) => format!("EXIF {o}"),
        }
    }
}

const ALL_FLAVOURS: &[Flavour] = &[
    Flavour::Sampling("2x2"),
    Flavour::Sampling("2x1"),
    Flavour::Sampling("1x2"),
    Flavour::Sampling("4x1"),
    Flavour::Sampling("1x1"),
    Flavour::Grey,
    Flavour::Progressive,
    Flavour::Restart(1),
    Flavour::Restart(3),
    Flavour::Restart(5),
    Flavour::Restart(7),
    Flavour::Cmyk,
    Flavour::Orientation(1),
    Flavour::Orientation(2),
    Flavour::Orientation(3),
    Flavour::Orientation(4),
    Flavour::Orientation(5),
    Flavour::Orientation(6),
    Flavour::Orientation(7),
    Flavour::Orientation(8),
];

const ALL_SIZES: &[(u32, u32)] = &[
    (1179, 2556),
    (3001, 2000),
    (3001, 1999),
    (1001, 667),
    (1281, 721),
    (2048, 1536),
    (1, 1),
    (7, 3),
    (8, 8),
    (9, 9),
    (16, 16),
    (17, 33),
    (32, 32),
    (33, 31),
    (63, 65),
];

const ALL_WIDTHS: &[u32] = &[1, 16, 100, 320, 640, 1280];

/// The small set `make test` runs: the sizes of the failures and
/// the tiny ones, each flavour family once.
const SMALL_FLAVOURS: &[Flavour] = &[
    Flavour::Sampling("2x2"),
    Flavour::Sampling("4x1"),
    Flavour::Sampling("1x2"),
    Flavour::Grey,
    Flavour::Progressive,
    Flavour::Restart(3),
    Flavour::Cmyk,
    Flavour::Orientation(5),
    Flavour::Orientation(6),
    Flavour::Orientation(7),
];
const SMALL_SIZES: &[(u32, u32)] = &[(1179, 2556), (3001, 1999), (1, 1), (7, 3), (9, 9)];
const SMALL_WIDTHS: &[u32] = &[1, 16, 100, 320];

/// A Debian tool the test needs, or a panic that says how to install it.
fn tool(path: &str, package: &str) -> PathBuf {
    let found = if path.starts_with('/') {
        Some(PathBuf::from(path)).filter(|p| p.exists())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(path))
                .find(|p| p.exists())
        })
    };
    found.unwrap_or_else(|| {
        panic!(
            "{path} not found: install Debian's {package} (scripts/reference_tools.sh, \
             which make test runs, does it)"
        )
    })
}

fn run(command: &mut Command) -> Vec<u8> {
    let output = command.output().expect("the tool starts");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

struct Tools {
    convert: PathBuf,
    cjpeg: PathBuf,
    vipsthumbnail: PathBuf,
}

impl Tools {
    fn find() -> Tools {
        Tools {
            // Debian's ImageMagick 6, by path: some machines put another
            // `convert` earlier on PATH.
            convert: tool("/usr/bin/convert", "imagemagick"),
            cjpeg: tool("cjpeg", "libjpeg-turbo-progs"),
            vipsthumbnail: tool("vipsthumbnail", "libvips-tools"),
        }
    }

    /// The source picture: a fractal plasma (smooth areas, edges and
    /// detail at every scale), the same for the same size every run.
    fn source(&self, dir: &Path, (w, h): (u32, u32)) -> PathBuf {
        let path = dir.join(format!("source-{w}x{h}.ppm"));
        if !path.exists() {
            run(Command::new(&self.convert)
                .args([
                    "-size",
                    &format!("{w}x{h}"),
                    "-seed",
                    "42",
                    "plasma:fractal",
                ])
                .arg(&path));
        }
        path
    }

    fn cjpeg(&self, source: &Path, args: &[&str]) -> Vec<u8> {
        run(Command::new(&self.cjpeg)
            .args(["-quality", "92"])
            .args(args)
            .arg(source))
    }

    fn jpeg(&self, dir: &Path, size: (u32, u32), flavour: Flavour) -> Vec<u8> {
        let source = self.source(dir, size);
        match flavour {
            Flavour::Sampling(sampling) => self.cjpeg(&source, &["-sample", sampling]),
            Flavour::Grey => self.cjpeg(&source, &["-grayscale"]),
            Flavour::Progressive => self.cjpeg(&source, &["-progressive"]),
            Flavour::Restart(n) => self.cjpeg(&source, &["-restart", &format!("{n}B")]),
            Flavour::Cmyk => {
                let path = dir.join(format!("cmyk-{}x{}.jpg", size.0, size.1));
                run(Command::new(&self.convert)
                    .arg(&source)
                    .args(["-colorspace", "CMYK", "-quality", "92"])
                    .arg(&path));
                std::fs::read(&path).unwrap()
            }
            Flavour::Orientation(o) => {
                common::media::with_orientation(&self.cjpeg(&source, &[]), o)
            }
        }
    }

    /// vips' thumbnail of `input` at `size` (`vipsthumbnail --size`), as RGB.
    fn vips(&self, dir: &Path, input: &Path, size: &str) -> image::RgbImage {
        let output = dir.join("vips.png");
        run(Command::new(&self.vipsthumbnail)
            .arg(input)
            .args(["--size", size])
            .arg("-o")
            .arg(&output));
        image::open(&output).unwrap().to_rgb8()
    }

    /// The JPEG decoded in full by libjpeg-turbo (through ImageMagick:
    /// upright, CMYK converted naively as ours is without a profile) and
    /// kept lossless: vips' picture without its shrink-on-load.
    fn lossless(&self, dir: &Path, input: &Path) -> PathBuf {
        let output = dir.join("lossless.png");
        run(Command::new(&self.convert)
            .arg(input)
            .args(["-auto-orient", "-colorspace", "sRGB", "-strip"])
            .arg(&output));
        output
    }
}

/// mediaonce's thumbnail `width` pixels wide, before encoding: the step's
/// decode (shrink-on-load included) and resize.
fn ours(jpeg: &[u8], width: u32) -> Result<image::RgbImage, StepError> {
    let params = serde_json::json!({ "widths": [width], "format": "png" });
    let params = ThumbnailParams::parse(params.as_object().unwrap()).unwrap();
    let (image, plans) = decode_for(jpeg, DEFAULT_MAX_PIXELS, &params)?;
    Ok(render(&image, &plans[0], Format::Png)?.to_rgb8())
}

/// Flavours that libjpeg-turbo itself renders only approximately at a
/// reduced scale, so vips' shrink-on-load is not the picture: 4:1:1
/// (chroma a quarter as wide, upsampled by repeating at 1/8 to 1/2 scale),
/// 4:2:2 and 4:4:0 (its scaled IDCTs are square, so their chroma is
/// decoded at the luma's scale and upsampled on the subsampled axis from
/// half the samples; mediaonce decodes it through a rectangular IDCT with
/// all of them, DESIGN.md "thumbnail": lowest SSIM 0.980 against the full
/// decode, 0.966 against vips' blur), and CMYK without a profile (vips
/// assumes its own CMYK profile, ours and browsers convert naively).
/// Their reference is vips on a lossless full decode of the same file.
fn judged_on_full_decode(flavour: Flavour) -> bool {
    matches!(
        flavour,
        Flavour::Sampling("4x1" | "2x1" | "1x2") | Flavour::Cmyk
    )
}

/// A side under which SSIM measures the resize filter's shape, not the
/// picture: an output of 1 to 3 pixels on a side is a weighted mean of
/// the whole image, Lanczos-weighted by ours and box-weighted by vips'
/// integer shrink (a 9×9 plasma at 1 px differs by up to 12 levels for
/// that alone). Such outputs are held to `MAX_TINY_LEVELS` of vips' in
/// each channel's mean instead.
const TINY: u32 = 4;
const MAX_TINY_LEVELS: f64 = 16.0;

/// One case's figures against vips' JPEG thumbnail and against vips on the
/// lossless full decode: per channel SSIM, and the largest mean absolute
/// difference of a channel (levels of 255).
struct Figures {
    /// Our output's size.
    size: (u32, u32),
    vips: [f64; 3],
    lossless: [f64; 3],
    levels: f64,
    lossless_levels: f64,
}

fn worst(channels: [f64; 3]) -> f64 {
    channels.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The largest mean absolute difference of one channel.
fn levels(a: &image::RgbImage, b: &image::RgbImage) -> f64 {
    (0..3)
        .map(|c| {
            let sum: f64 = a
                .pixels()
                .zip(b.pixels())
                .map(|(p, q)| (p[c] as f64 - q[c] as f64).abs())
                .sum();
            sum / (a.width() * a.height()) as f64
        })
        .fold(0.0, f64::max)
}

/// Our output's size: the width asked (never upscaled) and the height in
/// proportion, rounded, as vips gives it without shrink-on-load. (On a
/// JPEG, vips takes its shrink-on-load frame, rounded up to whole pixels,
/// for the picture: 3001×1999 at 1/8 is 376×250, so at 100 px wide its
/// height is 66, where the picture's proportion gives 66.6.)
fn expected_size(upright: (u32, u32), width: u32) -> (u32, u32) {
    let width = width.min(upright.0);
    let height = (upright.1 as f64 * width as f64 / upright.0 as f64).round() as u32;
    (width, height.max(1))
}

/// One test file: the JPEG, where it is on disk, and its lossless full
/// decode (`Tools::lossless`).
struct Input {
    jpeg: Vec<u8>,
    path: PathBuf,
    lossless: PathBuf,
}

fn compare(
    tools: &Tools,
    dir: &Path,
    input: &Input,
    size: (u32, u32),
    flavour: Flavour,
    width: u32,
) -> Result<Figures, String> {
    let ours = ours(&input.jpeg, width).map_err(|e| format!("failed: {e}"))?;
    let upright = match flavour {
        Flavour::Orientation(5..=8) => (size.1, size.0),
        _ => size,
    };
    let (w, h) = expected_size(upright, width);
    if ours.dimensions() != (w, h) {
        return Err(format!("{:?}, not {:?}", ours.dimensions(), (w, h)));
    }
    // vips at its own size must be ours but for its frame's rounding.
    let natural = tools.vips(dir, &input.path, &format!("{width}x>"));
    let (vw, vh) = natural.dimensions();
    if vw.abs_diff(w) > 1 || vh.abs_diff(h) > 1 {
        return Err(format!("{:?} where vips made {:?}", (w, h), (vw, vh)));
    }
    let exact = format!("{w}x{h}!");
    let vips = if (vw, vh) == (w, h) {
        natural
    } else {
        tools.vips(dir, &input.path, &exact)
    };
    let lossless = tools.vips(dir, &input.lossless, &exact);
    Ok(Figures {
        lossless_levels: levels(&lossless, &ours),
        size: (w, h),
        vips: ssim::ssim_rgb(&vips, &ours)?,
        lossless: ssim::ssim_rgb(&lossless, &ours)?,
        levels: levels(&vips, &ours),
    })
}

/// Whether a case's figures pass, and if not why.
fn judge(flavour: Flavour, figures: &Figures) -> Result<(), String> {
    let on_full_decode = judged_on_full_decode(flavour);
    if figures.size.0.min(figures.size.1) < TINY {
        let levels = if on_full_decode {
            figures.lossless_levels
        } else {
            figures.levels
        };
        return (levels <= MAX_TINY_LEVELS)
            .then_some(())
            .ok_or_else(|| format!("a channel differs by {levels:.1} levels"));
    }
    let score = if on_full_decode {
        worst(figures.lossless)
    } else {
        worst(figures.vips)
    };
    (score >= MIN_SSIM).then_some(()).ok_or_else(|| {
        format!(
            "SSIM {:.4?} against vips, {:.4?} against its full decode",
            figures.vips, figures.lossless
        )
    })
}

/// A scratch directory of the test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("vips-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs every case, then fails naming each one that failed or differs;
/// prints the tables (flavour × width: the lowest channel SSIM over the
/// sizes whose output is at least `TINY` on each side, against vips and
/// against vips on the full decode; the largest level difference of the
/// tiny ones).
fn differential(sizes: &[(u32, u32)], flavours: &[Flavour], widths: &[u32]) {
    let tools = Tools::find();
    let dir = scratch("differential");
    let mut tables: [BTreeMap<(Flavour, u32), f64>; 3] = Default::default();
    let mut problems = Vec::new();
    for &size in sizes {
        for &flavour in flavours {
            let jpeg = tools.jpeg(&dir, size, flavour);
            let path = dir.join("input.jpg");
            std::fs::write(&path, &jpeg).unwrap();
            let lossless = tools.lossless(&dir, &path);
            let input = Input {
                jpeg,
                path,
                lossless,
            };
            for &width in widths {
                let case = format!("{} {}x{} at {width}", flavour.name(), size.0, size.1);
                let figures = compare(&tools, &dir, &input, size, flavour, width);
                let figures = match figures {
                    Ok(figures) => figures,
                    Err(problem) => {
                        problems.push(format!("{case}: {problem}"));
                        continue;
                    }
                };
                if let Err(problem) = judge(flavour, &figures) {
                    problems.push(format!("{case}: {problem}"));
                }
                let cells = if figures.size.0.min(figures.size.1) < TINY {
                    let levels = if judged_on_full_decode(flavour) {
                        figures.lossless_levels
                    } else {
                        figures.levels
                    };
                    [None, None, Some(levels)]
                } else {
                    [
                        Some(worst(figures.vips)),
                        Some(worst(figures.lossless)),
                        None,
                    ]
                };
                // The SSIM tables keep the lowest, the levels table the largest.
                for (i, (table, cell)) in tables.iter_mut().zip(cells).enumerate() {
                    if let Some(value) = cell {
                        let entry = table.entry((flavour, width)).or_insert(value);
                        *entry = if i == 2 {
                            entry.max(value)
                        } else {
                            entry.min(value)
                        };
                    }
                }
            }
        }
    }
    let titles = [
        "lowest channel SSIM against vipsthumbnail",
        "lowest channel SSIM against vipsthumbnail on a lossless full decode",
        "largest mean level difference from vipsthumbnail (its full decode for 4:2:2, 4:4:0, 4:1:1 and CMYK), outputs under 4 px",
    ];
    for (title, table) in titles.iter().zip(&tables) {
        println!("\n{title}, over {sizes:?}");
        print!("{:<12}", "flavour");
        for width in widths {
            print!(" {width:>7}");
        }
        println!();
        for &flavour in flavours {
            print!("{:<12}", flavour.name());
            for &width in widths {
                match table.get(&(flavour, width)) {
                    Some(value) => print!(" {value:>7.4}"),
                    None => print!(" {:>7}", "-"),
                }
            }
            println!();
        }
    }
    assert!(
        problems.is_empty(),
        "{} cases differ from vips:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn jpegs_of_every_flavour_and_size_thumbnail_like_vips() {
    if std::env::var("MEDIAONCE_VIPS_CASES").as_deref() == Ok("all") {
        differential(ALL_SIZES, ALL_FLAVOURS, ALL_WIDTHS);
    } else {
        differential(SMALL_SIZES, SMALL_FLAVOURS, SMALL_WIDTHS);
    }
}

#[test]
fn an_arithmetic_coded_jpeg_fails_permanently_naming_arithmetic_coding() {
    let tools = Tools::find();
    let dir = scratch("arithmetic");
    let source = tools.source(&dir, (64, 48));
    for args in [&["-arithmetic"][..], &["-arithmetic", "-progressive"]] {
        let jpeg = tools.cjpeg(&source, args);
        let error = ours(&jpeg, 16).expect_err("arithmetic coding is not decoded");
        assert!(error.is_permanent(), "{args:?}: {error:?}");
        assert!(
            error.to_string().contains("arithmetic-coded"),
            "{args:?}: {error}"
        );
    }
}
