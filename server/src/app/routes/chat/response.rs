//! Open Responses output as Chat Completions and Completions objects: the
//! final response object becomes a `chat.completion` (or `text_completion`),
//! and its stream of semantic events becomes OpenAI's chunks. Tool calls,
//! reasoning and logprobs come from the one model-output layer that serves
//! `/v1/responses`.

use crate::app::routes::chat::wire::{
    AssistantMessage, CachedTokens, ChatUsage, Chunk, ChunkChoice, Completion, Delta, FinalChoice, FunctionCall,
    LegacyLogprobs, Logprobs, ReasoningTokens, StreamData, StreamError, ToolCall,
};
use crate::protocol::output::FunctionCallItem;
use crate::protocol::{LogProb, OutputContent, OutputItem, ResponseObject, ResponseStatus, StreamEvent};
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

fn calls(response: &ResponseObject) -> impl Iterator<Item = &FunctionCallItem> {
    response.output.iter().filter_map(|i| match i {
        OutputItem::FunctionCall(c) => Some(c),
        _ => None,
    })
}

/// Every part of the answer (all message items' parts).
fn answer_parts(response: &ResponseObject) -> impl Iterator<Item = &OutputContent> {
    response.output.iter().flat_map(|i| match i {
        OutputItem::Message(m) => m.content.as_slice(),
        _ => &[],
    })
}

/// The answer text (all message items' text parts).
fn answer_text(response: &ResponseObject) -> String {
    answer_parts(response)
        .filter_map(|p| match p {
            OutputContent::OutputText { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn answer_logprobs(response: &ResponseObject) -> Vec<LogProb> {
    answer_parts(response)
        .flat_map(|p| match p {
            OutputContent::OutputText { logprobs, .. } => logprobs.as_slice(),
            _ => &[],
        })
        .cloned()
        .collect()
}

fn reasoning_text(response: &ResponseObject) -> String {
    response
        .output
        .iter()
        .flat_map(|i| match i {
            OutputItem::Reasoning(r) => r.content.as_slice(),
            _ => &[],
        })
        .map(OutputContent::text)
        .collect()
}

/// OpenAI's `finish_reason`: `length` for a response cut off by a token
/// limit (even inside a tool call, whose arguments are then unfinished),
/// `content_filter` for one a filter stopped, else `tool_calls` or `stop`.
pub fn finish_reason(response: &ResponseObject) -> &'static str {
    if response.status == ResponseStatus::Incomplete {
        match &response.incomplete_details {
            Some(d) if d.reason == "content_filter" => "content_filter",
            _ => "length",
        }
    } else if calls(response).next().is_some() {
        "tool_calls"
    } else {
        "stop"
    }
}

/// Responses usage as OpenAI's.
pub fn usage(response: &ResponseObject) -> ChatUsage {
    let u = response.usage.unwrap_or_default();
    ChatUsage {
        prompt_tokens: u.input_tokens,
        completion_tokens: u.output_tokens,
        total_tokens: u.input_tokens + u.output_tokens,
        prompt_tokens_details: CachedTokens { cached_tokens: u.input_tokens_details.cached_tokens },
        completion_tokens_details: ReasoningTokens { reasoning_tokens: u.output_tokens_details.reasoning_tokens },
    }
}

/// The final `chat.completion` for a finished response.
pub fn chat_completion(response: &ResponseObject, logprobs: bool) -> Completion {
    let tool_calls: Vec<ToolCall> = calls(response)
        .map(|c| ToolCall {
            index: None,
            id: Some(c.call_id.clone()),
            kind: Some("function"),
            function: FunctionCall { name: Some(c.name.clone()), arguments: c.arguments.clone() },
        })
        .collect();
    let text = answer_text(response);
    let reasoning = reasoning_text(response);
    let message = AssistantMessage {
        role: "assistant",
        content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
    };
    let logprobs = logprobs.then(|| Logprobs::Chat { content: answer_logprobs(response) });
    let choice = FinalChoice::Chat { index: 0, message, logprobs, finish_reason: finish_reason(response) };
    completion(Api::Chat, response, choice)
}

/// The final `text_completion` for a finished response.
pub fn text_completion(response: &ResponseObject, logprobs: bool) -> Completion {
    let logprobs = logprobs.then(|| Logprobs::Legacy(LegacyLogprobs::of(&answer_logprobs(response))));
    let choice = FinalChoice::Text { index: 0, text: answer_text(response), logprobs, finish_reason: finish_reason(response) };
    completion(Api::Completions, response, choice)
}

fn completion(api: Api, response: &ResponseObject, choice: FinalChoice) -> Completion {
    Completion {
        id: api.id(&response.id),
        object: api.object(false),
        created: response.created_at,
        model: response.model.clone(),
        system_fingerprint: None,
        choices: vec![choice],
        usage: usage(response),
    }
}

/// Turns a response's stream of events into OpenAI chunks.
#[derive(Debug)]
pub struct ChunkMapper {
    api: Api,
    id: String,
    created: i64,
    model: String,
    include_usage: bool,
    logprobs: bool,
    /// Output index of each function call item -> its `tool_calls` index.
    calls: HashMap<usize, usize>,
}

impl ChunkMapper {
    /// A mapper for `api` chunks.
    pub fn new(api: Api, include_usage: bool, logprobs: bool) -> Self {
        Self { api, id: String::new(), created: 0, model: String::new(), include_usage, logprobs, calls: HashMap::new() }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>) -> Chunk {
        Chunk {
            id: self.id.clone(),
            object: self.api.object(true),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: self.include_usage.then_some(None),
        }
    }

    /// A chunk of one choice carrying `delta` (chat; completions keep only
    /// its text).
    fn delta(&self, delta: Delta, logprobs: Option<Logprobs>, finish_reason: Option<&'static str>) -> StreamData {
        let choice = match self.api {
            Api::Chat => ChunkChoice::Chat { index: 0, delta, logprobs, finish_reason },
            Api::Completions => ChunkChoice::Text { index: 0, text: delta.content.unwrap_or_default(), logprobs, finish_reason },
        };
        StreamData::Chunk(self.chunk(vec![choice]))
    }

    fn text_logprobs(&self, entries: &[LogProb]) -> Option<Logprobs> {
        match (self.logprobs, self.api) {
            (false, _) => None,
            (true, Api::Chat) => Some(Logprobs::Chat { content: entries.to_vec() }),
            (true, Api::Completions) => Some(Logprobs::Legacy(LegacyLogprobs::of(entries))),
        }
    }

    /// The chunks for one Responses event (none for most), or an error
    /// payload to send as the stream's last data.
    pub fn push(&mut self, event: &StreamEvent) -> Vec<StreamData> {
        let chat = self.api == Api::Chat;
        match event {
            StreamEvent::Created(e) => {
                self.id = self.api.id(&e.response.id);
                self.created = e.response.created_at;
                self.model.clone_from(&e.response.model);
                let role = Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() };
                if chat { vec![self.delta(role, None, None)] } else { Vec::new() }
            }
            StreamEvent::OutputTextDelta(e) => {
                let delta = Delta { content: Some(e.delta.clone()), ..Delta::default() };
                vec![self.delta(delta, self.text_logprobs(&e.logprobs), None)]
            }
            StreamEvent::ReasoningDelta(e) if chat => {
                vec![self.delta(Delta { reasoning_content: Some(e.delta.clone()), ..Delta::default() }, None, None)]
            }
            StreamEvent::OutputItemAdded(e) if chat => match &e.item {
                OutputItem::FunctionCall(item) => {
                    let index = self.calls.len();
                    self.calls.insert(e.output_index, index);
                    let call = ToolCall {
                        index: Some(index),
                        id: Some(item.call_id.clone()),
                        kind: Some("function"),
                        function: FunctionCall { name: Some(item.name.clone()), arguments: String::new() },
                    };
                    vec![self.delta(Delta { tool_calls: Some(vec![call]), ..Delta::default() }, None, None)]
                }
                _ => Vec::new(),
            },
            StreamEvent::FunctionCallArgumentsDelta(e) if chat => {
                let index = self.calls.get(&e.output_index).copied().unwrap_or(0);
                let call = ToolCall { index: Some(index), id: None, kind: None, function: FunctionCall { name: None, arguments: e.delta.clone() } };
                vec![self.delta(Delta { tool_calls: Some(vec![call]), ..Delta::default() }, None, None)]
            }
            StreamEvent::Completed(e) | StreamEvent::Incomplete(e) => {
                let mut chunks = vec![self.delta(Delta::default(), None, Some(finish_reason(&e.response)))];
                if self.include_usage {
                    let last = Chunk { usage: Some(Some(usage(&e.response))), ..self.chunk(Vec::new()) };
                    chunks.push(StreamData::Chunk(last));
                }
                chunks
            }
            StreamEvent::Failed(e) => {
                let (message, code) = e.response.error.as_ref().map_or_else(
                    || ("generation failed".to_string(), "server_error".to_string()),
                    |err| (err.message.clone(), err.code.clone()),
                );
                vec![StreamData::Error { error: StreamError { message, kind: "server_error", param: None, code } }]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::protocol::mapper::{FinishKind, MapperInput, ResponseMapper, UsageCounts};
    use crate::protocol::request::{validate, RequestLimits};
    use serde_json::{json, Value};

    fn mapper() -> ResponseMapper {
        let req = validate(json!({"input": "x", "model": "m"}), &RequestLimits::default()).unwrap();
        ResponseMapper::new("resp_abc".into(), 7, &req)
    }

    fn entry(token: &str) -> LogProb {
        LogProb { token: token.into(), logprob: -0.1, bytes: token.as_bytes().to_vec(), top_logprobs: Vec::new() }
    }

    /// Every event of a response that reasons, answers "Hi" and calls `f`.
    fn events(reason: FinishKind) -> Vec<StreamEvent> {
        let mut m = mapper();
        let mut all = m.start();
        for input in [
            MapperInput::ReasoningDelta("think".into()),
            MapperInput::TextDeltaWithLogprobs { text: "Hi".into(), logprobs: vec![entry("Hi")] },
            MapperInput::FunctionCallStarted { call_id: "call_1".into(), name: "f".into() },
            MapperInput::FunctionCallArgumentsDelta("{\"city\": \"Par".into()),
            MapperInput::Finished { reason, usage: UsageCounts { input_tokens: 5, cached_tokens: 2, output_tokens: 3, reasoning_tokens: 1 } },
        ] {
            all.extend(m.push(input));
        }
        all
    }

    fn finished(reason: FinishKind) -> ResponseObject {
        events(reason).iter().rev().find_map(|e| e.response().cloned()).unwrap()
    }

    fn json_of(v: impl serde::Serialize) -> Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn a_finished_response_is_a_chat_completion() {
        let c = json_of(chat_completion(&finished(FinishKind::Stop), true));
        assert_eq!(c["id"], "chatcmpl-abc");
        let choice = &c["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Hi");
        assert_eq!(choice["message"]["reasoning_content"], "think");
        assert_eq!(choice["message"]["tool_calls"][0], json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Par"}}));
        assert_eq!(choice["logprobs"]["content"][0]["token"], "Hi");
        assert_eq!(c["usage"], json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 1}}));
        let t = json_of(text_completion(&finished(FinishKind::Stop), true));
        assert_eq!((t["object"].as_str(), t["choices"][0]["text"].as_str()), (Some("text_completion"), Some("Hi")));
        assert_eq!(t["choices"][0]["logprobs"], json!({"tokens": ["Hi"], "token_logprobs": [-0.1], "top_logprobs": [{}], "text_offset": [0]}));
    }

    #[test]
    fn a_response_cut_off_in_a_tool_call_finishes_with_length() {
        let cut = finished(FinishKind::MaxOutputTokens);
        assert_eq!(finish_reason(&cut), "length", "a cut-off call is no finished call");
        let mut m = ChunkMapper::new(Api::Chat, false, false);
        let chunks: Vec<Value> = events(FinishKind::MaxOutputTokens).iter().flat_map(|e| m.push(e)).map(json_of).collect();
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length", "streamed too: {chunks:?}");
        assert_eq!(finish_reason(&finished(FinishKind::ContentFilter)), "content_filter");
    }

    #[test]
    fn events_become_chunks_with_tool_call_indexes_and_usage_last() {
        let mut m = ChunkMapper::new(Api::Chat, true, false);
        let chunks: Vec<Value> = events(FinishKind::Stop).iter().flat_map(|e| m.push(e)).map(json_of).collect();
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(chunks[1]["choices"][0]["delta"], json!({"reasoning_content": "think"}));
        assert_eq!(chunks[2]["choices"][0]["delta"], json!({"content": "Hi"}));
        assert_eq!(chunks[3]["choices"][0]["delta"]["tool_calls"][0], json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}));
        assert_eq!(chunks[4]["choices"][0]["delta"]["tool_calls"][0], json!({"index": 0, "function": {"arguments": "{\"city\": \"Par"}}));
        assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!((chunks[6]["choices"].as_array().map(Vec::len), chunks[6]["usage"]["total_tokens"].as_u64()), (Some(0), Some(8)));
        assert_eq!(chunks.len(), 7);
        assert!(chunks[..6].iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()), "usage: null until the last chunk");
        assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-abc" && c["object"] == "chat.completion.chunk"));
    }

    #[test]
    fn a_failed_stream_ends_with_an_error_payload() {
        let mut m = mapper();
        let mut all = m.start();
        all.extend(m.push(MapperInput::Failed { message: "boom".into() }));
        let mut chunks = ChunkMapper::new(Api::Completions, false, false);
        let out: Vec<Value> = all.iter().flat_map(|e| chunks.push(e)).map(json_of).collect();
        assert_eq!(out, vec![json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": "server_error"}})]);
    }
}
