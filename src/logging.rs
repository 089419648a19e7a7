//! The log subscriber: Lambda's advanced logging controls, honoured without
//! a regex engine (the bootstrap's size: an `EnvFilter` brings one).
//!
//! - `AWS_LAMBDA_LOG_FORMAT=JSON`: one JSON object per line (the batch's
//!   span, with its `request_id`, in each); otherwise text.
//! - `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`: one level for everything
//!   (`trace`, `debug`, `info`, `warn`, `error`, `off`); default `info`.
//!   Release builds have no `trace` events (Cargo.toml: tracing's
//!   `release_max_level_debug`; the SDK's wire-level detail, 100 KB of
//!   the bootstrap), so `trace` there logs what `debug` does.
//!   Per-module directives (`mediaonce=debug`) are not read: the level of
//!   the last one that names a level is used.

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The level `text` names (the last level word in it), if any.
pub fn level(text: &str) -> Option<LevelFilter> {
    text.split([',', '='])
        .rev()
        .find_map(|word| word.trim().parse::<LevelFilter>().ok())
}

/// Installs the subscriber writing to `writer` (stdout in Lambda). A second
/// call does nothing.
pub fn init<W>(writer: W)
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|text| level(&text))
        .unwrap_or(LevelFilter::INFO);
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT")
        .is_ok_and(|format| format.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_max_level(level)
        .with_writer(writer);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_is_read_from_lambdas_and_rusts_forms() {
        assert_eq!(level("DEBUG"), Some(LevelFilter::DEBUG));
        assert_eq!(level("warn"), Some(LevelFilter::WARN));
        assert_eq!(level("mediaonce=trace"), Some(LevelFilter::TRACE));
        assert_eq!(level("info,aws_smithy=error"), Some(LevelFilter::ERROR));
        assert_eq!(level("loud"), None);
    }
}
