//! The Chat Completions and Completions objects Spindle writes, as typed
//! structs: final objects, stream chunks, and the stream's error payload.

use crate::protocol::LogProb;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde::Serialize as DeriveSerialize;

/// `chat.completion` or `text_completion`.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct Completion {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// The object's kind.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// The model that answered.
    pub model: String,
    /// Always `null`.
    pub system_fingerprint: Option<String>,
    /// Exactly one choice.
    pub choices: Vec<FinalChoice>,
    /// Token counts.
    pub usage: ChatUsage,
}

/// A final choice: a message (chat) or a text (completions).
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
#[serde(untagged)]
pub enum FinalChoice {
    /// `{index, message, logprobs, finish_reason}`.
    Chat {
        /// Always 0.
        index: u32,
        /// The assistant's message.
        message: AssistantMessage,
        /// `{content: [...]}` when asked for.
        logprobs: Option<Logprobs>,
        /// `stop`, `length`, `tool_calls` or `content_filter`.
        finish_reason: &'static str,
    },
    /// `{index, text, logprobs, finish_reason}`.
    Text {
        /// Always 0.
        index: u32,
        /// The answer.
        text: String,
        /// Parallel arrays when asked for.
        logprobs: Option<Logprobs>,
        /// `stop`, `length` or `content_filter`.
        finish_reason: &'static str,
    },
}

/// The assistant's final message.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The answer (`null` when the reply is only tool calls).
    pub content: Option<String>,
    /// The calls the model made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A thinking model's reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// One tool call, whole or as a stream delta.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct ToolCall {
    /// Its position among the reply's calls (chunks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_…` (absent on argument deltas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (absent on argument deltas).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The function and its arguments (or more of them).
    pub function: FunctionCall,
}

/// `{name, arguments}`.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct FunctionCall {
    /// The function (absent on argument deltas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its arguments as JSON text.
    pub arguments: String,
}

/// Log-probabilities in either family's shape.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// Chat: `{content: [{token, logprob, bytes, top_logprobs}]}`.
    Chat {
        /// One entry per token.
        content: Vec<LogProb>,
    },
    /// Completions: parallel arrays.
    Legacy(LegacyLogprobs),
}

/// Completions' older logprobs shape.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct LegacyLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f64>,
    /// Each token's alternatives, by text.
    pub top_logprobs: Vec<TopByText>,
    /// Each token's byte offset in the text.
    pub text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// The parallel arrays of `entries`.
    pub fn of(entries: &[LogProb]) -> Self {
        let mut offset = 0;
        let mut text_offset = Vec::with_capacity(entries.len());
        for e in entries {
            text_offset.push(offset);
            offset += e.token.len();
        }
        Self {
            tokens: entries.iter().map(|e| e.token.clone()).collect(),
            token_logprobs: entries.iter().map(|e| e.logprob).collect(),
            top_logprobs: entries.iter().map(|e| TopByText(e.top_logprobs.iter().map(|t| (t.token.clone(), t.logprob)).collect())).collect(),
            text_offset,
        }
    }
}

/// A token's alternatives as `{text: logprob}`, in rank order (two tokens
/// with the same text keep the better-ranked one: JSON keys are unique).
#[derive(Debug, Clone, PartialEq)]
pub struct TopByText(pub Vec<(String, f64)>);

impl Serialize for TopByText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<_> = self.0.iter().filter(|(token, _)| seen.insert(token.as_str())).collect();
        let mut map = serializer.serialize_map(Some(unique.len()))?;
        for (token, logprob) in unique {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// OpenAI's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, DeriveSerialize)]
pub struct ChatUsage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// `{cached_tokens}`.
    pub prompt_tokens_details: CachedTokens,
    /// `{reasoning_tokens}`.
    pub completion_tokens_details: ReasoningTokens,
}

/// `prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, DeriveSerialize)]
pub struct CachedTokens {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// `completion_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, DeriveSerialize)]
pub struct ReasoningTokens {
    /// Generated tokens spent reasoning.
    pub reasoning_tokens: usize,
}

/// One `data:` payload of a stream: a chunk, or the error that ends it.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
#[serde(untagged)]
pub enum StreamData {
    /// `chat.completion.chunk` or `text_completion`.
    Chunk(Chunk),
    /// `{error: {message, type, param, code}}`.
    Error {
        /// What went wrong.
        error: StreamError,
    },
}

/// The error payload that ends a failed stream.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct StreamError {
    /// Why.
    pub message: String,
    /// Always `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `null`.
    pub param: Option<String>,
    /// The response's error code.
    pub code: String,
}

/// One stream chunk.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct Chunk {
    /// Same on every chunk of a stream.
    pub id: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// The model.
    pub model: String,
    /// Always `null`.
    pub system_fingerprint: Option<String>,
    /// One choice, or none on the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Absent unless `stream_options.include_usage`; then `null` except on
    /// the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<ChatUsage>>,
}

/// A chunk's choice: a delta (chat) or a text (completions).
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
#[serde(untagged)]
pub enum ChunkChoice {
    /// `{index, delta, logprobs, finish_reason}`.
    Chat {
        /// Always 0.
        index: u32,
        /// What changed.
        delta: Delta,
        /// The delta's tokens' log-probabilities, when asked for.
        logprobs: Option<Logprobs>,
        /// Set on the last choice.
        finish_reason: Option<&'static str>,
    },
    /// `{index, text, logprobs, finish_reason}`.
    Text {
        /// Always 0.
        index: u32,
        /// New text.
        text: String,
        /// The text's tokens' log-probabilities, when asked for.
        logprobs: Option<Logprobs>,
        /// Set on the last choice.
        finish_reason: Option<&'static str>,
    },
}

/// What a chat chunk adds to the message.
#[derive(Debug, Clone, PartialEq, Default, DeriveSerialize)]
pub struct Delta {
    /// `assistant`, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New answer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A call starting, or more of its arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternatives_with_the_same_text_keep_the_better_ranked_one() {
        let top = TopByText(vec![("a".into(), -0.1), ("b".into(), -0.5), ("a".into(), -0.9)]);
        assert_eq!(serde_json::to_string(&top).ok().as_deref(), Some(r#"{"a":-0.1,"b":-0.5}"#));
    }
}
