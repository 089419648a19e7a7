//! Upload progress on stderr: a bar redrawn in place on a terminal, a line
//! every tenth of the way otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mediaonce::backfill::BackfillProgress;
use mediaonce::upload::Progress;

/// How often the display is redrawn.
const REDRAW: Duration = Duration::from_millis(200);
const BAR_WIDTH: usize = 30;

/// Shows `progress` of `total` bytes until the returned handle is finished.
pub fn show(progress: Arc<Progress>, total: u64) -> Shown {
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let task = tokio::spawn(async move {
        let mut tenths_shown = 0;
        let mut ticks = tokio::time::interval(REDRAW);
        loop {
            ticks.tick().await;
            let sent = progress.sent();
            if terminal {
                eprint!("\r{}", line(sent, total, started.elapsed(), true));
            } else {
                let tenths = (sent * 10).checked_div(total).unwrap_or(10);
                if tenths > tenths_shown {
                    tenths_shown = tenths;
                    eprintln!("{}", line(sent, total, started.elapsed(), false));
                }
            }
            let _ = std::io::stderr().flush();
        }
    });
    Shown {
        task,
        terminal,
        started,
    }
}

pub struct Shown {
    task: tokio::task::JoinHandle<()>,
    terminal: bool,
    started: Instant,
}

impl Shown {
    /// Stops redrawing after a failure (the error says the rest).
    pub fn abandon(self) {
        self.task.abort();
        if self.terminal {
            eprintln!();
        }
    }

    /// Stops redrawing; the last line shows `sent` of `total`.
    pub fn finish(self, sent: u64, total: u64) {
        self.task.abort();
        let last = line(sent, total, self.started.elapsed(), self.terminal);
        if self.terminal {
            eprintln!("\r{last}");
        } else {
            eprintln!("{last}");
        }
    }
}

/// Shows a backfill's counts: redrawn on a terminal (a bar of sent over
/// listed), a line every 1,000 messages otherwise.
pub fn show_counts(counts: Arc<BackfillProgress>, dry_run: bool) -> Counting {
    use std::sync::atomic::Ordering;
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let task = tokio::spawn(async move {
        let mut thousands_shown = 0;
        let mut ticks = tokio::time::interval(REDRAW);
        loop {
            ticks.tick().await;
            let listed = counts.listed.load(Ordering::Relaxed);
            let sent = counts.sent.load(Ordering::Relaxed);
            let line = counts_line(listed, sent, started.elapsed(), terminal, dry_run);
            if terminal {
                eprint!("\r{line}");
            } else if (listed / 1_000) > thousands_shown {
                thousands_shown = listed / 1_000;
                eprintln!("{line}");
            }
            let _ = std::io::stderr().flush();
        }
    });
    Counting { task, terminal }
}

pub struct Counting {
    task: tokio::task::JoinHandle<()>,
    terminal: bool,
}

impl Counting {
    pub fn stop(self) {
        self.task.abort();
        if self.terminal {
            eprintln!();
        }
    }
}

/// A backfill's progress line. Pure.
pub fn counts_line(listed: u64, sent: u64, elapsed: Duration, bar: bool, dry_run: bool) -> String {
    let rate = (if dry_run { listed } else { sent }) as f64 / elapsed.as_secs_f64().max(1e-3);
    let text = format!(
        "{listed} listed, {sent} sent, {rate:.0} {}/s",
        if dry_run { "objects" } else { "messages" }
    );
    if !bar || dry_run {
        return format!("backfill: {text}");
    }
    let filled = if listed == 0 {
        0
    } else {
        ((sent as f64 / listed as f64) * BAR_WIDTH as f64) as usize
    }
    .min(BAR_WIDTH);
    format!(
        "[{}{}] {text}",
        "#".repeat(filled),
        ".".repeat(BAR_WIDTH - filled)
    )
}

/// One progress line: a bar (on a terminal), the share, the bytes and the
/// rate. Pure.
pub fn line(sent: u64, total: u64, elapsed: Duration, bar: bool) -> String {
    let share = if total == 0 {
        1.0
    } else {
        sent as f64 / total as f64
    };
    let rate = sent as f64 / elapsed.as_secs_f64().max(1e-3);
    let text = format!(
        "{:>3}% {} of {} at {}/s",
        (share * 100.0).floor() as u64,
        mib(sent as f64),
        mib(total as f64),
        mib(rate)
    );
    if !bar {
        return format!("uploaded {text}");
    }
    let filled = ((share * BAR_WIDTH as f64) as usize).min(BAR_WIDTH);
    format!(
        "[{}{}] {text}",
        "#".repeat(filled),
        ".".repeat(BAR_WIDTH - filled)
    )
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_share_bytes_and_rate() {
        let half = line(50 << 20, 100 << 20, Duration::from_secs(2), true);
        assert_eq!(
            half,
            "[###############...............]  50% 50.0 MiB of 100.0 MiB at 25.0 MiB/s"
        );
        let plain = line(100 << 20, 100 << 20, Duration::from_secs(4), false);
        assert_eq!(plain, "uploaded 100% 100.0 MiB of 100.0 MiB at 25.0 MiB/s");
        assert!(line(0, 0, Duration::ZERO, false).contains("100%"));
    }

    #[test]
    fn backfill_lines_show_counts_and_rate() {
        assert_eq!(
            counts_line(20, 10, Duration::from_secs(2), true, false),
            "[###############...............] 20 listed, 10 sent, 5 messages/s"
        );
        assert_eq!(
            counts_line(30, 0, Duration::from_secs(3), false, true),
            "backfill: 30 listed, 0 sent, 10 objects/s"
        );
    }
}
