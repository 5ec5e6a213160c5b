//! Wire shapes: event names and round trips, SSE framing, every required key
//! of the response object, and item round trips (stored JSON back to items).
#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::{json, Value};
use spindle_server::protocol::{
    validate, FinishKind, InputItem, MapperInput, OutputItem, RequestLimits, ResponseMapper,
    ResponseObject, StreamEvent, UsageCounts, EVENT_TYPES, SSE_DONE,
};

const CATALOGUE: [&str; 24] = [
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.output_text.annotation.added",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "error",
];

/// The keys digest §3 requires on every response object.
const RESPONSE_KEYS: [&str; 31] = [
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
];

fn all_kinds_of_events() -> Vec<StreamEvent> {
    let req = validate(
        json!({"model": "m", "input": "x"}),
        &RequestLimits::default(),
    )
    .unwrap();
    let mut m = ResponseMapper::new("resp_1".into(), 1, &req);
    let mut events = m.enqueue();
    events.extend(m.start());
    for input in [
        MapperInput::ReasoningDelta("hmm".into()),
        MapperInput::TextDelta("hi".into()),
        MapperInput::FunctionCallStarted {
            call_id: "call_1".into(),
            name: "f".into(),
        },
        MapperInput::FunctionCallArgumentsDelta("{}".into()),
        MapperInput::FunctionCallDone,
        MapperInput::Finished {
            reason: FinishKind::MaxOutputTokens,
            usage: UsageCounts::default(),
        },
    ] {
        events.extend(m.push(input));
    }
    let mut failing = ResponseMapper::new("resp_2".into(), 1, &req);
    events.extend(failing.push(MapperInput::Failed {
        message: "x".into(),
    }));
    let mut completing = ResponseMapper::new("resp_3".into(), 1, &req);
    events.extend(completing.push(MapperInput::Finished {
        reason: FinishKind::Stop,
        usage: UsageCounts::default(),
    }));
    events.extend(events_the_mapper_does_not_emit());
    events
}

/// The catalogue events Spindle's mapper never produces (refusals,
/// annotations, reasoning summaries), built by hand.
fn events_the_mapper_does_not_emit() -> Vec<StreamEvent> {
    use spindle_server::protocol::events::*;
    use spindle_server::protocol::OutputContent;
    let (item_id, output_index, content_index) = ("msg_1".to_owned(), 0, 0);
    let summary = OutputContent::SummaryText { text: "s".into() };
    vec![
        StreamEvent::AnnotationAdded(AnnotationAddedEvent {
            sequence_number: 90,
            item_id: item_id.clone(),
            output_index,
            content_index,
            annotation_index: 0,
            annotation: json!({"type": "url_citation", "url": "https://x", "start_index": 0, "end_index": 1, "title": "t"}),
        }),
        StreamEvent::RefusalDelta(PartDeltaEvent {
            sequence_number: 91,
            item_id: item_id.clone(),
            output_index,
            content_index,
            delta: "no".into(),
        }),
        StreamEvent::RefusalDone(RefusalDoneEvent {
            sequence_number: 92,
            item_id: item_id.clone(),
            output_index,
            content_index,
            refusal: "no".into(),
        }),
        StreamEvent::ReasoningSummaryPartAdded(SummaryPartEvent {
            sequence_number: 93,
            item_id: item_id.clone(),
            output_index,
            summary_index: 0,
            part: summary.clone(),
        }),
        StreamEvent::ReasoningSummaryTextDelta(SummaryTextDeltaEvent {
            sequence_number: 94,
            item_id: item_id.clone(),
            output_index,
            summary_index: 0,
            delta: "s".into(),
        }),
        StreamEvent::ReasoningSummaryTextDone(SummaryTextDoneEvent {
            sequence_number: 95,
            item_id: item_id.clone(),
            output_index,
            summary_index: 0,
            text: "s".into(),
        }),
        StreamEvent::ReasoningSummaryPartDone(SummaryPartEvent {
            sequence_number: 96,
            item_id,
            output_index,
            summary_index: 0,
            part: summary,
        }),
    ]
}

#[test]
fn event_names_are_exactly_the_catalogue() {
    assert_eq!(EVENT_TYPES, CATALOGUE);
}

#[test]
fn events_round_trip_with_their_type_names() {
    let events = all_kinds_of_events();
    let mut seen: Vec<&str> = events.iter().map(StreamEvent::event_type).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), CATALOGUE.len(), "{seen:?}");
    for e in &events {
        let v = serde_json::to_value(e).unwrap();
        assert_eq!(v["type"], e.event_type());
        assert!(CATALOGUE.contains(&e.event_type()));
        assert_eq!(v["sequence_number"], e.sequence_number());
        assert_eq!(
            v.as_object().unwrap().keys().next().map(String::as_str),
            Some("type")
        );
        let back: StreamEvent = serde_json::from_value(v).unwrap();
        assert_eq!(&back, e);
    }
}

#[test]
fn sse_frames_are_one_line_events() {
    for e in all_kinds_of_events() {
        let frame = e.to_sse().unwrap();
        let expected_head = format!("event: {}\ndata: ", e.event_type());
        assert!(frame.starts_with(&expected_head), "{frame}");
        assert!(frame.ends_with("}\n\n"));
        assert!(!frame.contains('\r'));
        assert_eq!(frame.matches('\n').count(), 3);
        let data = frame.strip_prefix(&expected_head).unwrap().trim_end();
        assert_eq!(
            serde_json::from_str::<Value>(data).unwrap(),
            serde_json::to_value(&e).unwrap()
        );
    }
    assert_eq!(SSE_DONE, "data: [DONE]\n\n");
}

#[test]
fn response_objects_carry_every_required_key() {
    for e in all_kinds_of_events() {
        let Some(r) = e.response() else { continue };
        let v = serde_json::to_value(r).unwrap();
        let obj = v.as_object().unwrap();
        for key in RESPONSE_KEYS {
            assert!(obj.contains_key(key), "{} lacks {key}", e.event_type());
        }
        assert_eq!(v["object"], "response");
        assert_eq!(v["text"], json!({"format": {"type": "text"}}));
        assert_eq!(v["tool_choice"], "auto");
        assert_eq!(v["truncation"], "disabled");
        assert_eq!(v["service_tier"], "auto");
        assert_eq!(
            (v["temperature"].as_f64(), v["top_p"].as_f64()),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(v["metadata"], json!({}));
        assert_eq!(v["reasoning"], Value::Null);
        let back: ResponseObject = serde_json::from_value(v).unwrap();
        assert_eq!(&back, r);
    }
}

#[test]
fn echoed_settings_have_the_response_shapes() {
    let req = validate(
        json!({"input": "x", "model": "m",
               "tools": [{"type": "function", "name": "f"}],
               "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "f"}]},
               "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "verbosity": "high"},
               "reasoning": {"effort": "low"}}),
        &RequestLimits::default(),
    )
    .unwrap();
    let v = serde_json::to_value(ResponseMapper::new("resp_1".into(), 1, &req).response()).unwrap();
    assert_eq!(
        v["tools"],
        json!([{"type": "function", "name": "f", "description": null, "parameters": null, "strict": null}])
    );
    assert_eq!(
        v["tool_choice"],
        json!({"type": "allowed_tools", "tools": [{"type": "function", "name": "f"}], "mode": "auto"})
    );
    assert_eq!(
        v["text"],
        json!({"format": {"type": "json_schema", "name": "response", "description": null, "schema": null, "strict": false}, "verbosity": "high"})
    );
    assert_eq!(v["reasoning"], json!({"effort": "low", "summary": null}));
    let forced = validate(json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "f"}}), &RequestLimits::default()).unwrap();
    let v =
        serde_json::to_value(ResponseMapper::new("resp_1".into(), 1, &forced).response()).unwrap();
    assert_eq!(v["tool_choice"], json!({"type": "function", "name": "f"}));
}

#[test]
fn input_items_round_trip_through_json() {
    let req = validate(
        json!({"input": [
            {"role": "user", "content": "plain"},
            {"role": "user", "content": [{"type": "input_text", "text": "t"}, {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]},
            {"role": "assistant", "phase": "commentary", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "o"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            {"type": "item_reference", "id": "msg_1"},
            {"type": "compaction", "encrypted_content": "e"}
        ]}),
        &RequestLimits::default(),
    )
    .unwrap();
    for item in &req.input {
        let v = serde_json::to_value(item).unwrap();
        let back: InputItem = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(&back, item, "{v}");
        // The validator accepts its own serialization too.
        let again = validate(json!({"input": [v]}), &RequestLimits::default()).unwrap();
        assert_eq!(&again.input[0], item);
    }
}

#[test]
fn stored_output_items_read_back_as_input_items() {
    let events = all_kinds_of_events();
    let last = events
        .iter()
        .rev()
        .find(|e| e.event_type() == "response.incomplete")
        .unwrap();
    let output: Vec<OutputItem> = last.response().unwrap().output.clone();
    assert_eq!(output.len(), 3);
    for item in &output {
        let v = serde_json::to_value(item).unwrap();
        let via_serde: InputItem = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(via_serde, item.to_input(), "{v}");
        let via_validator = validate(json!({"input": [v]}), &RequestLimits::default()).unwrap();
        assert_eq!(via_validator.input[0], item.to_input());
    }
}
