//! The thumbnail step's decoding and resizing on arbitrary files: the
//! declared size checked, then a JPEG at a reduced scale (`mediaonce_jpeg::scaled`,
//! which hands what it does not read to jpeg-decoder) or any image in
//! full, and each planned crop resized from what was decoded (the
//! shrink-on-load geometry: a crop outside the decoded frame fails the
//! resize). It must never panic, always end, and never fail a resize.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mediaonce::steps::thumbnail::{decode_for, render, Format, ThumbnailParams};

fuzz_target!(|data: &[u8]| {
    // Small outputs, so that a JPEG shrinks on load: 1/8, 1/4 or 1/2 by
    // its size, whichever the last byte picks.
    let width = 1 + data.last().copied().unwrap_or(0) as u64 % 48;
    let params = serde_json::json!({ "widths": [width] });
    let params = ThumbnailParams::parse(params.as_object().expect("an object")).expect("params");
    // Four megapixels: room for every scale, small enough to stay quick.
    if let Ok((image, plans)) = decode_for(data, 4_000_000, &params) {
        for plan in &plans {
            if let Err(e) = render(&image, plan, Format::Png) {
                panic!("{}x{} decoded, {plan:?}: {e}", image.width(), image.height());
            }
        }
    }
});
