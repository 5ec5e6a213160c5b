//! Server-sent events framing: `event: <type>` equal to the payload's `type`,
//! one `data:` line of JSON, `\n` line endings, `data: [DONE]` last.

use serde_json::Value;

/// One event as SSE bytes (one write per event).
pub fn frame(event: &Value) -> String {
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("message");
    // A line break in the name would end the field early and split the event.
    let kind = if kind.contains(['\n', '\r']) { kind.replace(['\n', '\r'], " ") } else { kind.to_string() };
    format!("event: {kind}\ndata: {event}\n\n")
}

/// The stream terminator.
pub const DONE: &str = "data: [DONE]\n\n";

/// A comment line that keeps idle connections (long prefills) alive.
pub const KEEP_ALIVE: &str = ": keep-alive\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_event_equal_to_type() {
        let e = serde_json::json!({"type": "response.created", "sequence_number": 0});
        assert_eq!(frame(&e), "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n");
    }
}
