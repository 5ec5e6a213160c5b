//! Reasoning summaries on the open `reasoning` item: the raw reasoning part
//! is closed first, then one `summary_text` part streams
//! (`reasoning_summary_part.added`, `reasoning_summary_text.delta`…,
//! `.done`, `reasoning_summary_part.done`), and the item closes after it.

use super::{bump, Open, ResponseMapper};
use crate::protocol::events::{StreamEvent, SummaryPartEvent, SummaryTextDeltaEvent, SummaryTextDoneEvent};
use crate::protocol::output::{OutputContent, OutputItem};

impl ResponseMapper {
    /// More summary text for the open reasoning item (ignored when none is open).
    pub(super) fn summary_delta(&mut self, text: String, events: &mut Vec<StreamEvent>) {
        let Some(Open::Reasoning(index)) = self.open else { return };
        if text.is_empty() {
            return;
        }
        if self.summary_part.is_none() {
            self.close_part(index, events);
            let Some(OutputItem::Reasoning(r)) = self.response.output.get_mut(index) else { return };
            let part = OutputContent::SummaryText { text: String::new() };
            r.summary.push(part.clone());
            let summary_index = r.summary.len() - 1;
            let item_id = r.id.clone();
            self.summary_part = Some(summary_index);
            events.push(StreamEvent::ReasoningSummaryPartAdded(SummaryPartEvent {
                sequence_number: bump(&mut self.next_sequence),
                item_id,
                output_index: index,
                summary_index,
                part,
            }));
        }
        let Some(OutputItem::Reasoning(r)) = self.response.output.get_mut(index) else { return };
        let summary_index = r.summary.len().saturating_sub(1);
        if let Some(OutputContent::SummaryText { text: all }) = r.summary.last_mut() {
            all.push_str(&text);
        }
        events.push(StreamEvent::ReasoningSummaryTextDelta(SummaryTextDeltaEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id: r.id.clone(),
            output_index: index,
            summary_index,
            delta: text,
        }));
    }

    /// Closes the summary part of item `index` (`.done` events).
    pub(super) fn close_summary(&mut self, index: usize, events: &mut Vec<StreamEvent>) {
        let Some(summary_index) = self.summary_part.take() else { return };
        let Some(OutputItem::Reasoning(r)) = self.response.output.get(index) else { return };
        let Some(part) = r.summary.get(summary_index).cloned() else { return };
        let text = match &part {
            OutputContent::SummaryText { text } => text.clone(),
            _ => String::new(),
        };
        let item_id = r.id.clone();
        events.push(StreamEvent::ReasoningSummaryTextDone(SummaryTextDoneEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id: item_id.clone(),
            output_index: index,
            summary_index,
            text,
        }));
        events.push(StreamEvent::ReasoningSummaryPartDone(SummaryPartEvent {
            sequence_number: bump(&mut self.next_sequence),
            item_id,
            output_index: index,
            summary_index,
            part,
        }));
    }
}
