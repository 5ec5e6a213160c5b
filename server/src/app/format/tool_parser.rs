//! The output side of function tools: a streaming parser from the model's
//! generated text to text and `function_call` [`MapperInput`]s (the prompt
//! side is `tools`).
//!
//! [`ToolCallParser`] reads the generated text as it streams and recognises:
//! - `<tool_call>{"name": "f", "arguments": {...}}</tool_call>` anywhere in
//!   the output (whitespace around the JSON allowed; `"parameters"` accepted
//!   for `"arguments"`; `arguments` may also be a string holding a JSON
//!   object; missing or `null` arguments mean `{}`); several blocks are
//!   parallel calls, each its own `function_call` item;
//! - Mistral style: `[TOOL_CALLS]` then a JSON list of such objects
//!   (`[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`), with
//!   [`ToolCallParser::mistral`];
//! - Llama 3 style: the output *starting* with a bare JSON object
//!   `{"name": "f", "parameters": {...}}` (or `"arguments"`); such an
//!   answer is held back until its first object closes;
//! - Qwen2.5-Coder style, for a response's tools ([`ToolCallParser::for_response`]):
//!   an answer that is exactly one JSON call object in a code fence
//!   (```` ```json … ``` ````) whose arguments fit the tool's schema
//!   ([`fenced`]); a fenced answer is held back until that is decided.
//!
//! A call is accepted only when `name` is one of the request's tools;
//! anything else (malformed JSON, an unknown name, an unterminated block) is
//! passed on unchanged as text, so no text is ever lost. Whitespace between
//! calls and around them is dropped (so no empty message items appear), as
//! is a missing or cut-off `</tool_call>` after a complete call.
//! `parallel_tool_calls: false` keeps the first call only and
//! `max_tool_calls` caps the calls; calls beyond the cap are dropped.
//! With `tool_choice: "none"` the output is not parsed at all (it is text).
//!
//! A call written exactly as `{"name": "f", "arguments": ` (or
//! `"parameters"`), which is what constrained decoding makes the model write
//! ([`crate::app::format::constrain`]), streams: `FunctionCallStarted` as soon as the name
//! is complete, then the arguments' text as it is generated, then
//! `FunctionCallDone` at its closing bracket ([`crate::app::format::tool_stream`]). Other
//! spellings are parsed whole and their arguments reported as compact JSON in
//! one delta.

mod fenced;

use fenced::Fenced;
use crate::app::format::tool_stream::{match_head, scan_object, ArgScanner, Head, Scan};
use crate::app::format::constrain::{CallFormat, MISTRAL_MARKER, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};
use crate::protocol::mapper::{new_call_id, FinishKind, MapperInput};
use crate::protocol::{LogProb, ResponseObject, ToolChoice, ToolChoiceMode};
use serde_json::Value;

/// Where the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Only whitespace so far: a bare JSON call may still come.
    Start,
    /// Plain text (watching for [`TOOL_CALL_OPEN`]).
    Text,
    /// Inside `<tool_call>`: buffering the JSON object.
    Call,
    /// After a call's JSON: skipping whitespace and [`TOOL_CALL_CLOSE`].
    Close,
    /// The output began with `{`: buffering it as a possible bare call.
    Bare,
    /// Inside a streamed call's arguments (see [`crate::app::format::tool_stream`]).
    Args,
    /// After a streamed call's arguments: skipping the call object's `}`.
    AfterArgs,
    /// After Mistral's `[TOOL_CALLS]`: expecting the list's `[`.
    ListOpen,
    /// The output began with a code fence: holding it back while it may be
    /// one fenced JSON call ([`fenced`]).
    Fenced,
}

/// Streaming parser from generated text to text and function-call
/// [`MapperInput`]s (formats: see the module docs). Pure: feed deltas with
/// [`push`](Self::push), end with [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    names: Vec<String>,
    limit: usize,
    mode: Mode,
    /// Text not yet emitted (held back, or the open call's body).
    buf: String,
    /// Whitespace just before an open tag (emitted if the block is malformed).
    held_ws: String,
    /// A call ended and no text followed yet (leading whitespace is dropped).
    after_call: bool,
    /// Calls accepted so far (emitted or dropped by the cap).
    calls: usize,
    /// The streamed call's argument scanner.
    args: ArgScanner,
    /// Whether the streamed call is reported (within the cap).
    emitting: bool,
    /// Mistral's `[TOOL_CALLS] [call, …]` instead of `<tool_call>` blocks.
    list: bool,
    /// What followed the open tag before the call (a list's ` [`, or the
    /// `, ` before a list's next call), emitted if the block is malformed.
    held_after: String,
    /// The open call follows a `,` in a list: a malformed one re-emits only
    /// the separator (the tag was not written there).
    list_next: bool,
    /// Each tool's parameter schema; when set, an answer that is exactly one
    /// fenced JSON object calling a tool with fitting arguments is a call.
    schemas: Option<Vec<(String, Option<Value>)>>,
    /// Log-probabilities of tokens whose text is not emitted yet: they go
    /// with the next text emitted, or are dropped when the text is a call.
    logprobs: Vec<LogProb>,
    /// The output was cut by a token limit: text held back as the start of
    /// a call tag is that call's unfinished start, not text.
    cut: bool,
}

impl ToolCallParser {
    /// A parser accepting calls to `names`; `parallel_tool_calls: false`
    /// keeps only the first call, `max_tool_calls` caps them.
    pub fn new<S: Into<String>>(
        names: impl IntoIterator<Item = S>,
        parallel_tool_calls: bool,
        max_tool_calls: Option<u32>,
    ) -> Self {
        let cap = max_tool_calls.map_or(usize::MAX, |n| n as usize);
        Self {
            names: names.into_iter().map(Into::into).collect(),
            limit: if parallel_tool_calls { cap } else { cap.min(1) },
            mode: Mode::Start,
            buf: String::new(),
            held_ws: String::new(),
            after_call: false,
            calls: 0,
            args: ArgScanner::default(),
            emitting: false,
            list: false,
            held_after: String::new(),
            list_next: false,
            schemas: None,
            logprobs: Vec::new(),
            cut: false,
        }
    }

    /// Also reads an answer that is exactly one fenced JSON object naming
    /// one of these tools (name, parameter schema) with arguments that fit
    /// its schema as a call.
    pub fn with_fenced_calls(mut self, schemas: Vec<(String, Option<Value>)>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Reads Mistral's `[TOOL_CALLS] [call, …]` lists instead of `<tool_call>` blocks.
    pub fn mistral(mut self) -> Self {
        self.list = true;
        self
    }

    /// The tag that opens calls.
    fn open_tag(&self) -> &'static str {
        if self.list {
            MISTRAL_MARKER
        } else {
            TOOL_CALL_OPEN
        }
    }

    /// The parser for a response echoing its request: `None` when no call
    /// may be made (no function tools, `tool_choice: "none"` or
    /// `allowed_tools` in mode `none`): text is then text.
    pub fn for_response(response: &ResponseObject, format: CallFormat) -> Option<Self> {
        let no_calls = match &response.tool_choice {
            ToolChoice::Mode(ToolChoiceMode::None) => true,
            ToolChoice::Specific(crate::protocol::SpecificToolChoice::AllowedTools { mode, .. }) => *mode == ToolChoiceMode::None,
            _ => false,
        };
        if response.tools.is_empty() || no_calls || response.max_tool_calls == Some(0) {
            return None;
        }
        let schemas = response.tools.iter().map(|t| (t.name.clone(), t.parameters.clone())).collect();
        let parser = Self::new(response.tools.iter().map(|t| t.name.clone()), response.parallel_tool_calls, response.max_tool_calls)
            .with_fenced_calls(schemas);
        Some(if matches!(format, CallFormat::Mistral(_)) { parser.mistral() } else { parser })
    }

    /// Feeds generated text; returns what can be reported so far.
    pub fn push(&mut self, delta: &str) -> Vec<MapperInput> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.drain(false, &mut out);
        out
    }

    /// The output ended: flushes everything still held back.
    pub fn finish(&mut self) -> Vec<MapperInput> {
        let mut out = Vec::new();
        self.drain(true, &mut out);
        out
    }

    /// Passes `input` through the parser: text is parsed, the end flushes
    /// the parser before [`MapperInput::Finished`], the rest passes as is.
    /// (Log-probabilities go with the text their tokens end up in; those of
    /// a call's tokens are dropped.)
    pub fn route(&mut self, input: MapperInput) -> Vec<MapperInput> {
        match input {
            MapperInput::TextDelta(text) => self.push(&text),
            MapperInput::TextDeltaWithLogprobs { text, logprobs } => {
                self.logprobs.extend(logprobs);
                self.push(&text)
            }
            finished @ MapperInput::Finished { .. } => {
                self.cut = matches!(&finished, MapperInput::Finished { reason: FinishKind::MaxOutputTokens | FinishKind::ContextLength, .. });
                let mut out = self.finish();
                out.push(finished);
                out
            }
            other => vec![other],
        }
    }

    /// Runs the state machine until it needs more text (or, at the end,
    /// until everything is flushed).
    fn drain(&mut self, end: bool, out: &mut Vec<MapperInput>) {
        loop {
            let again = match self.mode {
                Mode::Start => self.step_start(end),
                Mode::Text => self.step_text(end, out),
                Mode::Call => self.step_call(end, out),
                Mode::Close => self.step_close(end),
                Mode::Bare => self.step_bare(end, out),
                Mode::Args => self.step_args(end, out),
                Mode::AfterArgs => self.step_after_args(end),
                Mode::ListOpen => self.step_list_open(end, out),
                Mode::Fenced => self.step_fenced(end, out),
            };
            if !again {
                return;
            }
        }
    }

    fn step_start(&mut self, end: bool) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() && !end {
            return false;
        }
        let fences = self.schemas.is_some();
        if fences && !end && fenced::could_open(&self.buf) {
            return false;
        }
        self.mode = if trimmed.starts_with('{') {
            Mode::Bare
        } else if fences && fenced::opens(&self.buf) {
            Mode::Fenced
        } else {
            Mode::Text
        };
        true
    }

    /// Holds a fenced answer back until it is one JSON call (at the end of
    /// the output) or cannot be one (then it is text).
    fn step_fenced(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        match fenced::match_fenced(&self.buf, end) {
            Fenced::Undecided { object: None } => false,
            Fenced::Undecided { object: Some(object) } => {
                if self.fenced_call(&self.buf[object]).is_some() {
                    return false;
                }
                self.mode = Mode::Text;
                true
            }
            Fenced::Call { object } => {
                if let Some((name, arguments)) = self.fenced_call(&self.buf[object]) {
                    self.buf.clear();
                    self.accept(name, arguments, out);
                }
                self.mode = Mode::Text;
                true
            }
            Fenced::NotACall => {
                self.mode = Mode::Text;
                true
            }
        }
    }

    /// `(name, arguments)` when `json` calls a tool with arguments that fit
    /// its schema.
    fn fenced_call(&self, json: &str) -> Option<(String, String)> {
        let (name, arguments) = self.parse_call(json)?;
        let schemas = self.schemas.as_ref()?;
        let (_, schema) = schemas.iter().find(|(n, _)| *n == name)?;
        fenced::arguments_fit(schema.as_ref(), &arguments).then_some((name, arguments))
    }

    fn step_text(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        let open = self.open_tag();
        if let Some(at) = self.buf.find(open) {
            let before = self.buf[..at].trim_end().to_owned();
            self.held_ws = self.buf[before.len()..at].to_owned();
            self.buf.drain(..at + open.len());
            self.emit_text(&before, out);
            self.mode = if self.list { Mode::ListOpen } else { Mode::Call };
            return true;
        }
        if end {
            let mut rest = std::mem::take(&mut self.buf);
            let unfinished_tag = partial_suffix(&rest, open);
            if self.cut && unfinished_tag > 0 {
                rest.truncate(rest.len() - unfinished_tag);
                rest.truncate(rest.trim_end().len());
            }
            self.emit_text(&rest, out);
            return false;
        }
        let keep_from = self.buf.len() - partial_suffix(&self.buf, open);
        let ready = self.buf[..keep_from].trim_end().len();
        let text: String = self.buf.drain(..ready).collect();
        self.emit_text(&text, out);
        false
    }

    fn step_call(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        let lead = self.buf.len() - self.buf.trim_start().len();
        let body = &self.buf[lead..];
        if body.is_empty() {
            return end && self.malformed(out);
        }
        if !body.starts_with('{') {
            return self.malformed(out);
        }
        match match_head(body, &self.names) {
            Head::Complete { name, len } => {
                self.buf.drain(..lead + len);
                self.held_ws.clear();
                self.held_after.clear();
                self.list_next = false;
                self.start_streamed(name, out);
                return true;
            }
            Head::Partial if !end => return false,
            Head::Partial | Head::NoMatch => {}
        }
        match scan_object(body) {
            Scan::Complete(n) => match self.parse_call(&body[..n]) {
                Some((name, arguments)) => {
                    self.buf.drain(..lead + n);
                    self.held_ws.clear();
                    self.held_after.clear();
                    self.list_next = false;
                    self.accept(name, arguments, out);
                    self.mode = Mode::Close;
                    true
                }
                None => self.malformed(out),
            },
            Scan::Incomplete if end || (!self.list && body.contains(TOOL_CALL_CLOSE)) => self.malformed(out),
            Scan::Incomplete => false,
        }
    }

    fn step_close(&mut self, end: bool) -> bool {
        if self.list {
            return self.step_list_next(end);
        }
        let trimmed = self.buf.trim_start();
        if let Some(rest) = trimmed.strip_prefix(TOOL_CALL_CLOSE) {
            self.buf = rest.to_owned();
            self.mode = Mode::Text;
            return true;
        }
        if TOOL_CALL_CLOSE.starts_with(trimmed) {
            // Whitespace or a cut-off closing tag: wait, or drop at the end.
            if !end {
                return false;
            }
            self.buf.clear();
        }
        self.mode = Mode::Text;
        true
    }

    /// After `[TOOL_CALLS]`: the list's `[` (else the marker was text).
    fn step_list_open(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() {
            return end && self.malformed(out);
        }
        let Some(rest) = trimmed.strip_prefix('[') else { return self.malformed(out) };
        let rest = rest.to_owned();
        self.held_after = self.buf[..self.buf.len() - rest.len()].to_owned();
        self.buf = rest;
        self.mode = Mode::Call;
        true
    }

    /// After a call in a list: `,` and the next call, or `]` and text.
    fn step_list_next(&mut self, end: bool) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() && !end {
            return false;
        }
        if let Some(rest) = trimmed.strip_prefix(',') {
            let rest = rest.to_owned();
            self.held_after = self.buf[..self.buf.len() - rest.len()].to_owned();
            self.list_next = true;
            self.buf = rest;
            self.mode = Mode::Call;
            return true;
        }
        if let Some(rest) = trimmed.strip_prefix(']') {
            self.buf = rest.to_owned();
        }
        self.mode = Mode::Text;
        true
    }

    fn step_bare(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        let lead = self.buf.len() - self.buf.trim_start().len();
        let body = &self.buf[lead..];
        match match_head(body, &self.names) {
            Head::Complete { name, len } => {
                self.buf.drain(..lead + len);
                self.start_streamed(name, out);
                return true;
            }
            Head::Partial if !end => return false,
            Head::Partial | Head::NoMatch => {}
        }
        match scan_object(body) {
            Scan::Complete(n) => {
                if let Some((name, arguments)) = self.parse_call(&body[..n]) {
                    self.buf.drain(..lead + n);
                    self.accept(name, arguments, out);
                    self.mode = Mode::Close;
                } else {
                    self.mode = Mode::Text;
                }
                true
            }
            Scan::Incomplete if end => {
                self.mode = Mode::Text;
                true
            }
            Scan::Incomplete => false,
        }
    }

    /// A streamed call's head is complete: report the call (within the cap).
    fn start_streamed(&mut self, name: String, out: &mut Vec<MapperInput>) {
        self.logprobs.clear();
        self.emitting = self.calls < self.limit;
        if self.emitting {
            out.push(MapperInput::FunctionCallStarted { call_id: new_call_id(), name });
        }
        self.calls = self.calls.saturating_add(1);
        self.after_call = true;
        self.args = ArgScanner::default();
        self.mode = Mode::Args;
    }

    /// Passes on the arguments as they arrive; at their closing bracket the
    /// call is done. Output that ends inside them (the token limit) leaves
    /// the call open, so the response closes it as `incomplete`.
    fn step_args(&mut self, end: bool, out: &mut Vec<MapperInput>) -> bool {
        let (n, closed) = self.args.feed(&self.buf);
        let delta: String = self.buf.drain(..n).collect();
        self.logprobs.clear();
        if self.emitting && !delta.is_empty() {
            out.push(MapperInput::FunctionCallArgumentsDelta(delta));
        }
        if closed && self.emitting {
            out.push(MapperInput::FunctionCallDone);
        }
        if closed || end {
            self.mode = Mode::AfterArgs;
        }
        closed
    }

    /// Drops the `}` that closes the call object after its arguments.
    fn step_after_args(&mut self, end: bool) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() && !end {
            return false;
        }
        if let Some(rest) = trimmed.strip_prefix('}') {
            self.buf = rest.to_owned();
        }
        self.mode = Mode::Close;
        true
    }

    /// The open block is not a call: its tag (with the whitespace before it)
    /// and body go on as text.
    fn malformed(&mut self, out: &mut Vec<MapperInput>) -> bool {
        let tag = if std::mem::take(&mut self.list_next) { "" } else { self.open_tag() };
        let tag = format!("{}{tag}{}", std::mem::take(&mut self.held_ws), std::mem::take(&mut self.held_after));
        self.emit_text(&tag, out);
        self.mode = Mode::Text;
        true
    }

    /// Emits `text` (without leading whitespace right after a call).
    fn emit_text(&mut self, text: &str, out: &mut Vec<MapperInput>) {
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        if !text.is_empty() {
            out.push(match std::mem::take(&mut self.logprobs) {
                lp if lp.is_empty() => MapperInput::TextDelta(text.to_owned()),
                logprobs => MapperInput::TextDeltaWithLogprobs { text: text.to_owned(), logprobs },
            });
            self.after_call = false;
        }
    }

    /// Reports a parsed call unless the cap is reached.
    fn accept(&mut self, name: String, arguments: String, out: &mut Vec<MapperInput>) {
        self.logprobs.clear();
        if self.calls < self.limit {
            out.push(MapperInput::FunctionCallStarted {
                call_id: new_call_id(),
                name,
            });
            out.push(MapperInput::FunctionCallArgumentsDelta(arguments));
            out.push(MapperInput::FunctionCallDone);
        }
        self.calls = self.calls.saturating_add(1);
        self.after_call = true;
    }

    /// `(name, compact arguments)` when `json` is a call to a known tool.
    fn parse_call(&self, json: &str) -> Option<(String, String)> {
        let value: Value = serde_json::from_str(json).ok()?;
        let object = value.as_object()?;
        let name = object.get("name")?.as_str()?;
        if !self.names.iter().any(|n| n == name) {
            return None;
        }
        let arguments = match object.get("arguments").or_else(|| object.get("parameters")) {
            None | Some(Value::Null) => "{}".to_owned(),
            Some(v @ Value::Object(_)) => v.to_string(),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s).ok()? {
                v @ Value::Object(_) => v.to_string(),
                _ => return None,
            },
            Some(_) => return None,
        };
        Some((name.to_owned(), arguments))
    }
}

/// Routes `inputs` through `parser` when there is one.
pub fn route_all(
    parser: Option<&mut ToolCallParser>,
    inputs: Vec<MapperInput>,
) -> Vec<MapperInput> {
    match parser {
        None => inputs,
        Some(p) => inputs.into_iter().flat_map(|i| p.route(i)).collect(),
    }
}

/// Length of the longest proper prefix of `tag` that `text` ends with.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
