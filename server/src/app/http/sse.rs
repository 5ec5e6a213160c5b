//! Server-sent events framing: `event: <type>` equal to the payload's `type`,
//! one `data:` line of JSON, `\n` line endings, `data: [DONE]` last.

use crate::app::runtime::drive::Outgoing;
use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// What a driven response's [`Outgoing`] is on an SSE stream: the event
/// (`event:` is its catalogue name), a keep-alive comment, or `[DONE]`.
pub fn outgoing(o: Outgoing) -> Option<String> {
    match o {
        Outgoing::Event(e) => match e.to_sse() {
            Ok(frame) => Some(frame),
            Err(err) => {
                tracing::error!("an event could not be serialized: {err}");
                None
            }
        },
        Outgoing::KeepAlive => Some(KEEP_ALIVE.to_string()),
        Outgoing::Done => Some(DONE.to_string()),
    }
}

/// A `text/event-stream` response of `frames`, written as they come.
pub fn streamed(frames: impl tokio_stream::Stream<Item = String> + Send + 'static) -> Response {
    response(Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>)))
}

/// An SSE response of a driven response's events, framed by [`outgoing`].
pub fn of_events(rx: mpsc::Receiver<Outgoing>) -> Response {
    streamed(ReceiverStream::new(rx).filter_map(outgoing))
}

/// A `text/event-stream` response with `body`, never cached.
pub fn response(body: Body) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The stream terminator.
pub const DONE: &str = "data: [DONE]\n\n";

/// A comment line that keeps idle connections (long prefills) alive.
pub const KEEP_ALIVE: &str = ": keep-alive\n\n";
