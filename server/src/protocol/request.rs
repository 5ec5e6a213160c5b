//! The create-response request (digest §2): [`validate`] turns a JSON body
//! into a [`ValidRequest`], or a 400 whose `param` names the offending field
//! path. Unknown fields are ignored; JSON `null` counts as absent.
//!
//! Extensions (documented, optional): `top_k` (int ≥ 0), `min_p` (0–1),
//! `repetition_penalty` (> 0), `seed` (int ≥ 0), the deprecated OpenAI
//! `user` (string ≤ 256), and `text.format.type = "json_object"`.

use super::config::{
    FunctionTool, Include, NamedFunction, ReasoningConfig, ReasoningEffort, ReasoningSummary,
    ServiceTier, SpecificToolChoice, StreamOptions, TextConfig, TextFormat, ToolChoice,
    ToolChoiceMode, Truncation, Verbosity,
};
use super::error::{codes, ApiError};
use super::items::{parse_input, req_function_name, InputItem};
use super::parse::{index_path, missing, Obj};
use serde_json::{Map, Value};

/// `temperature` when the request leaves it out (OpenAI's default, echoed).
pub const DEFAULT_TEMPERATURE: f64 = 1.0;
/// `top_p` when the request leaves it out.
pub const DEFAULT_TOP_P: f64 = 1.0;
/// The smallest `max_output_tokens` the schema allows.
pub const MIN_MAX_OUTPUT_TOKENS: u32 = 16;

/// Server-side limits the validator enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most items in `input`.
    pub max_input_items: usize,
    /// Most entries in `tools`.
    pub max_tools: usize,
    /// Largest `max_output_tokens` a request may ask for.
    pub max_output_tokens: u32,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_input_items: 2048,
            max_tools: 128,
            max_output_tokens: 32_768,
        }
    }
}

/// Sampling fields as sent (`None` = not sent; see the `DEFAULT_*` consts).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sampling {
    /// 0–2.
    pub temperature: Option<f64>,
    /// 0–1.
    pub top_p: Option<f64>,
    /// Extension: keep the k most likely tokens (0 disables).
    pub top_k: Option<u32>,
    /// Extension: min-p filter, 0–1.
    pub min_p: Option<f64>,
    /// Extension: HF repetition penalty, > 0 (1 disables).
    pub repetition_penalty: Option<f64>,
    /// −2–2.
    pub presence_penalty: Option<f64>,
    /// −2–2.
    pub frequency_penalty: Option<f64>,
    /// Extension: PRNG seed.
    pub seed: Option<u64>,
    /// 0–20 alternatives per token.
    pub top_logprobs: Option<u32>,
    /// Extension (as vLLM's): keep generating past end-of-sequence tokens
    /// until `max_output_tokens`, for benchmarks with fixed output lengths.
    pub ignore_eos: bool,
}

/// A checked create-response request. Everything the response echoes is here.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    /// Model id; `None` lets the server choose (set it to the resolved model
    /// before building a [`super::ResponseMapper`], which echoes it).
    pub model: Option<String>,
    /// The input items (a string input is one user message).
    pub input: Vec<InputItem>,
    /// Extra system guidance.
    pub instructions: Option<String>,
    /// Response to continue from.
    pub previous_response_id: Option<String>,
    /// SSE mode (default false).
    pub stream: bool,
    /// SSE options.
    pub stream_options: Option<StreamOptions>,
    /// Persist the response (default true).
    pub store: bool,
    /// Run asynchronously (default false; needs `store`).
    pub background: bool,
    /// Output-token cap (16 ..= the server's limit).
    pub max_output_tokens: Option<u32>,
    /// Sampling fields.
    pub sampling: Sampling,
    /// Function tools.
    pub tools: Vec<FunctionTool>,
    /// Tool choice (default `auto`).
    pub tool_choice: ToolChoice,
    /// Several tool calls per turn (default true).
    pub parallel_tool_calls: bool,
    /// Cap on tool calls (≥ 1).
    pub max_tool_calls: Option<u32>,
    /// `auto` or `disabled` (default).
    pub truncation: Truncation,
    /// Output format.
    pub text: TextConfig,
    /// Reasoning settings, if sent.
    pub reasoning: Option<ReasoningConfig>,
    /// Opt-in extra output.
    pub include: Vec<Include>,
    /// Up to 16 string pairs, echoed.
    pub metadata: Map<String, Value>,
    /// Abuse-monitoring id (≤ 64).
    pub safety_identifier: Option<String>,
    /// Deprecated OpenAI end-user id, echoed when sent.
    pub user: Option<String>,
    /// Prompt-cache key (≤ 64).
    pub prompt_cache_key: Option<String>,
    /// Service tier (default `auto`).
    pub service_tier: ServiceTier,
    /// Strings that end the output (Chat Completions' `stop`; not a field
    /// of the Responses API).
    pub stop: Vec<String>,
}

impl ValidRequest {
    /// Whether `include` asks for `entry`.
    pub fn includes(&self, entry: Include) -> bool {
        self.include.contains(&entry)
    }

    /// Whether the answer's tokens carry log-probabilities: `top_logprobs`
    /// given, or `include` asks for `message.output_text.logprobs`.
    pub fn wants_logprobs(&self) -> bool {
        self.sampling.top_logprobs.is_some() || self.includes(Include::MessageOutputTextLogprobs)
    }
}

/// Validates a create-response body against `limits`.
pub fn validate(body: Value, limits: &RequestLimits) -> Result<ValidRequest, ApiError> {
    let o = Obj::new(&body, "")?;
    let input = match o.get("input") {
        Some(v) => parse_input(v, limits.max_input_items)?,
        None => Vec::new(),
    };
    let store = o.opt_bool("store")?.unwrap_or(true);
    let background = o.opt_bool("background")?.unwrap_or(false);
    if background && !store {
        return Err(ApiError::invalid(
            "background",
            "background mode requires 'store' to be true.",
        ));
    }
    let tools = parse_tools(&o, limits.max_tools)?;
    let tool_choice = parse_tool_choice(&o, &tools)?;
    let request = ValidRequest {
        model: o.opt_string("model", 1, 256)?,
        input,
        instructions: o.opt_string("instructions", 0, super::items::MAX_TEXT_CHARS)?,
        previous_response_id: o.opt_string("previous_response_id", 1, 256)?,
        stream: o.opt_bool("stream")?.unwrap_or(false),
        stream_options: parse_stream_options(&o)?,
        store,
        background,
        max_output_tokens: opt_u32(
            &o,
            "max_output_tokens",
            MIN_MAX_OUTPUT_TOKENS,
            limits.max_output_tokens,
        )?,
        sampling: parse_sampling(&o)?,
        tools,
        tool_choice,
        parallel_tool_calls: o.opt_bool("parallel_tool_calls")?.unwrap_or(true),
        max_tool_calls: opt_u32(&o, "max_tool_calls", 1, u32::MAX)?,
        truncation: match o.opt_enum("truncation", &["auto", "disabled"])? {
            Some(0) => Truncation::Auto,
            _ => Truncation::Disabled,
        },
        text: parse_text(&o)?,
        reasoning: parse_reasoning(&o)?,
        include: parse_include(&o)?,
        metadata: parse_metadata(&o)?,
        safety_identifier: o.opt_string("safety_identifier", 0, 64)?,
        user: o.opt_string("user", 0, 256)?,
        prompt_cache_key: o.opt_string("prompt_cache_key", 0, 64)?,
        service_tier: parse_service_tier(&o)?,
        stop: Vec::new(),
    };
    if request.input.is_empty()
        && request.previous_response_id.is_none()
        && request.instructions.is_none()
    {
        return Err(missing("input"));
    }
    Ok(request)
}

fn opt_u32(o: &Obj<'_>, key: &str, min: u32, max: u32) -> Result<Option<u32>, ApiError> {
    Ok(o.opt_int(key, i64::from(min), i64::from(max))?
        .map(|x| x as u32))
}

fn parse_sampling(o: &Obj<'_>) -> Result<Sampling, ApiError> {
    let repetition_penalty = o.opt_f64("repetition_penalty", 0.0, 10.0)?;
    if repetition_penalty == Some(0.0) {
        return Err(ApiError::invalid_with_code(
            "repetition_penalty",
            codes::DECIMAL_BELOW_MIN_VALUE,
            "Invalid 'repetition_penalty': expected a value > 0.",
        ));
    }
    Ok(Sampling {
        temperature: o.opt_f64("temperature", 0.0, 2.0)?,
        top_p: o.opt_f64("top_p", 0.0, 1.0)?,
        top_k: opt_u32(o, "top_k", 0, u32::MAX)?,
        min_p: o.opt_f64("min_p", 0.0, 1.0)?,
        repetition_penalty,
        presence_penalty: o.opt_f64("presence_penalty", -2.0, 2.0)?,
        frequency_penalty: o.opt_f64("frequency_penalty", -2.0, 2.0)?,
        seed: o.opt_int("seed", 0, i64::MAX)?.map(|s| s as u64),
        top_logprobs: opt_u32(o, "top_logprobs", 0, 20)?,
        ignore_eos: o.opt_bool("ignore_eos")?.unwrap_or(false),
    })
}

fn parse_tools(o: &Obj<'_>, max_tools: usize) -> Result<Vec<FunctionTool>, ApiError> {
    let Some(list) = o.opt_array("tools")? else {
        return Ok(Vec::new());
    };
    if list.len() > max_tools {
        return Err(ApiError::invalid_with_code(
            "tools",
            codes::ARRAY_ABOVE_MAX_LENGTH,
            format!(
                "Invalid 'tools': array too long. Expected at most {max_tools} tools, but got {}.",
                list.len()
            ),
        ));
    }
    let mut tools: Vec<FunctionTool> = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let t = Obj::new(v, &index_path("tools", i))?;
        let kind = t
            .opt_str("type")?
            .ok_or_else(|| missing(&t.path_of("type")))?;
        if kind != "function" {
            let path = t.path_of("type");
            return Err(ApiError::invalid(
                &path,
                format!("Invalid value for '{path}': tool type '{kind}' is not supported; only 'function' tools are."),
            ));
        }
        let name = req_function_name(&t, "name")?;
        if tools.iter().any(|prev| prev.name == name) {
            let path = t.path_of("name");
            return Err(ApiError::invalid(
                &path,
                format!("Duplicate function name '{name}' in 'tools'."),
            ));
        }
        tools.push(FunctionTool {
            name,
            description: t.opt_string("description", 0, super::items::MAX_TEXT_CHARS)?,
            parameters: t
                .opt_obj("parameters")?
                .map(|p| Value::Object(p.map().clone())),
            strict: t.opt_bool("strict")?,
        });
    }
    Ok(tools)
}

/// Checks that `name` (at `path`) is one of `tools`.
fn check_tool_known(path: &str, name: &str, tools: &[FunctionTool]) -> Result<(), ApiError> {
    if tools.iter().any(|t| t.name == name) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            path,
            format!("Invalid '{path}': no function named '{name}' in 'tools'."),
        ))
    }
}

fn parse_tool_choice(o: &Obj<'_>, tools: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    const MODES: [ToolChoiceMode; 3] = [
        ToolChoiceMode::None,
        ToolChoiceMode::Auto,
        ToolChoiceMode::Required,
    ];
    let choice = match o.get("tool_choice") {
        None => return Ok(ToolChoice::default()),
        Some(Value::String(_)) => {
            let i = o
                .opt_enum("tool_choice", &["none", "auto", "required"])?
                .unwrap_or(1);
            ToolChoice::Mode(MODES[i])
        }
        Some(_) => {
            let c = o
                .opt_obj("tool_choice")?
                .ok_or_else(|| missing("tool_choice"))?;
            let kind = c.opt_enum("type", &["function", "allowed_tools"])?;
            match kind {
                None => return Err(missing("tool_choice.type")),
                Some(0) => {
                    let name = req_function_name(&c, "name")?;
                    check_tool_known("tool_choice.name", &name, tools)?;
                    ToolChoice::Specific(SpecificToolChoice::Function { name })
                }
                Some(_) => parse_allowed_tools(&c, tools)?,
            }
        }
    };
    if choice != ToolChoice::Mode(ToolChoiceMode::None)
        && choice != ToolChoice::Mode(ToolChoiceMode::Auto)
        && tools.is_empty()
    {
        return Err(ApiError::invalid(
            "tool_choice",
            "'tool_choice' requires 'tools' to be given.",
        ));
    }
    Ok(choice)
}

fn parse_allowed_tools(c: &Obj<'_>, tools: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    const MODES: [ToolChoiceMode; 3] = [
        ToolChoiceMode::None,
        ToolChoiceMode::Auto,
        ToolChoiceMode::Required,
    ];
    let list = c
        .opt_array("tools")?
        .ok_or_else(|| missing("tool_choice.tools"))?;
    if list.is_empty() || list.len() > 128 {
        return Err(ApiError::invalid(
            "tool_choice.tools",
            "'tool_choice.tools' must list 1 to 128 tools.",
        ));
    }
    let mut allowed = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let t = Obj::new(v, &index_path("tool_choice.tools", i))?;
        if t.opt_enum("type", &["function"])?.is_none() {
            return Err(missing(&t.path_of("type")));
        }
        let name = req_function_name(&t, "name")?;
        check_tool_known(&t.path_of("name"), &name, tools)?;
        allowed.push(NamedFunction { name });
    }
    let mode = c
        .opt_enum("mode", &["none", "auto", "required"])?
        .map_or(ToolChoiceMode::Auto, |i| MODES[i]);
    Ok(ToolChoice::Specific(SpecificToolChoice::AllowedTools {
        tools: allowed,
        mode,
    }))
}

fn parse_text(o: &Obj<'_>) -> Result<TextConfig, ApiError> {
    const VERBOSITY: [Verbosity; 3] = [Verbosity::Low, Verbosity::Medium, Verbosity::High];
    let Some(t) = o.opt_obj("text")? else {
        return Ok(TextConfig::default());
    };
    let verbosity = t
        .opt_enum("verbosity", &["low", "medium", "high"])?
        .map(|i| VERBOSITY[i]);
    let format = match t.opt_obj("format")? {
        None => TextFormat::Text,
        Some(f) => match f.opt_enum("type", &["text", "json_schema", "json_object"])? {
            None => return Err(missing("text.format.type")),
            Some(0) => TextFormat::Text,
            Some(2) => TextFormat::JsonObject,
            Some(_) => TextFormat::JsonSchema {
                name: f
                    .opt_string("name", 1, 64)?
                    .unwrap_or_else(|| "response".to_owned()),
                description: f.opt_string("description", 0, super::items::MAX_TEXT_CHARS)?,
                schema: f.opt_obj("schema")?.map(|s| Value::Object(s.map().clone())),
                strict: f.opt_bool("strict")?.unwrap_or(false),
            },
        },
    };
    Ok(TextConfig { format, verbosity })
}

fn parse_reasoning(o: &Obj<'_>) -> Result<Option<ReasoningConfig>, ApiError> {
    const EFFORT: [ReasoningEffort; 5] = [
        ReasoningEffort::None,
        ReasoningEffort::Low,
        ReasoningEffort::Medium,
        ReasoningEffort::High,
        ReasoningEffort::Xhigh,
    ];
    const SUMMARY: [ReasoningSummary; 3] = [
        ReasoningSummary::Concise,
        ReasoningSummary::Detailed,
        ReasoningSummary::Auto,
    ];
    let Some(r) = o.opt_obj("reasoning")? else {
        return Ok(None);
    };
    Ok(Some(ReasoningConfig {
        effort: r
            .opt_enum("effort", &["none", "low", "medium", "high", "xhigh"])?
            .map(|i| EFFORT[i]),
        summary: r
            .opt_enum("summary", &["concise", "detailed", "auto"])?
            .map(|i| SUMMARY[i]),
    }))
}

fn parse_include(o: &Obj<'_>) -> Result<Vec<Include>, ApiError> {
    const NAMES: [&str; 2] = [
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    ];
    let Some(list) = o.opt_array("include")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let path = index_path("include", i);
        let s = v
            .as_str()
            .ok_or_else(|| super::parse::wrong_type(&path, "a string", v))?;
        let entry = match super::parse::enum_index(&path, s, &NAMES)? {
            0 => Include::ReasoningEncryptedContent,
            _ => Include::MessageOutputTextLogprobs,
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out)
}

fn parse_metadata(o: &Obj<'_>) -> Result<Map<String, Value>, ApiError> {
    let Some(m) = o.opt_obj("metadata")? else {
        return Ok(Map::new());
    };
    if m.map().len() > 16 {
        return Err(ApiError::invalid_with_code(
            "metadata",
            codes::ARRAY_ABOVE_MAX_LENGTH,
            format!(
                "Invalid 'metadata': expected at most 16 keys, but got {}.",
                m.map().len()
            ),
        ));
    }
    for (key, value) in m.map() {
        let path = format!("metadata.{key}");
        if key.chars().count() > 64 {
            return Err(ApiError::invalid_with_code(
                "metadata",
                codes::STRING_ABOVE_MAX_LENGTH,
                "Invalid 'metadata': keys must be at most 64 characters.",
            ));
        }
        let s = value
            .as_str()
            .ok_or_else(|| super::parse::wrong_type(&path, "a string", value))?;
        super::parse::check_len(&path, s, 0, 512)?;
    }
    Ok(m.map().clone())
}

fn parse_service_tier(o: &Obj<'_>) -> Result<ServiceTier, ApiError> {
    const TIERS: [ServiceTier; 4] = [
        ServiceTier::Auto,
        ServiceTier::Default,
        ServiceTier::Flex,
        ServiceTier::Priority,
    ];
    Ok(
        o.opt_enum("service_tier", &["auto", "default", "flex", "priority"])?
            .map_or(ServiceTier::Auto, |i| TIERS[i]),
    )
}

fn parse_stream_options(o: &Obj<'_>) -> Result<Option<StreamOptions>, ApiError> {
    let Some(s) = o.opt_obj("stream_options")? else {
        return Ok(None);
    };
    Ok(Some(StreamOptions {
        include_obfuscation: s.opt_bool("include_obfuscation")?,
    }))
}
