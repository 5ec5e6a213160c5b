//! JSON text of response bodies.

/// `value` as compact JSON text (a response body).
pub fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!("a response body could not be serialized: {e}");
        String::from("{}")
    })
}
