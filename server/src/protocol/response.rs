//! The response object (`ResponseResource`, digest §3). Every key the schema
//! requires is always serialized (nullable ones as `null`).

use super::config::{
    FunctionTool, ReasoningConfig, ServiceTier, TextConfig, ToolChoice, Truncation,
};
use super::error::ResponseError;
use super::output::OutputItem;
use super::request::{ValidRequest, DEFAULT_TEMPERATURE, DEFAULT_TOP_P};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A response's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    /// Waiting to start (background mode).
    Queued,
    /// Generating.
    InProgress,
    /// Finished normally.
    Completed,
    /// Failed; `error` says why.
    Failed,
    /// Cut short; `incomplete_details` says why.
    Incomplete,
    /// Cancelled by the client (OpenAI's status for cancelled background
    /// responses; the spec does not mention it).
    Cancelled,
}

impl ResponseStatus {
    /// The wire name (`in_progress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Incomplete => "incomplete",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether no further change can happen.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Queued | Self::InProgress)
    }
}

/// `incomplete_details`: `{reason}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` or `content_filter`.
    pub reason: String,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    /// Generated tokens spent on reasoning.
    pub reasoning_tokens: usize,
}

/// `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Details of the prompt tokens.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Details of the generated tokens.
    pub output_tokens_details: OutputTokensDetails,
    /// `input_tokens + output_tokens`.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage from counts (`total_tokens` is computed).
    pub fn new(input: usize, cached: usize, output: usize, reasoning: usize) -> Self {
        Self {
            input_tokens: input,
            input_tokens_details: InputTokensDetails {
                cached_tokens: cached,
            },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning,
            },
            total_tokens: input + output,
        }
    }
}

/// The response object. A wire mirror of the schema, hence its many fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    /// Always `"response"`.
    pub object: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds when it completed (only for `completed`).
    pub completed_at: Option<i64>,
    /// Status.
    pub status: ResponseStatus,
    /// Why it is incomplete.
    pub incomplete_details: Option<IncompleteDetails>,
    /// The model that answered.
    pub model: String,
    /// The response this continues.
    pub previous_response_id: Option<String>,
    /// Echo of `instructions`.
    pub instructions: Option<String>,
    /// Output items.
    pub output: Vec<OutputItem>,
    /// Why it failed.
    pub error: Option<ResponseError>,
    /// Echo of `tools`.
    pub tools: Vec<FunctionTool>,
    /// Echo of `tool_choice`.
    pub tool_choice: ToolChoice,
    /// Echo of `truncation`.
    pub truncation: Truncation,
    /// Echo of `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// Echo of `text`.
    pub text: TextConfig,
    /// Echo of `top_p` (default 1).
    pub top_p: f64,
    /// Echo of `presence_penalty` (default 0).
    pub presence_penalty: f64,
    /// Echo of `frequency_penalty` (default 0).
    pub frequency_penalty: f64,
    /// Echo of `top_logprobs` (default 0).
    pub top_logprobs: u32,
    /// Echo of `temperature` (default 1).
    pub temperature: f64,
    /// Echo of `reasoning`.
    pub reasoning: Option<ReasoningConfig>,
    /// Token counts, once finished.
    pub usage: Option<Usage>,
    /// Echo of `max_output_tokens`.
    pub max_output_tokens: Option<u32>,
    /// Echo of `max_tool_calls`.
    pub max_tool_calls: Option<u32>,
    /// Echo of `store`.
    pub store: bool,
    /// Echo of `background`.
    pub background: bool,
    /// Echo of `service_tier`.
    pub service_tier: ServiceTier,
    /// Echo of `metadata` (`{}` when none).
    pub metadata: Map<String, Value>,
    /// Echo of `safety_identifier`.
    pub safety_identifier: Option<String>,
    /// Echo of `prompt_cache_key`.
    pub prompt_cache_key: Option<String>,
    /// Echo of the deprecated `user`, only when sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ResponseObject {
    /// A fresh `in_progress` response with no output, echoing `request`.
    pub fn new(id: String, created_at: i64, request: &ValidRequest) -> Self {
        let s = &request.sampling;
        Self {
            id,
            object: "response".to_owned(),
            created_at,
            completed_at: None,
            status: ResponseStatus::InProgress,
            incomplete_details: None,
            model: request.model.clone().unwrap_or_default(),
            previous_response_id: request.previous_response_id.clone(),
            instructions: request.instructions.clone(),
            output: Vec::new(),
            error: None,
            tools: request.tools.clone(),
            tool_choice: request.tool_choice.clone(),
            truncation: request.truncation,
            parallel_tool_calls: request.parallel_tool_calls,
            text: request.text.clone(),
            top_p: s.top_p.unwrap_or(DEFAULT_TOP_P),
            presence_penalty: s.presence_penalty.unwrap_or(0.0),
            frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
            top_logprobs: s.top_logprobs.unwrap_or(0),
            temperature: s.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            reasoning: request.reasoning,
            usage: None,
            max_output_tokens: request.max_output_tokens,
            max_tool_calls: request.max_tool_calls,
            store: request.store,
            background: request.background,
            service_tier: request.service_tier,
            metadata: request.metadata.clone(),
            safety_identifier: request.safety_identifier.clone(),
            prompt_cache_key: request.prompt_cache_key.clone(),
            user: request.user.clone(),
        }
    }

    /// The concatenated text of all `output_text` parts of message items
    /// (what the OpenAI SDK calls `output_text`).
    pub fn output_text(&self) -> String {
        let mut out = String::new();
        for item in &self.output {
            if let OutputItem::Message(m) = item {
                for part in &m.content {
                    if let super::output::OutputContent::OutputText { text, .. } = part {
                        out.push_str(text);
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_are_the_wire_names() {
        for status in [ResponseStatus::Queued, ResponseStatus::InProgress, ResponseStatus::Completed, ResponseStatus::Failed, ResponseStatus::Incomplete, ResponseStatus::Cancelled] {
            assert_eq!(serde_json::to_value(status).ok(), Some(Value::from(status.as_str())));
        }
    }
}
