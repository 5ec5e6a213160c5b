//! Bounded fuzzing that CI runs: a fixed seed and a fixed number of cases per
//! target, over what a client controls. Request validation (Open Responses)
//! and the Chat Completions mapping get random JSON built from their own
//! field names and mutations of valid bodies; the tool-call parsers get
//! random splits of text rich in their markers; SSE framing gets events
//! with random text (each must frame as one event and read back equal). Every case must return (no panic) and keep its invariants. (The
//! GGUF reader's corruption and truncation cases are in the engine's
//! `gguf_bad_input` tests.)
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{json, Map, Value};
use spindle_server::app::routes::chat::request::{chat_to_responses, ChatBody};
use spindle_server::app::http::extract::from_value;
use spindle_server::app::http::sse;
use spindle_server::app::runtime::drive::Outgoing;
use spindle_server::app::format::tool_parser::ToolCallParser;
use spindle_server::protocol::mapper::MapperInput;
use spindle_server::protocol::events::OutputTextDeltaEvent;
use spindle_server::protocol::{validate, RequestLimits, StreamEvent};
use spindle_testenv::Rng;

/// Cases per target.
const CASES: usize = 20_000;

const STRINGS: &[&str] = &["", "a", "user", "assistant", "system", "tool", "function", "auto", "none", "required", "json_schema",
    "json_object", "text", "input_text", "output_text", "message", "function_call", "function_call_output", "call_1", "get_weather",
    "\u{0}", "a\nb", "é\u{301}", "<tool_call>", "{\"", "resp_1", "-1", "1e999", "🙂"];

/// Random JSON shaped like the bodies: keys from `keys`, nested values.
fn value(rng: &mut Rng, keys: &[&str], depth: usize) -> Value {
    match rng.below(if depth == 0 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 1),
        2 => json!(rng.next() as i64 % 100_000 - 50_000),
        3 => json!((rng.next() % 1000) as f64 / 7.0 - 50.0),
        4 | 5 => json!(rng.pick(STRINGS)),
        6 | 7 => {
            let mut m = Map::new();
            for _ in 0..rng.below(6) {
                let key = rng.pick(keys).to_string();
                m.insert(key, value(rng, keys, depth - 1));
            }
            Value::Object(m)
        }
        _ => Value::Array((0..rng.below(4)).map(|_| value(rng, keys, depth - 1)).collect()),
    }
}

/// `base` with a few of its values (at any depth) replaced by random ones.
fn mutate(rng: &mut Rng, base: &Value, keys: &[&str]) -> Value {
    let mut v = base.clone();
    for _ in 0..1 + rng.below(3) {
        // A random path, as a JSON pointer, walked read-only first.
        let mut pointer = String::new();
        let mut at = &v;
        loop {
            let next = match at {
                Value::Object(m) if !m.is_empty() && rng.below(3) > 0 => {
                    let (k, child) = m.iter().nth(rng.below(m.len())).unwrap();
                    pointer.push('/');
                    pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    Some(child)
                }
                Value::Array(a) if !a.is_empty() && rng.below(3) > 0 => {
                    let i = rng.below(a.len());
                    pointer.push_str(&format!("/{i}"));
                    a.get(i)
                }
                _ => None,
            };
            match next {
                Some(n) => at = n,
                None => break,
            }
        }
        let replacement = value(rng, keys, 2);
        if let Some(slot) = v.pointer_mut(&pointer) {
            *slot = replacement;
        }
    }
    v
}

const RESPONSE_KEYS: &[&str] = &["model", "input", "instructions", "tools", "tool_choice", "text", "format", "type", "role", "content",
    "name", "parameters", "strict", "schema", "max_output_tokens", "temperature", "top_p", "stream", "store", "background",
    "previous_response_id", "truncation", "reasoning", "effort", "summary", "include", "metadata", "call_id", "arguments", "output",
    "text", "id", "status", "seed", "top_logprobs", "allowed_tools", "tools", "mode", "parallel_tool_calls", "max_tool_calls"];

#[test]
fn request_validation_never_panics_and_errors_are_4xx() {
    let mut rng = Rng(0x5EED_0001);
    let valid = json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "x"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}],
        "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}, "max_output_tokens": 64, "temperature": 0.5});
    let limits = RequestLimits::default();
    assert!(validate(valid.clone(), &limits).is_ok());
    let (mut ok, mut refused) = (0, 0);
    for i in 0..CASES {
        let body = if i % 2 == 0 { mutate(&mut rng, &valid, RESPONSE_KEYS) } else { value(&mut rng, RESPONSE_KEYS, 4) };
        match validate(body.clone(), &limits) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!((400..500).contains(&e.status), "case {i}: {} for {body}", e.status);
                assert!(!e.message.is_empty(), "case {i}: empty message for {body}");
                refused += 1;
            }
        }
    }
    println!("validate: {CASES} cases, {ok} accepted, {refused} refused, 0 panics");
    assert!(ok > 100 && refused > 100, "the cases exercise both outcomes: {ok} accepted, {refused} refused");
}

const CHAT_KEYS: &[&str] = &["model", "messages", "role", "content", "tool_calls", "tool_call_id", "function", "name", "arguments", "id",
    "type", "text", "image_url", "url", "tools", "parameters", "tool_choice", "response_format", "json_schema", "schema", "stop", "n",
    "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "stream", "stream_options", "include_usage", "seed"];

#[test]
fn chat_mapping_and_validation_never_panic() {
    let mut rng = Rng(0x5EED_0002);
    let valid = json!({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "stop": ["x"], "max_tokens": 8, "response_format": {"type": "json_object"}});
    let limits = RequestLimits::default();
    let (mut mapped, mut valid_count) = (0, 0);
    for i in 0..CASES {
        let body = if i % 2 == 0 { mutate(&mut rng, &valid, CHAT_KEYS) } else { value(&mut rng, CHAT_KEYS, 4) };
        match from_value::<ChatBody>(body.clone()).and_then(chat_to_responses) {
            Ok((responses_body, _)) => {
                mapped += 1;
                match validate(responses_body, &limits) {
                    Ok(_) => valid_count += 1,
                    Err(e) => assert!((400..500).contains(&e.status), "case {i}: {}", e.status),
                }
            }
            Err(e) => assert!((400..500).contains(&e.status), "case {i}: {} for {body}", e.status),
        }
    }
    println!("chat mapping: {CASES} cases, {mapped} mapped, {valid_count} valid, 0 panics");
    assert!(valid_count > 100, "{valid_count}");
}

const MARKERS: &[&str] = &["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "{", "}", "[", "]", "\"name\"", "\"arguments\"", ":", ",", "\"",
    "\\", "f", "g", " ", "\n", "text", "\"f\"", "{\"a\": 1}", "é"];

/// Text without any of the parsers' markers.
const PLAIN: &[&str] = &["text", " ", "é", "\n", "f", "Sure! ", "1."];

#[test]
fn tool_call_parsers_never_panic_and_keep_text_or_calls() {
    let mut rng = Rng(0x5EED_0003);
    let (mut calls, mut well_formed_calls) = (0, 0);
    for i in 0..CASES {
        let mistral = i % 2 == 1;
        // Every fourth case is one well-formed call (after random text);
        // the rest are soups of the parsers' markers.
        let well_formed = i % 4 < 2;
        let noise: String = if well_formed {
            (0..rng.below(6)).map(|_| *rng.pick(PLAIN)).collect()
        } else {
            (0..rng.below(40)).map(|_| *rng.pick(MARKERS)).collect()
        };
        let text = match (well_formed, mistral) {
            (true, false) => format!("{noise}<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\": 1}}}}\n</tool_call>"),
            (true, true) => format!("{noise}[TOOL_CALLS] [{{\"name\": \"f\", \"arguments\": {{\"a\": 1}}}}]"),
            (false, _) => noise,
        };
        let mut parser = ToolCallParser::new(["f"], rng.below(2) == 0, None);
        if mistral {
            parser = parser.mistral();
        }
        let mut out = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut cut = 1 + rng.below(6).min(rest.len() - 1);
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let (piece, tail) = rest.split_at(cut);
            out.extend(parser.push(piece));
            rest = tail;
        }
        out.extend(parser.finish());
        // Whatever came in went out as text or as (well-formed) calls.
        let emitted: usize = out.iter().map(|m| match m {
            MapperInput::TextDelta(t) => t.len(),
            _ => 0,
        }).sum();
        let started = out.iter().filter(|m| matches!(m, MapperInput::FunctionCallStarted { .. })).count();
        let done = out.iter().filter(|m| matches!(m, MapperInput::FunctionCallDone)).count();
        assert_eq!(started, done, "case {i}: {text:?} -> {out:?}");
        assert!(started > 0 || emitted <= text.len(), "case {i}: more text out than in: {text:?}");
        calls += started;
        well_formed_calls += usize::from(well_formed && started == 1);
    }
    println!("tool-call parsers: {CASES} cases, {calls} calls parsed ({well_formed_calls} of {} well-formed ones), 0 panics", CASES / 2);
    assert_eq!(well_formed_calls, CASES / 2, "well-formed calls after plain text were missed");
}

#[test]
fn sse_frames_are_one_event_each_whatever_the_text() {
    let mut rng = Rng(0x5EED_0004);
    for i in 0..CASES {
        let text: String = (0..rng.below(6)).map(|_| *rng.pick(STRINGS)).collect();
        let event = StreamEvent::OutputTextDelta(OutputTextDeltaEvent {
            sequence_number: rng.below(1 << 20) as u64,
            item_id: rng.pick(STRINGS).to_string(),
            output_index: rng.below(4),
            content_index: 0,
            delta: text,
            logprobs: Vec::new(),
        });
        let frame = sse::outgoing(Outgoing::Event(event.clone())).expect("every event frames");
        assert!(frame.ends_with("\n\n"), "case {i}: {frame:?}");
        let body = &frame[..frame.len() - 2];
        let lines: Vec<&str> = body.split('\n').collect();
        assert_eq!(lines.len(), 2, "case {i}: an event split over lines: {frame:?}");
        assert_eq!(lines[0], "event: response.output_text.delta", "case {i}");
        let data = lines[1].strip_prefix("data: ").expect("a data line");
        let back: StreamEvent = serde_json::from_str(data).expect("the data reads back");
        assert_eq!(back, event, "case {i}");
    }
    println!("SSE framing: {CASES} cases, 0 panics");
}
