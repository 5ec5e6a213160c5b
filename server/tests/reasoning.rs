//! A thinking model's output (no model needed): generated tokens through the
//! reasoning splitter, the tool-call parser and the mapper give a `reasoning`
//! item with `response.reasoning.delta` events first, then the answer (here a
//! streamed call), with `reasoning_tokens` counted.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{json, Value};
use spindle_server::app::format::reasoning::{ReasoningSplitter, ThinkTags};
use spindle_server::app::format::tool_parser::ToolCallParser;
use spindle_server::protocol::{validate, FinishKind, MapperInput, RequestLimits, ResponseMapper, UsageCounts};

const TAGS: ThinkTags = ThinkTags { open: 900, close: 901 };

#[test]
fn reasoning_then_a_streamed_call_with_reasoning_tokens_counted() {
    let req = validate(json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}), &RequestLimits::default()).unwrap();
    let mut mapper = ResponseMapper::new("resp_r".into(), 1, &req);
    let mut parser = ToolCallParser::for_response(mapper.response_ref(), spindle_server::app::format::constrain::CallFormat::Hermes(None)).unwrap();
    let mut split = ReasoningSplitter::new(TAGS, false);
    let tokens: [(u32, &str); 9] = [(900, "<think>"), (1, "\nThe user"), (2, " wants weather.\n"), (901, "</think>"), (3, "\n\n"),
        (4, "<tool_call>\n{\"name\": \"get_weather\", "), (5, "\"arguments\": {\"city\": "), (6, "\"Oslo\"}}"), (7, "\n</tool_call>")];
    let mut events: Vec<Value> = mapper.start().iter().map(|e| serde_json::to_value(e).unwrap()).collect();
    let mut push = |inputs: Vec<MapperInput>, parser: &mut ToolCallParser, mapper: &mut ResponseMapper| {
        for input in inputs.into_iter().flat_map(|i| parser.route(i)) {
            events.extend(mapper.push(input).iter().map(|e| serde_json::to_value(e).unwrap()));
        }
    };
    for (id, text) in tokens {
        push(split.token(id, text.to_string()), &mut parser, &mut mapper);
    }
    let usage = UsageCounts { input_tokens: 10, cached_tokens: 0, output_tokens: 9, reasoning_tokens: split.reasoning_tokens() };
    push(vec![MapperInput::Finished { reason: FinishKind::Stop, usage }], &mut parser, &mut mapper);

    let response = serde_json::to_value(mapper.response()).unwrap();
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{output:?}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["text"], "\nThe user wants weather.\n");
    assert_eq!((output[1]["type"].as_str(), output[1]["name"].as_str()), (Some("function_call"), Some("get_weather")));
    assert_eq!(output[1]["arguments"], "{\"city\": \"Oslo\"}");
    assert_eq!(response["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let first_reasoning = kinds.iter().position(|k| *k == "response.reasoning.delta").expect("reasoning deltas");
    let first_call_delta = kinds.iter().position(|k| *k == "response.function_call_arguments.delta").unwrap();
    assert!(first_reasoning < first_call_delta, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "response.reasoning.delta").count(), 2);
    assert_eq!(*kinds.last().unwrap(), "response.completed");
}
