//! The access log line of a streamed response is written when its stream
//! ends, not when its headers go out: with the stream's real duration, the
//! bytes it sent, and whether it ran to its end or the client left.

use axum::body::{Body, Bytes, HttpBody};
use axum::http::HeaderMap;
use axum::response::Response;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// What the access line says about a request.
#[derive(Debug, Clone)]
pub struct AccessLine {
    /// `x-request-id`.
    pub request_id: String,
    /// HTTP method.
    pub method: String,
    /// The matched route.
    pub route: String,
    /// HTTP status.
    pub status: u16,
    /// When the request arrived.
    pub started: Instant,
}

impl AccessLine {
    fn write(&self, stream: Option<(&str, u64)>) {
        let ms = self.started.elapsed().as_millis() as u64;
        let (request_id, method, route, status) = (&self.request_id, &self.method, &self.route, self.status);
        match stream {
            None => tracing::info!(request_id, method, route, status, ms, "request"),
            Some((end, bytes)) => tracing::info!(request_id, method, route, status, ms, stream = end, bytes, "request"),
        }
    }
}

/// Writes `line` now, or, for an event stream, when the stream ends.
pub fn log(line: AccessLine, response: Response) -> Response {
    if !is_event_stream(response.headers()) {
        line.write(None);
        return response;
    }
    response.map(|body| Body::new(LoggedBody { inner: body, line: Some(line), bytes: 0, finished: false }))
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A streamed body that writes its access line when it is done.
struct LoggedBody {
    inner: Body,
    line: Option<AccessLine>,
    bytes: u64,
    finished: bool,
}

impl HttpBody for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            Poll::Ready(None) => self.finished = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write(Some((if self.finished { "complete" } else { "client_closed" }, self.bytes)));
        }
    }
}
