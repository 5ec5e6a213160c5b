//! Constrained decoding with the real model over HTTP: the event order of a
//! streamed response with two parallel calls (name first, argument deltas,
//! done), `allowed_tools` narrowing that keeps the prompt tokens and the
//! prefix-cache hits of an unchanged request, the seed article's check (one
//! allowed tool, a request for another: the other is never emitted),
//! `json_object` output, and 400s for schemas that cannot be enforced.
//! (The 50-request-per-mode checks with schema validation are in
//! `tests/python/test_constrained.py`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::format::tools::render_prompt;
use spindle_server::app::Limits;
use spindle_server::protocol::{validate, RequestLimits};

fn tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "description": "Get the weather for a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}},
        {"type": "function", "name": "get_time", "description": "Get the local time in a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}},
        {"type": "function", "name": "send_email", "description": "Send an email.",
         "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}},
    ])
}

fn body(input: Value, extra: Value) -> Value {
    let mut b = json!({"model": "smollm2-135m-instruct", "input": input, "tools": tools(), "max_output_tokens": 160, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn post(s: &common::Server, b: &Value) -> (u16, Value) {
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(b).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The SSE events of a streamed request.
async fn stream(s: &common::Server, b: &Value) -> Vec<Value> {
    let mut b = b.clone();
    b["stream"] = json!(true);
    let text = common::http().post(format!("{}/v1/responses", s.base)).json(&b).send().await.unwrap().text().await.unwrap();
    text.split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn calls(response: &Value) -> Vec<&Value> {
    response["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect()
}

#[tokio::test]
async fn two_parallel_calls_stream_in_order_name_first_then_argument_deltas() {
    let s = common::start(vec![], Limits::default()).await;
    let mut found = None;
    for seed in 0..24 {
        let b = body(json!("What is the weather in Paris, and the time in Tokyo?"),
                     json!({"tool_choice": "required", "max_tool_calls": 2, "temperature": 0.8, "seed": seed}));
        let events = stream(&s, &b).await;
        if calls(&events.last().unwrap()["response"]).len() == 2 && events.last().unwrap()["type"] == "response.completed" {
            found = Some(events);
            break;
        }
    }
    let events = found.expect("no seed in 0..24 gave two completed calls");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for output_index in 0..2u64 {
        let of = |t: &str| -> Vec<usize> {
            (0..events.len()).filter(|&i| kinds[i] == t && events[i]["output_index"] == output_index).collect()
        };
        let (added, deltas, done, item_done) = (of("response.output_item.added"), of("response.function_call_arguments.delta"),
            of("response.function_call_arguments.done"), of("response.output_item.done"));
        assert_eq!((added.len(), done.len(), item_done.len()), (1, 1, 1), "{kinds:?}");
        assert!(deltas.len() > 1, "the arguments stream in several deltas");
        assert!(added[0] < deltas[0] && *deltas.last().unwrap() < done[0] && done[0] < item_done[0], "{kinds:?}");
        let item = &events[added[0]]["item"];
        assert_eq!((item["type"].as_str(), item["status"].as_str(), item["arguments"].as_str()), (Some("function_call"), Some("in_progress"), Some("")));
        let joined: String = deltas.iter().map(|&i| events[i]["delta"].as_str().unwrap()).collect();
        assert_eq!(events[done[0]]["arguments"].as_str(), Some(joined.as_str()));
        let finished = &events[item_done[0]]["item"];
        assert_eq!((finished["status"].as_str(), finished["arguments"].as_str()), (Some("completed"), Some(joined.as_str())));
        let args: Value = serde_json::from_str(&joined).expect("arguments parse");
        assert!(args["city"].is_string(), "{args}");
    }
    let first_item_done = kinds.iter().position(|k| *k == "response.output_item.done").unwrap();
    let second_added = (0..events.len()).find(|&i| kinds[i] == "response.output_item.added" && events[i]["output_index"] == 1).unwrap();
    assert!(first_item_done < second_added, "the first call closes before the second opens");
    assert_eq!(*kinds.last().unwrap(), "response.completed");
}

#[tokio::test]
async fn narrowing_allowed_tools_keeps_the_prompt_tokens_and_the_cache_hits() {
    let narrowed = json!({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]});
    // The prompt does not depend on tool_choice: identical tokens.
    let limits = RequestLimits::default();
    let auto = validate(body(json!("Weather in Rome?"), json!({})), &limits).unwrap();
    let narrow = validate(body(json!("Weather in Rome?"), json!({"tool_choice": narrowed})), &limits).unwrap();
    let template = spindle_engine::chat_template::ChatTemplate::chatml_default();
    assert_eq!(render_prompt(&template, &auto, &auto.input).unwrap(), render_prompt(&template, &narrow, &narrow.input).unwrap());

    // A previous_response_id chain, on two fresh servers: turn 2 unchanged vs narrowed.
    let mut usage = Vec::new();
    for choice in [json!("auto"), narrowed] {
        let s = common::start(vec![], Limits::default()).await;
        let (status, first) = post(&s, &body(json!("Hello! I am planning a trip to Rome."), json!({"store": true}))).await;
        assert_eq!(status, 200, "{first}");
        let (status, second) = post(&s, &body(json!("What is the weather there?"),
            json!({"previous_response_id": first["id"], "tool_choice": choice}))).await;
        assert_eq!(status, 200, "{second}");
        usage.push(second["usage"].clone());
    }
    assert_eq!(usage[0]["input_tokens"], usage[1]["input_tokens"], "{usage:?}");
    let cached = |u: &Value| u["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached(&usage[0]) > 0, "{usage:?}");
    assert_eq!(cached(&usage[0]), cached(&usage[1]), "narrowing must not cost cache hits: {usage:?}");
}

#[tokio::test]
async fn one_allowed_tool_and_a_request_for_another_never_emits_the_other() {
    let s = common::start(vec![], Limits::default()).await;
    let only_weather = json!({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]});
    for seed in 0..8 {
        let b = body(json!("Send an email to bob@example.com telling him the report is ready."),
                     json!({"tool_choice": only_weather, "temperature": 0.9, "seed": seed}));
        let (status, r) = post(&s, &b).await;
        assert_eq!(status, 200, "{r}");
        for call in calls(&r) {
            assert_eq!(call["name"], "get_weather", "{r}");
        }
        // Free text may mention anything, but can never open a call block.
        let text: String = r["output"].as_array().unwrap().iter().filter(|i| i["type"] == "message")
            .map(|i| i["content"][0]["text"].as_str().unwrap_or("").to_string()).collect();
        assert!(!text.contains("<tool_call>"), "{text}");
    }
}

#[tokio::test]
async fn json_object_output_parses_and_unenforceable_schemas_are_400s() {
    let s = common::start(vec![], Limits::default()).await;
    let b = json!({"model": "smollm2-135m-instruct", "input": "Describe a cat as JSON.", "max_output_tokens": 200, "temperature": 0,
                   "text": {"format": {"type": "json_object"}}});
    let (status, r) = post(&s, &b).await;
    assert_eq!(status, 200, "{r}");
    // The small model may ramble inside a string until the token limit: a
    // completed answer is one JSON object, a cut one is the start of one
    // (serde_json, not the server's grammar, says so: it ran out of input
    // rather than meeting a wrong character).
    let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.trim_start().starts_with('{'), "{text}");
    match r["status"].as_str() {
        Some("completed") => assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}"),
        Some("incomplete") => {
            let e = serde_json::from_str::<Value>(text).expect_err("a cut object cannot parse");
            assert_eq!(e.classify(), serde_json::error::Category::Eof, "not a JSON prefix ({e}): {text}");
        }
        other => panic!("unexpected status {other:?}: {r}"),
    }

    let unenforceable = json!({"type": "object", "properties": {"a": {"type": "string"}}, "if": {"required": ["a"]}, "then": {}});
    let mut strict_tool = tools();
    strict_tool[0]["parameters"] = unenforceable.clone();
    strict_tool[0]["strict"] = json!(true);
    let mut b = body(json!("hi"), json!({"tool_choice": "required"}));
    b["tools"] = strict_tool.clone();
    let (status, e) = post(&s, &b).await;
    assert_eq!((status, e["error"]["param"].as_str(), e["error"]["code"].as_str()), (400, Some("tools[0].parameters"), Some("unsupported_schema")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("\"if\""), "{e}");

    strict_tool[0]["strict"] = json!(false);
    b["tools"] = strict_tool;
    b["max_output_tokens"] = json!(32);
    let (status, r) = post(&s, &b).await;
    assert_eq!(status, 200, "a non-strict schema falls back to any JSON object: {r}");

    let b = json!({"model": "smollm2-135m-instruct", "input": "hi", "max_output_tokens": 16,
                   "text": {"format": {"type": "json_schema", "name": "x", "schema": unenforceable, "strict": true}}});
    let (status, e) = post(&s, &b).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("text.format.schema")), "{e}");
}
