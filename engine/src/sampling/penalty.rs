//! [`PenaltyCounts`]: what the repetition, presence and frequency
//! penalties need of a sequence's history, kept by the executor across
//! steps and grown by the tokens each step appends, so a step costs
//! O(new tokens) rather than O(context).

use crate::batch::{ForwardBatch, PenaltyHistory, SeqId};
use crate::error::{EngineError, Result};
use std::collections::HashMap;

/// The distinct tokens a sequence's penalties touch, in increasing order,
/// each with how often it occurs in the *output* (0 for a token only the
/// prompt holds). The prompt's tokens belong here only when the repetition
/// penalty is on (they matter to nothing else).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PenaltyCounts {
    seen: Vec<(u32, u32)>,
}

impl PenaltyCounts {
    /// The counts of a history: `prompt` (each token counted 0 times) and
    /// `output` (each occurrence counted).
    pub fn new(prompt: &[u32], output: &[u32]) -> Self {
        let mut all: Vec<(u32, u32)> = prompt.iter().map(|&t| (t, 0)).chain(output.iter().map(|&t| (t, 1))).collect();
        all.sort_unstable();
        let mut seen: Vec<(u32, u32)> = Vec::with_capacity(all.len());
        for (t, c) in all {
            match seen.last_mut() {
                Some(last) if last.0 == t => last.1 += c,
                _ => seen.push((t, c)),
            }
        }
        Self { seen }
    }

    /// Counts newly generated tokens.
    pub fn push_output(&mut self, tokens: &[u32]) {
        for &t in tokens {
            match self.seen.binary_search_by_key(&t, |e| e.0) {
                Ok(i) => self.seen[i].1 += 1,
                Err(i) => self.seen.insert(i, (t, 1)),
            }
        }
    }

    /// `(token, output count)` in increasing token order.
    pub fn seen(&self) -> &[(u32, u32)] {
        &self.seen
    }

    /// Applies the penalties in place (see the module docs of
    /// [`crate::sampling`]); ids outside `logits` are ignored.
    pub fn apply(&self, logits: &mut [f32], repetition: f32, presence: f32, frequency: f32) {
        if repetition == 1.0 && presence == 0.0 && frequency == 0.0 {
            return;
        }
        for &(t, count) in &self.seen {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if repetition != 1.0 {
                *l = if *l > 0.0 { *l / repetition } else { *l * repetition };
            }
            if count > 0 && (presence != 0.0 || frequency != 0.0) {
                *l -= frequency * count as f32 + presence;
            }
        }
    }
}

/// An executor's [`PenaltyCounts`] by sequence, kept across steps from the
/// histories the steps carry (see [`PenaltyHistory`]).
#[derive(Debug, Default)]
pub struct PenaltyBook {
    counts: HashMap<SeqId, PenaltyCounts>,
}

impl PenaltyBook {
    /// Keeps whole histories and counts appended tokens; an append for a
    /// sequence the book does not hold is an invalid batch.
    pub fn update(&mut self, batch: &ForwardBatch) -> Result<()> {
        for seq in &batch.seqs {
            match seq.sampling.as_ref().and_then(|s| s.history.as_ref()) {
                Some(PenaltyHistory::Full { prompt, output }) => {
                    self.counts.insert(seq.id, PenaltyCounts::new(prompt, output));
                }
                Some(PenaltyHistory::Append(new)) => self
                    .counts
                    .get_mut(&seq.id)
                    .ok_or_else(|| EngineError::InvalidBatch(format!("sequence {} appends to a penalty history this executor does not hold", seq.id)))?
                    .push_output(new),
                None => {}
            }
        }
        Ok(())
    }

    /// Each sequence's counts, in batch order (`None` where it sends no history).
    pub fn for_batch(&self, batch: &ForwardBatch) -> Vec<Option<&PenaltyCounts>> {
        let has_history = |s: &crate::batch::SeqInput| s.sampling.as_ref().is_some_and(|s| s.history.is_some());
        batch.seqs.iter().map(|s| if has_history(s) { self.counts.get(&s.id) } else { None }).collect()
    }

    /// Forgets the histories of `ids`.
    pub fn release(&mut self, ids: &[SeqId]) {
        for id in ids {
            self.counts.remove(id);
        }
    }

    /// Sequences whose histories are kept.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no history is kept.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_merge_prompt_and_output_and_grow_by_appending() {
        let mut counts = PenaltyCounts::new(&[9, 5, 9], &[5, 7, 5]);
        assert_eq!(counts.seen(), &[(5, 2), (7, 1), (9, 0)]);
        counts.push_output(&[9, 1, 7]);
        assert_eq!(counts.seen(), &[(1, 1), (5, 2), (7, 2), (9, 1)]);
        assert_eq!(counts, PenaltyCounts::new(&[9, 5, 9], &[5, 7, 5, 9, 1, 7]), "appending equals counting the whole history");
    }

    #[test]
    fn penalties_touch_only_the_history_and_count_only_the_output() {
        let counts = PenaltyCounts::new(&[0], &[1, 1, 2]);
        let mut logits = vec![2.0, -2.0, 4.0, 1.0];
        counts.apply(&mut logits, 2.0, 0.5, 0.25);
        // 0: prompt only, repetition only; 1: twice in the output; 2: once; 3: untouched.
        assert_eq!(logits, vec![1.0, -4.0 - (0.25 * 2.0 + 0.5), 2.0 - (0.25 + 0.5), 1.0]);
    }
}
