//! What a request may generate, as a grammar for constrained decoding:
//! `tool_choice` (none / auto / required / one function / an allowed
//! subset), `parallel_tool_calls`, `max_tool_calls`, each tool's argument
//! schema, and `text.format` (JSON Schema or any JSON object).
//!
//! The prompt never changes with any of these (the tool list renders the
//! same bytes whatever `tool_choice` says, so the prefix cache keeps its
//! hits); only the grammar does. Grammars are llguidance Lark with `%json`
//! for schemas, in the tool-call format the chat template uses
//! ([`CallFormat`]).
//!
//! Schemas: the whole grammar is compiled once; only when that fails is each
//! schema compiled alone, to name the culprit. A tool with `strict: true` and
//! a `text.format` JSON Schema must compile, else 400 naming the unsupported
//! keyword. A non-strict tool whose
//! schema does not compile gets arguments constrained to any JSON object
//! (logged), since its schema is advisory.

use crate::protocol::error::ApiError;
use crate::protocol::request::ValidRequest;
use crate::protocol::{FunctionTool, SpecificToolChoice, TextFormat, ToolChoice, ToolChoiceMode};
use serde_json::{json, Value};
use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::tokenizer::Tokenizer;
use crate::app::format::reasoning::ThinkTags;
use spindle_engine::grammar::{GrammarCompiler, SharedConstraint};

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` blocks
    /// (Hermes / Qwen 2.5; Spindle's default for templates without tools);
    /// the tags' token ids when each is a single (added) token, as in Qwen's
    /// vocabulary, so the grammar emits those tokens rather than their text.
    Hermes(Option<HermesTags>),
    /// One bare `{"name": …, "parameters": {…}}` object (Llama 3.1).
    Llama3Json,
    /// `[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]` (Mistral v3); the
    /// marker's token id when it is a single (special) token.
    Mistral(Option<u32>),
}

/// Opens a Hermes call block.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a Hermes call block.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// Mistral's tool-call marker.
pub const MISTRAL_MARKER: &str = "[TOOL_CALLS]";

/// Hermes' tags around a call.
pub const HERMES_OPEN: &str = "<tool_call>";
/// See [`HERMES_OPEN`].
pub const HERMES_CLOSE: &str = "</tool_call>";

/// The token ids of `<tool_call>` and `</tool_call>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HermesTags {
    /// `<tool_call>`.
    pub open: u32,
    /// `</tool_call>`.
    pub close: u32,
}

impl CallFormat {
    /// The format a chat template implies (`tokenizer` finds Mistral's marker token).
    pub fn of(template: &ChatTemplate, tokenizer: &Tokenizer) -> Self {
        let source = template.source();
        let single = |text: &str| tokenizer.encode(text, false).ok().filter(|ids| ids.len() == 1).map(|ids| ids[0]);
        if !template.uses_tools() || source.contains(HERMES_OPEN) {
            let tags = single(HERMES_OPEN).zip(single(HERMES_CLOSE)).map(|(open, close)| HermesTags { open, close });
            Self::Hermes(tags)
        } else if source.contains(MISTRAL_MARKER) {
            Self::Mistral(single(MISTRAL_MARKER))
        } else {
            Self::Llama3Json
        }
    }

    /// The marker tokens, each with its text: a marker that decodes to no
    /// text (special) is put back into the text for the call parser.
    pub fn marker_tokens(self) -> Vec<(u32, &'static str)> {
        match self {
            Self::Mistral(Some(id)) => vec![(id, MISTRAL_MARKER)],
            Self::Hermes(Some(tags)) => vec![(tags.open, HERMES_OPEN), (tags.close, HERMES_CLOSE)],
            _ => Vec::new(),
        }
    }
}

/// The request's constraint, compiled, or `None` when nothing constrains it.
pub fn constraint_for(
    compiler: Option<&GrammarCompiler>,
    format: CallFormat,
    req: &ValidRequest,
) -> Result<Option<SharedConstraint>, ApiError> {
    constraint_after_thinking(compiler, format, req, None)
}

/// [`constraint_for`] for a thinking model: the reasoning (`think`'s tags;
/// `true` when the prompt already opened it) stays free, the grammar applies
/// to the answer, which may start with whitespace.
pub fn constraint_after_thinking(
    compiler: Option<&GrammarCompiler>,
    format: CallFormat,
    req: &ValidRequest,
    think: Option<(ThinkTags, bool)>,
) -> Result<Option<SharedConstraint>, ApiError> {
    let Some(plan) = Plan::of(req) else { return Ok(None) };
    let Some(compiler) = compiler else {
        // Plain `auto` over every tool with free text promises nothing a
        // grammar must keep; everything else needs one.
        if req.tool_choice == ToolChoice::Mode(ToolChoiceMode::Auto) && plan.text_schema.is_none() && !plan.json_object {
            return Ok(None);
        }
        let param = if plan.text_schema.is_some() || plan.json_object { "text.format" } else { "tool_choice" };
        return Err(ApiError::unsupported_capability(param, "Constrained decoding is not available for this model's tokenizer."));
    };
    let mut args: Vec<Value> = plan.tools.iter().map(|t| tool_schema(t)).collect();
    let compile = |args: &[Value]| {
        let lark = plan.lark(format, args);
        compiler.compile_lark(&if think.is_some() { lead_whitespace(&lark) } else { lark })
    };
    let mut constraint = match compile(&args) {
        Ok(c) => c,
        Err(_) => {
            // Only on failure: find the schema that cannot be enforced, one by one.
            if let Some(schema) = plan.text_schema {
                check_schema(compiler, schema, "text.format.schema")?;
            }
            for (tool, schema) in plan.tools.iter().zip(args.iter_mut()) {
                let index = req.tools.iter().position(|t| t.name == tool.name).unwrap_or(0);
                if let Err(e) = check_schema(compiler, schema, &format!("tools[{index}].parameters")) {
                    if tool.strict == Some(true) {
                        return Err(e);
                    }
                    tracing::warn!("tool '{}': arguments constrained to any JSON object ({})", tool.name, e.message);
                    *schema = json!({"type": "object"});
                }
            }
            compile(&args).map_err(|e| ApiError::internal(format!("grammar: {e}")))?
        }
    };
    if let Some((tags, starts_inside)) = think {
        constraint = constraint.after_thinking(tags.open, tags.close, starts_inside);
    }
    Ok(Some(constraint.shared()))
}

/// What the grammar must allow, before rendering.
struct Plan<'a> {
    /// Tools that may be called (empty: no calls).
    tools: Vec<&'a FunctionTool>,
    /// At least one call.
    required: bool,
    /// Most calls.
    max_calls: usize,
    /// The text's schema (`None`: free text).
    text_schema: Option<&'a Value>,
    /// Text is JSON (any object) without a schema.
    json_object: bool,
}

impl<'a> Plan<'a> {
    /// `None` when the request needs no grammar (no callable tools, free text).
    fn of(req: &'a ValidRequest) -> Option<Self> {
        let (names, required): (Option<Vec<&str>>, bool) = match &req.tool_choice {
            ToolChoice::Mode(ToolChoiceMode::None) => (Some(Vec::new()), false),
            ToolChoice::Mode(ToolChoiceMode::Auto) => (None, false),
            ToolChoice::Mode(ToolChoiceMode::Required) => (None, true),
            ToolChoice::Specific(SpecificToolChoice::Function { name }) => (Some(vec![name.as_str()]), true),
            ToolChoice::Specific(SpecificToolChoice::AllowedTools { tools, mode }) => match mode {
                ToolChoiceMode::None => (Some(Vec::new()), false),
                _ => (Some(tools.iter().map(|t| t.name.as_str()).collect()), *mode == ToolChoiceMode::Required),
            },
        };
        let tools: Vec<&FunctionTool> = match names {
            None => req.tools.iter().collect(),
            Some(names) => req.tools.iter().filter(|t| names.contains(&t.name.as_str())).collect(),
        };
        let (text_schema, json_object) = match &req.text.format {
            TextFormat::Text => (None, false),
            TextFormat::JsonObject => (None, true),
            TextFormat::JsonSchema { schema, .. } => (schema.as_ref(), schema.is_none()),
        };
        let forced_one = matches!(req.tool_choice, ToolChoice::Specific(SpecificToolChoice::Function { .. }));
        let max_calls = match (req.parallel_tool_calls, req.max_tool_calls) {
            _ if forced_one => 1,
            (false, _) => 1,
            (true, Some(n)) => n as usize,
            (true, None) => usize::MAX,
        };
        let tools = if max_calls == 0 { Vec::new() } else { tools };
        if tools.is_empty() && text_schema.is_none() && !json_object {
            return None;
        }
        Some(Self { tools, required: required && max_calls > 0, max_calls, text_schema, json_object })
    }

    /// The Lark grammar, with `args[i]` the argument schema of `tools[i]`.
    fn lark(&self, format: CallFormat, args: &[Value]) -> String {
        let mut g = String::new();
        let text = if let Some(schema) = self.text_schema {
            g.push_str(&format!("text_json: %json {}\n", with_layout(schema)));
            Some("text_json")
        } else if self.json_object {
            g.push_str(&format!("text_json: %json {}\n", with_layout(&json!({"type": "object"}))));
            Some("text_json")
        } else {
            None
        };
        if self.tools.is_empty() {
            g.insert_str(0, &format!("start: {}\n", text.unwrap_or("TEXT")));
            return g;
        }
        for (i, (tool, schema)) in self.tools.iter().zip(args).enumerate() {
            let head = match format {
                CallFormat::Hermes(_) => format!("{{\"name\": {}, \"arguments\": ", json!(tool.name)),
                CallFormat::Llama3Json => format!("{{\"name\": {}, \"parameters\": ", json!(tool.name)),
                CallFormat::Mistral(_) => format!("{{\"name\": {}, \"arguments\": ", json!(tool.name)),
            };
            g.push_str(&format!("body_{i}: {} args_{i} \"}}\"\nargs_{i}: %json {}\n", lark_string(&head), with_layout(schema)));
        }
        let bodies: Vec<String> = (0..self.tools.len()).map(|i| format!("body_{i}")).collect();
        g.push_str(&format!("body: {}\n", bodies.join(" | ")));
        let start = match format {
            CallFormat::Hermes(tags) => self.hermes(&mut g, text, tags),
            CallFormat::Llama3Json => self.llama3(text),
            CallFormat::Mistral(marker) => self.mistral(&mut g, text, marker),
        };
        g.insert_str(0, &format!("start: {start}\n"));
        g.push_str("TEXT: /(.|\\n)*/ & ~/(.|\\n)*<tool_call>(.|\\n)*/\n");
        g
    }

    /// Hermes rules; returns the start expansion. With single-token tags the
    /// calls are those tokens around the JSON (free text, made of bytes, can
    /// never produce them); otherwise the tags' text.
    fn hermes(&self, g: &mut String, text: Option<&str>, tags: Option<HermesTags>) -> String {
        match tags {
            Some(t) => g.push_str(&format!("call: <[{}]> \"\\n\" body \"\\n\" <[{}]>\n", t.open, t.close)),
            None => g.push_str("call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n"),
        }
        let more = match self.max_calls {
            1 => String::new(),
            usize::MAX => "(\"\\n\" call)*".to_string(),
            n => format!("(\"\\n\" call){{0,{}}}", n - 1),
        };
        g.push_str(&format!("calls: call {more}\n"));
        match (self.required, text, tags) {
            (true, _, _) => "calls".to_string(),
            (false, Some(json_text), _) => format!("{json_text} | calls"),
            (false, None, Some(_)) => "TEXT | TEXT calls".to_string(),
            (false, None, None) => {
                // Free text, or text up to the first `<tool_call>` and then calls.
                g.push_str("pre[suffix=\"<tool_call>\"]: /(.|\\n)*/\n");
                g.push_str(&format!("after_open: \"\\n\" body \"\\n</tool_call>\" {more}\n"));
                "TEXT | pre after_open".to_string()
            }
        }
    }

    /// Mistral rules: the marker (its token, or its text), then a JSON list
    /// of calls; free text cannot contain the marker. Returns the start expansion.
    fn mistral(&self, g: &mut String, text: Option<&str>, marker: Option<u32>) -> String {
        let more = match self.max_calls {
            1 => String::new(),
            usize::MAX => "(\", \" body)*".to_string(),
            n => format!("(\", \" body){{0,{}}}", n - 1),
        };
        let list = format!("\" [\" body {more} \"]\"");
        match marker {
            // A special token: free text (bytes) can never contain it.
            Some(id) => g.push_str(&format!("calls: <[{id}]> {list}\nMTEXT: /(.|\\n)*/\n")),
            // Text: free text may not contain it, and text before the calls
            // ends right at it (as Hermes' `<tool_call>`).
            None => {
                g.push_str(&format!("calls: {} {list}\n", lark_string(MISTRAL_MARKER)));
                g.push_str(&format!("after_marker: {list}\n"));
                g.push_str("MTEXT: /(.|\\n)*/ & ~/(.|\\n)*\\[TOOL_CALLS\\](.|\\n)*/\n");
                g.push_str("mpre[suffix=\"[TOOL_CALLS]\"]: /(.|\\n)*/\n");
            }
        }
        match (self.required, text, marker) {
            (true, _, _) => "calls".to_string(),
            (false, Some(json_text), _) => format!("{json_text} | calls"),
            (false, None, Some(_)) => "MTEXT | MTEXT calls".to_string(),
            (false, None, None) => "MTEXT | mpre after_marker".to_string(),
        }
    }

    /// Llama 3 JSON: one bare call object, or text that does not start with `{`.
    fn llama3(&self, text: Option<&str>) -> String {
        match (self.required, text) {
            (true, _) => "body".to_string(),
            (false, Some(json_text)) => format!("{json_text} | body"),
            (false, None) => "NOT_JSON | body\nNOT_JSON: /([^{ \\t\\n](.|\\n)*)?/".to_string(),
        }
    }
}

/// The grammar with optional whitespace before its start (after `</think>`).
fn lead_whitespace(lark: &str) -> String {
    match lark.split_once('\n') {
        Some((start, rest)) => {
            let body = start.trim_start_matches("start:").trim();
            format!("start: LEAD_WS? ({body})\n{rest}LEAD_WS: /[ \\t\\n]+/\n")
        }
        None => lark.to_string(),
    }
}

/// A tool's argument schema (`{"type":"object"}` when it has none).
fn tool_schema(tool: &FunctionTool) -> Value {
    match &tool.parameters {
        Some(Value::Object(o)) if !o.is_empty() => Value::Object(o.clone()),
        _ => json!({"type": "object"}),
    }
}

/// The schema with the JSON layout of the prompt's examples (`", "` and
/// `": "`, no free whitespace, so a small model cannot pad forever).
fn with_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.insert("x-guidance".into(), json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    s
}

/// Compiles `schema` alone: 400 naming `param` and the compiler's complaint
/// (e.g. `Unimplemented keys: ["if"]`) when it cannot be enforced.
fn check_schema(compiler: &GrammarCompiler, schema: &Value, param: &str) -> Result<(), ApiError> {
    if !schema.is_object() {
        return Err(ApiError::invalid(param, "A JSON Schema must be an object."));
    }
    compiler.compile_json_schema(with_layout(schema)).map(|_| ()).map_err(|e| {
        ApiError::invalid(param, format!("This JSON Schema cannot be enforced: {e}")).with_code("unsupported_schema")
    })
}

/// A Lark string literal.
fn lark_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::protocol::request::{validate, RequestLimits};

    fn req(extra: Value) -> ValidRequest {
        let mut body = json!({"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            {"type": "function", "name": "b"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        validate(body, &RequestLimits { max_input_items: 10, max_tools: 10, max_output_tokens: 100 }).unwrap()
    }

    #[test]
    fn plans_follow_tool_choice_and_call_limits() {
        let auto = req(json!({}));
        let p = Plan::of(&auto).unwrap();
        assert_eq!((p.tools.len(), p.required, p.max_calls), (2, false, usize::MAX));
        assert!(Plan::of(&req(json!({"tool_choice": "none"}))).is_none(), "none and free text: no grammar");
        let named = req(json!({"tool_choice": {"type": "function", "name": "b"}, "parallel_tool_calls": false}));
        let p = Plan::of(&named).unwrap();
        assert_eq!((p.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), p.required, p.max_calls), (vec!["b"], true, 1));
        let allowed = req(json!({"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "a"}]},
                                 "max_tool_calls": 3}));
        let p = Plan::of(&allowed).unwrap();
        assert_eq!((p.tools.len(), p.required, p.max_calls), (1, true, 3));
        let lark = p.lark(CallFormat::Hermes(None), &[json!({"type": "object"})]);
        assert!(lark.starts_with("start: calls\n"), "{lark}");
        assert!(lark.contains("(\"\\n\" call){0,2}"), "{lark}");
        assert!(lark.contains("{\\\"name\\\": \\\"a\\\", \\\"arguments\\\": \""), "{lark}");
        assert!(!lark.contains("\\\"b\\\""), "b is not allowed: {lark}");
    }

    #[test]
    fn hermes_tags_that_are_single_tokens_are_emitted_as_those_tokens() {
        let tags = CallFormat::Hermes(Some(HermesTags { open: 151657, close: 151658 }));
        let required = req(json!({"tool_choice": "required"}));
        let lark = Plan::of(&required).unwrap().lark(tags, &[json!({}), json!({})]);
        assert!(lark.contains("call: <[151657]> \"\\n\" body \"\\n\" <[151658]>\n"), "{lark}");
        assert!(!lark.contains("\"<tool_call>"), "the tags' text is not a way to call: {lark}");
        let auto = Plan::of(&req(json!({}))).unwrap().lark(tags, &[json!({}), json!({})]);
        assert!(auto.starts_with("start: TEXT | TEXT calls\n"), "{auto}");
        assert_eq!(tags.marker_tokens(), vec![(151657, HERMES_OPEN), (151658, HERMES_CLOSE)]);
    }

    #[test]
    fn thinking_models_may_lead_the_answer_with_whitespace() {
        let lark = "start: calls\ncall: x\n";
        assert_eq!(lead_whitespace(lark), "start: LEAD_WS? (calls)\ncall: x\nLEAD_WS: /[ \\t\\n]+/\n");
    }

    #[test]
    fn text_formats_plan_a_json_grammar() {
        let none = req(json!({"tool_choice": "none", "text": {"format": {"type": "json_object"}}}));
        let p = Plan::of(&none).unwrap();
        assert!(p.tools.is_empty() && p.json_object);
        assert!(p.lark(CallFormat::Hermes(None), &[]).starts_with("start: text_json\n"));
        let schema = req(json!({"tool_choice": "auto", "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}}}}));
        let p = Plan::of(&schema).unwrap();
        assert!(p.lark(CallFormat::Hermes(None), &[json!({}), json!({})]).starts_with("start: text_json | calls\n"));
    }
}
