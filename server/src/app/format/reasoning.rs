//! Models that think in tags (Qwen3 `<think>…</think>`, DeepSeek-R1 style,
//! whose prompt already ends in `<think>`): the generated tokens up to
//! `</think>` become a `reasoning` item (`response.reasoning.delta` events
//! with the raw text) and count as `reasoning_tokens`; the rest is the
//! answer, where tool calls are parsed and where a grammar applies.
//!
//! The split is by token id, so it needs `<think>` and `</think>` to be
//! single tokens of the vocabulary and the chat template to use them
//! ([`ThinkTags::of`]); otherwise the output is plain answer text.

use crate::protocol::mapper::MapperInput;
use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::tokenizer::Tokenizer;

/// The tag tokens of a thinking model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTags {
    /// `<think>`.
    pub open: u32,
    /// `</think>`.
    pub close: u32,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkTags {
    /// The tags, when both are single tokens and the template mentions one.
    pub fn of(tokenizer: &Tokenizer, template: &ChatTemplate) -> Option<Self> {
        if !template.source().contains(OPEN) && !template.source().contains(CLOSE) {
            return None;
        }
        let single = |tag: &str| tokenizer.encode(tag, false).ok().filter(|ids| ids.len() == 1).map(|ids| ids[0]);
        Some(Self { open: single(OPEN)?, close: single(CLOSE)? })
    }
}

/// Where the output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing yet: a first `<think>` opens the reasoning.
    Undecided,
    /// Inside the reasoning.
    Thinking,
    /// The answer (whitespace right after `</think>` is dropped).
    Answer { after_think: bool },
}

/// Splits one response's generated tokens into reasoning and answer.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    tags: ThinkTags,
    phase: Phase,
    reasoning_tokens: usize,
}

impl ReasoningSplitter {
    /// A splitter; `starts_inside` when the prompt ends with `<think>`.
    pub fn new(tags: ThinkTags, starts_inside: bool) -> Self {
        Self { tags, phase: if starts_inside { Phase::Thinking } else { Phase::Undecided }, reasoning_tokens: 0 }
    }

    /// Whether the output is inside the reasoning.
    pub fn thinking(&self) -> bool {
        self.phase == Phase::Thinking
    }

    /// Whether the output has reached the answer.
    pub fn answering(&self) -> bool {
        matches!(self.phase, Phase::Answer { .. })
    }

    /// Tokens generated inside the reasoning, both tags included.
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// One generated token and the text it brought.
    pub fn token(&mut self, id: u32, text: String) -> Vec<MapperInput> {
        match self.phase {
            Phase::Undecided if id == self.tags.open => {
                self.phase = Phase::Thinking;
                self.reasoning_tokens += 1;
                let rest = text.replacen(OPEN, "", 1);
                self.reasoning(rest)
            }
            Phase::Undecided => {
                self.phase = Phase::Answer { after_think: false };
                self.answer(text)
            }
            Phase::Thinking => {
                self.reasoning_tokens += 1;
                if id != self.tags.close {
                    return self.reasoning(text);
                }
                self.phase = Phase::Answer { after_think: true };
                let (before, after) = text.split_once(CLOSE).unwrap_or((text.as_str(), ""));
                let mut out = self.reasoning(before.to_string());
                out.extend(self.answer(after.to_string()));
                out
            }
            Phase::Answer { .. } => self.answer(text),
        }
    }

    /// Text flushed at the end of the output (held back until then).
    pub fn flush(&mut self, text: String) -> Vec<MapperInput> {
        match self.phase {
            Phase::Thinking => self.reasoning(text),
            _ => self.answer(text),
        }
    }

    fn reasoning(&self, text: String) -> Vec<MapperInput> {
        if text.is_empty() {
            Vec::new()
        } else {
            vec![MapperInput::ReasoningDelta(text)]
        }
    }

    fn answer(&mut self, text: String) -> Vec<MapperInput> {
        let text = match self.phase {
            Phase::Answer { after_think: true } => {
                let trimmed = text.trim_start().to_string();
                if !trimmed.is_empty() {
                    self.phase = Phase::Answer { after_think: false };
                }
                trimmed
            }
            _ => text,
        };
        if text.is_empty() {
            Vec::new()
        } else {
            vec![MapperInput::TextDelta(text)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: ThinkTags = ThinkTags { open: 10, close: 11 };

    fn run(s: &mut ReasoningSplitter, tokens: &[(u32, &str)]) -> Vec<MapperInput> {
        tokens.iter().flat_map(|(id, t)| s.token(*id, (*t).to_string())).collect()
    }

    #[test]
    fn a_leading_think_block_becomes_reasoning_then_the_answer_follows_trimmed() {
        let mut s = ReasoningSplitter::new(TAGS, false);
        let out = run(&mut s, &[(10, "<think>"), (1, "\nHmm"), (2, ", ok.\n"), (11, "</think>"), (3, "\n\n"), (4, "Yes"), (5, " no")]);
        assert_eq!(out, vec![
            MapperInput::ReasoningDelta("\nHmm".into()),
            MapperInput::ReasoningDelta(", ok.\n".into()),
            MapperInput::TextDelta("Yes".into()),
            MapperInput::TextDelta(" no".into()),
        ]);
        assert_eq!(s.reasoning_tokens(), 4);
    }

    #[test]
    fn a_prompt_ending_in_think_starts_inside_and_no_think_means_all_answer() {
        let mut r1 = ReasoningSplitter::new(TAGS, true);
        let out = run(&mut r1, &[(1, "a"), (11, "b</think>c")]);
        assert_eq!(out, vec![MapperInput::ReasoningDelta("a".into()), MapperInput::ReasoningDelta("b".into()), MapperInput::TextDelta("c".into())]);
        assert_eq!(r1.reasoning_tokens(), 2);
        let mut plain = ReasoningSplitter::new(TAGS, false);
        assert_eq!(run(&mut plain, &[(1, "Hi"), (10, "<think>")]), vec![MapperInput::TextDelta("Hi".into()), MapperInput::TextDelta("<think>".into())]);
        assert_eq!(plain.reasoning_tokens(), 0);
        let mut cut = ReasoningSplitter::new(TAGS, true);
        assert_eq!(cut.flush("held".into()), vec![MapperInput::ReasoningDelta("held".into())]);
    }
}
