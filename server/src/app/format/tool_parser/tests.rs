//! Tests of the streaming tool-call parser.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::protocol::request::{validate, RequestLimits};
use serde_json::json;

/// Text runs merged; calls as `name(args)`.
fn summary(inputs: &[MapperInput]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut text: Option<String> = None;
    for input in inputs {
        match input {
            MapperInput::TextDelta(t) => text.get_or_insert_with(String::new).push_str(t),
            MapperInput::FunctionCallStarted { call_id, name } => {
                out.extend(text.take());
                assert!(call_id.starts_with("call_"));
                out.push(format!("{name}("));
            }
            MapperInput::FunctionCallArgumentsDelta(a) => {
                out.last_mut().unwrap().push_str(a);
            }
            MapperInput::FunctionCallDone => out.last_mut().unwrap().push(')'),
            other => out.push(format!("{other:?}")),
        }
    }
    out.extend(text);
    out
}

fn parser() -> ToolCallParser {
    ToolCallParser::new(["get_weather", "get_time"], true, None)
}

/// Runs `output` whole, char by char and in 3-char pieces through
/// `make()`; all must give `expected`.
fn check(make: impl Fn() -> ToolCallParser, output: &str, expected: &[&str]) {
    let chars: Vec<char> = output.chars().collect();
    for size in [usize::MAX, 1, 3] {
        let mut p = make();
        let mut inputs = Vec::new();
        for piece in chars.chunks(size.min(chars.len().max(1))) {
            inputs.extend(p.push(&piece.iter().collect::<String>()));
        }
        inputs.extend(p.finish());
        assert_eq!(summary(&inputs), expected, "pieces of {size}: {output:?}");
    }
}

const CALL_A: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const CALL_B: &str =
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";

#[test]
fn plain_text_passes_through_and_streams() {
    check(
        parser,
        "Hello there, friend.\n",
        &["Hello there, friend.\n"],
    );
    check(parser, "a < b and <tool", &["a < b and <tool"]);
    let mut p = parser();
    assert_eq!(summary(&p.push("Hello")), ["Hello"]);
    assert_eq!(summary(&p.push(" <tool_")), Vec::<String>::new());
    assert_eq!(summary(&p.push("x")), [" <tool_x"]);
}

#[test]
fn no_parser_when_no_call_may_be_made() {
    let tools = json!([{"type": "function", "name": "get_weather"}]);
    let limits = RequestLimits::default();
    let response = |extra: serde_json::Value| {
        let mut body = json!({"model": "m", "input": "x", "tools": tools});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let req = validate(body, &limits).unwrap();
        crate::protocol::mapper::ResponseMapper::new("r".into(), 0, &req).response()
    };
    assert!(ToolCallParser::for_response(&response(json!({})), CallFormat::Hermes(None)).is_some());
    for extra in [json!({"tool_choice": "none"}),
                  json!({"tool_choice": {"type": "allowed_tools", "mode": "none", "tools": [{"type": "function", "name": "get_weather"}]}})] {
        assert!(ToolCallParser::for_response(&response(extra.clone()), CallFormat::Hermes(None)).is_none(), "{extra}");
    }
}

#[test]
fn a_streamed_call_cut_off_by_the_token_limit_stays_open() {
    let mut p = parser();
    let mut inputs = p.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par");
    inputs.extend(p.finish());
    assert!(matches!(&inputs[0], MapperInput::FunctionCallStarted { name, .. } if name == "get_weather"));
    assert_eq!(inputs[1..], [MapperInput::FunctionCallArgumentsDelta("{\"city\": \"Par".into())]);
}

#[test]
fn the_start_of_a_call_cut_off_by_the_token_limit_is_not_text() {
    let finished = |reason| MapperInput::Finished { reason, usage: Default::default() };
    // A second call cut off after its tag's first character: no stray "<".
    let mut p = parser();
    let mut inputs = p.route(MapperInput::TextDelta(format!("{CALL_A}\n<")));
    inputs.extend(p.route(finished(FinishKind::MaxOutputTokens)));
    assert_eq!(summary(&inputs[..inputs.len() - 1]), [r#"get_weather({"city": "Paris"})"#], "{inputs:?}");
    // Text before the cut-off tag stays.
    let mut p = parser();
    let mut inputs = p.route(MapperInput::TextDelta("It is 3 <tool_c".into()));
    inputs.extend(p.route(finished(FinishKind::ContextLength)));
    assert_eq!(summary(&inputs[..inputs.len() - 1]), ["It is 3"]);
    // An answer that ends by itself keeps its last character.
    let mut p = parser();
    let mut inputs = p.route(MapperInput::TextDelta("x <".into()));
    inputs.extend(p.route(finished(FinishKind::Stop)));
    assert_eq!(summary(&inputs[..inputs.len() - 1]), ["x <"]);
}

#[test]
fn one_call_becomes_started_arguments_done() {
    let mut p = parser();
    let mut inputs = p.push(CALL_A);
    inputs.extend(p.finish());
    assert!(
        matches!(&inputs[0], MapperInput::FunctionCallStarted { name, .. } if name == "get_weather")
    );
    assert_eq!(
        inputs[1],
        MapperInput::FunctionCallArgumentsDelta(r#"{"city": "Paris"}"#.into())
    );
    assert_eq!(inputs[2], MapperInput::FunctionCallDone);
    assert_eq!(inputs.len(), 3);
    check(parser, CALL_A, &[r#"get_weather({"city": "Paris"})"#]);
}

#[test]
fn two_calls_are_two_items_without_text_between() {
    let out = format!("{CALL_A}\n{CALL_B}\n");
    check(
        parser,
        &out,
        &[
            r#"get_weather({"city": "Paris"})"#,
            r#"get_time({"tz": "UTC"})"#,
        ],
    );
    let mut p = parser();
    let ids: Vec<String> = p
        .push(&out)
        .into_iter()
        .filter_map(|i| match i {
            MapperInput::FunctionCallStarted { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    assert!(ids.len() == 2 && ids[0] != ids[1]);
}

#[test]
fn text_before_and_after_a_call() {
    let out = format!("Let me check.\n{CALL_A}\nDone: it is sunny.");
    check(
        parser,
        &out,
        &[
            "Let me check.",
            r#"get_weather({"city": "Paris"})"#,
            "Done: it is sunny.",
        ],
    );
}

#[test]
fn malformed_blocks_stay_text() {
    for out in [
        "Hi <tool_call>{\"name\": \"get_weather\", oops}</tool_call> bye",
        "Hi <tool_call>not json</tool_call>",
        "Hi <tool_call>{\"name\": \"unknown_fn\", \"arguments\": {}}</tool_call>",
        "Hi <tool_call>{\"name\": \"get_weather\", \"arguments\": [1]}</tool_call>",
        "Hi <tool_call>{\"name\": \"get_weather\", \"argu",
        "Hi <tool_call>",
    ] {
        check(parser, out, &[out]);
    }
    let out = format!("<tool_call>[1]</tool_call>{CALL_B}");
    check(
        parser,
        &out,
        &["<tool_call>[1]</tool_call>", r#"get_time({"tz": "UTC"})"#],
    );
}

#[test]
fn parallel_tool_calls_false_keeps_the_first_call() {
    let out = format!("{CALL_A}\n{CALL_B}\n{CALL_A}");
    let single = || ToolCallParser::new(["get_weather", "get_time"], false, None);
    check(single, &out, &[r#"get_weather({"city": "Paris"})"#]);
}

#[test]
fn max_tool_calls_caps_the_calls() {
    let out = format!("{CALL_A}{CALL_B}{CALL_A}");
    let capped = || ToolCallParser::new(["get_weather", "get_time"], true, Some(2));
    check(
        capped,
        &out,
        &[
            r#"get_weather({"city": "Paris"})"#,
            r#"get_time({"tz": "UTC"})"#,
        ],
    );
}

#[test]
fn argument_variants_and_bare_json() {
    let out = r#"<tool_call>{"name": "get_time", "parameters": {"tz": "CET"}}</tool_call>"#;
    check(parser, out, &[r#"get_time({"tz": "CET"})"#]);
    let out =
        r#"<tool_call>{"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}</tool_call>"#;
    check(parser, out, &[r#"get_time({"tz":"CET"})"#]);
    check(
        parser,
        r#"<tool_call>{"name": "get_time"}"#,
        &["get_time({})"],
    );
    let llama = r#" {"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
    check(parser, llama, &[r#"get_weather({"city": "Oslo"})"#]);
    check(
        parser,
        r#"{"answer": 42} is JSON"#,
        &[r#"{"answer": 42} is JSON"#],
    );
    check(parser, r#"{"name": "x"}"#, &[r#"{"name": "x"}"#]);
}

#[test]
fn route_flushes_before_finished_and_for_response_reads_the_request() {
    let mut p = parser();
    assert!(p.route(MapperInput::TextDelta("ok <tool_c".into())).len() == 1);
    let finished = MapperInput::Finished {
        reason: crate::protocol::FinishKind::Stop,
        usage: Default::default(),
    };
    let out = p.route(finished.clone());
    assert_eq!(
        out,
        vec![MapperInput::TextDelta(" <tool_c".into()), finished]
    );
    let req = |extra: Value| {
        let mut body = json!({"input": "x", "tools": [{"type": "function", "name": "f"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let req = validate(body, &RequestLimits::default()).unwrap();
        ResponseObject::new("resp_1".into(), 0, &req)
    };
    assert!(ToolCallParser::for_response(&req(json!({})), CallFormat::Hermes(None)).is_some());
    assert!(ToolCallParser::for_response(&req(json!({"tool_choice": "none"})), CallFormat::Hermes(None)).is_none());
    assert!(ToolCallParser::for_response(&req(json!({"tools": []})), CallFormat::Hermes(None)).is_none());
}

#[test]
fn mistral_lists_are_calls_and_a_stray_marker_stays_text() {
    let mistral = || parser().mistral();
    let two = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]";
    check(mistral, two, &["get_weather({\"city\": \"Paris\"})", "get_time({\"tz\": \"UTC\"})"]);
    check(mistral, &format!("Let me check.{two}"), &["Let me check.", "get_weather({\"city\": \"Paris\"})", "get_time({\"tz\": \"UTC\"})"]);
    check(mistral, "[TOOL_CALLS] nothing", &["[TOOL_CALLS] nothing"]);
    check(mistral, "[TOOL_CALLS] [{\"name\": \"get_w", &["[TOOL_CALLS] [{\"name\": \"get_w"]);
    check(mistral, "[TOOL_ and text", &["[TOOL_ and text"]);
    // A list cut off inside its second call: the first call, then the rest as written.
    let cut = "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}, {\"name\": \"get_w";
    check(mistral, cut, &["get_time({\"tz\": \"UTC\"})", ", {\"name\": \"get_w"]);
    // Hermes tags are plain text to a Mistral parser.
    check(mistral, CALL_A, &[CALL_A]);
    let one = || ToolCallParser::new(["get_weather", "get_time"], false, None).mistral();
    check(one, two, &["get_weather({\"city\": \"Paris\"})"]);
}

/// A parser that also reads fenced calls, `get_weather` needing a string `city`.
fn fenced_parser() -> ToolCallParser {
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false});
    parser().with_fenced_calls(vec![("get_weather".into(), Some(weather)), ("get_time".into(), None)])
}

#[test]
fn an_answer_that_is_one_fenced_call_with_fitting_arguments_is_a_call() {
    let fenced = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
    check(fenced_parser, fenced, &["get_weather({\"city\":\"Paris\"})"]);
    check(fenced_parser, &format!("\n{fenced}\n"), &["get_weather({\"city\":\"Paris\"})"]);
    check(fenced_parser, "```\n{\"name\": \"get_time\", \"arguments\": {}}\n```", &["get_time({})"]);
    // Without schemas (a parser not made for a response's tools) it is text.
    check(parser, fenced, &[fenced]);
}

#[test]
fn fenced_answers_that_are_not_certain_calls_stay_text() {
    for text in [
        // Arguments that do not fit the schema, an unknown tool, more text.
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n```",
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n```",
        "```json\n{\"name\": \"send_mail\", \"arguments\": {}}\n```",
        "```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```\nThat calls the tool.",
        "```python\nprint('hi')\n```",
        "``not a fence",
        "`x`",
    ] {
        check(fenced_parser, text, &[text]);
    }
}

fn lp(token: &str) -> crate::protocol::LogProb {
    crate::protocol::LogProb { token: token.into(), logprob: -0.5, bytes: token.as_bytes().to_vec(), top_logprobs: Vec::new() }
}

/// Text and the tokens' entries it carries, over everything `inputs` holds.
fn text_and_entries(inputs: &[MapperInput]) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut entries = Vec::new();
    for input in inputs {
        match input {
            MapperInput::TextDelta(t) => text.push_str(t),
            MapperInput::TextDeltaWithLogprobs { text: t, logprobs } => {
                text.push_str(t);
                entries.extend(logprobs.iter().map(|l| l.token.clone()));
            }
            _ => {}
        }
    }
    (text, entries)
}

#[test]
fn log_probabilities_go_with_their_text_and_not_with_calls() {
    let mut p = parser();
    let mut out = Vec::new();
    for token in ["Sure", ", ", "here", ".", " <tool_call>", "\n{\"name\": \"get_time\", \"arguments\": {}}", "\n</tool_call>"] {
        out.extend(p.route(MapperInput::TextDeltaWithLogprobs { text: token.into(), logprobs: vec![lp(token)] }));
    }
    out.extend(p.finish());
    let (text, entries) = text_and_entries(&out);
    assert_eq!(text, "Sure, here.");
    assert_eq!(entries, ["Sure", ", ", "here", "."], "the text's tokens keep their entries; the call's are dropped");
    let calls: Vec<&MapperInput> = out.iter().filter(|i| matches!(i, MapperInput::FunctionCallStarted { name, .. } if name == "get_time")).collect();
    assert_eq!(calls.len(), 1, "{out:?}");
}
