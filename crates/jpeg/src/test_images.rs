//! Test JPEGs for the re-coders: busy pictures written by jpeg-encoder
//! (the step's encoder), their pixels, and their segments.

use jpeg_encoder::{ColorType, SamplingFactor};

/// A busy picture: gradients, a checker and grain, so every table, and
/// every band of every progressive scan, has symbols, and successive
/// approximation has bits to refine. `channels` 1 (grey) or 3.
pub fn busy_picture(width: u16, height: u16, channels: usize) -> Vec<u8> {
    let mut grain = 0x2545_F491_u32;
    (0..height as u32)
        .flat_map(|y| (0..width as u32).map(move |x| (x, y)))
        .flat_map(|(x, y)| {
            grain ^= grain << 13;
            grain ^= grain >> 17;
            grain ^= grain << 5;
            let checker = if (x / 3 + y / 5) % 2 == 0 { 60 } else { 0 };
            let noise = grain % 24;
            [
                ((x * 7 + noise) % 256) as u8,
                ((y * 3 + checker + noise) % 256) as u8,
                ((x * y) % 251) as u8,
            ]
            .into_iter()
            .take(channels)
            .collect::<Vec<_>>()
        })
        .collect()
}

/// The busy picture as jpeg-encoder writes it: baseline, one interleaved
/// scan, the example Huffman tables.
pub fn busy_jpeg(
    width: u16,
    height: u16,
    quality: u8,
    colour: ColorType,
    sampling: SamplingFactor,
) -> Vec<u8> {
    let channels = if colour == ColorType::Luma { 1 } else { 3 };
    let mut out = Vec::new();
    let mut encoder = jpeg_encoder::Encoder::new(&mut out, quality);
    encoder.set_sampling_factor(sampling);
    encoder
        .encode(
            &busy_picture(width, height, channels),
            width,
            height,
            colour,
        )
        .unwrap();
    out
}

/// The busy colour picture as jpeg-encoder writes it progressive: one
/// scan per component and band, the example tables.
pub fn busy_jpeg_progressive(width: u16, height: u16, quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = jpeg_encoder::Encoder::new(&mut out, quality);
    encoder.set_sampling_factor(SamplingFactor::R_4_2_0);
    encoder.set_progressive(true);
    encoder
        .encode(
            &busy_picture(width, height, 3),
            width,
            height,
            ColorType::Rgb,
        )
        .unwrap();
    out
}

/// The pixels jpeg-decoder decodes.
pub fn pixels(jpeg: &[u8]) -> Vec<u8> {
    jpeg_decoder::Decoder::new(std::io::Cursor::new(jpeg))
        .decode()
        .unwrap()
}

/// A file's segments up to EOI: each marker, its body, and (after a scan
/// header) the coded data up to the next marker.
pub fn segments(jpeg: &[u8]) -> Vec<(u8, &[u8], &[u8])> {
    let mut segments = Vec::new();
    let mut at = 2;
    while jpeg[at + 1] != 0xD9 {
        let marker = jpeg[at + 1];
        let len = u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize;
        let body = &jpeg[at + 4..at + 2 + len];
        at += 2 + len;
        let data = at;
        if marker == 0xDA {
            // Stuffing keeps 0xFF 0x00 out of markers.
            while !(jpeg[at] == 0xFF && jpeg[at + 1] != 0) {
                at += 1;
            }
        }
        segments.push((marker, body, &jpeg[data..at]));
    }
    segments
}
