//! The SQS body parser on arbitrary input: it must never panic, and what it
//! accepts must hold what the handler relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mediaonce::event::{decode_key, parse_body, Notification};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = decode_key(text);
    if let Ok(Notification::Records(records)) = parse_body(text) {
        assert!(!records.is_empty());
        for record in records {
            assert!(!record.bucket.is_empty());
            assert!(!record.key.is_empty());
            assert_ne!(record.version_id.as_deref(), Some("null"));
            let _ = record.kind();
        }
    }
});
