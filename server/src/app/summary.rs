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

use super::reasoning::ThinkTags;
use super::state::AppState;
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
}

impl Summarizer {
    /// A summarizer when `summary` was asked for and the model thinks in tags.
    pub fn new(summary: Option<ReasoningSummary>, tags: Option<ThinkTags>) -> Option<Self> {
        tags?;
        Some(Self { length: summary?, reasoning: String::new(), done: false })
    }

    /// `inputs` with the summary inserted where the reasoning ends (before
    /// the first answer text, call or end).
    pub async fn interleave(&mut self, state: &Arc<AppState>, inputs: Vec<MapperInput>) -> Vec<MapperInput> {
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
                        out.extend(self.summarize(state).await);
                    }
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
    async fn summarize(&self, state: &Arc<AppState>) -> Vec<MapperInput> {
        match tokio::time::timeout(SUMMARY_TIMEOUT, self.generate(state)).await {
            Ok(Ok(deltas)) => deltas.into_iter().map(MapperInput::ReasoningSummaryDelta).collect(),
            Ok(Err(why)) => {
                tracing::warn!("reasoning summary left out: {why}");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!("reasoning summary left out: it took over {SUMMARY_TIMEOUT:?}");
                Vec::new()
            }
        }
    }

    async fn generate(&self, state: &Arc<AppState>) -> Result<Vec<String>, String> {
        let max_tokens = match self.length {
            ReasoningSummary::Concise => 48,
            ReasoningSummary::Auto => 96,
            ReasoningSummary::Detailed => 192,
        };
        let prompt = self.prompt(state)?;
        if prompt.len() + max_tokens > state.model.context_length {
            return Err(format!("the reasoning ({} prompt tokens) leaves no room in the context window", prompt.len()));
        }
        let request = GenerationRequest {
            prompt,
            sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
            stop: StopConditions { stop_token_ids: state.model.tokenizer.eos_ids().to_vec(), max_tokens, ..StopConditions::default() },
            cache_salt: None,
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

    /// The summarizing prompt: one user turn with the reasoning, and an
    /// empty (closed) reasoning block so the model answers at once.
    fn prompt(&self, state: &AppState) -> Result<Vec<u32>, String> {
        let ask = match self.length {
            ReasoningSummary::Concise => "in one sentence",
            ReasoningSummary::Auto => "in two or three sentences",
            ReasoningSummary::Detailed => "in a short paragraph",
        };
        let content = format!("Summarize the following reasoning {ask}. Reply with the summary only.\n\n{}", self.reasoning.trim());
        let messages = [json!({"role": "user", "content": content})];
        let mut text = state.model.template.render(&messages, None, true).map_err(|e| e.to_string())?;
        let opened = text.trim_end().ends_with("<think>");
        text.push_str(if opened { "\n</think>\n\n" } else { "<think>\n\n</think>\n\n" });
        state.model.tokenizer.encode(&text, false).map_err(|e| e.to_string())
    }
}
