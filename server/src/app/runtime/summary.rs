//! `reasoning.summary` for thinking models: when the reasoning ends, the
//! same model summarizes it in a side generation (greedy, without thinking,
//! batched with everything else by the scheduler), and the summary becomes
//! the reasoning item's `summary_text` part, before the answer's events. The
//! answer keeps generating meanwhile; its events wait in the stream.
//!
//! Lengths: `concise` up to 48 tokens, `auto` 96, `detailed` 192. The
//! summary's tokens are not part of the response's `usage` (the response's
//! own generation is). A summary that cannot be made (no room in the
//! context window, a failed generation, 30 s passed) is left out and logged;
//! the response goes on.

use crate::app::format::reasoning::ThinkTags;
use crate::app::runtime::state::AppState;
use crate::protocol::mapper::MapperInput;
use crate::protocol::ReasoningSummary;
use serde_json::json;
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest};
use std::sync::Arc;
use std::time::Duration;

/// Longest a summary may take.
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(30);

/// Watches a response's mapper inputs for the end of its reasoning.
#[derive(Debug)]
pub struct Summarizer {
    length: ReasoningSummary,
    reasoning: String,
    done: bool,
    cache_salt: Option<String>,
}

impl Summarizer {
    /// A summarizer when `summary` was asked for and the model thinks in
    /// tags; its generation shares the response's `prompt_cache_key`.
    pub fn new(summary: Option<ReasoningSummary>, tags: Option<ThinkTags>, cache_salt: Option<String>) -> Option<Self> {
        tags?;
        Some(Self { length: summary?, reasoning: String::new(), done: false, cache_salt })
    }

    /// `inputs` with the summary inserted where the reasoning ends (before
    /// the first answer text, call or end).
    /// The summary is given up at `deadline` (or after 30 s) or when `stop`
    /// resolves (the server drains, the client left).
    pub async fn interleave(
        &mut self,
        state: &Arc<AppState>,
        inputs: Vec<MapperInput>,
        deadline: tokio::time::Instant,
        stop: impl std::future::Future<Output = ()>,
    ) -> Vec<MapperInput> {
        if self.done {
            return inputs;
        }
        let mut out = Vec::with_capacity(inputs.len() + 1);
        let mut rest = inputs.into_iter();
        while let Some(input) = rest.next() {
            match &input {
                MapperInput::ReasoningDelta(text) => self.reasoning.push_str(text),
                MapperInput::Started { .. } => {}
                MapperInput::Failed { .. } => self.done = true,
                _ => {
                    self.done = true;
                    if !self.reasoning.trim().is_empty() {
                        out.extend(self.summarize(state, deadline, stop).await);
                    }
                    out.push(input);
                    out.extend(rest);
                    return out;
                }
            }
            out.push(input);
            if self.done {
                out.extend(rest);
                break;
            }
        }
        out
    }

    /// The summary as mapper inputs (empty when it could not be made).
    async fn summarize(&self, state: &Arc<AppState>, deadline: tokio::time::Instant, stop: impl std::future::Future<Output = ()>) -> Vec<MapperInput> {
        let until = deadline.min(tokio::time::Instant::now() + SUMMARY_TIMEOUT);
        let why = tokio::select! {
            r = self.generate(state) => match r {
                Ok(deltas) => return deltas.into_iter().map(MapperInput::ReasoningSummaryDelta).collect(),
                Err(why) => why,
            },
            () = tokio::time::sleep_until(until) => "it ran out of time".to_string(),
            () = stop => "the response was stopped".to_string(),
        };
        tracing::warn!("reasoning summary left out: {why}");
        Vec::new()
    }

    async fn generate(&self, state: &Arc<AppState>) -> Result<Vec<String>, String> {
        let max_tokens = match self.length {
            ReasoningSummary::Concise => 48,
            ReasoningSummary::Auto => 96,
            ReasoningSummary::Detailed => 192,
        };
        let (st, length, reasoning) = (state.clone(), self.length, self.reasoning.clone());
        let prompt = tokio::task::spawn_blocking(move || summary_prompt(&st, length, &reasoning)).await.map_err(|e| e.to_string())??;
        if prompt.len() + max_tokens > state.model.context_length {
            return Err(format!("the reasoning ({} prompt tokens) leaves no room in the context window", prompt.len()));
        }
        let request = GenerationRequest {
            prompt,
            sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
            stop: StopConditions { stop_token_ids: state.model.tokenizer.eos_ids().to_vec(), max_tokens, ..StopConditions::default() },
            cache_salt: self.cache_salt.clone(),
            constraint: None,
        };
        let mut stream = state.scheduler.submit(request).map_err(|e| e.to_string())?;
        let mut deltas = Vec::new();
        while let Some(event) = stream.recv().await {
            match event {
                GenerationEvent::Delta { text, .. } if !text.is_empty() => deltas.push(text),
                GenerationEvent::Finished { text, .. } => {
                    deltas.push(text);
                    break;
                }
                GenerationEvent::Failed { message } => return Err(message),
                _ => {}
            }
        }
        let mut text: String = deltas.concat();
        text = text.trim().to_string();
        Ok(if text.is_empty() { Vec::new() } else { vec![text] })
    }
}

/// The summarizing prompt: one user turn with the reasoning (its text
/// tokenized literally: special-token text in it stays text), and an empty
/// (closed) reasoning block so the model answers at once.
fn summary_prompt(state: &AppState, length: ReasoningSummary, reasoning: &str) -> Result<Vec<u32>, String> {
    const SLOT: &str = "\u{1}reasoning\u{1}";
    let ask = match length {
        ReasoningSummary::Concise => "in one sentence",
        ReasoningSummary::Auto => "in two or three sentences",
        ReasoningSummary::Detailed => "in a short paragraph",
    };
    let content = format!("Summarize the following reasoning {ask}. Reply with the summary only.\n\n{SLOT}");
    let messages = [json!({"role": "user", "content": content})];
    let mut text = state.model.template.render(&messages, None, true).map_err(|e| e.to_string())?;
    let opened = text.trim_end().ends_with("<think>");
    text.push_str(if opened { "\n</think>\n\n" } else { "<think>\n\n</think>\n\n" });
    let (before, after) = text.split_once(SLOT).ok_or("the chat template dropped the message")?;
    let tok = &state.model.tokenizer;
    let mut ids = tok.encode(before, false).map_err(|e| e.to_string())?;
    ids.extend(tok.encode_with(reasoning.trim(), false, false).map_err(|e| e.to_string())?);
    ids.extend(tok.encode(after, false).map_err(|e| e.to_string())?);
    Ok(ids)
}
