//! Mapping between LMSP 1.0 shapes and the Open Responses engine path:
//! request bodies in, response objects and stream events out.

use super::problem::Problem;
use crate::protocol::error::ApiError;
use serde_json::{json, Map, Value};

/// Fields LMSP 1.0 defines; anything else (other than `extensions`) is ignored.
const FIELDS: &[&str] =
    &["model", "input", "stream", "max_output_tokens", "temperature", "tools", "tool_choice", "store", "previous_response_id"];

/// An LMSP request body as an Open Responses create body (LMSP's `store`
/// defaults to false). Needs-a-capability-we-lack → 400 `unsupported_capability`.
pub fn request_to_engine(body: &Value) -> Result<Value, Problem> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::invalid("", "The request body must be a JSON object.").into());
    };
    for required in ["model", "input"] {
        if obj.get(required).is_none_or(Value::is_null) {
            return Err(ApiError::invalid(required, format!("Missing required parameter: '{required}'."))
                .with_code("missing_required_parameter")
                .into());
        }
    }
    let mut out = Map::new();
    for key in FIELDS {
        if let Some(v) = obj.get(*key) {
            out.insert((*key).to_string(), v.clone());
        }
    }
    if let Some(format) = structured_output(obj.get("response_format"))? {
        out.insert("text".into(), json!({"format": format}));
    }
    out.entry("store").or_insert(json!(false));
    // Spindle's one extension: generate to the token limit (load testing).
    if let Some(ignore_eos) = obj.get("extensions").and_then(|e| e.get("ignore_eos")).and_then(Value::as_bool) {
        out.insert("ignore_eos".into(), json!(ignore_eos));
    }
    Ok(Value::Object(out))
}

/// LMSP's `response_format` as an Open Responses `text.format` (`None` for
/// text). JSON Schemas are enforced strictly (the structured_output capability).
fn structured_output(format: Option<&Value>) -> Result<Option<Value>, Problem> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format["type"].as_str() {
        None | Some("text") => Ok(None),
        Some("json_schema") => {
            let spec = &format["json_schema"];
            if !spec["schema"].is_object() {
                return Err(ApiError::invalid("response_format.json_schema.schema", "A JSON Schema object is required.").into());
            }
            let name = spec["name"].as_str().unwrap_or("response");
            Ok(Some(json!({"type": "json_schema", "name": name, "schema": spec["schema"], "strict": true})))
        }
        Some(other) => Err(ApiError::invalid("response_format.type", format!("Unknown response_format type '{other}'.")).into()),
    }
}

/// An Open Responses response object in LMSP's shape.
pub fn response_from_engine(r: &Value) -> Value {
    let status = r["status"].clone();
    let error = match r["status"].as_str() {
        Some("failed") => failed_problem(&r["error"]),
        _ => Value::Null,
    };
    json!({
        "id": r["id"],
        "object": "response",
        "created_at": r["created_at"],
        "status": status,
        "model": r["model"],
        "output": r["output"].as_array().map(|items| items.iter().map(item).collect::<Vec<_>>()).unwrap_or_default(),
        "usage": usage(&r["usage"]),
        "error": error,
        "incomplete_details": r["incomplete_details"],
    })
}

fn failed_problem(error: &Value) -> Value {
    let code = error["code"].as_str().unwrap_or("server_error");
    json!({"type": format!("https://spindle.dev/problems/{code}"), "title": "Generation failed", "status": 500,
           "detail": error["message"], "code": code})
}

fn usage(u: &Value) -> Value {
    let (input, output) = (u["input_tokens"].as_u64().unwrap_or(0), u["output_tokens"].as_u64().unwrap_or(0));
    json!({"input_tokens": input, "output_tokens": output, "total_tokens": input + output})
}

/// An output item with only the fields LMSP defines.
fn item(i: &Value) -> Value {
    match i["type"].as_str() {
        Some("message") => json!({
            "id": i["id"], "type": "message", "role": i["role"],
            "content": i["content"].as_array().map(|parts| parts.iter().map(|p| json!({"type": p["type"], "text": p["text"]})).collect::<Vec<_>>()).unwrap_or_default(),
        }),
        Some("function_call") => json!({"id": i["id"], "type": "function_call", "call_id": i["call_id"], "name": i["name"], "arguments": i["arguments"]}),
        Some("reasoning") => json!({"id": i["id"], "type": "reasoning", "summary": i["summary"]}),
        _ => i.clone(),
    }
}

/// One Open Responses stream event as LMSP `(event name, data)`, or `None`
/// for events LMSP leaves out.
pub fn event_from_engine(e: &Value, response_id: &str) -> Option<(String, Value)> {
    let kind = e["type"].as_str()?;
    let data = match kind {
        "response.created" => json!({"response_id": response_id, "status": "in_progress"}),
        "response.output_item.added" | "response.output_item.done" => {
            json!({"response_id": response_id, "output_index": e["output_index"], "item": item(&e["item"])})
        }
        "response.output_text.delta" | "response.function_call_arguments.delta" => {
            json!({"response_id": response_id, "item_id": e["item_id"], "delta": e["delta"]})
        }
        "response.completed" => json!({"response_id": response_id, "status": "completed", "usage": usage(&e["response"]["usage"])}),
        "response.incomplete" => json!({"response_id": response_id, "status": "incomplete",
            "incomplete_details": e["response"]["incomplete_details"], "usage": usage(&e["response"]["usage"])}),
        "response.failed" => json!({"response_id": response_id, "status": "failed", "error": failed_problem(&e["response"]["error"])}),
        "response.cancelled" => json!({"response_id": response_id, "status": "cancelled"}),
        _ => return None,
    };
    Some((kind.to_string(), data))
}

/// One SSE frame with an integer id.
pub fn sse_frame(id: u64, event: &str, data: &Value) -> String {
    format!("id: {id}\nevent: {event}\ndata: {data}\n\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_and_capabilities_are_checked() {
        let body = json!({"model": "m", "input": "hi", "response_format": {"type": "text"}, "extensions": {"x": 1}, "foo": 2});
        let mapped = request_to_engine(&body).unwrap();
        assert_eq!(mapped, json!({"model": "m", "input": "hi", "store": false}));
        let schema = json!({"model": "m", "input": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}});
        assert_eq!(request_to_engine(&schema).unwrap()["text"], json!({"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": true}}));
        let no_schema = json!({"model": "m", "input": "hi", "response_format": {"type": "json_schema", "json_schema": {}}});
        assert_eq!(request_to_engine(&no_schema).unwrap_err().0.param.as_deref(), Some("response_format.json_schema.schema"));
        assert_eq!(request_to_engine(&json!({"input": "hi"})).unwrap_err().0.param.as_deref(), Some("model"));
    }

    #[test]
    fn events_map_to_the_seed_shapes() {
        let delta = json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "A", "output_index": 0, "sequence_number": 3});
        assert_eq!(event_from_engine(&delta, "resp_1"), Some(("response.output_text.delta".into(), json!({"response_id": "resp_1", "item_id": "msg_1", "delta": "A"}))));
        assert_eq!(event_from_engine(&json!({"type": "response.content_part.added"}), "resp_1"), None);
        let done = json!({"type": "response.completed", "response": {"usage": {"input_tokens": 3, "output_tokens": 4}}});
        assert_eq!(event_from_engine(&done, "r").unwrap().1["usage"], json!({"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}));
        assert_eq!(sse_frame(1, "e", &json!({})), "id: 1\nevent: e\ndata: {}\n\n");
    }
}
