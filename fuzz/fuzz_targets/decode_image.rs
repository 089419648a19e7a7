//! The thumbnail step's decoding on arbitrary files: the declared size
//! checked, then a JPEG at a reduced scale (`jpeg::scaled`, which hands
//! what it does not read to jpeg-decoder) or any image in full. It must
//! never panic, and always end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mediaonce::steps::thumbnail::{decode_for, ThumbnailParams};

fuzz_target!(|data: &[u8]| {
    // Small outputs, so that a JPEG shrinks on load: 1/8, 1/4 or 1/2 by
    // its size, whichever the last byte picks.
    let width = 1 + data.last().copied().unwrap_or(0) as u64 % 48;
    let params = serde_json::json!({ "widths": [width] });
    let params = ThumbnailParams::parse(params.as_object().expect("an object")).expect("params");
    // Four megapixels: room for every scale, small enough to stay quick.
    let _ = decode_for(data, 4_000_000, &params);
});
