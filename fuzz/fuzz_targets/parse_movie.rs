//! The ISO BMFF reader on arbitrary files: finding `moov` and parsing it
//! must never panic, never read outside the file, and always end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mediaonce::bmff::{read_movie, RangeSource};

/// A file whose reads are checked against its size.
struct Checked<'a>(&'a [u8]);

#[async_trait::async_trait]
impl RangeSource for Checked<'_> {
    async fn read_range(&self, range: std::ops::Range<u64>) -> Result<Vec<u8>, String> {
        assert!(range.start <= range.end && range.end <= self.0.len() as u64, "{range:?}");
        self.0.read_range(range).await
    }
}

fuzz_target!(|data: &[u8]| {
    // Half the runs with the start at hand, as probe has it.
    let start = &data[..data.len().min(if data.len() % 2 == 0 { 4096 } else { 0 })];
    let _ = futures::executor::block_on(read_movie(&Checked(data), data.len() as u64, start));
});
