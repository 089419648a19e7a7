//! A GET's body that counts the bytes it yields as the reader takes them
//! (so a read stopped early counts only what was read).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// `stream`, adding each chunk's length to `counter` as it is read.
pub(super) fn count_reads(stream: ByteStream, counter: Arc<AtomicU64>) -> ByteStream {
    ByteStream::new(SdkBody::from_body_1_x(Counting {
        inner: stream.into_inner(),
        counter,
    }))
}

struct Counting {
    inner: SdkBody,
    counter: Arc<AtomicU64>,
}

impl Body for Counting {
    type Data = Bytes;
    type Error = aws_smithy_types::body::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.counter.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        Body::size_hint(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_what_is_read() {
        let counter = Arc::new(AtomicU64::new(0));
        let stream = count_reads(ByteStream::from(vec![7u8; 3000]), counter.clone());
        assert_eq!(counter.load(Ordering::Relaxed), 0);
        let bytes = stream.collect().await.unwrap().into_bytes();
        assert_eq!(bytes.len(), 3000);
        assert_eq!(counter.load(Ordering::Relaxed), 3000);
    }
}
