//! Driving one generation: scheduler events through the protocol mapper into
//! typed events for a transport to frame ([`Outgoing`]) or the final object
//! (JSON), metrics, and the store.

use crate::app::format::reasoning::ReasoningSplitter;
use crate::app::runtime::state::AppState;
use crate::app::format::tool_parser::{route_all, ToolCallParser};
use crate::protocol::mapper::{FinishKind, MapperInput, ResponseMapper, UsageCounts};
use crate::protocol::{ResponseObject, ResponseStatus, StreamEvent};
use crate::store::StoredResponse;
use spindle_scheduler::{EventStream, GenerationEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);
/// Events a stream queues for its reader before the generation waits.
pub const STREAM_BUFFER: usize = 64;
/// How long a frame may still wait for a slow reader once the request's
/// deadline has passed or the server drains.
const SEND_GRACE: Duration = Duration::from_secs(1);

/// What to persist when the generation ends.
pub struct Persist {
    /// Write the response (and its events) to the store.
    pub store: bool,
    /// This turn's input items, as stored.
    pub input_items: Vec<crate::protocol::InputItem>,
    /// Background mode.
    pub background: bool,
    /// Splits a thinking model's output into reasoning and answer.
    pub reasoning: Option<crate::app::format::reasoning::ReasoningSplitter>,
    /// `reasoning.summary` as asked (see [`crate::app::runtime::summary`]).
    pub summary: Option<crate::protocol::ReasoningSummary>,
    /// The prefix-cache salt of the request (its tenant and
    /// `prompt_cache_key`; side generations share it).
    pub cache_salt: Option<String>,
    /// The tenant the response is stored for.
    pub tenant: crate::app::access::auth::Tenant,
    /// The prompt's ids; with the generated ids, recorded in the model's
    /// [`crate::app::format::ledger::TokenLedger`] when the turn ends without failing.
    pub prompt: Vec<u32>,
    /// A background response's handle (cancel and delete stop it).
    pub control: Option<Arc<crate::app::runtime::control::Background>>,
    /// The tenant's slot, held until the generation ends.
    pub slot: Option<crate::app::access::slots::Slot>,
    /// Attach each answer token's log-probabilities to the text.
    pub logprobs: bool,
}

/// Run the generation to its end. With a `sink`, every event goes to it (then
/// [`Outgoing::Done`]); a closed sink aborts the generation (dropping the
/// stream frees its KV blocks). With function tools, text goes through the
/// tool-call parser ([`ToolCallParser`]). Returns the final response object.
pub async fn drive(
    state: Arc<AppState>,
    mut stream: EventStream,
    mut mapper: ResponseMapper,
    sink: Option<Sink>,
    mut persist: Persist,
) -> ResponseObject {
    let mut reasoning = persist.reasoning.take();
    let mut summarizer = crate::app::runtime::summary::Summarizer::new(persist.summary, state.model.think_tags, persist.cache_salt.take());
    // The events are kept only to be stored with the response.
    let mut events: Option<Vec<StreamEvent>> = persist.store.then(Vec::new);
    let mut timing = Timing::new();
    let deadline = tokio::time::Instant::now() + state.limits.request_timeout;
    let mut draining = state.draining.subscribe();
    let mut tool_calls = ToolCallParser::for_response(mapper.response_ref(), state.model.call_format);
    let tool_calls_on = tool_calls.is_some();
    let mut alive = emit(&state, &sink, events.as_mut(), mapper.start(), deadline).await;
    let mut held: Vec<StreamEvent> = Vec::new();
    let mut generated: Vec<u32> = Vec::new();
    // How many of `events` are stored already (a background response's
    // progress, stored at each item's end).
    let mut events_saved = 0;
    while alive {
        let next = tokio::select! {
            e = stream.recv() => Next::Event(e),
            _ = tokio::time::sleep(KEEP_ALIVE_EVERY) => Next::Idle,
            _ = tokio::time::sleep_until(deadline) => Next::Stop("the request exceeded the server's time limit"),
            _ = draining.wait_for(|d| *d) => Next::Stop("the server is shutting down"),
        };
        let event = match next {
            Next::Idle => {
                alive = send(&state, &sink, Outgoing::KeepAlive, deadline).await;
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
        let item_done = outs.iter().flatten().any(|e| matches!(e, StreamEvent::OutputItemDone(_)));
        if terminal {
            // Before the client can see the end and send the next turn.
            record_tokens(&state, mapper.response_ref(), std::mem::take(&mut persist.prompt), std::mem::take(&mut generated));
        }
        for out in outs {
            if terminal && persist.store {
                // Held back until the response is stored: a client that
                // chains on `previous_response_id` as soon as it sees
                // `response.completed` must find it.
                events.get_or_insert_default().extend(out.iter().cloned());
                held.extend(out);
            } else {
                alive = emit(&state, &sink, events.as_mut(), out, deadline).await && alive;
            }
        }
        if terminal {
            break;
        }
        // Never after a cancel or DELETE (a DELETE that gave up waiting
        // may have removed the row already).
        let stopped = persist.control.as_ref().is_some_and(|c| c.stopped().is_some());
        if item_done && persist.background && persist.store && !stopped {
            let new = events.as_deref().map_or(Vec::new(), |all| all[events_saved..].to_vec());
            let count = new.len();
            if save(&state, mapper.response_ref(), &persist, new).await {
                events_saved += count;
            }
        }
    }
    drop(stream);
    // Stopped before its end (a cancel, or a streaming client gone): what it
    // produced is kept as `cancelled`.
    mapper.cancel();
    let response = mapper.into_response();
    let control = persist.control.take();
    let deleted = control.as_ref().is_some_and(|c| c.stopped() == Some(crate::app::runtime::control::Stopped::Deleted));
    if persist.store && !deleted {
        let mut events = events.unwrap_or_default();
        let unsaved = events.split_off(events_saved.min(events.len()));
        save(&state, &response, &persist, unsaved).await;
    }
    if let Some(control) = control {
        control.finish();
    }
    for event in held {
        alive = alive && send(&state, &sink, Outgoing::Event(event), deadline).await;
    }
    if alive {
        send(&state, &sink, Outgoing::Done, deadline).await;
    }
    response
}

/// What a driven response hands its transport, in order. Each transport
/// frames these itself (SSE, WebSocket, Chat Completions chunks, LMSP).
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// One semantic event.
    Event(StreamEvent),
    /// Nothing happened for a while (a long prefill): SSE writes a comment.
    KeepAlive,
    /// Every event was delivered (SSE writes `data: [DONE]`).
    Done,
}

/// Where a driven response's events go.
#[derive(Debug, Clone)]
pub struct Sink {
    tx: mpsc::Sender<Outgoing>,
    /// Set before the terminal event is sent.
    ending: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Sink {
    /// Events into `tx`.
    pub fn new(tx: mpsc::Sender<Outgoing>) -> Self {
        Self { tx, ending: None }
    }

    /// Also set `flag` before the terminal event goes out (so whoever reads
    /// the terminal event knows the response is ending).
    pub fn with_ending_flag(mut self, flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.ending = Some(flag);
        self
    }
}

/// Sends `events` (logging them when there is a log); `false` once the
/// client is gone.
async fn emit(
    state: &AppState,
    sink: &Option<Sink>,
    mut log: Option<&mut Vec<StreamEvent>>,
    events: Vec<StreamEvent>,
    deadline: tokio::time::Instant,
) -> bool {
    let mut alive = true;
    for event in events {
        if let Some(log) = log.as_deref_mut() {
            log.push(event.clone());
        }
        alive = alive && send(state, sink, Outgoing::Event(event), deadline).await;
    }
    alive
}

/// Queues one frame for the client; `false` when the client is gone or has
/// not made room for it within the stall timeout (nor by the request's
/// deadline, nor shortly after the server starts draining): the caller then
/// ends the generation and its KV blocks are freed.
async fn send(state: &AppState, sink: &Option<Sink>, outgoing: Outgoing, deadline: tokio::time::Instant) -> bool {
    let Some(s) = sink else { return true };
    let frame = match s.tx.try_send(outgoing) {
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
    let record = stored_record(mapper.response_ref(), persist);
    if let Err(e) = crate::app::runtime::stored::with_store(state, move |s| s.put(&record)).await {
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
            let logprobs = shape.logprobs.then(|| crate::app::runtime::logprobs::of_token(&state.model, &token));
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
fn record_tokens(state: &AppState, response: &ResponseObject, mut prompt: Vec<u32>, generated: Vec<u32>) {
    if !matches!(response.status, ResponseStatus::Completed | ResponseStatus::Incomplete) || prompt.is_empty() {
        return;
    }
    let item_ids = response.output.iter().map(|i| i.id().to_string()).collect();
    prompt.extend(generated);
    state.model.ledger.record(&response.id, item_ids, prompt);
}

/// Stores the response as it stands with `events` (those not stored yet),
/// in one write; `false` when that failed (logged).
async fn save(state: &Arc<AppState>, response: &ResponseObject, persist: &Persist, events: Vec<StreamEvent>) -> bool {
    let record = stored_record(response, persist);
    let store = state.store.clone();
    let result = tokio::task::spawn_blocking(move || store.put_with_events(&record, &events)).await;
    match result {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::error!("storing a response failed: {e}");
            false
        }
        Err(e) => {
            tracing::error!("storing a response panicked: {e}");
            false
        }
    }
}

/// The store's record of `response` as it stands.
fn stored_record(response: &ResponseObject, persist: &Persist) -> StoredResponse {
    StoredResponse::new(response.clone(), &persist.input_items, persist.background, persist.tenant.as_str())
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
