//! Tool calls on a real tool-calling model: Qwen2.5-Coder-0.5B-Instruct
//! (Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 tensors), whose vocabulary has
//! `<tool_call>` and `</tool_call>` as single added tokens.
//!
//! Ignored by a plain `cargo test` (the model is 491 MB); `scripts/test.sh`
//! fetches it, sets `SPINDLE_QWEN05_GGUF` and runs these with `--ignored`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Server;
use serde_json::{json, Value};

const NAME: &str = "qwen2.5-coder-0.5b-instruct";

async fn start() -> Server {
    common::start_env_model("SPINDLE_QWEN05_GGUF", NAME).await
}

async fn post(s: &Server, body: Value) -> Value {
    common::post_response(s, NAME, body).await
}

fn tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "description": "Current weather for a city",
         "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"],
                        "additionalProperties": false}},
        {"type": "function", "name": "get_time", "description": "Current local time in a time zone",
         "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"],
                        "additionalProperties": false}}
    ])
}

/// The response's function calls as (name, arguments).
fn calls(r: &Value) -> Vec<(String, Value)> {
    r["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|o| o["type"] == "function_call")
        .map(|o| {
            let args = serde_json::from_str(o["arguments"].as_str().expect("arguments string")).expect("arguments are JSON");
            (o["name"].as_str().expect("name").to_string(), args)
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the 491 MB Qwen2.5-Coder-0.5B file: scripts/test.sh fetches it and runs this with --ignored"]
async fn required_named_and_allowed_tools_give_calls_valid_under_their_schemas() {
    let s = start().await;
    let ask = "What's the weather in Paris, and what time is it in Tokyo?";
    let required = post(&s, json!({"input": ask, "tools": tools(), "tool_choice": "required",
                                   "parallel_tool_calls": false, "max_output_tokens": 80})).await;
    let c = calls(&required);
    assert_eq!(c.len(), 1, "one call (parallel_tool_calls false): {required}");
    assert_eq!(required["status"], "completed", "{required}");
    let named = post(&s, json!({"input": ask, "tools": tools(), "parallel_tool_calls": false, "max_output_tokens": 80,
                                "tool_choice": {"type": "function", "name": "get_time"}})).await;
    let c = calls(&named);
    assert_eq!(c.len(), 1, "{named}");
    assert_eq!(c[0].0, "get_time");
    assert!(c[0].1["timezone"].is_string() && c[0].1.as_object().unwrap().len() == 1, "{named}");
    let allowed = post(&s, json!({"input": ask, "tools": tools(), "parallel_tool_calls": false, "max_output_tokens": 80,
                                  "tool_choice": {"type": "allowed_tools", "mode": "required",
                                                  "tools": [{"type": "function", "name": "get_weather"}]}})).await;
    let c = calls(&allowed);
    assert_eq!(c.len(), 1, "{allowed}");
    assert_eq!(c[0].0, "get_weather");
    assert!(c[0].1["location"].is_string() && c[0].1.as_object().unwrap().len() == 1, "{allowed}");
}

/// Under `tool_choice: "auto"` Qwen2.5-Coder writes its call as a fenced JSON
/// object; 7 or more of 8 weather questions must come back as a
/// `get_weather` call with fitting arguments, and a question no tool answers
/// stays text.
#[tokio::test]
#[ignore = "needs the 491 MB Qwen2.5-Coder-0.5B file: scripts/test.sh fetches it and runs this with --ignored"]
async fn under_auto_weather_questions_become_calls_and_a_text_question_stays_text() {
    let s = start().await;
    let cities = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Lima"];
    let mut called = Vec::new();
    for city in cities {
        let r = post(&s, json!({"input": format!("What's the weather like in {city} right now?"), "tools": tools(),
                                "tool_choice": "auto", "temperature": 0, "max_output_tokens": 120})).await;
        let c = calls(&r);
        let fits = c.len() == 1 && c[0].0 == "get_weather" && c[0].1["location"].is_string() && c[0].1.as_object().unwrap().len() == 1;
        if fits {
            called.push(city);
        } else {
            eprintln!("{city}: not a call: {r}");
        }
    }
    assert!(called.len() >= 7, "only {} of 8 weather questions became calls: {called:?}", called.len());
    let text = post(&s, json!({"input": "Write a haiku about the sea.", "tools": tools(), "tool_choice": "auto",
                               "temperature": 0, "max_output_tokens": 80})).await;
    assert!(calls(&text).is_empty(), "{text}");
    assert_eq!(text["output"].as_array().unwrap().iter().filter(|o| o["type"] == "message").count(), 1, "{text}");
}

/// Sixteen sampled requests (temperature 1, a seed each) for every forcing
/// mode: each one's call names a tool that mode allows, and its arguments
/// validate against that tool's schema.
#[tokio::test]
#[ignore = "needs the 491 MB Qwen2.5-Coder-0.5B file: scripts/test.sh fetches it and runs this with --ignored"]
async fn sixteen_sampled_requests_per_forcing_mode_all_give_calls_valid_under_their_schemas() {
    let s = start().await;
    let schemas: Vec<(String, jsonschema::Validator)> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), jsonschema::validator_for(&t["parameters"]).expect("schema")))
        .collect();
    let asks = [
        "What's the weather in Paris, and what time is it in Tokyo?",
        "Is it raining in Lisbon?",
        "What time is it in New York?",
        "Tell me about the climate and the clock in Oslo.",
    ];
    let modes: [(&str, Value, &[&str]); 3] = [
        ("required", json!("required"), &["get_weather", "get_time"]),
        ("named", json!({"type": "function", "name": "get_time"}), &["get_time"]),
        ("allowed_tools", json!({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}), &["get_weather"]),
    ];
    for (mode, choice, allowed) in modes {
        let requests = (0..16u64).map(|i| {
            post(&s, json!({"input": asks[i as usize % asks.len()], "tools": tools(), "tool_choice": choice,
                            "parallel_tool_calls": false, "temperature": 1.0, "seed": 1000 + i, "max_output_tokens": 80}))
        });
        let responses = futures_util::future::join_all(requests).await;
        for (i, r) in responses.iter().enumerate() {
            assert_eq!(r["status"], "completed", "{mode} #{i}: {r}");
            let c = calls(r);
            assert_eq!(c.len(), 1, "{mode} #{i}: exactly one call: {r}");
            let (name, args) = &c[0];
            assert!(allowed.contains(&name.as_str()), "{mode} #{i}: {name} is not allowed: {r}");
            let (_, validator) = schemas.iter().find(|(n, _)| n == name).expect("a declared tool");
            assert!(validator.is_valid(args), "{mode} #{i}: arguments {args} do not fit {name}'s schema");
        }
    }
}
