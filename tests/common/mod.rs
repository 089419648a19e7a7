//! Shared by the integration tests: a real pipeline on the emulators for
//! each test (a bucket whose notifications go to a queue, a claim table,
//! and the handler's `App`), SQS helpers, the tests' own steps, counting
//! clients, and media made by ffmpeg. Every name is unique, so tests run in
//! parallel without sharing state.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use mediaonce::lease::Clock;

pub mod counting;
pub mod events;
pub mod heif;
pub mod hls;
pub mod media;
pub mod pipeline;
pub mod sfn;
pub mod sqs;
pub mod steps;
pub mod ts;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use counting::{CallCounter, ReadCounter};
#[allow(unused_imports)]
pub use pipeline::{claim_request, create_table, fresh_ledger, Options, Pipeline};
#[allow(unused_imports)]
pub use sqs::{
    failed_ids, handle_before, handle_in, handle_with, lambda_message, queue_arn, receive_from,
};
#[allow(unused_imports)]
pub use steps::{
    quiet_injected_panics, CountedProbe, GatedProbe, HangingStep, PanickingStep, INJECTED_PANIC,
};

/// The wall clock in epoch milliseconds, as the workers' `SystemClock` reads it.
pub fn now_ms() -> u64 {
    use mediaonce::lease::Clock;
    mediaonce::lease::SystemClock.now_ms()
}

/// The system clock, `.0` milliseconds off: another worker's clock, or the
/// same worker later (a lease's worth after a crash).
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock(pub i64);

impl Clock for SkewedClock {
    fn now_ms(&self) -> u64 {
        (now_ms() as i64 + self.0) as u64
    }
}

/// A name no other test uses, valid for buckets, queues and tables.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}
