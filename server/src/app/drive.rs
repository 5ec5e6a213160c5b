//! Driving one generation: scheduler events through the protocol mapper into
//! SSE frames (streaming) or the final object (JSON), metrics, and the store.

use super::reasoning::ReasoningSplitter;
use super::sse;
use super::state::AppState;
use super::tools::{route_all, ToolCallParser};
use crate::protocol::mapper::{FinishKind, MapperInput, ResponseMapper, UsageCounts};
use crate::store::StoredResponse;
use serde_json::Value;
use spindle_scheduler::{EventStream, GenerationEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);
/// How long a frame may still wait for a slow reader once the request's
/// deadline has passed or the server drains.
const SEND_GRACE: Duration = Duration::from_secs(1);

/// What to persist when the generation ends.
pub struct Persist {
    /// Write the response (and its events) to the store.
    pub store: bool,
    /// This turn's input items, as stored.
    pub input_items: Vec<Value>,
    /// Background mode.
    pub background: bool,
    /// Splits a thinking model's output into reasoning and answer.
    pub reasoning: Option<super::reasoning::ReasoningSplitter>,
    /// `reasoning.summary` as asked (see [`super::summary`]).
    pub summary: Option<crate::protocol::ReasoningSummary>,
    /// The prefix-cache salt of the request (its tenant and
    /// `prompt_cache_key`; side generations share it).
    pub cache_salt: Option<String>,
    /// The tenant the response is stored for.
    pub tenant: super::auth::Tenant,
    /// The prompt's ids; with the generated ids, recorded in the model's
    /// [`super::ledger::TokenLedger`] when the turn ends without failing.
    pub prompt: Vec<u32>,
    /// A background response's handle (cancel and delete stop it).
    pub control: Option<Arc<super::background::Background>>,
    /// The tenant's slot, held until the generation ends.
    pub slot: Option<super::slots::Slot>,
    /// Attach each answer token's log-probabilities to the text.
    pub logprobs: bool,
}

/// Run the generation to its end. With a `sink`, every event is sent as an
/// SSE frame (then `[DONE]`); a closed sink aborts the generation (dropping
/// the stream frees its KV blocks). With function tools, text goes through
/// the tool-call parser ([`ToolCallParser`]). Returns the final response object.
pub async fn drive(
    state: Arc<AppState>,
    mut stream: EventStream,
    mut mapper: ResponseMapper,
    sink: Option<Sink>,
    mut persist: Persist,
) -> Value {
    let mut reasoning = persist.reasoning.take();
    let mut summarizer = super::summary::Summarizer::new(persist.summary, state.model.think_tags, persist.cache_salt.take());
    let mut events: Vec<Value> = Vec::new();
    let mut timing = Timing::new();
    let deadline = tokio::time::Instant::now() + state.limits.request_timeout;
    let mut draining = state.draining.subscribe();
    let mut tool_calls = ToolCallParser::for_response(mapper.response_ref(), state.model.call_format);
    let tool_calls_on = tool_calls.is_some();
    let mut alive = emit(&state, &sink, &mut events, mapper.start(), deadline).await;
    let mut held: Vec<String> = Vec::new();
    let mut generated: Vec<u32> = Vec::new();
    while alive {
        let next = tokio::select! {
            e = stream.recv() => Next::Event(e),
            _ = tokio::time::sleep(KEEP_ALIVE_EVERY) => Next::Idle,
            _ = tokio::time::sleep_until(deadline) => Next::Stop("the request exceeded the server's time limit"),
            _ = draining.wait_for(|d| *d) => Next::Stop("the server is shutting down"),
        };
        let event = match next {
            Next::Idle => {
                if sink.as_ref().is_some_and(|s| s.framing == Framing::Sse) {
                    alive = send(&state, &sink, sse::KEEP_ALIVE.to_string(), deadline).await;
                }
                continue;
            }
            Next::Stop(why) => GenerationEvent::Failed { message: why.to_string() },
            // The stream ended with no terminal event: the scheduler is gone.
            // The response fails rather than staying `in_progress` forever.
            Next::Event(None) => GenerationEvent::Failed { message: "the scheduler stopped before the response finished".into() },
            Next::Event(Some(e)) => e,
        };
        if persist.control.as_ref().is_some_and(|c| c.stopped().is_some()) {
            break; // cancelled or deleted: ended below
        }
        if matches!(event, GenerationEvent::Started { .. }) && persist.background && persist.store {
            mark_in_progress(&state, &mapper, &persist).await;
        }
        let terminal = matches!(event, GenerationEvent::Finished { .. } | GenerationEvent::Failed { .. });
        if let GenerationEvent::Delta { token, .. } = &event {
            generated.push(token.id);
        }
        let mut inputs = route_all(tool_calls.as_mut(), to_mapper_inputs(event, &mut timing, &state, reasoning.as_mut(), OutputShape { calls_parsed: tool_calls_on, logprobs: persist.logprobs }));
        if let Some(s) = summarizer.as_mut() {
            inputs = s.interleave(&state, inputs, deadline, stop_signal(&state, sink.as_ref())).await;
        }
        if terminal {
            if let Some(flag) = sink.as_ref().and_then(|s| s.ending.as_ref()) {
                flag.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        let outs: Vec<_> = inputs.into_iter().map(|input| mapper.push(input)).collect();
        if terminal {
            // Before the client can see the end and send the next turn.
            let response = serde_json::to_value(mapper.response_ref()).unwrap_or(Value::Null);
            record_tokens(&state, &response, std::mem::take(&mut persist.prompt), std::mem::take(&mut generated));
        }
        for out in outs {
            if terminal && persist.store {
                // Held back until the response is stored: a client that
                // chains on `previous_response_id` as soon as it sees
                // `response.completed` must find it.
                held.extend(log_only(sink.as_ref(), &mut events, out));
            } else {
                alive = emit(&state, &sink, &mut events, out, deadline).await && alive;
            }
        }
        if terminal {
            break;
        }
    }
    drop(stream);
    // Stopped before its end (a cancel, or a streaming client gone): what it
    // produced is kept as `cancelled`.
    mapper.cancel();
    let response = serde_json::to_value(mapper.response()).unwrap_or(Value::Null);
    let control = persist.control.take();
    let deleted = control.as_ref().is_some_and(|c| c.stopped() == Some(super::background::Stopped::Deleted));
    if persist.store && !deleted {
        save(&state, &response, persist, events).await;
    }
    if let Some(control) = control {
        control.finish();
    }
    for frame in held {
        alive = alive && send(&state, &sink, frame, deadline).await;
    }
    if alive && sink.as_ref().is_some_and(|s| s.framing == Framing::Sse) {
        send(&state, &sink, sse::DONE.to_string(), deadline).await;
    }
    response
}

/// Where a driven response's events go, and how they are framed.
#[derive(Debug, Clone)]
pub struct Sink {
    tx: mpsc::Sender<String>,
    framing: Framing,
    /// Set before the terminal event's frames are sent.
    ending: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// How events are written to a [`Sink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// SSE frames, keep-alive comments, `data: [DONE]` last.
    Sse,
    /// One JSON text per event (WebSocket). No `[DONE]`, and exactly one
    /// terminal message: a mid-stream failure sends only `response.failed`
    /// (its `error` field says why), not the SSE `error` event before it.
    Json,
}

impl Sink {
    /// SSE framing into `tx`.
    pub fn sse(tx: mpsc::Sender<String>) -> Self {
        Self { tx, framing: Framing::Sse, ending: None }
    }

    /// JSON-per-message framing into `tx`.
    pub fn json(tx: mpsc::Sender<String>) -> Self {
        Self { tx, framing: Framing::Json, ending: None }
    }

    /// Also set `flag` before the terminal event's frames go out (so whoever
    /// reads the terminal event knows the response is ending).
    pub fn with_ending_flag(mut self, flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.ending = Some(flag);
        self
    }

    /// The frame for `event`, or `None` when this framing leaves it out.
    fn frame(&self, event: &Value) -> Option<String> {
        match self.framing {
            Framing::Sse => Some(sse::frame(event)),
            Framing::Json if event["type"] == "error" => None,
            Framing::Json => Some(event.to_string()),
        }
    }
}

/// Records `events` in the log and returns their frames unsent.
fn log_only(sink: Option<&Sink>, log: &mut Vec<Value>, events: Vec<crate::protocol::StreamEvent>) -> Vec<String> {
    let mut frames = Vec::new();
    for e in events {
        let v = serde_json::to_value(&e).unwrap_or(Value::Null);
        frames.extend(sink.and_then(|s| s.frame(&v)));
        log.push(v);
    }
    frames
}

async fn emit(
    state: &AppState,
    sink: &Option<Sink>,
    log: &mut Vec<Value>,
    events: Vec<crate::protocol::StreamEvent>,
    deadline: tokio::time::Instant,
) -> bool {
    let mut alive = true;
    for frame in log_only(sink.as_ref(), log, events) {
        alive = alive && send(state, sink, frame, deadline).await;
    }
    alive
}

/// Queues one frame for the client; `false` when the client is gone or has
/// not made room for it within the stall timeout (nor by the request's
/// deadline, nor shortly after the server starts draining): the caller then
/// ends the generation and its KV blocks are freed.
async fn send(state: &AppState, sink: &Option<Sink>, frame: String, deadline: tokio::time::Instant) -> bool {
    let Some(s) = sink else { return true };
    let frame = match s.tx.try_send(frame) {
        Ok(()) => return true,
        Err(mpsc::error::TrySendError::Closed(_)) => return false,
        Err(mpsc::error::TrySendError::Full(frame)) => frame,
    };
    let now = tokio::time::Instant::now();
    let mut limit = (now + state.limits.stream_stall_timeout).min(deadline.max(now + SEND_GRACE));
    let mut draining = state.draining.subscribe();
    let sending = s.tx.send(frame);
    tokio::pin!(sending);
    loop {
        tokio::select! {
            sent = &mut sending => return sent.is_ok(),
            () = tokio::time::sleep_until(limit) => {
                tracing::warn!("a client stopped reading its stream: ending the response");
                return false;
            }
            _ = draining.wait_for(|d| *d), if limit > tokio::time::Instant::now() + SEND_GRACE => {
                limit = tokio::time::Instant::now() + SEND_GRACE;
            }
        }
    }
}

/// A background response that has started generating reads `in_progress`.
async fn mark_in_progress(state: &Arc<AppState>, mapper: &ResponseMapper, persist: &Persist) {
    let response = serde_json::to_value(mapper.response_ref()).unwrap_or(Value::Null);
    let record = stored_record(&response, persist);
    if let Err(e) = super::responses::with_store(state, move |s| s.put(&record)).await {
        tracing::warn!("recording a background response as in_progress failed: {}", e.message);
    }
}

enum Next {
    Event(Option<GenerationEvent>),
    Idle,
    Stop(&'static str),
}

struct Timing {
    start: Instant,
    admitted: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Timing {
    fn new() -> Self {
        Self { start: Instant::now(), admitted: None, first: None, last: None }
    }

    /// Records the finished request's phases.
    fn finish(&self, state: &AppState) {
        let end = Instant::now();
        let admitted = self.admitted.unwrap_or(self.start);
        let first = self.first.unwrap_or(end);
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        state.metrics.phases(secs(self.start, admitted), secs(admitted, first), secs(first, end), secs(self.start, end));
    }
}

/// How the answer's text is shaped on its way to the mapper.
#[derive(Debug, Clone, Copy)]
struct OutputShape {
    /// Text goes through the tool-call parser (marker tokens are kept).
    calls_parsed: bool,
    /// Each answer token carries its log-probabilities.
    logprobs: bool,
}

/// Attaches an answer token's log-probabilities to the text it produced (the
/// last text delta), or sends them alone when its text is held back.
fn with_logprobs(mut inputs: Vec<MapperInput>, entry: crate::protocol::LogProb) -> Vec<MapperInput> {
    let logprobs = vec![entry];
    match inputs.iter_mut().rev().find(|i| matches!(i, MapperInput::TextDelta(_))) {
        Some(slot) => {
            let text = match std::mem::replace(slot, MapperInput::TextDelta(String::new())) {
                MapperInput::TextDelta(text) => text,
                _ => String::new(),
            };
            *slot = MapperInput::TextDeltaWithLogprobs { text, logprobs };
        }
        None => inputs.push(MapperInput::TextDeltaWithLogprobs { text: String::new(), logprobs }),
    }
    inputs
}

fn to_mapper_inputs(
    event: GenerationEvent,
    timing: &mut Timing,
    state: &AppState,
    reasoning: Option<&mut ReasoningSplitter>,
    shape: OutputShape,
) -> Vec<MapperInput> {
    match event {
        GenerationEvent::Started { cached_tokens } => {
            timing.admitted = Some(Instant::now());
            vec![MapperInput::Started { cached_tokens }]
        }
        GenerationEvent::Delta { mut text, token } => {
            let logprobs = shape.logprobs.then(|| super::logprobs::of_token(&state.model, &token));
            if shape.calls_parsed {
                for (id, marker) in state.model.call_format.marker_tokens() {
                    // A tag that decodes to its own text ends this delta with it
                    // (text held over may contain the tag's characters, e.g.
                    // inside a JSON string, so `contains` is not the test).
                    if token.id == id && !text.ends_with(marker) {
                        // A special marker decodes to nothing; the call parser
                        // needs it (after any text held over from earlier tokens).
                        text.push_str(marker);
                    }
                }
            }
            let now = Instant::now();
            timing.first.get_or_insert(now);
            match timing.last {
                None => state.metrics.ttft((now - timing.start).as_secs_f64()),
                Some(prev) => state.metrics.itl((now - prev).as_secs_f64()),
            }
            timing.last = Some(now);
            // Whether this token belongs to the answer (not the reasoning).
            let (inputs, answer_token) = match reasoning {
                Some(r) => {
                    let was_thinking = r.thinking();
                    let inputs = r.token(token.id, text);
                    (inputs, !was_thinking && r.answering())
                }
                None if text.is_empty() => (Vec::new(), true),
                None => (vec![MapperInput::TextDelta(text)], true),
            };
            match logprobs {
                Some(entry) if answer_token => with_logprobs(inputs, entry),
                _ => inputs,
            }
        }
        GenerationEvent::Finished { reason, text, usage } => {
            state.metrics.tokens(usage.input_tokens, usage.cached_tokens, usage.output_tokens);
            timing.finish(state);
            let mut counts = UsageCounts::from(usage);
            let mut inputs = match reasoning {
                Some(r) => {
                    counts.reasoning_tokens = r.reasoning_tokens();
                    r.flush(text)
                }
                None if text.is_empty() => Vec::new(),
                None => vec![MapperInput::TextDelta(text)],
            };
            inputs.push(MapperInput::Finished { reason: FinishKind::from(&reason), usage: counts });
            inputs
        }
        GenerationEvent::Failed { message } => vec![MapperInput::Failed { message }],
    }
}

/// Resolves when the response must stop waiting on side work: the server
/// drains, or the client went away.
fn stop_signal(state: &AppState, sink: Option<&Sink>) -> impl std::future::Future<Output = ()> {
    let mut draining = state.draining.subscribe();
    let tx = sink.map(|s| s.tx.clone());
    async move {
        let closed = async {
            match tx {
                Some(tx) => tx.closed().await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = draining.wait_for(|d| *d) => {}
            () = closed => {}
        }
    }
}

/// Records a completed or incomplete turn's ids in the ledger.
fn record_tokens(state: &AppState, response: &Value, mut prompt: Vec<u32>, generated: Vec<u32>) {
    let status = response.get("status").and_then(Value::as_str);
    if !matches!(status, Some("completed" | "incomplete")) || prompt.is_empty() {
        return;
    }
    let Some(id) = response.get("id").and_then(Value::as_str) else { return };
    let item_ids = response
        .get("output")
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(|i| i.get("id").and_then(Value::as_str).map(str::to_string)).collect())
        .unwrap_or_default();
    prompt.extend(generated);
    state.model.ledger.record(id, item_ids, prompt);
}

async fn save(state: &Arc<AppState>, response: &Value, persist: Persist, events: Vec<Value>) {
    let record = stored_record(response, &persist);
    let store = state.store.clone();
    let result = tokio::task::spawn_blocking(move || store.put_with_events(&record, &events)).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("storing a response failed: {e}"),
        Err(e) => tracing::error!("storing a response panicked: {e}"),
    }
}

/// The store's record of `response` as it stands.
fn stored_record(response: &Value, persist: &Persist) -> StoredResponse {
    StoredResponse {
        id: response.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
        created_at: response.get("created_at").and_then(Value::as_i64).unwrap_or(0),
        status: response.get("status").and_then(Value::as_str).unwrap_or("completed").to_string(),
        previous_response_id: response.get("previous_response_id").and_then(Value::as_str).map(str::to_string),
        background: persist.background,
        response: response.clone(),
        input_items: persist.input_items.clone(),
        tenant: persist.tenant.as_str().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: &str) -> crate::protocol::LogProb {
        crate::protocol::LogProb { token: token.into(), logprob: -1.0, bytes: token.as_bytes().to_vec(), top_logprobs: Vec::new() }
    }

    #[test]
    fn an_answer_token_keeps_its_entry_with_its_text_or_alone() {
        let with_text = with_logprobs(vec![MapperInput::ReasoningDelta("r".into()), MapperInput::TextDelta("Hi".into())], entry("Hi"));
        assert_eq!(with_text, vec![MapperInput::ReasoningDelta("r".into()), MapperInput::TextDeltaWithLogprobs { text: "Hi".into(), logprobs: vec![entry("Hi")] }]);
        // A token whose text is held back (a partial character, a possible
        // stop string) still counts: its entry goes out with no text.
        let held = with_logprobs(Vec::new(), entry("\u{fffd}"));
        assert_eq!(held, vec![MapperInput::TextDeltaWithLogprobs { text: String::new(), logprobs: vec![entry("\u{fffd}")] }]);
    }
}
