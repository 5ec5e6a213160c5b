//! Request settings that the response echoes back (digest §2 and §3): tools,
//! `tool_choice`, `text`, `reasoning`, `truncation`, `include`,
//! `service_tier`, `stream_options`. Each type serializes in the response's
//! echo shape.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A function tool: `{type:"function", name, description, parameters, strict}`
/// (all five keys are always serialized, as the response schema requires).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "function")]
pub struct FunctionTool {
    /// 1–64 characters of `[a-zA-Z0-9_-]`.
    pub name: String,
    /// What the function does.
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    pub parameters: Option<Value>,
    /// Whether arguments must match `parameters` exactly.
    pub strict: Option<bool>,
}

impl FunctionTool {
    /// The tool as HF chat templates take it:
    /// `{"type":"function","function":{"name","description","parameters"}}`.
    pub fn to_template_tool(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::String(d.clone()));
        }
        let parameters = self
            .parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        function.insert("parameters".into(), parameters);
        serde_json::json!({"type": "function", "function": function})
    }
}

/// `"none"`, `"auto"` or `"required"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    /// The model must not call tools.
    None,
    /// The model may call tools or answer.
    Auto,
    /// The model must call at least one tool.
    Required,
}

/// `{type:"function", name}` inside `allowed_tools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "function")]
pub struct NamedFunction {
    /// The function's name.
    pub name: String,
}

/// `tool_choice`: a mode, one forced function, or an allowed subset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `"none"` | `"auto"` | `"required"`.
    Mode(ToolChoiceMode),
    /// An object form.
    Specific(SpecificToolChoice),
}

/// The object forms of `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SpecificToolChoice {
    /// `{type:"function", name}`: call this function.
    Function {
        /// The function's name.
        name: String,
    },
    /// `{type:"allowed_tools", tools, mode}`: only these may be called.
    AllowedTools {
        /// The callable subset (1–128).
        tools: Vec<NamedFunction>,
        /// How to choose among them (defaults to `auto`; always echoed).
        mode: ToolChoiceMode,
    },
}

impl Default for ToolChoice {
    fn default() -> Self {
        Self::Mode(ToolChoiceMode::Auto)
    }
}

/// `text.format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    /// Plain text (the default).
    Text,
    /// Any JSON object (accepted as an extension; the response schema has it).
    JsonObject,
    /// JSON matching `schema`.
    JsonSchema {
        /// Schema name (echoed as `"response"` when the request had none).
        name: String,
        /// What the schema is for.
        description: Option<String>,
        /// The JSON Schema. Serialized as `null` in the response echo, as
        /// the response schema demands (digest §3, a spec bug); the value
        /// here is what the request sent.
        #[serde(serialize_with = "serialize_null")]
        schema: Option<Value>,
        /// Strict adherence (default false).
        strict: bool,
    },
}

fn serialize_null<S: serde::Serializer>(_: &Option<Value>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_none()
}

/// `text.verbosity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verbosity {
    /// Terse.
    Low,
    /// Normal.
    Medium,
    /// Verbose.
    High,
}

/// `text`: `{format, verbosity?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// Output format.
    pub format: TextFormat,
    /// Verbosity hint, echoed only when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<Verbosity>,
}

impl Default for TextConfig {
    fn default() -> Self {
        Self {
            format: TextFormat::Text,
            verbosity: None,
        }
    }
}

/// `reasoning.effort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// No reasoning.
    None,
    /// Low.
    Low,
    /// Medium.
    Medium,
    /// High.
    High,
    /// Extra high.
    Xhigh,
}

/// `reasoning.summary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningSummary {
    /// Short.
    Concise,
    /// Long.
    Detailed,
    /// Server's choice.
    Auto,
}

/// `reasoning`: `{effort, summary}` (both keys always echoed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReasoningConfig {
    /// Effort.
    pub effort: Option<ReasoningEffort>,
    /// Summary style.
    pub summary: Option<ReasoningSummary>,
}

/// `truncation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Truncation {
    /// Drop the oldest context to fit.
    Auto,
    /// Fail with 400 `context_length_exceeded` when too long (the default).
    #[default]
    Disabled,
}

/// An `include` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Include {
    /// `reasoning.encrypted_content`.
    #[serde(rename = "reasoning.encrypted_content")]
    ReasoningEncryptedContent,
    /// `message.output_text.logprobs`.
    #[serde(rename = "message.output_text.logprobs")]
    MessageOutputTextLogprobs,
}

/// `service_tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceTier {
    /// Server's choice (the default).
    #[default]
    Auto,
    /// Default tier.
    Default,
    /// Flex tier.
    Flex,
    /// Priority tier.
    Priority,
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Whether delta events may carry `obfuscation` padding (default true;
    /// Spindle never sends it).
    pub include_obfuscation: Option<bool>,
}
