//! Colour: an image tagged with an ICC profile (JPEG APP2, PNG iCCP, WebP
//! ICCP, TIFF) is converted to sRGB before it is resized. Outputs carry no
//! profile, and a browser shows an untagged image as sRGB, so without this
//! an iPhone photo in Display P3 would come out desaturated.
//!
//! moxcms does the transform: pure Rust (it cross-compiles for arm64 Lambda
//! with nothing else to build), already under `image`, and it reads the
//! matrix/shaper and LUT profiles cameras and phones write. lcms2, the C
//! reference, would bring a C library to build for both architectures for
//! no gain on these profiles.
//!
//! Relative colorimetric intent (moxcms' default): colours inside sRGB
//! keep their appearance, colours outside (a P3 red) are clipped to the
//! nearest sRGB value, as browsers do for matrix/shaper profiles.

use image::{DynamicImage, ImageBuffer, LumaA, Rgb, Rgba};
use moxcms::{ColorProfile, DataColorSpace, Layout, TransformExecutor, TransformOptions};

/// What happened to an image's profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversion {
    /// No profile: the pixels are taken as sRGB.
    Untagged,
    /// Converted from the profile to sRGB.
    Converted,
    /// A profile that cannot be applied (unreadable, or for other
    /// channels than the image has): the pixels are taken as sRGB, as
    /// browsers do with a broken profile. Says why, for the job's log.
    Ignored(String),
}

/// `image` in sRGB, from the profile `icc` it was tagged with (if any).
/// Never fails: a profile that cannot be applied is ignored and said so.
pub fn to_srgb(image: DynamicImage, icc: Option<&[u8]>) -> (DynamicImage, Conversion) {
    let Some(icc) = icc else {
        return (image, Conversion::Untagged);
    };
    let profile = match ColorProfile::new_from_slice(icc) {
        Ok(profile) => profile,
        Err(e) => {
            return (
                image,
                Conversion::Ignored(format!("unreadable ICC profile: {e}")),
            )
        }
    };
    match convert(&image, &profile) {
        Ok(converted) => (converted, Conversion::Converted),
        Err(why) => (image, Conversion::Ignored(why)),
    }
}

fn convert(image: &DynamicImage, profile: &ColorProfile) -> Result<DynamicImage, String> {
    let srgb = ColorProfile::new_srgb();
    let options = TransformOptions::default();
    let space = profile.color_space;
    let wrong = || format!("a {space:?} ICC profile on a {:?} image", image.color());
    let (w, h) = (image.width(), image.height());
    let failed = |e: moxcms::CmsError| format!("colour transform failed: {e}");
    match space {
        DataColorSpace::Rgb => {}
        DataColorSpace::Gray => {
            // Grey with its own tone curve: to sRGB's curve, as RGB.
            let grey = match image {
                DynamicImage::ImageLuma8(_) | DynamicImage::ImageLumaA8(_) => image.to_luma8(),
                _ => return Err(wrong()),
            };
            let transform = profile
                .create_transform_8bit(Layout::Gray, &srgb, Layout::Rgb, options)
                .map_err(failed)?;
            let out = run(&*transform, grey.as_raw(), 3).map_err(failed)?;
            let rgb = ImageBuffer::<Rgb<u8>, _>::from_raw(w, h, out).ok_or_else(wrong)?;
            return Ok(if image.color().has_alpha() {
                with_alpha(rgb, &image.to_luma_alpha8())
            } else {
                DynamicImage::ImageRgb8(rgb)
            });
        }
        // CMYK pixels come to `cmyk_to_srgb`, never here: a CMYK profile
        // on an RGB or grey image does not fit it.
        _ => return Err(wrong()),
    }
    // 8-bit RGB(A) at 8 bits; 16-bit (and float) at 16 bits, so a smooth
    // gradient is not quantised before it is resized.
    let (layout, deep) = match image {
        DynamicImage::ImageRgb8(_) => (Layout::Rgb, false),
        DynamicImage::ImageRgba8(_) => (Layout::Rgba, false),
        DynamicImage::ImageRgb16(_) | DynamicImage::ImageRgb32F(_) => (Layout::Rgb, true),
        DynamicImage::ImageRgba16(_) | DynamicImage::ImageRgba32F(_) => (Layout::Rgba, true),
        _ => return Err(wrong()),
    };
    let alpha = layout == Layout::Rgba;
    if deep {
        let transform = profile
            .create_transform_16bit(layout, &srgb, layout, options)
            .map_err(failed)?;
        let source = if alpha {
            image.to_rgba16().into_raw()
        } else {
            image.to_rgb16().into_raw()
        };
        let out = run(&*transform, &source, 1).map_err(failed)?;
        return if alpha {
            ImageBuffer::from_raw(w, h, out).map(DynamicImage::ImageRgba16)
        } else {
            ImageBuffer::from_raw(w, h, out).map(DynamicImage::ImageRgb16)
        }
        .ok_or_else(wrong);
    }
    let transform = profile
        .create_transform_8bit(layout, &srgb, layout, options)
        .map_err(failed)?;
    let out = run(&*transform, image.as_bytes(), 1).map_err(failed)?;
    if alpha {
        ImageBuffer::from_raw(w, h, out).map(DynamicImage::ImageRgba8)
    } else {
        ImageBuffer::from_raw(w, h, out).map(DynamicImage::ImageRgb8)
    }
    .ok_or_else(wrong)
}

/// `image` in sRGB from ITU-T H.273 code points (a HEIF `colr` nclx box):
/// sRGB's and BT.709's primaries with their curves are taken as they are;
/// others (Display P3, BT.2020) are converted through the profile moxcms
/// makes from the code points.
pub fn cicp_to_srgb(
    image: DynamicImage,
    primaries: u16,
    transfer: u16,
) -> (DynamicImage, Conversion) {
    // 1: BT.709 (sRGB's primaries), 2: unspecified. Curves: 1 and 6 (BT.709,
    // BT.601), 13 (sRGB), 2 (unspecified); encoded values are resized as
    // they are, as for any sRGB image.
    if matches!(primaries, 1 | 2) && matches!(transfer, 1 | 2 | 6 | 13) {
        return (image, Conversion::Untagged);
    }
    let code = |v: u16| u8::try_from(v).map_err(|_| format!("colour code point {v}"));
    let cicp = (|| -> Result<moxcms::CicpProfile, String> {
        Ok(moxcms::CicpProfile {
            color_primaries: moxcms::CicpColorPrimaries::try_from(code(primaries)?)
                .map_err(|e| format!("colour primaries {primaries}: {e:?}"))?,
            transfer_characteristics: moxcms::TransferCharacteristics::try_from(code(transfer)?)
                .map_err(|e| format!("transfer characteristics {transfer}: {e:?}"))?,
            // The pixels are RGB already; the matrix played its part in
            // the decoder.
            matrix_coefficients: moxcms::MatrixCoefficients::Identity,
            full_range: true,
        })
    })();
    let profile = match cicp {
        Ok(cicp) => ColorProfile::new_from_cicp(cicp),
        Err(why) => return (image, Conversion::Ignored(why)),
    };
    match convert(&image, &profile) {
        Ok(converted) => (converted, Conversion::Converted),
        Err(why) => (image, Conversion::Ignored(why)),
    }
}

/// CMYK pixels (ink amounts, 0 = none, four bytes a pixel, as jpeg-decoder
/// gives them for Adobe's inverted CMYK and YCCK alike) in sRGB: through
/// the image's CMYK profile when it has one that applies, else naively,
/// each ink taking its share of the light (R = (1 − C)(1 − K)), as
/// ImageMagick converts CMYK without a profile. `None` if `inks` is not
/// `width` × `height` pixels.
pub fn cmyk_to_srgb(
    inks: &[u8],
    width: u32,
    height: u32,
    icc: Option<&[u8]>,
) -> Option<(image::RgbImage, Conversion)> {
    let managed = icc.map(|icc| {
        let profile = ColorProfile::new_from_slice(icc)
            .map_err(|e| format!("unreadable ICC profile: {e}"))?;
        if profile.color_space != DataColorSpace::Cmyk {
            return Err(format!(
                "a {:?} ICC profile on a CMYK image",
                profile.color_space
            ));
        }
        let failed = |e: moxcms::CmsError| format!("colour transform failed: {e}");
        // moxcms reads 8-bit CMYK in its four-channel (Rgba) layout.
        let transform = profile
            .create_transform_8bit(
                Layout::Rgba,
                &ColorProfile::new_srgb(),
                Layout::Rgb,
                TransformOptions::default(),
            )
            .map_err(failed)?;
        let mut rgb = vec![0u8; inks.len() / 4 * 3];
        transform.transform(inks, &mut rgb).map_err(failed)?;
        Ok(rgb)
    });
    let (rgb, conversion) = match managed {
        Some(Ok(rgb)) => (rgb, Conversion::Converted),
        Some(Err(why)) => (naive_cmyk(inks), Conversion::Ignored(why)),
        None => (naive_cmyk(inks), Conversion::Untagged),
    };
    let image = image::RgbImage::from_raw(width, height, rgb)?;
    Some((image, conversion))
}

fn naive_cmyk(inks: &[u8]) -> Vec<u8> {
    let light = |ink: u8, black: u8| {
        let (ink, black) = (255 - ink as u32, 255 - black as u32);
        ((ink * black + 127) / 255) as u8
    };
    inks.chunks_exact(4)
        .flat_map(|p| [light(p[0], p[3]), light(p[1], p[3]), light(p[2], p[3])])
        .collect()
}

/// `source` through `transform`, into a new buffer `growth` times its
/// length (3 for grey to RGB).
fn run<T: Copy + Default>(
    transform: &(dyn TransformExecutor<T> + Send + Sync),
    source: &[T],
    growth: usize,
) -> Result<Vec<T>, moxcms::CmsError> {
    let mut out = vec![T::default(); source.len() * growth];
    transform.transform(source, &mut out)?;
    Ok(out)
}

/// RGB pixels with the alpha of a grey-and-alpha image of the same size.
fn with_alpha(
    rgb: ImageBuffer<Rgb<u8>, Vec<u8>>,
    alpha: &ImageBuffer<LumaA<u8>, Vec<u8>>,
) -> DynamicImage {
    let rgba = ImageBuffer::<Rgba<u8>, _>::from_fn(rgb.width(), rgb.height(), |x, y| {
        let Rgb([r, g, b]) = *rgb.get_pixel(x, y);
        let LumaA([_, a]) = *alpha.get_pixel(x, y);
        Rgba([r, g, b, a])
    });
    DynamicImage::ImageRgba8(rgba)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Luma;

    /// sRGB's transfer function, both ways.
    fn to_linear(v: f64) -> f64 {
        if v <= 0.04045 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    }
    fn from_linear(v: f64) -> f64 {
        let v = v.clamp(0.0, 1.0);
        if v <= 0.0031308 {
            v * 12.92
        } else {
            1.055 * v.powf(1.0 / 2.4) - 0.055
        }
    }

    /// Display P3 to sRGB by the primaries' matrices (both D65; P3 uses
    /// sRGB's curve): the reference the transform is checked against,
    /// computed without moxcms. Out-of-gamut values clip.
    fn p3_to_srgb(p3: [u8; 3]) -> [f64; 3] {
        const M: [[f64; 3]; 3] = [
            [1.224_940, -0.224_940, 0.0],
            [-0.042_057, 1.042_057, 0.0],
            [-0.019_638, -0.078_636, 1.098_274],
        ];
        let lin = p3.map(|c| to_linear(c as f64 / 255.0));
        [0, 1, 2].map(|row| {
            let l: f64 = (0..3).map(|i| M[row][i] * lin[i]).sum();
            from_linear(l) * 255.0
        })
    }

    fn p3_image(pixels: &[[u8; 3]]) -> DynamicImage {
        let mut image = image::RgbImage::new(pixels.len() as u32, 1);
        for (x, p) in pixels.iter().enumerate() {
            image.put_pixel(x as u32, 0, Rgb(*p));
        }
        DynamicImage::ImageRgb8(image)
    }

    #[test]
    fn display_p3_becomes_the_srgb_a_colour_managed_converter_gives() {
        let icc = ColorProfile::new_display_p3().encode().unwrap();
        // P3's red (outside sRGB), a skin tone and a deep blue (inside).
        let pixels = [[255, 0, 0], [200, 120, 60], [40, 60, 160]];
        let (out, conversion) = to_srgb(p3_image(&pixels), Some(&icc));
        assert_eq!(conversion, Conversion::Converted);
        let out = out.to_rgb8();
        for (x, p3) in pixels.iter().enumerate() {
            let got = out.get_pixel(x as u32, 0).0;
            let want = p3_to_srgb(*p3);
            for c in 0..3 {
                assert!(
                    (got[c] as f64 - want[c]).abs() <= 2.0,
                    "P3 {p3:?}: got {got:?}, want {want:?}"
                );
            }
        }
        // Not what ignoring the profile would give.
        assert_ne!(out.get_pixel(1, 0).0, [200, 120, 60]);
    }

    #[test]
    fn untagged_stays_and_a_broken_or_mismatched_profile_is_ignored() {
        let image = p3_image(&[[10, 20, 30]]);
        assert_eq!(to_srgb(image.clone(), None).1, Conversion::Untagged);
        let (same, why) = to_srgb(image.clone(), Some(b"not a profile"));
        assert!(
            matches!(why, Conversion::Ignored(ref w) if w.contains("unreadable")),
            "{why:?}"
        );
        assert_eq!(same, image);
        let grey = DynamicImage::ImageLuma8(image::GrayImage::from_pixel(1, 1, Luma([9])));
        let icc = ColorProfile::new_display_p3().encode().unwrap();
        let (_, why) = to_srgb(grey, Some(&icc));
        assert!(
            matches!(why, Conversion::Ignored(ref w) if w.contains("Rgb")),
            "{why:?}"
        );
    }

    #[test]
    fn sixteen_bit_images_are_transformed_at_sixteen_bits() {
        // A gradient finer than 8 bits: 256 steps of 1/65535 each.
        let icc = ColorProfile::new_display_p3().encode().unwrap();
        let gradient = image::ImageBuffer::<Rgb<u16>, _>::from_fn(256, 1, |x, _| {
            let v = 30_000 + x as u16;
            Rgb([v, v, v])
        });
        let (out, conversion) = to_srgb(DynamicImage::ImageRgb16(gradient), Some(&icc));
        assert_eq!(conversion, Conversion::Converted);
        let DynamicImage::ImageRgb16(out) = out else {
            panic!("stays 16-bit")
        };
        // Grey stays grey (both spaces share D65 and the curve), and the
        // 256 input levels keep more than the one or two an 8-bit pass
        // would leave.
        let levels: std::collections::BTreeSet<u16> = out.pixels().map(|p| p.0[1]).collect();
        assert!(levels.len() > 64, "{} distinct levels", levels.len());
    }
}
