//! The one pure state machine from generation output to Open Responses
//! events. SSE, WebSocket and the non-streaming JSON reply all drive a
//! [`ResponseMapper`]; the JSON reply is simply [`ResponseMapper::response`]
//! after the terminal event.
//!
//! Event order (digest §5c/§5d):
//! - [`ResponseMapper::start`]: `response.created`, `response.in_progress`.
//! - Text: `output_item.added` (message, `content: []`) → `content_part.added`
//!   (empty `output_text`) → `output_text.delta`×N → `output_text.done` →
//!   `content_part.done` → `output_item.done`.
//! - Function call: `output_item.added` (`arguments: ""`) →
//!   `function_call_arguments.delta`×N → `function_call_arguments.done` →
//!   `output_item.done`.
//! - Reasoning: like text, with a `reasoning_text` part and `response.reasoning.*`.
//! - End: `response.completed` or `response.incomplete` (the open item then ends
//!   `incomplete`); failure: `error` then `response.failed`.
//!
//! Robustness rules: pushing before `start` starts implicitly; a new kind of
//! output closes the open item (`completed`); empty deltas emit nothing;
//! argument deltas with no open call, and anything after the terminal event,
//! are ignored; a response that finishes with no output gets one empty
//! message, so `output` is never empty.

mod summary;
use super::error::ApiError;
use super::events::{
    ArgumentsDeltaEvent, ArgumentsDoneEvent, ContentPartEvent, ErrorEvent, OutputItemEvent,
    OutputTextDeltaEvent, OutputTextDoneEvent, PartDeltaEvent, PartTextDoneEvent, ResponseEvent,
    StreamEvent,
};
use super::items::Role;
use super::output::{
    FunctionCallItem, ItemStatus, LogProb, OutputContent, OutputItem, OutputMessage, ReasoningItem,
};
use super::request::ValidRequest;
use super::response::{IncompleteDetails, ResponseObject, ResponseStatus, Usage};
use spindle_scheduler::request::{FinishReason, Usage as SchedulerUsage};

/// Why generation finished, as the mapper needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishKind {
    /// End of sequence or a stop string: `completed`.
    Stop,
    /// The output-token cap: `incomplete`, reason `max_output_tokens`.
    MaxOutputTokens,
    /// The context window filled up: `incomplete`, reason `max_output_tokens`
    /// (the output was cut by the token budget).
    ContextLength,
    /// A content filter stopped it: `incomplete`, reason `content_filter`.
    ContentFilter,
}

impl From<&FinishReason> for FinishKind {
    fn from(reason: &FinishReason) -> Self {
        match reason {
            FinishReason::Eos | FinishReason::StopString(_) => Self::Stop,
            FinishReason::MaxTokens => Self::MaxOutputTokens,
            FinishReason::ContextLength => Self::ContextLength,
        }
    }
}

/// Token counts at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageCounts {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Prompt tokens served from the prefix cache; when 0, the value from
    /// [`MapperInput::Started`] is reported instead.
    pub cached_tokens: usize,
    /// Generated tokens (reasoning included).
    pub output_tokens: usize,
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: usize,
}

impl From<SchedulerUsage> for UsageCounts {
    fn from(u: SchedulerUsage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            cached_tokens: u.cached_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: 0,
        }
    }
}

/// What the generation side reports, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum MapperInput {
    /// Admitted; `cached_tokens` prompt tokens came from the prefix cache.
    Started {
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// Visible answer text.
    TextDelta(String),
    /// Visible answer text with its tokens' log-probabilities.
    TextDeltaWithLogprobs {
        /// The text.
        text: String,
        /// One entry per token.
        logprobs: Vec<LogProb>,
    },
    /// Raw reasoning text (a `reasoning` item).
    ReasoningDelta(String),
    /// Summary text of the open reasoning item (`reasoning.summary`); the
    /// part closes with the item.
    ReasoningSummaryDelta(String),
    /// The model began a function call.
    FunctionCallStarted {
        /// `call_…` (see [`new_call_id`]).
        call_id: String,
        /// Function name.
        name: String,
    },
    /// More of the open call's arguments.
    FunctionCallArgumentsDelta(String),
    /// The open call's arguments are complete.
    FunctionCallDone,
    /// Generation ended.
    Finished {
        /// Why.
        reason: FinishKind,
        /// Token counts.
        usage: UsageCounts,
    },
    /// Generation failed (reported as `server_error`).
    Failed {
        /// What went wrong.
        message: String,
    },
}

/// A fresh id `<prefix>_<32 hex>`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A fresh response id, `resp_…`.
pub fn new_response_id() -> String {
    new_id("resp")
}

/// A fresh function call id, `call_…`.
pub fn new_call_id() -> String {
    new_id("call")
}

/// The current Unix time in seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Which item is open, by its index in `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Message(usize),
    Reasoning(usize),
    FunctionCall(usize),
}

/// Maps [`MapperInput`]s onto streaming events and a response snapshot.
#[derive(Debug, Clone)]
pub struct ResponseMapper {
    response: ResponseObject,
    next_sequence: u64,
    open: Option<Open>,
    /// The open reasoning item's streaming summary part.
    summary_part: Option<usize>,
    cached_tokens: usize,
    created: bool,
    started: bool,
    clock: fn() -> i64,
}

impl ResponseMapper {
    /// A mapper for a response `response_id` created at `created_at` (Unix s),
    /// echoing `request`.
    pub fn new(response_id: String, created_at: i64, request: &ValidRequest) -> Self {
        Self {
            response: ResponseObject::new(response_id, created_at, request),
            next_sequence: 0,
            open: None,
            summary_part: None,
            cached_tokens: 0,
            created: false,
            started: false,
            clock: unix_now,
        }
    }

    /// Replaces the clock used for `completed_at` (for tests).
    pub fn with_clock(mut self, clock: fn() -> i64) -> Self {
        self.clock = clock;
        self
    }

    /// The response as it stands (after the terminal event: the final object,
    /// equal to the one the terminal event carried).
    pub fn response(&self) -> ResponseObject {
        self.response.clone()
    }

    /// The response by reference.
    pub fn response_ref(&self) -> &ResponseObject {
        &self.response
    }

    /// Consumes the mapper, returning the response.
    pub fn into_response(self) -> ResponseObject {
        self.response
    }

    /// Whether the terminal event has been emitted.
    pub fn is_finished(&self) -> bool {
        self.response.status.is_terminal()
    }

    /// The `sequence_number` the next event will get (= events emitted so far).
    pub fn next_sequence_number(&self) -> u64 {
        self.next_sequence
    }

    /// Background mode: `response.created` (status `queued`) and `response.queued`.
    /// Later, [`start`](Self::start) emits only `response.in_progress`.
    pub fn enqueue(&mut self) -> Vec<StreamEvent> {
        if self.created || self.is_finished() {
            return Vec::new();
        }
        self.response.status = ResponseStatus::Queued;
        self.created = true;
        let created = StreamEvent::Created(self.lifecycle());
        vec![created, StreamEvent::Queued(self.lifecycle())]
    }

    /// `response.created` (unless [`enqueue`](Self::enqueue)d) then
    /// `response.in_progress`. Idempotent.
    pub fn start(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        self.ensure_started(&mut events);
        events
    }

    /// Feeds one input; returns the events it causes, in order.
    pub fn push(&mut self, input: MapperInput) -> Vec<StreamEvent> {
        if self.is_finished() {
            return Vec::new();
        }
        let mut events = Vec::new();
        self.ensure_started(&mut events);
        match input {
            MapperInput::Started { cached_tokens } => self.cached_tokens = cached_tokens,
            MapperInput::TextDelta(text) => self.text_delta(text, Vec::new(), &mut events),
            MapperInput::TextDeltaWithLogprobs { text, logprobs } => {
                self.text_delta(text, logprobs, &mut events)
            }
            MapperInput::ReasoningDelta(text) => self.reasoning_delta(text, &mut events),
            MapperInput::ReasoningSummaryDelta(text) => self.summary_delta(text, &mut events),
            MapperInput::FunctionCallStarted { call_id, name } => {
                self.close_open(ItemStatus::Completed, &mut events);
                self.open_function_call(call_id, name, &mut events);
            }
            MapperInput::FunctionCallArgumentsDelta(delta) => {
                self.arguments_delta(delta, &mut events)
            }
            MapperInput::FunctionCallDone => {
                if matches!(self.open, Some(Open::FunctionCall(_))) {
                    self.close_open(ItemStatus::Completed, &mut events);
                }
            }
            MapperInput::Finished { reason, usage } => self.finish(reason, usage, &mut events),
            MapperInput::Failed { message } => return self.fail(&ApiError::internal(message)),
        }
        events
    }

    /// Ends an unfinished response as `cancelled` (a cancel request, or a
    /// streaming client that went away): what was produced stays, an open
    /// item is left `incomplete`. No events: nobody is listening for them.
    pub fn cancel(&mut self) {
        if self.is_finished() {
            return;
        }
        if let Some(open) = self.open.take() {
            if let Some(item) = self.response.output.get_mut(open_index(open)) {
                set_status(item, ItemStatus::Incomplete);
            }
        }
        self.response.status = ResponseStatus::Cancelled;
    }

    /// Fails the response with `error`: `error`, then `response.failed` whose
    /// `response.error` is `{code, message}`. An open item is left in `output`
    /// with status `incomplete` (no done events: the stream ends at the error).
    pub fn fail(&mut self, error: &ApiError) -> Vec<StreamEvent> {
        if self.is_finished() {
            return Vec::new();
        }
        let mut events = Vec::new();
        self.ensure_started(&mut events);
        if let Some(open) = self.open.take() {
            if let Some(item) = self.response.output.get_mut(open_index(open)) {
                set_status(item, ItemStatus::Incomplete);
            }
        }
        let sequence_number = self.next_seq();
        events.push(StreamEvent::Error(ErrorEvent {
            sequence_number,
            error: error.to_payload(),
        }));
        self.response.status = ResponseStatus::Failed;
        self.response.error = Some(error.to_response_error());
        events.push(StreamEvent::Failed(self.lifecycle()));
        events
    }

    fn next_seq(&mut self) -> u64 {
        bump(&mut self.next_sequence)
    }

    /// A lifecycle payload: the next sequence number and a snapshot.
    fn lifecycle(&mut self) -> ResponseEvent {
        ResponseEvent {
            sequence_number: self.next_seq(),
            response: Box::new(self.response.clone()),
        }
    }

    fn ensure_started(&mut self, events: &mut Vec<StreamEvent>) {
        if self.started || self.is_finished() {
            return;
        }
        self.response.status = ResponseStatus::InProgress;
        if !self.created {
            self.created = true;
            events.push(StreamEvent::Created(self.lifecycle()));
        }
        self.started = true;
        events.push(StreamEvent::InProgress(self.lifecycle()));
    }

    /// Adds `item` to `output` and emits `output_item.added`; returns its index.
    fn add_item(&mut self, item: OutputItem, events: &mut Vec<StreamEvent>) -> usize {
        let output_index = self.response.output.len();
        let sequence_number = self.next_seq();
        events.push(StreamEvent::OutputItemAdded(OutputItemEvent {
            sequence_number,
            output_index,
            item: item.clone(),
        }));
        self.response.output.push(item);
        output_index
    }

    /// Appends `part` to the item at `index` and emits `content_part.added`.
    fn add_part(&mut self, index: usize, part: OutputContent, events: &mut Vec<StreamEvent>) {
        let Some(item) = self.response.output.get_mut(index) else {
            return;
        };
        let content = match item {
            OutputItem::Message(m) => &mut m.content,
            OutputItem::Reasoning(r) => &mut r.content,
            _ => return,
        };
        let content_index = content.len();
        content.push(part.clone());
        events.push(StreamEvent::ContentPartAdded(ContentPartEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id: item.id().to_owned(),
            output_index: index,
            content_index,
            part,
        }));
    }

    fn open_message(&mut self, events: &mut Vec<StreamEvent>) -> usize {
        let item = OutputItem::Message(OutputMessage {
            id: new_id("msg"),
            status: ItemStatus::InProgress,
            role: Role::Assistant,
            content: Vec::new(),
            phase: None,
        });
        let index = self.add_item(item, events);
        self.add_part(index, OutputContent::empty_text(), events);
        self.open = Some(Open::Message(index));
        index
    }

    fn text_delta(&mut self, text: String, logprobs: Vec<LogProb>, events: &mut Vec<StreamEvent>) {
        if text.is_empty() && logprobs.is_empty() {
            return;
        }
        let index = match self.open {
            Some(Open::Message(i)) => i,
            _ => {
                self.close_open(ItemStatus::Completed, events);
                self.open_message(events)
            }
        };
        let Some(OutputItem::Message(m)) = self.response.output.get_mut(index) else {
            return;
        };
        let content_index = m.content.len().saturating_sub(1);
        if let Some(OutputContent::OutputText {
            text: all,
            logprobs: all_lp,
            ..
        }) = m.content.last_mut()
        {
            all.push_str(&text);
            all_lp.extend(logprobs.iter().cloned());
        }
        events.push(StreamEvent::OutputTextDelta(OutputTextDeltaEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id: m.id.clone(),
            output_index: index,
            content_index,
            delta: text,
            logprobs,
        }));
    }

    fn reasoning_delta(&mut self, text: String, events: &mut Vec<StreamEvent>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(Open::Reasoning(i)) => i,
            _ => {
                self.close_open(ItemStatus::Completed, events);
                let item = OutputItem::Reasoning(ReasoningItem {
                    id: new_id("rs"),
                    summary: Vec::new(),
                    content: Vec::new(),
                    encrypted_content: None,
                    status: ItemStatus::InProgress,
                });
                let index = self.add_item(item, events);
                self.add_part(
                    index,
                    OutputContent::ReasoningText {
                        text: String::new(),
                    },
                    events,
                );
                self.open = Some(Open::Reasoning(index));
                index
            }
        };
        let Some(OutputItem::Reasoning(r)) = self.response.output.get_mut(index) else {
            return;
        };
        let content_index = r.content.len().saturating_sub(1);
        if let Some(OutputContent::ReasoningText { text: all }) = r.content.last_mut() {
            all.push_str(&text);
        }
        events.push(StreamEvent::ReasoningDelta(PartDeltaEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id: r.id.clone(),
            output_index: index,
            content_index,
            delta: text,
        }));
    }

    fn open_function_call(&mut self, call_id: String, name: String, events: &mut Vec<StreamEvent>) {
        let item = OutputItem::FunctionCall(FunctionCallItem {
            id: new_id("fc"),
            call_id,
            name,
            arguments: String::new(),
            status: ItemStatus::InProgress,
        });
        let index = self.add_item(item, events);
        self.open = Some(Open::FunctionCall(index));
    }

    fn arguments_delta(&mut self, delta: String, events: &mut Vec<StreamEvent>) {
        let Some(Open::FunctionCall(index)) = self.open else {
            return;
        };
        if delta.is_empty() {
            return;
        }
        let Some(OutputItem::FunctionCall(f)) = self.response.output.get_mut(index) else {
            return;
        };
        f.arguments.push_str(&delta);
        events.push(StreamEvent::FunctionCallArgumentsDelta(
            ArgumentsDeltaEvent {
                sequence_number: bump(&mut self.next_sequence),
                item_id: f.id.clone(),
                output_index: index,
                delta,
            },
        ));
    }

    /// Ends the open item with `status`, emitting its done events.
    fn close_open(&mut self, status: ItemStatus, events: &mut Vec<StreamEvent>) {
        let Some(open) = self.open.take() else { return };
        let index = open_index(open);
        match open {
            Open::Reasoning(_) if self.summary_part.is_some() => self.close_summary(index, events),
            Open::Message(_) | Open::Reasoning(_) => self.close_part(index, events),
            Open::FunctionCall(_) => {
                if let Some(OutputItem::FunctionCall(f)) = self.response.output.get(index) {
                    events.push(StreamEvent::FunctionCallArgumentsDone(ArgumentsDoneEvent {
                        sequence_number: bump(&mut self.next_sequence),
                        item_id: f.id.clone(),
                        output_index: index,
                        arguments: f.arguments.clone(),
                    }));
                }
            }
        }
        if let Some(item) = self.response.output.get_mut(index) {
            set_status(item, status);
            events.push(StreamEvent::OutputItemDone(OutputItemEvent {
                sequence_number: bump(&mut self.next_sequence),
                output_index: index,
                item: item.clone(),
            }));
        }
    }

    /// `<text>.done` then `content_part.done` for the last part of item `index`.
    fn close_part(&mut self, index: usize, events: &mut Vec<StreamEvent>) {
        let Some(item) = self.response.output.get(index) else {
            return;
        };
        let (item_id, content) = match item {
            OutputItem::Message(m) => (&m.id, &m.content),
            OutputItem::Reasoning(r) => (&r.id, &r.content),
            _ => return,
        };
        let Some(part) = content.last() else { return };
        let content_index = content.len() - 1;
        let item_id = item_id.clone();
        let text_seq = bump(&mut self.next_sequence);
        let part_seq = bump(&mut self.next_sequence);
        events.push(match part {
            OutputContent::OutputText { text, logprobs, .. } => {
                StreamEvent::OutputTextDone(OutputTextDoneEvent {
                    sequence_number: text_seq,
                    item_id: item_id.clone(),
                    output_index: index,
                    content_index,
                    text: text.clone(),
                    logprobs: logprobs.clone(),
                })
            }
            other => StreamEvent::ReasoningDone(PartTextDoneEvent {
                sequence_number: text_seq,
                item_id: item_id.clone(),
                output_index: index,
                content_index,
                text: other.text().to_owned(),
            }),
        });
        events.push(StreamEvent::ContentPartDone(ContentPartEvent {
            sequence_number: part_seq,
            item_id,
            output_index: index,
            content_index,
            part: part.clone(),
        }));
    }

    fn finish(&mut self, reason: FinishKind, usage: UsageCounts, events: &mut Vec<StreamEvent>) {
        let (status, incomplete_reason) = match reason {
            FinishKind::Stop => (ItemStatus::Completed, None),
            FinishKind::MaxOutputTokens | FinishKind::ContextLength => {
                (ItemStatus::Incomplete, Some("max_output_tokens"))
            }
            FinishKind::ContentFilter => (ItemStatus::Incomplete, Some("content_filter")),
        };
        if self.open.is_none() && self.response.output.is_empty() {
            self.open_message(events);
        }
        self.close_open(status, events);
        let cached = if usage.cached_tokens > 0 {
            usage.cached_tokens
        } else {
            self.cached_tokens
        };
        self.response.usage = Some(Usage::new(
            usage.input_tokens,
            cached,
            usage.output_tokens,
            usage.reasoning_tokens,
        ));
        match incomplete_reason {
            None => {
                self.response.status = ResponseStatus::Completed;
                self.response.completed_at = Some((self.clock)());
                events.push(StreamEvent::Completed(self.lifecycle()));
            }
            Some(reason) => {
                self.response.status = ResponseStatus::Incomplete;
                self.response.incomplete_details = Some(IncompleteDetails {
                    reason: reason.to_owned(),
                });
                events.push(StreamEvent::Incomplete(self.lifecycle()));
            }
        }
    }
}

/// Returns `*counter` and increments it.
fn bump(counter: &mut u64) -> u64 {
    let n = *counter;
    *counter += 1;
    n
}

fn open_index(open: Open) -> usize {
    match open {
        Open::Message(i) | Open::Reasoning(i) | Open::FunctionCall(i) => i,
    }
}

fn set_status(item: &mut OutputItem, status: ItemStatus) {
    match item {
        OutputItem::Message(m) => m.status = status,
        OutputItem::FunctionCall(f) => f.status = status,
        OutputItem::FunctionCallOutput(f) => f.status = status,
        OutputItem::Reasoning(r) => r.status = status,
        OutputItem::Compaction(_) => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::protocol::request::{validate, RequestLimits};
    use serde_json::json;

    fn mapper() -> ResponseMapper {
        let req = validate(
            json!({"input": "x", "model": "m"}),
            &RequestLimits::default(),
        )
        .unwrap();
        ResponseMapper::new("resp_u".into(), 5, &req).with_clock(|| 9)
    }

    #[test]
    fn sequence_numbers_never_skip_across_every_path() {
        let mut m = mapper();
        let mut all = m.enqueue();
        all.extend(m.start());
        for input in [
            MapperInput::Started { cached_tokens: 1 },
            MapperInput::FunctionCallArgumentsDelta("ignored".into()),
            MapperInput::ReasoningDelta("r".into()),
            MapperInput::FunctionCallStarted {
                call_id: "c".into(),
                name: "f".into(),
            },
            MapperInput::FunctionCallArgumentsDelta(String::new()),
            MapperInput::TextDelta("t".into()),
            MapperInput::Failed {
                message: "x".into(),
            },
        ] {
            all.extend(m.push(input));
        }
        let numbers: Vec<u64> = all.iter().map(StreamEvent::sequence_number).collect();
        assert_eq!(numbers, (0..all.len() as u64).collect::<Vec<_>>());
        assert_eq!(m.next_sequence_number(), all.len() as u64);
        assert_eq!(m.response_ref().status, ResponseStatus::Failed);
    }

    #[test]
    fn a_cancelled_response_keeps_its_text_and_leaves_the_open_item_incomplete() -> Result<(), serde_json::Error> {
        let mut m = mapper();
        m.start();
        m.push(MapperInput::Started { cached_tokens: 0 });
        m.push(MapperInput::TextDelta("half an ans".into()));
        m.cancel();
        let r = m.response();
        assert_eq!(r.status, ResponseStatus::Cancelled);
        let item = serde_json::to_value(&r.output[0])?;
        assert_eq!((item["status"].as_str(), item["content"][0]["text"].as_str()), (Some("incomplete"), Some("half an ans")), "{item}");
        m.push(MapperInput::Failed { message: "aborted".into() });
        assert_eq!(m.response().status, ResponseStatus::Cancelled, "a later failure does not overwrite it");
        Ok(())
    }

    #[test]
    fn cached_tokens_prefer_the_final_usage() {
        let mut m = mapper();
        m.push(MapperInput::Started { cached_tokens: 3 });
        let usage = UsageCounts {
            input_tokens: 10,
            cached_tokens: 8,
            output_tokens: 2,
            reasoning_tokens: 0,
        };
        m.push(MapperInput::Finished {
            reason: FinishKind::Stop,
            usage,
        });
        let u = m.response().usage.unwrap();
        assert_eq!(
            (u.input_tokens_details.cached_tokens, u.total_tokens),
            (8, 12)
        );
        assert_eq!(m.into_response().completed_at, Some(9));
    }

    #[test]
    fn scheduler_types_convert() {
        assert_eq!(FinishKind::from(&FinishReason::Eos), FinishKind::Stop);
        assert_eq!(
            FinishKind::from(&FinishReason::StopString("x".into())),
            FinishKind::Stop
        );
        assert_eq!(
            FinishKind::from(&FinishReason::MaxTokens),
            FinishKind::MaxOutputTokens
        );
        assert_eq!(
            FinishKind::from(&FinishReason::ContextLength),
            FinishKind::ContextLength
        );
        let u = SchedulerUsage {
            input_tokens: 4,
            cached_tokens: 2,
            output_tokens: 1,
        };
        assert_eq!(UsageCounts::from(u).cached_tokens, 2);
        assert!(new_call_id().starts_with("call_") && new_response_id().len() == 5 + 32);
    }
}
