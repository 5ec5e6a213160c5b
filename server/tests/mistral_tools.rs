//! Mistral's tool-call format end to end, on a tiny random Llama-shaped
//! model whose vocabulary has `[TOOL_CALLS]` as a special token and whose
//! template is Mistral v3's shape (`[AVAILABLE_TOOLS]`, `[TOOL_CALLS] [...]`
//! with 9-character call ids, `[TOOL_RESULTS]`). The grammar makes the model
//! write the marker token then a JSON list of calls; the special token
//! decodes to no text, so the server puts it back for the call parser.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::format::constrain::CallFormat;
use spindle_server::app::Limits;
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyModelOptions};
use std::path::Path;
use std::sync::Arc;

const TEMPLATE: &str = concat!(
    "{%- for message in messages %}",
    "{%- if message['role'] == 'user' %}",
    "{%- if tools and loop.last %}[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}",
    "[INST] {{ message['content'] }}[/INST]",
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}[TOOL_CALLS] [",
    "{%- for tc in message.tool_calls %}",
    "{%- if tc.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}",
    "{%- set out = tc.function|tojson %}{{ out[:-1] }}, \"id\": \"{{ tc.id }}\"}",
    "{%- if not loop.last %}, {% endif %}",
    "{%- endfor %}]<|im_end|>",
    "{%- elif message['role'] == 'assistant' %}{{ message['content'] }}<|im_end|>",
    "{%- elif message['role'] == 'tool' %}[TOOL_RESULTS] {\"content\": {{ message.content|tojson }}, \"call_id\": \"{{ message.tool_call_id }}\"}[/TOOL_RESULTS]",
    "{%- endif %}{%- endfor %}",
);

/// Installs the template; with `special`, renames a reserved token to
/// `[TOOL_CALLS]` (still special), else the marker is plain text.
fn make_mistral(dir: &Path, special: bool) {
    let rename = |v: &mut Value| {
        if special && v["content"] == "<|reserved_0|>" {
            v["content"] = json!("[TOOL_CALLS]");
        }
    };
    let path = dir.join("tokenizer.json");
    let mut tok: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    tok["added_tokens"].as_array_mut().unwrap().iter_mut().for_each(rename);
    std::fs::write(&path, tok.to_string()).unwrap();
    let path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["added_tokens_decoder"].as_object_mut().unwrap().values_mut().for_each(rename);
    config["chat_template"] = json!(TEMPLATE);
    std::fs::write(&path, config.to_string()).unwrap();
}

fn tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "strict": true,
         "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": false}},
        {"type": "function", "name": "get_time", "strict": true,
         "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"], "additionalProperties": false}}
    ])
}

async fn stream(s: &common::Server, body: &Value) -> Vec<Value> {
    let text = common::http().post(format!("{}/v1/responses", s.base)).json(body).send().await.unwrap().text().await.unwrap();
    text.split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn mistral_calls_are_a_marker_token_then_a_json_list_and_chain_with_short_ids() {
    run_format(true).await;
}

/// The same where `[TOOL_CALLS]` is not a token of the vocabulary: the
/// grammar writes it as text, and free text can never contain it.
#[tokio::test]
async fn a_textual_mistral_marker_works_the_same() {
    run_format(false).await;
}

async fn run_format(special: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mistral");
    write_tiny_model(&TinyModelOptions { max_position: 2048, ..TinyModelOptions::new(TinyArch::Llama) }, &dir).unwrap();
    make_mistral(&dir, special);
    let s = common::start_model(dir.to_str().unwrap(), "mistral", vec![], Limits::default(), 512, |s| Arc::new(s)).await;
    assert_eq!(matches!(s.state.model.call_format, CallFormat::Mistral(Some(_))), special, "{:?}", s.state.model.call_format);
    assert!(matches!(s.state.model.call_format, CallFormat::Mistral(_)));

    let (mut calls, mut texts, mut chained) = (0, 0, 0);
    for seed in 0..16 {
        let choice = if seed % 2 == 0 { json!("required") } else { json!("auto") };
        let body = json!({"model": "mistral", "input": "Weather in Paris?", "tools": tools(), "tool_choice": choice, "stream": true,
                          "max_output_tokens": 96, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed});
        let events = stream(&s, &body).await;
        let response = &events.last().unwrap()["response"];
        let output = response["output"].as_array().unwrap();
        for item in output {
            match item["type"].as_str().unwrap() {
                "function_call" if item["status"] == "completed" => {
                    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
                    match item["name"].as_str().unwrap() {
                        "get_weather" => assert!(["Paris", "Rome"].contains(&args["city"].as_str().unwrap()), "{args}"),
                        "get_time" => assert!(args["utc"].is_boolean(), "{args}"),
                        other => panic!("unknown tool {other}"),
                    }
                    calls += 1;
                }
                "message" if response["status"] == "completed" => {
                    // (A call cut off by the token limit before its name is
                    // complete stays text, marker included, as with `<tool_call>`.)
                    let text = item["content"][0]["text"].as_str().unwrap_or("");
                    assert!(!text.contains("[TOOL_CALLS]"), "seed {seed}: the marker leaked into text: {text:?}");
                    texts += 1;
                }
                _ => {}
            }
        }
        if choice == "required" && response["status"] == "completed" {
            assert!(output.iter().any(|i| i["type"] == "function_call"), "seed {seed}: required made no call: {response}");
        }
        let names: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        if let Some(first_args) = names.iter().position(|n| *n == "response.function_call_arguments.delta") {
            let added = names.iter().position(|n| *n == "response.output_item.added").unwrap();
            assert!(added < first_args, "the call item is added before its arguments stream");
        }
        // Turn 2: the call's result goes back through the template, which demands 9-character ids.
        if let Some(call) = output.iter().find(|i| i["type"] == "function_call" && i["status"] == "completed") {
            let next = json!({"model": "mistral", "previous_response_id": response["id"], "tools": tools(), "tool_choice": "none",
                              "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}], "max_output_tokens": 16});
            let r = common::http().post(format!("{}/v1/responses", s.base)).json(&next).send().await.unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            chained += 1;
        }
    }
    println!("mistral format (special marker: {special}): {calls} calls, {texts} text items, {chained} chained turns over 16 seeds");
    assert!(calls >= 5, "too few completed calls");
    assert!(chained >= 4);
}
