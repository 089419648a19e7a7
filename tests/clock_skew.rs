//! Clock skew, as DESIGN.md says: a lease ends at the holder's invocation
//! deadline plus the margin. A worker whose clock is ahead by less than the
//! margin never takes a job over before the holder's deadline; one ahead by
//! more may, and then the holder's finish is rejected and one result stands.
//!
//! Each worker's clock is the `now_ms` of its claims, so skew is exact here.

mod common;

use common::{claim_request, fresh_ledger};
use mediaonce::lease::LeasePolicy;
use mediaonce::ledger::{ClaimOutcome, ClaimRequest, FinishError, JobStatus, Ledger};

const T0: u64 = 1_800_000_000_000;
const INVOCATION: u64 = 60_000;

/// A claim by a worker whose clock reads `clock_ms`, in an invocation ending
/// at `deadline_ms` on that clock.
fn claim(key: &str, owner: &str, clock_ms: u64, deadline_ms: u64) -> ClaimRequest {
    let lease_until_ms = LeasePolicy::default().lease_until_ms(clock_ms, Some(deadline_ms));
    claim_request(key, owner, clock_ms, lease_until_ms)
}

/// Worker A claims at T0 with a correct clock; its invocation ends at T0 + 60 s.
async fn holder(ledger: &Ledger, key: &str) -> mediaonce::ledger::Claim {
    match ledger
        .claim(&claim(key, "A", T0, T0 + INVOCATION))
        .await
        .unwrap()
    {
        ClaimOutcome::Run(claim) => claim,
        other => panic!("first claim runs: {other:?}"),
    }
}

#[tokio::test]
async fn a_clock_ahead_by_less_than_the_margin_waits_for_the_holder() {
    let ledger = fresh_ledger().await;
    let key = "s".repeat(64);
    let a = holder(&ledger, &key).await;
    let margin = LeasePolicy::default().deadline_margin.as_millis() as u64;
    // At the holder's very deadline, B's clock reads 1 ms less than the margin ahead.
    let real = T0 + INVOCATION;
    let b_clock = real + margin - 1;
    let outcome = ledger
        .claim(&claim(&key, "B", b_clock, b_clock + INVOCATION))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Busy(_)), "{outcome:?}");
    ledger.finish_done(&a, real).await.unwrap();
}

#[tokio::test]
async fn a_clock_ahead_by_more_than_the_margin_takes_over_early_and_the_holders_finish_is_rejected()
{
    let ledger = fresh_ledger().await;
    let key = "t".repeat(64);
    let a = holder(&ledger, &key).await;
    let margin = LeasePolicy::default().deadline_margin.as_millis() as u64;
    // Halfway through A's invocation, B's clock is 45 s ahead: past A's lease.
    let real = T0 + INVOCATION / 2;
    let b_clock = real + INVOCATION / 2 + margin + 15_000;
    let b = match ledger
        .claim(&claim(&key, "B", b_clock, b_clock + INVOCATION))
        .await
        .unwrap()
    {
        ClaimOutcome::Run(b) => b,
        other => panic!("B takes over while A still runs: {other:?}"),
    };
    assert_eq!(b.attempt, 2);
    // The step ran twice. A's finish, done or failed, is rejected: B owns the job.
    assert!(matches!(
        ledger.finish_done(&a, real + 1).await,
        Err(FinishError::LostLease(_))
    ));
    assert!(matches!(
        ledger.finish_failed(&a, "late", real + 1).await,
        Err(FinishError::LostLease(_))
    ));
    ledger.finish_done(&b, b_clock + 1).await.unwrap();
    let row = ledger.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.attempts, row.owner.as_str()),
        (JobStatus::Done, 2, "B")
    );
}

#[tokio::test]
async fn a_clock_behind_only_delays_a_takeover() {
    let ledger = fresh_ledger().await;
    let key = "u".repeat(64);
    holder(&ledger, &key).await;
    // A died. Real time is past its lease, but C's clock is 20 s behind.
    let lease_end = T0 + INVOCATION + LeasePolicy::default().deadline_margin.as_millis() as u64;
    let real = lease_end + 5_000;
    let c_clock = real - 20_000;
    let outcome = ledger
        .claim(&claim(&key, "C", c_clock, c_clock + INVOCATION))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Busy(_)), "{outcome:?}");
    // Once C's clock passes the lease, it takes over.
    let later = lease_end + 1;
    let outcome = ledger
        .claim(&claim(&key, "C", later, later + INVOCATION))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Run(_)), "{outcome:?}");
}
