//! What a failed call to a service means to its caller, whatever the
//! service: the kinds callers branch on, beside the operation's own error
//! type and message.

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// The kind of a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The thing asked for does not exist (HTTP 404, `NoSuchKey`,
    /// `ResourceNotFoundException`).
    NotFound,
    /// A condition the call carried failed (HTTP 412, `If-Match`).
    PreconditionFailed,
    /// Worth trying again later: throttling, a 5xx, a timeout, a dropped
    /// connection (what is left after the SDK's own retries).
    Transient,
    /// Anything else: denied, invalid, malformed.
    Other,
}

impl ErrorKind {
    /// The kind of an AWS SDK error, from its HTTP status and error code.
    pub fn of_sdk<E, R>(err: &SdkError<E, R>) -> ErrorKind
    where
        E: ProvideErrorMetadata,
        R: crate::aws::HasStatus,
    {
        match err {
            SdkError::ServiceError(service) => {
                Self::of_response(service.raw().status_code(), service.err().code())
            }
            SdkError::ResponseError(response) => {
                Self::of_response(response.raw().status_code(), None)
            }
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => ErrorKind::Transient,
            _ => ErrorKind::Other,
        }
    }

    /// The kind of an answer with `status` and, if the service named one,
    /// its error `code`. Pure.
    pub fn of_response(status: u16, code: Option<&str>) -> ErrorKind {
        const THROTTLING: [&str; 6] = [
            "ThrottlingException",
            "Throttling",
            "SlowDown",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "TooManyRequestsException",
        ];
        match (status, code) {
            (_, Some(code)) if THROTTLING.contains(&code) => ErrorKind::Transient,
            (_, Some("NoSuchKey" | "NoSuchVersion" | "ResourceNotFoundException")) | (404, _) => {
                ErrorKind::NotFound
            }
            (412, _) => ErrorKind::PreconditionFailed,
            (429 | 500..=599, _) => ErrorKind::Transient,
            _ => ErrorKind::Other,
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(self) -> bool {
        self == ErrorKind::Transient
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_status_and_code() {
        assert_eq!(ErrorKind::of_response(404, None), ErrorKind::NotFound);
        assert_eq!(
            ErrorKind::of_response(404, Some("NoSuchKey")),
            ErrorKind::NotFound
        );
        assert_eq!(
            ErrorKind::of_response(400, Some("ResourceNotFoundException")),
            ErrorKind::NotFound
        );
        assert_eq!(
            ErrorKind::of_response(412, None),
            ErrorKind::PreconditionFailed
        );
        assert_eq!(
            ErrorKind::of_response(503, Some("SlowDown")),
            ErrorKind::Transient
        );
        assert_eq!(
            ErrorKind::of_response(400, Some("ThrottlingException")),
            ErrorKind::Transient
        );
        assert_eq!(ErrorKind::of_response(500, None), ErrorKind::Transient);
        assert_eq!(
            ErrorKind::of_response(403, Some("AccessDenied")),
            ErrorKind::Other
        );
        assert!(ErrorKind::Transient.is_transient());
        assert!(!ErrorKind::Other.is_transient());
    }
}
