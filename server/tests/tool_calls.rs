//! Function tools, basic path: the default tool format in the prompt (stable,
//! independent of `tool_choice`), the function-call history round trip, and
//! the digest's §5d streaming order for parsed calls (parser + mapper, no
//! model); then the same over a real socket with the real model.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{json, Value};
use spindle_engine::chat_template::ChatTemplate;
use spindle_server::app::format::tool_parser::ToolCallParser;
use spindle_server::app::format::tools::{render_prompt, tools_section};
use spindle_server::app::Limits;
use spindle_server::protocol::{
    validate, FinishKind, MapperInput, RequestLimits, ResponseMapper, UsageCounts, ValidRequest,
};

const WEATHER: &str = r#"{"type": "function", "name": "get_weather", "description": "Weather now.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}"#;
const TIME: &str = r#"{"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}"#;

fn tools() -> Value {
    json!([serde_json::from_str::<Value>(WEATHER).unwrap(), serde_json::from_str::<Value>(TIME).unwrap()])
}

fn request(body: Value) -> ValidRequest {
    validate(body, &RequestLimits::default()).unwrap()
}

/// The history of one tool round: a question, two parallel calls, their results.
fn round_trip_input() -> Value {
    json!([
        {"type": "message", "role": "user", "content": "Weather in Paris and Lyon?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Lyon\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
    ])
}

#[test]
fn default_tools_section_is_the_documented_text() {
    let req = request(json!({"input": "x", "tools": [serde_json::from_str::<Value>(WEATHER).unwrap()]}));
    let expected = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    assert_eq!(tools_section(&req.tools), expected);
}

#[test]
fn default_format_ignores_tool_choice_and_renders_history_as_text() {
    let t = ChatTemplate::chatml_default();
    assert!(!t.uses_tools());
    let body = |choice: Value| {
        let mut b = json!({"input": round_trip_input(), "tools": tools(), "instructions": "Be brief."});
        if !choice.is_null() {
            b["tool_choice"] = choice;
        }
        request(b)
    };
    let auto = body(Value::Null);
    let a = render_prompt(&t, &auto, &auto.input).unwrap();
    for choice in [json!("none"), json!("required"), json!({"type": "function", "name": "get_time"})] {
        let other = body(choice);
        assert_eq!(a, render_prompt(&t, &other, &other.input).unwrap());
    }
    let expected = format!(
        "<|im_start|>system\nBe brief.\n\n{}<|im_end|>\n<|im_start|>user\nWeather in Paris and Lyon?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Paris\"}}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Lyon\"}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        tools_section(&auto.tools)
    );
    assert_eq!(a, expected);
    let plain = request(json!({"input": "hi", "tools": tools()}));
    let p = render_prompt(&t, &plain, &plain.input).unwrap();
    assert!(p.starts_with("<|im_start|>system\n# Tools\n"), "{p}");
}

#[test]
fn templates_that_read_tools_get_them_natively() {
    let src = "{% if tools %}TOOLS{{ tools | length }}|{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}[calls]{% endif %}|{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert!(t.uses_tools());
    let req = request(json!({"input": [
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}], "tools": tools()}));
    assert_eq!(render_prompt(&t, &req, &req.input).unwrap(), "TOOLS2|assistant:[calls]|tool:ok|");
}

/// Feeds `output` one char at a time through parser and mapper, then ends.
fn stream_through(req: &ValidRequest, output: &str) -> (Vec<Value>, Value) {
    let mut mapper = ResponseMapper::new("resp_t".into(), 1, req);
    let mut parser = ToolCallParser::for_response(mapper.response_ref(), spindle_server::app::format::constrain::CallFormat::Hermes(None)).expect("tools on");
    let mut events = mapper.start();
    let finished = MapperInput::Finished { reason: FinishKind::Stop, usage: UsageCounts::default() };
    let inputs = output.chars().map(|c| MapperInput::TextDelta(c.to_string())).chain([finished]);
    for input in inputs {
        for routed in parser.route(input) {
            events.extend(mapper.push(routed));
        }
    }
    let events: Vec<Value> = events.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
    (events, serde_json::to_value(mapper.response()).unwrap())
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// [`types`] with each run of argument deltas as one entry (calls stream
/// their arguments in as many deltas as the text arrived in).
fn kinds(events: &[Value]) -> Vec<&str> {
    let mut out = types(events);
    out.dedup_by(|a, b| *a == "response.function_call_arguments.delta" && a == b);
    out
}

/// The concatenated argument deltas of item `item_id`.
fn joined_deltas(events: &[Value], item_id: &str) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta" && e["item_id"] == item_id)
        .map(|e| e["delta"].as_str().unwrap())
        .collect()
}

/// The digest's §5d event order for a response that is one function call.
const ONE_CALL_ORDER: [&str; 7] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
];

#[test]
fn a_parsed_call_streams_in_the_exact_5d_order() {
    let req = request(json!({"model": "m", "input": "x", "tools": tools()}));
    let output = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (events, response) = stream_through(&req, output);
    assert_eq!(kinds(&events), ONE_CALL_ORDER);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    let added = &events[2]["item"];
    assert_eq!(events[2]["output_index"], 0);
    assert_eq!((added["type"].as_str(), added["name"].as_str()), (Some("function_call"), Some("get_weather")));
    assert_eq!((added["arguments"].as_str(), added["status"].as_str()), (Some(""), Some("in_progress")));
    let id = added["id"].as_str().unwrap();
    assert!(id.starts_with("fc_") && added["call_id"].as_str().unwrap().starts_with("call_"));
    let args = r#"{"city": "Paris"}"#;
    assert_eq!(joined_deltas(&events, id), args, "the arguments as generated, streamed");
    let n = events.len();
    assert_eq!((events[n - 3]["item_id"].as_str(), events[n - 3]["arguments"].as_str()), (Some(id), Some(args)));
    assert_eq!(events[n - 2]["item"]["status"], "completed");
    assert_eq!(events[n - 2]["item"]["arguments"], args);
    assert_eq!(response["output"], json!([events[n - 2]["item"].clone()]));
    assert_eq!(events[n - 1]["response"]["output"], response["output"]);
}

#[test]
fn text_then_two_parallel_calls_are_three_items() {
    let req = request(json!({"model": "m", "input": "x", "tools": tools()}));
    let output = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
    let (events, response) = stream_through(&req, output);
    let block = |kind: &str| -> Vec<&str> {
        if kind == "message" {
            let mut v = vec!["response.output_item.added", "response.content_part.added"];
            v.extend(["response.output_text.delta"; 9]);
            v.extend(["response.output_text.done", "response.content_part.done", "response.output_item.done"]);
            v
        } else {
            vec![
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        }
    };
    let mut expected = vec!["response.created", "response.in_progress"];
    for kind in ["message", "call", "call"] {
        expected.extend(block(kind));
    }
    expected.push("response.completed");
    assert_eq!(kinds(&events), expected);
    let out = response["output"].as_array().unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0]["content"][0]["text"], "Checking.");
    assert_eq!((out[1]["name"].as_str(), out[2]["name"].as_str()), (Some("get_weather"), Some("get_time")));
    assert_ne!(out[1]["call_id"], out[2]["call_id"]);
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e["type"] == "response.output_item.added") {
        let index = e["output_index"].as_u64().unwrap() as usize;
        assert_eq!(out[index]["id"], e["item"]["id"], "event {i}");
    }
    let single = request(json!({"model": "m", "input": "x", "tools": tools(), "parallel_tool_calls": false}));
    let (_, response) = stream_through(&single, output);
    assert_eq!(response["output"].as_array().map(Vec::len), Some(2));
}

// ---- over a real socket, with the real model ----

mod common;

use common::Server;

async fn start() -> Server {
    common::start(vec![], Limits::default()).await
}

async fn post(s: &Server, body: Value) -> (u16, Value) {
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Every output item is a finished message or a function call to a known
/// tool with JSON-object arguments.
fn assert_well_formed(r: &Value) {
    let out = r["output"].as_array().expect("output");
    println!("output: {}", r["output"]);
    assert!(!out.is_empty(), "{r}");
    for item in out {
        match item["type"].as_str() {
            Some("message") => assert_eq!(item["role"], "assistant"),
            Some("function_call") => {
                assert!(matches!(item["name"].as_str(), Some("get_weather" | "get_time")), "{item}");
                let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).expect("arguments");
                assert!(args.is_object(), "{item}");
            }
            other => panic!("unexpected item {other:?}: {r}"),
        }
    }
}

#[tokio::test]
async fn served_prompt_has_the_tools_block_and_ignores_tool_choice() {
    let s = start().await;
    let template = &s.state.model.template;
    assert!(!template.uses_tools(), "SmolLM2's template has no tools: the default format applies");
    let with = |choice: Value| request(json!({"input": "What is the weather in Paris?", "tools": tools(), "tool_choice": choice}));
    let (auto, required) = (with(json!("auto")), with(json!("required")));
    let prompt = render_prompt(template, &auto, &auto.input).unwrap();
    assert!(prompt.contains(&tools_section(&auto.tools)), "{prompt}");
    assert!(prompt.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""));
    assert_eq!(prompt, render_prompt(template, &required, &required.input).unwrap());

    let body = |choice: &str| {
        json!({"model": "smollm2-135m-instruct", "input": "What is the weather in Paris?", "tools": tools(),
               "tool_choice": choice, "max_output_tokens": 24, "temperature": 0, "store": false})
    };
    let (status, first) = post(&s, body("auto")).await;
    assert_eq!(status, 200, "{first}");
    assert_well_formed(&first);
    let (status, second) = post(&s, body("required")).await;
    assert_eq!(status, 200, "{second}");
    assert_well_formed(&second);
    let tokens = |r: &Value| r["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(tokens(&first), tokens(&second), "tool_choice must not change the prompt");
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0, "the same prompt hits the prefix cache: {second}");
    let (status, bare) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "What is the weather in Paris?", "max_output_tokens": 16, "store": false})).await;
    assert_eq!(status, 200, "{bare}");
    assert!(tokens(&bare) + 50 < tokens(&first), "the tools block is in the served prompt");
}

#[tokio::test]
async fn function_call_output_round_trips_through_a_chain() {
    let s = start().await;
    let body = json!({"model": "smollm2-135m-instruct", "input": round_trip_input(), "tools": tools(),
                      "max_output_tokens": 24, "temperature": 0});
    let (status, first) = post(&s, body).await;
    assert_eq!(status, 200, "{first}");
    assert!(matches!(first["status"].as_str(), Some("completed" | "incomplete")), "{first}");
    assert_well_formed(&first);
    let prev = first["id"].as_str().unwrap();
    let next = json!({"model": "smollm2-135m-instruct", "previous_response_id": prev, "tools": tools(),
                      "input": [{"type": "function_call", "call_id": "call_3", "name": "get_time", "arguments": "{\"tz\":\"CET\"}"},
                                {"type": "function_call_output", "call_id": "call_3", "output": "12:00"}],
                      "max_output_tokens": 16, "temperature": 0});
    let (status, second) = post(&s, next).await;
    assert_eq!(status, 200, "{second}");
    assert_well_formed(&second);
    assert!(second["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());
    assert!(second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{second}");
    let none = json!({"model": "smollm2-135m-instruct", "input": round_trip_input(), "tools": tools(),
                      "tool_choice": "none", "max_output_tokens": 16, "temperature": 0, "store": false});
    let (status, r) = post(&s, none).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["output"].as_array().unwrap().iter().all(|i| i["type"] == "message"), "tool_choice none: text only: {r}");
}

/// Parse an SSE body into data JSON objects; checks framing.
fn parse_sse(text: &str) -> Vec<Value> {
    assert!(text.ends_with("data: [DONE]\n\n"), "stream must end with [DONE]: {text:?}");
    let blocks = text.split("\n\n").filter(|b| !b.is_empty() && !b.starts_with(':') && *b != "data: [DONE]");
    blocks
        .map(|b| {
            let mut lines = b.lines();
            let event = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line");
            let data: Value = serde_json::from_str(lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data"))
                .expect("json data");
            assert_eq!(data["type"], event);
            data
        })
        .collect()
}

#[tokio::test]
async fn the_real_model_calls_a_tool_streamed_in_5d_order_and_the_result_round_trips() {
    let s = start().await;
    let body = json!({"model": "smollm2-135m-instruct", "tools": tools(), "stream": true, "input": few_shot(),
        "max_output_tokens": 48, "temperature": 0});
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await.expect("body"));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    let response = &events.last().expect("events")["response"];
    assert_well_formed(response);
    assert_eq!(kinds(&events), ONE_CALL_ORDER, "greedy decoding continues the few-shot pattern with one call: {response}");
    let call = &response["output"][0];
    assert_eq!((call["name"].as_str(), call["status"].as_str()), (Some("get_time"), Some("completed")));
    assert_eq!(events[2]["item"]["arguments"], "");
    assert_eq!(events[events.len() - 3]["arguments"], call["arguments"]);
    assert_eq!(joined_deltas(&events, call["id"].as_str().unwrap()), call["arguments"].as_str().unwrap());

    let next = json!({"model": "smollm2-135m-instruct", "tools": tools(), "previous_response_id": response["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "07:00"}],
        "max_output_tokens": 16, "temperature": 0});
    let (status, answer) = post(&s, next).await;
    assert_eq!(status, 200, "{answer}");
    assert_well_formed(&answer);
    assert_eq!(answer["output"][0]["type"], "message", "{answer}");
    assert!(answer["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{answer}");
}

/// Three question → call rounds, then a fourth question: greedy decoding of
/// even a tiny model tends to continue the pattern with a call.
fn few_shot() -> Value {
    let mut items = Vec::new();
    for (i, tz) in ["UTC", "CET", "PST"].iter().enumerate() {
        items.push(json!({"type": "message", "role": "user", "content": format!("What time is it in {tz}?")}));
        let call_id = format!("call_{i}");
        let arguments = json!({"tz": tz}).to_string();
        items.push(json!({"type": "function_call", "call_id": call_id, "name": "get_time", "arguments": arguments}));
        items.push(json!({"type": "function_call_output", "call_id": call_id, "output": "12:00"}));
        items.push(json!({"type": "message", "role": "assistant", "content": "It is 12:00."}));
    }
    items.push(json!({"type": "message", "role": "user", "content": "What time is it in EST?"}));
    Value::Array(items)
}

/// Changing the tool list changes the prompt after the tools block starts:
/// only the common prefix may come from the cache, the answer equals the
/// one a server that never saw the old list gives, and no block stays held.
#[tokio::test]
async fn changing_the_tool_list_reuses_only_the_common_prefix_and_leaks_no_blocks() {
    let s = start().await;
    let before = s.state.scheduler.check_kv().expect("kv");
    let body = |tools: Value| {
        json!({"model": "smollm2-135m-instruct", "instructions": "You are a careful assistant.",
               "input": "What is the weather in Paris?", "tools": tools,
               "max_output_tokens": 24, "temperature": 0, "store": false})
    };
    let mut changed = tools();
    changed[1]["description"] = json!("The current time in a time zone.");

    let (status, first) = post(&s, body(tools())).await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = post(&s, body(changed.clone())).await;
    assert_eq!(status, 200, "{second}");

    // The token prefix the two prompts share bounds what the cache may supply.
    let tokenizer = &s.state.model.tokenizer;
    let template = &s.state.model.template;
    let ids = |tools: Value| {
        let req = request(body(tools));
        tokenizer.encode(&render_prompt(template, &req, &req.input).unwrap(), false).unwrap()
    };
    let (old_ids, new_ids) = (ids(tools()), ids(changed.clone()));
    let common = old_ids.iter().zip(&new_ids).take_while(|(a, b)| a == b).count();
    assert!(common + 5 < new_ids.len(), "the change must be inside the prompt ({common} of {})", new_ids.len());
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    assert!(cached > 0, "the instructions and tools head are shared: {second}");
    assert!(cached <= common, "cached {cached} tokens but the prompts share only {common}");

    // Same request on a server that never saw the old list: the same greedy answer.
    let fresh = start().await;
    let (status, alone) = post(&fresh, body(changed)).await;
    assert_eq!(status, 200, "{alone}");
    assert_eq!(alone["usage"]["input_tokens_details"]["cached_tokens"], 0, "{alone}");
    let answer = |r: &Value| -> Vec<Value> {
        let items = r["output"].as_array().unwrap();
        items.iter().map(|i| json!([i["type"], i["content"], i["name"], i["arguments"]])).collect()
    };
    assert!(!answer(&second).is_empty(), "{second}");
    assert_eq!(answer(&second), answer(&alone), "stale KV changed the answer");

    let after = s.state.scheduler.check_kv().expect("kv");
    assert_eq!(after.used, 0, "no sequence holds blocks once the requests are done: {after:?}");
    assert_eq!(after.total, before.total);
    assert_eq!(after.free + after.cached_evictable, before.free + before.cached_evictable);
}
