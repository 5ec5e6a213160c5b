//! Chat Completions and Completions request bodies as Open Responses
//! requests: messages become input items, tools and formats take the
//! Responses shapes, and the fields the Responses API lacks (`stop`, a
//! `max_tokens` below 16) are set on the validated request. One validator
//! and one model-output layer serve every protocol.

use crate::protocol::error::ApiError;
use serde_json::{json, Map, Value};

/// Most `stop` strings (OpenAI's limit).
const MAX_STOP: usize = 4;

/// What a Chat Completions body asks for beyond the Responses request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatExtras {
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens` / `max_tokens`.
    pub max_tokens: Option<u32>,
    /// `stop`.
    pub stop: Vec<String>,
    /// `logprobs`.
    pub logprobs: bool,
}

/// A Chat Completions body as a Responses create body plus the extras.
pub fn chat_to_responses(body: &Value) -> Result<(Value, ChatExtras), ApiError> {
    let o = body.as_object().ok_or_else(|| ApiError::invalid("body", "The request body must be a JSON object."))?;
    let messages = o.get("messages").and_then(Value::as_array).ok_or_else(|| {
        ApiError::invalid_with_code("messages", "missing_required_parameter", "Missing required parameter: 'messages'.")
    })?;
    let mut out = Map::new();
    let mut input = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        message_items(m, i, &mut input)?;
    }
    out.insert("input".into(), Value::Array(input));
    out.insert("store".into(), json!(false));
    for key in ["model", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "user", "parallel_tool_calls", "metadata",
        "top_k", "min_p", "repetition_penalty", "ignore_eos", "prompt_cache_key", "safety_identifier", "reasoning_effort"]
    {
        if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(effort) = out.remove("reasoning_effort") {
        out.insert("reasoning".into(), json!({"effort": effort}));
    }
    if let Some(tools) = o.get("tools").filter(|v| !v.is_null()) {
        out.insert("tools".into(), tools_to_responses(tools)?);
    }
    if let Some(choice) = o.get("tool_choice").filter(|v| !v.is_null()) {
        out.insert("tool_choice".into(), tool_choice_to_responses(choice));
    }
    if let Some(format) = o.get("response_format").filter(|v| !v.is_null()) {
        out.insert("text".into(), json!({"format": format_to_responses(format)?}));
    }
    let logprobs = o.get("logprobs").and_then(Value::as_bool).unwrap_or(false);
    match o.get("top_logprobs").filter(|v| !v.is_null()) {
        Some(n) if logprobs => {
            out.insert("top_logprobs".into(), n.clone());
        }
        Some(_) => return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true.")),
        None if logprobs => {
            out.insert("top_logprobs".into(), json!(0));
        }
        None => {}
    }
    check_n(o)?;
    let extras = ChatExtras {
        stream: o.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: o.get("stream_options").and_then(|s| s.get("include_usage")).and_then(Value::as_bool).unwrap_or(false),
        max_tokens: max_tokens(o)?,
        stop: stop_strings(o.get("stop"))?,
        logprobs,
    };
    Ok((Value::Object(out), extras))
}

/// The input items of one chat message.
fn message_items(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = |field: &str| format!("messages[{i}].{field}");
    let role = m.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param("role"), "Each message needs a 'role'."))?;
    let content = m.get("content").filter(|c| !c.is_null());
    match role {
        "system" | "developer" | "user" => {
            let content = content.ok_or_else(|| ApiError::invalid(param("content"), format!("A {role} message needs 'content'.")))?;
            out.push(json!({"type": "message", "role": role, "content": parts_to_responses(content, "input_text", &param("content"))?}));
        }
        "assistant" => {
            if let Some(content) = content {
                let text = parts_to_responses(content, "output_text", &param("content"))?;
                if text.as_str().is_none_or(|t| !t.is_empty()) {
                    out.push(json!({"type": "message", "role": "assistant", "content": text}));
                }
            }
            for (k, call) in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let f = &call["function"];
                let (Some(id), Some(name)) = (call["id"].as_str(), f["name"].as_str()) else {
                    return Err(ApiError::invalid(param(&format!("tool_calls[{k}]")), "A tool call needs 'id' and 'function.name'."));
                };
                let arguments = f["arguments"].as_str().unwrap_or("{}");
                out.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": arguments}));
            }
        }
        "tool" => {
            let call_id = m.get("tool_call_id").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param("tool_call_id"), "A tool message needs 'tool_call_id'."))?;
            let output = match content {
                Some(c) => parts_to_responses(c, "input_text", &param("content"))?,
                None => json!(""),
            };
            out.push(json!({"type": "function_call_output", "call_id": call_id, "output": output}));
        }
        other => return Err(ApiError::invalid(param("role"), format!("Unknown role '{other}'."))),
    }
    Ok(())
}

/// Message content: a string stays one; text parts become `part_type` parts.
fn parts_to_responses(content: &Value, part_type: &str, param: &str) -> Result<Value, ApiError> {
    match content {
        Value::String(_) => Ok(content.clone()),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(text)) => Ok(json!({"type": part_type, "text": text})),
                (Some("image_url"), _) => {
                    Ok(json!({"type": "input_image", "image_url": p["image_url"]["url"], "detail": p["image_url"]["detail"]}))
                }
                _ => Err(ApiError::invalid(format!("{param}[{k}]"), "Only text and image_url content parts are supported.")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        _ => Err(ApiError::invalid(param, "Content must be a string or an array of content parts.")),
    }
}

/// `[{type: function, function: {name, description, parameters, strict}}]`
/// as Responses function tools.
fn tools_to_responses(tools: &Value) -> Result<Value, ApiError> {
    let tools = tools.as_array().ok_or_else(|| ApiError::invalid("tools", "tools must be an array."))?;
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = t.get("function").and_then(Value::as_object).ok_or_else(|| ApiError::invalid(format!("tools[{i}].function"), "Each tool needs a 'function'."))?;
            let mut tool = f.clone();
            tool.insert("type".into(), json!("function"));
            Ok(Value::Object(tool))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn tool_choice_to_responses(choice: &Value) -> Value {
    match choice.get("function").and_then(|f| f.get("name")) {
        Some(name) => json!({"type": "function", "name": name}),
        None => choice.clone(),
    }
}

/// `response_format` as a Responses `text.format`.
fn format_to_responses(format: &Value) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut f = format.get("json_schema").and_then(Value::as_object).cloned().ok_or_else(|| {
                ApiError::invalid("response_format.json_schema", "A json_schema response_format needs 'json_schema'.")
            })?;
            f.insert("type".into(), json!("json_schema"));
            Ok(Value::Object(f))
        }
        Some("json_object" | "text") => Ok(format.clone()),
        _ => Err(ApiError::invalid("response_format.type", "response_format.type must be 'text', 'json_object' or 'json_schema'.")),
    }
}

fn check_n(o: &Map<String, Value>) -> Result<(), ApiError> {
    match o.get("n").filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(n) if n.as_u64() == Some(1) => Ok(()),
        Some(_) => Err(ApiError::invalid("n", "Only n = 1 is supported; send parallel requests for more choices.")),
    }
}

/// `max_completion_tokens` (or the older `max_tokens`): at least 1.
fn max_tokens(o: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
            let n = v.as_u64().filter(|&n| n >= 1).and_then(|n| u32::try_from(n).ok());
            return n.map(Some).ok_or_else(|| ApiError::invalid(key, format!("{key} must be a positive integer.")));
        }
    }
    Ok(None)
}

/// `stop`: a string or up to [`MAX_STOP`] strings.
pub fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let strings: Vec<String> = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(|| ApiError::invalid("stop", "stop must be a string or an array of strings."))?,
        Some(_) => return Err(ApiError::invalid("stop", "stop must be a string or an array of strings.")),
    };
    if strings.len() > MAX_STOP {
        return Err(ApiError::invalid("stop", format!("At most {MAX_STOP} stop strings.")));
    }
    Ok(strings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_tools_and_formats_take_the_responses_shapes() -> Result<(), ApiError> {
        let body = json!({
            "model": "m", "max_tokens": 5, "stop": ["\n\n"], "n": 1, "logprobs": true, "top_logprobs": 2,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
        });
        let (r, extras) = chat_to_responses(&body)?;
        assert_eq!(r["input"][1], json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}));
        assert_eq!(r["input"][2], json!({"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
        assert_eq!(r["input"][3], json!({"type": "function_call_output", "call_id": "call_1", "output": "18C"}));
        assert_eq!(r["tools"][0], json!({"type": "function", "name": "get_weather", "parameters": {"type": "object"}}));
        assert_eq!(r["tool_choice"], json!({"type": "function", "name": "get_weather"}));
        assert_eq!(r["text"]["format"], json!({"type": "json_schema", "name": "w", "schema": {"type": "object"}}));
        assert_eq!((r["top_logprobs"].as_u64(), r["store"].as_bool()), (Some(2), Some(false)));
        assert_eq!(extras, ChatExtras { stream: false, include_usage: false, max_tokens: Some(5), stop: vec!["\n\n".into()], logprobs: true });
        Ok(())
    }

    #[test]
    fn unsupported_requests_are_clear_400s() {
        let param = |body: Value| chat_to_responses(&body).err().and_then(|e| e.param);
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("messages"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "n": 2})).as_deref(), Some("n"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})).as_deref(), Some("max_tokens"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]})).as_deref(), Some("stop"));
        assert_eq!(param(json!({"messages": [{"role": "wizard", "content": "x"}]})).as_deref(), Some("messages[0].role"));
    }
}
