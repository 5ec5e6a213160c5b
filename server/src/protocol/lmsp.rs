//! LMSP 1.0 (a local model service protocol on the Responses shape): its
//! response object, output items and stream events, typed. The
//! `lmsp_events!` list below is the one source of LMSP event names.

use super::error::ResponseError;
use super::events::StreamEvent;
use super::items::Role;
use super::output::{CompactionItem, FunctionCallOutputItem, OutputContent, OutputItem};
use super::response::{IncompleteDetails, ResponseObject, ResponseStatus, Usage};
use serde::{Deserialize, Serialize};

/// The protocol version served.
pub const LMSP_VERSION: &str = "1.0";

/// Capabilities this server declares (checked on every request).
pub const CAPABILITIES: &[&str] = &["text", "streaming", "tools", "structured_output", "conversations", "tasks"];

/// A problem document (`application/problem+json`), as LMSP errors are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemDoc {
    /// `https://spindle.dev/problems/<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The code in words.
    pub title: String,
    /// The HTTP status it stands for.
    pub status: u16,
    /// What happened.
    pub detail: String,
    /// Machine-readable code.
    pub code: String,
    /// The request field at fault, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

impl ProblemDoc {
    /// A problem with `code` (its title is the code in words).
    pub fn new(status: u16, code: &str, detail: impl Into<String>) -> Self {
        Self { kind: format!("https://spindle.dev/problems/{code}"), title: title(code), status, detail: detail.into(), code: code.to_string(), param: None }
    }

    /// A failed generation's problem (status 500, titled "Generation failed").
    pub fn generation_failed(code: &str, detail: impl Into<String>) -> Self {
        Self { title: "Generation failed".into(), ..Self::new(500, code, detail) }
    }

    fn of_response_error(error: Option<&ResponseError>) -> Self {
        match error {
            Some(e) => Self::generation_failed(&e.code, e.message.clone()),
            None => Self::generation_failed("server_error", "The generation ended without a result."),
        }
    }
}

/// `server_error` → `Server error`.
fn title(code: &str) -> String {
    let mut t = code.replace('_', " ");
    if let Some(first) = t.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    t
}

/// LMSP's usage: `{input_tokens, output_tokens, total_tokens}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LmspUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

impl From<Usage> for LmspUsage {
    fn from(u: Usage) -> Self {
        Self { input_tokens: u.input_tokens, output_tokens: u.output_tokens, total_tokens: u.input_tokens + u.output_tokens }
    }
}

/// A message's content part with LMSP's fields: `{type, text}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmspPart {
    /// `output_text`, `refusal`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text (`null` for a refusal).
    pub text: Option<String>,
}

impl From<&OutputContent> for LmspPart {
    fn from(p: &OutputContent) -> Self {
        let (kind, text) = match p {
            OutputContent::OutputText { text, .. } => ("output_text", Some(text.clone())),
            OutputContent::Refusal { .. } => ("refusal", None),
            OutputContent::ReasoningText { text } => ("reasoning_text", Some(text.clone())),
            OutputContent::SummaryText { text } => ("summary_text", Some(text.clone())),
        };
        Self { kind: kind.to_string(), text }
    }
}

/// An output item with only the fields LMSP defines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LmspItem {
    /// `{id, type, role, content}`.
    Message {
        /// `msg_…`.
        id: String,
        /// Always `assistant`.
        role: Role,
        /// The parts.
        content: Vec<LmspPart>,
    },
    /// `{id, type, call_id, name, arguments}`.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// What the client's result refers to.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments as JSON text.
        arguments: String,
    },
    /// `{id, type, summary}`.
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Summary parts.
        summary: Vec<OutputContent>,
    },
    /// A function's result, as Open Responses writes it.
    FunctionCallOutput(FunctionCallOutputItem),
    /// A compacted window, as Open Responses writes it.
    Compaction(CompactionItem),
}

impl From<&OutputItem> for LmspItem {
    fn from(item: &OutputItem) -> Self {
        match item {
            OutputItem::Message(m) => Self::Message { id: m.id.clone(), role: m.role, content: m.content.iter().map(LmspPart::from).collect() },
            OutputItem::FunctionCall(c) => {
                Self::FunctionCall { id: c.id.clone(), call_id: c.call_id.clone(), name: c.name.clone(), arguments: c.arguments.clone() }
            }
            OutputItem::Reasoning(r) => Self::Reasoning { id: r.id.clone(), summary: r.summary.clone() },
            OutputItem::FunctionCallOutput(o) => Self::FunctionCallOutput(o.clone()),
            OutputItem::Compaction(c) => Self::Compaction(c.clone()),
        }
    }
}

/// LMSP's response object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmspResponse {
    /// `resp_…`.
    pub id: String,
    /// Always `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Where it stands.
    pub status: ResponseStatus,
    /// The model that answered (empty when unknown).
    #[serde(default)]
    pub model: String,
    /// Output items.
    pub output: Vec<LmspItem>,
    /// Token counts (zeros before any are known, as LMSP 1.0 always sends them).
    pub usage: Option<LmspUsage>,
    /// Why it failed.
    pub error: Option<ProblemDoc>,
    /// Why it is incomplete.
    pub incomplete_details: Option<IncompleteDetails>,
}

impl From<&ResponseObject> for LmspResponse {
    fn from(r: &ResponseObject) -> Self {
        Self {
            id: r.id.clone(),
            object: "response".into(),
            created_at: r.created_at,
            status: r.status,
            model: r.model.clone(),
            output: r.output.iter().map(LmspItem::from).collect(),
            usage: Some(r.usage.map(LmspUsage::from).unwrap_or_default()),
            error: (r.status == ResponseStatus::Failed).then(|| ProblemDoc::of_response_error(r.error.as_ref())),
            incomplete_details: r.incomplete_details.clone(),
        }
    }
}

impl LmspResponse {
    /// The response ended as `status`: `cancelled` carries no error.
    pub fn ended_as(mut self, status: ResponseStatus) -> Self {
        self.status = status;
        if status == ResponseStatus::Cancelled {
            self.error = None;
        }
        self
    }
}

/// `data` of a lifecycle event: `{response_id, status, ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmspStatus {
    /// The response.
    pub response_id: String,
    /// Where it stands.
    pub status: ResponseStatus,
    /// Why it is incomplete (`response.incomplete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete_details: Option<IncompleteDetails>,
    /// Token counts (`completed`, `incomplete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<LmspUsage>,
    /// Why it failed (`response.failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ProblemDoc>,
}

impl LmspStatus {
    /// Only the id and the status.
    pub fn bare(response_id: &str, status: ResponseStatus) -> Self {
        Self { response_id: response_id.to_string(), status, incomplete_details: None, usage: None, error: None }
    }
}

/// `data` of `response.output_item.{added,done}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmspItemEvent {
    /// The response.
    pub response_id: String,
    /// The item's index in `output`.
    pub output_index: usize,
    /// The item.
    pub item: LmspItem,
}

/// `data` of a text or arguments delta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmspDelta {
    /// The response.
    pub response_id: String,
    /// The item it extends.
    pub item_id: String,
    /// New text.
    pub delta: String,
}

macro_rules! lmsp_events {
    ($( $(#[doc = $doc:literal])* $variant:ident($payload:ty) = $name:literal, )*) => {
        /// An LMSP stream event: serializes as `{"event": <name>, "data": {...}}`
        /// (the SSE fields).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "event", content = "data")]
        pub enum LmspEvent {
            $( $(#[doc = $doc])* #[serde(rename = $name)] $variant($payload), )*
        }

        impl LmspEvent {
            /// The SSE `event:` name.
            pub fn name(&self) -> &'static str {
                match self { $( Self::$variant(_) => $name, )* }
            }
        }
    };
}

lmsp_events! {
    /// `response.created`.
    Created(LmspStatus) = "response.created",
    /// `response.output_item.added`.
    OutputItemAdded(LmspItemEvent) = "response.output_item.added",
    /// `response.output_item.done`.
    OutputItemDone(LmspItemEvent) = "response.output_item.done",
    /// `response.output_text.delta`.
    OutputTextDelta(LmspDelta) = "response.output_text.delta",
    /// `response.function_call_arguments.delta`.
    FunctionCallArgumentsDelta(LmspDelta) = "response.function_call_arguments.delta",
    /// `response.completed`: terminal.
    Completed(LmspStatus) = "response.completed",
    /// `response.incomplete`: terminal.
    Incomplete(LmspStatus) = "response.incomplete",
    /// `response.failed`: terminal.
    Failed(LmspStatus) = "response.failed",
    /// `response.cancelled`: terminal.
    Cancelled(LmspStatus) = "response.cancelled",
}

impl LmspEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Completed(_) | Self::Incomplete(_) | Self::Failed(_) | Self::Cancelled(_))
    }

    /// The terminal status this event sets (`None` for the others).
    pub fn terminal_status(&self) -> Option<ResponseStatus> {
        match self {
            Self::Completed(s) | Self::Incomplete(s) | Self::Failed(s) | Self::Cancelled(s) => Some(s.status),
            _ => None,
        }
    }

    /// `response.cancelled` for `response_id`.
    pub fn cancelled(response_id: &str) -> Self {
        Self::Cancelled(LmspStatus::bare(response_id, ResponseStatus::Cancelled))
    }

    /// `response.failed` for `response_id` with `error`.
    pub fn failed(response_id: &str, error: ProblemDoc) -> Self {
        Self::Failed(LmspStatus { error: Some(error), ..LmspStatus::bare(response_id, ResponseStatus::Failed) })
    }

    /// The LMSP event for an Open Responses event of `response_id`, or
    /// `None` for events LMSP leaves out.
    pub fn from_stream(e: &StreamEvent, response_id: &str) -> Option<Self> {
        let id = response_id.to_string();
        let ended = |r: &ResponseObject| LmspStatus {
            response_id: id.clone(),
            status: r.status,
            incomplete_details: r.incomplete_details.clone(),
            usage: Some(r.usage.map(LmspUsage::from).unwrap_or_default()),
            error: None,
        };
        Some(match e {
            StreamEvent::Created(_) => Self::Created(LmspStatus::bare(response_id, ResponseStatus::InProgress)),
            StreamEvent::OutputItemAdded(e) => Self::OutputItemAdded(LmspItemEvent { response_id: id, output_index: e.output_index, item: (&e.item).into() }),
            StreamEvent::OutputItemDone(e) => Self::OutputItemDone(LmspItemEvent { response_id: id, output_index: e.output_index, item: (&e.item).into() }),
            StreamEvent::OutputTextDelta(e) => Self::OutputTextDelta(LmspDelta { response_id: id, item_id: e.item_id.clone(), delta: e.delta.clone() }),
            StreamEvent::FunctionCallArgumentsDelta(e) => {
                Self::FunctionCallArgumentsDelta(LmspDelta { response_id: id, item_id: e.item_id.clone(), delta: e.delta.clone() })
            }
            StreamEvent::Completed(e) => Self::Completed(ended(&e.response)),
            StreamEvent::Incomplete(e) => Self::Incomplete(ended(&e.response)),
            StreamEvent::Failed(e) => Self::failed(response_id, ProblemDoc::of_response_error(e.response.error.as_ref())),
            _ => return None,
        })
    }

    /// The `data` JSON on one line.
    pub fn data_json(&self) -> String {
        let data = match self {
            Self::Created(s) | Self::Completed(s) | Self::Incomplete(s) | Self::Failed(s) | Self::Cancelled(s) => serde_json::to_string(s),
            Self::OutputItemAdded(i) | Self::OutputItemDone(i) => serde_json::to_string(i),
            Self::OutputTextDelta(d) | Self::FunctionCallArgumentsDelta(d) => serde_json::to_string(d),
        };
        data.unwrap_or_else(|_| "{}".to_string())
    }

    /// One SSE frame with an integer id.
    pub fn sse_frame(&self, id: u64) -> String {
        format!("id: {id}\nevent: {}\ndata: {}\n\n", self.name(), self.data_json())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::protocol::mapper::{FinishKind, MapperInput, ResponseMapper, UsageCounts};
    use crate::protocol::request::{validate, RequestLimits};
    use serde_json::json;

    fn events() -> Vec<StreamEvent> {
        let req = validate(json!({"input": "x", "model": "m"}), &RequestLimits::default()).unwrap();
        let mut m = ResponseMapper::new("resp_1".into(), 5, &req);
        let mut all = m.start();
        all.extend(m.push(MapperInput::TextDelta("A".into())));
        all.extend(m.push(MapperInput::Finished { reason: FinishKind::Stop, usage: UsageCounts { input_tokens: 3, cached_tokens: 0, output_tokens: 4, reasoning_tokens: 0 } }));
        all
    }

    #[test]
    fn events_map_to_the_seed_shapes_and_only_the_ones_lmsp_defines() {
        let mapped: Vec<LmspEvent> = events().iter().filter_map(|e| LmspEvent::from_stream(e, "resp_1")).collect();
        let names: Vec<&str> = mapped.iter().map(LmspEvent::name).collect();
        assert_eq!(names, ["response.created", "response.output_item.added", "response.output_text.delta", "response.output_item.done", "response.completed"]);
        let delta = serde_json::to_value(&mapped[2]).unwrap();
        assert_eq!(delta["data"], json!({"response_id": "resp_1", "item_id": delta["data"]["item_id"], "delta": "A"}));
        assert_eq!(serde_json::to_value(&mapped[4]).unwrap()["data"], json!({"response_id": "resp_1", "status": "completed",
            "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}));
        let item = serde_json::to_value(&mapped[3]).unwrap();
        assert_eq!(item["data"]["item"]["content"], json!([{"type": "output_text", "text": "A"}]));
        assert!(mapped[4].is_terminal() && !mapped[3].is_terminal());
        assert_eq!(LmspEvent::cancelled("r").sse_frame(9), "id: 9\nevent: response.cancelled\ndata: {\"response_id\":\"r\",\"status\":\"cancelled\"}\n\n");
    }

    #[test]
    fn a_response_without_usage_reports_zeros() {
        let req = validate(json!({"input": "x", "model": "m"}), &RequestLimits::default()).unwrap();
        let response = ResponseMapper::new("resp_1".into(), 5, &req).response();
        assert_eq!(serde_json::to_value(LmspResponse::from(&response)).unwrap()["usage"], json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}));
    }

    #[test]
    fn events_read_back_as_they_were_written() {
        for e in events().iter().filter_map(|e| LmspEvent::from_stream(e, "resp_1")).chain([LmspEvent::failed("r", ProblemDoc::generation_failed("x", "y"))]) {
            let text = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<LmspEvent>(&text).unwrap(), e, "{text}");
        }
    }
}
