//! The one log event of each job outcome.

use super::JobReport;
use crate::store::ObjectRef;

/// One log event per job outcome: a warning when the message comes back.
pub(super) fn log_job(report: &JobReport, message_id: &str, object: &ObjectRef) {
    macro_rules! job_event {
        ($level:expr) => {
            tracing::event!(
                $level,
                job_key = report.job_key.as_str(),
                step = report.step.as_str(),
                outcome = report.outcome.as_str(),
                attempt = report.attempt,
                duration_ms = report.duration_ms,
                message_id,
                object = %object,
                reason = report.reason.as_deref(),
                input_hash_source = report.input_hash_source.map(|s| s.as_str()),
                "job"
            )
        };
    }
    if report.outcome.must_retry() {
        job_event!(tracing::Level::WARN)
    } else {
        job_event!(tracing::Level::INFO)
    }
}
