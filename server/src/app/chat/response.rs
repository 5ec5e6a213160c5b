//! Open Responses output as Chat Completions and Completions objects: the
//! final response object becomes a `chat.completion` (or `text_completion`),
//! and its stream of semantic events becomes OpenAI's chunks. Tool calls,
//! reasoning and logprobs come from the one model-output layer that serves
//! `/v1/responses`.

use serde_json::{json, Value};
use std::collections::HashMap;

/// Which object family a conversion writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl Api {
    fn id(self, response_id: &str) -> String {
        let suffix = response_id.strip_prefix("resp_").unwrap_or(response_id);
        match self {
            Api::Chat => format!("chatcmpl-{suffix}"),
            Api::Completions => format!("cmpl-{suffix}"),
        }
    }

    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }
}

fn items<'a>(response: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    response["output"].as_array().into_iter().flatten().filter(move |i| i["type"] == kind)
}

/// The answer text (all message items' text parts).
fn answer_text(response: &Value) -> String {
    items(response, "message").flat_map(|m| m["content"].as_array().into_iter().flatten()).filter_map(|p| p["text"].as_str()).collect()
}

fn answer_logprobs(response: &Value) -> Vec<Value> {
    items(response, "message")
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .flat_map(|p| p["logprobs"].as_array().into_iter().flatten().cloned())
        .collect()
}

/// OpenAI's `finish_reason`: `length` for a response cut off by a token
/// limit (even inside a tool call, whose arguments are then unfinished),
/// `content_filter` for one a filter stopped, else `tool_calls` or `stop`.
pub fn finish_reason(response: &Value) -> &'static str {
    if response["status"] == "incomplete" {
        if response["incomplete_details"]["reason"] == "content_filter" {
            "content_filter"
        } else {
            "length"
        }
    } else if items(response, "function_call").next().is_some() {
        "tool_calls"
    } else {
        "stop"
    }
}

/// Responses usage as OpenAI's.
pub fn usage(response: &Value) -> Value {
    let u = &response["usage"];
    let input = u["input_tokens"].as_u64().unwrap_or(0);
    let output = u["output_tokens"].as_u64().unwrap_or(0);
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": input + output,
        "prompt_tokens_details": {"cached_tokens": u["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)},
        "completion_tokens_details": {"reasoning_tokens": u["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0)},
    })
}

/// The final `chat.completion` for a finished response.
pub fn chat_completion(response: &Value, logprobs: bool) -> Value {
    let calls: Vec<Value> = items(response, "function_call")
        .map(|c| json!({"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}))
        .collect();
    let text = answer_text(response);
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let reasoning: String = items(response, "reasoning")
        .flat_map(|r| r["content"].as_array().into_iter().flatten())
        .filter_map(|p| p["text"].as_str())
        .collect();
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    let logprobs = if logprobs { json!({"content": answer_logprobs(response)}) } else { Value::Null };
    json!({
        "id": Api::Chat.id(response["id"].as_str().unwrap_or_default()),
        "object": Api::Chat.object(false),
        "created": response["created_at"],
        "model": response["model"],
        "system_fingerprint": null,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason(response)}],
        "usage": usage(response),
    })
}

/// The final `text_completion` for a finished response.
pub fn text_completion(response: &Value, logprobs: bool) -> Value {
    let logprobs = if logprobs { legacy_logprobs(&answer_logprobs(response)) } else { Value::Null };
    json!({
        "id": Api::Completions.id(response["id"].as_str().unwrap_or_default()),
        "object": Api::Completions.object(false),
        "created": response["created_at"],
        "model": response["model"],
        "system_fingerprint": null,
        "choices": [{"index": 0, "text": answer_text(response), "logprobs": logprobs, "finish_reason": finish_reason(response)}],
        "usage": usage(response),
    })
}

/// Completions' older logprobs shape: parallel arrays.
fn legacy_logprobs(entries: &[Value]) -> Value {
    let mut offset = 0;
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        offsets.push(offset);
        offset += e["token"].as_str().map_or(0, str::len);
    }
    json!({
        "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| {
            let top: serde_json::Map<String, Value> = e["top_logprobs"].as_array().into_iter().flatten()
                .filter_map(|t| Some((t["token"].as_str()?.to_string(), t["logprob"].clone()))).collect();
            Value::Object(top)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Turns a response's stream of events into OpenAI chunks.
#[derive(Debug)]
pub struct ChunkMapper {
    api: Api,
    id: String,
    created: Value,
    model: Value,
    include_usage: bool,
    logprobs: bool,
    /// Output index of each function call item -> its `tool_calls` index.
    calls: HashMap<u64, usize>,
}

impl ChunkMapper {
    /// A mapper for `api` chunks.
    pub fn new(api: Api, include_usage: bool, logprobs: bool) -> Self {
        Self { api, id: String::new(), created: Value::Null, model: Value::Null, include_usage, logprobs, calls: HashMap::new() }
    }

    fn chunk(&self, choice: Value) -> Value {
        let mut chunk = json!({"id": self.id, "object": self.api.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": null, "choices": [choice]});
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A choice carrying `delta` (chat) or `text` (completions).
    fn choice(&self, delta: Value, logprobs: Value, finish: Value) -> Value {
        match self.api {
            Api::Chat => json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Api::Completions => json!({"index": 0, "text": delta["content"].as_str().unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}),
        }
    }

    /// The chunks for one Responses event (none for most), or an error
    /// payload to send as the stream's last data.
    pub fn push(&mut self, event: &Value) -> Vec<Value> {
        let kind = event["type"].as_str().unwrap_or_default();
        match kind {
            "response.created" => {
                let r = &event["response"];
                self.id = self.api.id(r["id"].as_str().unwrap_or_default());
                self.created = r["created_at"].clone();
                self.model = r["model"].clone();
                if self.api == Api::Chat {
                    return vec![self.chunk(self.choice(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null))];
                }
                Vec::new()
            }
            "response.output_text.delta" => {
                let logprobs = match (self.logprobs, self.api) {
                    (false, _) => Value::Null,
                    (true, Api::Chat) => json!({"content": event["logprobs"]}),
                    (true, Api::Completions) => legacy_logprobs(event["logprobs"].as_array().map_or(&[], Vec::as_slice)),
                };
                vec![self.chunk(self.choice(json!({"content": event["delta"]}), logprobs, Value::Null))]
            }
            "response.reasoning.delta" if self.api == Api::Chat => {
                vec![self.chunk(self.choice(json!({"reasoning_content": event["delta"]}), Value::Null, Value::Null))]
            }
            "response.output_item.added" if self.api == Api::Chat && event["item"]["type"] == "function_call" => {
                let index = self.calls.len();
                self.calls.insert(event["output_index"].as_u64().unwrap_or(0), index);
                let item = &event["item"];
                let call = json!({"index": index, "id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": ""}});
                vec![self.chunk(self.choice(json!({"tool_calls": [call]}), Value::Null, Value::Null))]
            }
            "response.function_call_arguments.delta" if self.api == Api::Chat => {
                let index = self.calls.get(&event["output_index"].as_u64().unwrap_or(0)).copied().unwrap_or(0);
                let call = json!({"index": index, "function": {"arguments": event["delta"]}});
                vec![self.chunk(self.choice(json!({"tool_calls": [call]}), Value::Null, Value::Null))]
            }
            "response.completed" | "response.incomplete" => {
                let r = &event["response"];
                let mut chunks = vec![self.chunk(self.choice(json!({}), Value::Null, json!(finish_reason(r))))];
                if self.include_usage {
                    let mut last = self.chunk(Value::Null);
                    last["choices"] = json!([]);
                    last["usage"] = usage(r);
                    chunks.push(last);
                }
                chunks
            }
            "response.failed" => {
                let e = &event["response"]["error"];
                vec![json!({"error": {"message": e["message"], "type": "server_error", "param": null, "code": e["code"]}})]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished() -> Value {
        json!({"id": "resp_abc", "created_at": 7, "model": "m", "status": "completed",
            "output": [
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]},
                {"type": "message", "content": [{"type": "output_text", "text": "Hi", "logprobs": [{"token": "Hi", "logprob": -0.1, "top_logprobs": []}]}]},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
            ],
            "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1}}})
    }

    #[test]
    fn a_finished_response_is_a_chat_completion() {
        let c = chat_completion(&finished(), true);
        assert_eq!(c["id"], "chatcmpl-abc");
        let choice = &c["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Hi");
        assert_eq!(choice["message"]["reasoning_content"], "think");
        assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(choice["logprobs"]["content"][0]["token"], "Hi");
        assert_eq!(c["usage"], json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 1}}));
        let t = text_completion(&finished(), false);
        assert_eq!((t["object"].as_str(), t["choices"][0]["text"].as_str()), (Some("text_completion"), Some("Hi")));
    }

    #[test]
    fn a_response_cut_off_in_a_tool_call_finishes_with_length() {
        let mut r = finished();
        r["status"] = json!("incomplete");
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        r["output"][2]["arguments"] = json!("{\"city\": \"Par");
        r["output"][2]["status"] = json!("incomplete");
        assert_eq!(chat_completion(&r, false)["choices"][0]["finish_reason"], "length", "a cut-off call is no finished call");
        let mut m = ChunkMapper::new(Api::Chat, false, false);
        m.push(&json!({"type": "response.created", "response": {"id": "resp_x", "created_at": 1, "model": "m"}}));
        let last = m.push(&json!({"type": "response.incomplete", "response": r}));
        assert_eq!(last[0]["choices"][0]["finish_reason"], "length", "streamed too: {last:?}");
        r["incomplete_details"] = json!({"reason": "content_filter"});
        assert_eq!(chat_completion(&r, false)["choices"][0]["finish_reason"], "content_filter");
    }

    #[test]
    fn events_become_chunks_with_tool_call_indexes_and_usage_last() {
        let mut m = ChunkMapper::new(Api::Chat, true, false);
        let mut chunks = m.push(&json!({"type": "response.created", "response": {"id": "resp_x", "created_at": 1, "model": "m"}}));
        chunks.extend(m.push(&json!({"type": "response.output_text.delta", "delta": "He"})));
        chunks.extend(m.push(&json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "c", "name": "f"}})));
        chunks.extend(m.push(&json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{}"})));
        chunks.extend(m.push(&json!({"type": "response.completed", "response": finished()})));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "He");
        assert_eq!(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["id"], "c");
        assert_eq!(chunks[3]["choices"][0]["delta"]["tool_calls"][0], json!({"index": 0, "function": {"arguments": "{}"}}));
        assert_eq!(chunks[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!((chunks[5]["choices"].as_array().map(Vec::len), chunks[5]["usage"]["total_tokens"].as_u64()), (Some(0), Some(8)));
        assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-x" && c["object"] == "chat.completion.chunk"));
    }
}
