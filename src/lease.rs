//! How long a claim lasts. Pure: no I/O, no clock reads.
//!
//! A job cannot outlive the process that runs it. Inside Lambda that is the
//! invocation: the lease ends at its deadline plus a margin (for clock skew
//! between this worker and the next one). Outside Lambda there is no
//! deadline, so the lease is a configured duration.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Default margin added to a Lambda invocation's deadline.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(10);
/// Default lease outside Lambda (the CLI).
pub const DEFAULT_FIXED_LEASE: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Added to an invocation deadline.
    pub deadline_margin: Duration,
    /// Used when there is no invocation deadline.
    pub fixed: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            deadline_margin: DEFAULT_LEASE_MARGIN,
            fixed: DEFAULT_FIXED_LEASE,
        }
    }
}

impl LeasePolicy {
    /// The epoch-millisecond time a claim made at `now_ms` expires.
    /// `deadline_ms` is the Lambda invocation's deadline, when there is one.
    pub fn lease_until_ms(&self, now_ms: u64, deadline_ms: Option<u64>) -> u64 {
        match deadline_ms {
            Some(deadline) => deadline.saturating_add(millis(self.deadline_margin)),
            None => now_ms.saturating_add(millis(self.fixed)),
        }
    }
}

/// Whether a lease ending at `lease_until_ms` is still live at `now_ms`.
/// A remaining time of zero or less is expired.
pub fn is_live(lease_until_ms: u64, now_ms: u64) -> bool {
    lease_until_ms > now_ms
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where a worker reads the time. Leases compare this worker's clock with
/// times other workers' clocks wrote (see DESIGN.md on clock skew).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Epoch milliseconds.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_now_ms()
    }
}

/// The wall clock in epoch milliseconds. Private: everything else reads the
/// time through a [`Clock`], so that tests and the simulator can set it.
fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambda_lease_ends_at_deadline_plus_margin() {
        let policy = LeasePolicy::default();
        assert_eq!(policy.lease_until_ms(1_000, Some(60_000)), 70_000);
    }

    #[test]
    fn cli_lease_is_fixed() {
        let policy = LeasePolicy {
            deadline_margin: Duration::from_secs(1),
            fixed: Duration::from_secs(900),
        };
        assert_eq!(policy.lease_until_ms(1_000, None), 901_000);
    }

    #[test]
    fn zero_remaining_is_expired() {
        assert!(is_live(1_001, 1_000));
        assert!(!is_live(1_000, 1_000));
        assert!(!is_live(999, 1_000));
    }
}
