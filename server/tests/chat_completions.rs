//! `/v1/chat/completions` and `/v1/completions` over a real socket with the
//! real model: the same conversation renders the same prompt as through
//! `/v1/responses` and reuses its cached prefix, `stop` and `max_tokens`
//! behave as OpenAI's, and a raw completion takes token ids.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::Limits;

const MODEL: &str = "smollm2-135m-instruct";

async fn post(s: &common::Server, path: &str, body: Value) -> (u16, Value) {
    let r = common::http().post(format!("{}{path}", s.base)).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a careful assistant who answers in one sentence. ".repeat(6)}),
        json!({"role": "user", "content": "What is the tallest mountain on Earth?"}),
    ]
}

#[tokio::test]
async fn a_conversation_renders_the_same_prompt_and_shares_the_cache_across_apis() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, r) = post(&s, "/v1/responses", json!({"model": MODEL, "input": conversation(), "max_output_tokens": 16, "temperature": 0, "store": false})).await;
    assert_eq!(status, 200, "{r}");
    let (status, c) = post(&s, "/v1/chat/completions", json!({"model": MODEL, "messages": conversation(), "max_tokens": 16, "temperature": 0})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], r["usage"]["input_tokens"], "{c} vs {r}");
    let cached = c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 64, "the chat request did not reuse the responses request's prefix: {}", c["usage"]);
    let text: String = r["output"][0]["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(c["choices"][0]["message"]["content"].as_str(), Some(text.as_str()), "greedy output differs");
}

#[tokio::test]
async fn stop_strings_and_max_tokens_end_the_output_as_openai_does() {
    let s = common::start(vec![], Limits::default()).await;
    let body = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": conversation(), "max_tokens": 24, "temperature": 0});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let (_, free) = post(&s, "/v1/chat/completions", body(json!({}))).await;
    let text = free["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 4, "{text}");
    let stop = format!(" {}", words[2]);
    let (status, stopped) = post(&s, "/v1/chat/completions", body(json!({"stop": [stop.clone()]}))).await;
    assert_eq!(status, 200, "{stopped}");
    let cut = &text[..text.find(&stop).unwrap()];
    assert_eq!(stopped["choices"][0]["message"]["content"].as_str(), Some(cut), "stop {stop:?} in {text:?}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    let (status, one) = post(&s, "/v1/chat/completions", body(json!({"max_tokens": 1}))).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!((one["usage"]["completion_tokens"].as_u64(), one["choices"][0]["finish_reason"].as_str()), (Some(1), Some("length")), "{one}");
}

#[tokio::test]
async fn a_raw_completion_takes_text_or_token_ids() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, by_text) = post(&s, "/v1/completions", json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0})).await;
    assert_eq!(status, 200, "{by_text}");
    let ids: Vec<u32> = s.state.model.tokenizer.encode("The capital of France is", true).unwrap();
    let (status, by_ids) = post(&s, "/v1/completions", json!({"model": MODEL, "prompt": ids, "max_tokens": 6, "temperature": 0})).await;
    assert_eq!(status, 200, "{by_ids}");
    assert_eq!(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);
    assert_eq!(by_text["usage"]["prompt_tokens"].as_u64(), Some(ids.len() as u64));
    let (status, bad) = post(&s, "/v1/completions", json!({"model": MODEL, "prompt": [999999], "max_tokens": 6})).await;
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("prompt[0]")), "{bad}");
}

/// Checks one chat logprobs entry: a log-probability, its bytes, and `top`
/// alternatives in descending order, the greedy choice first.
fn check_logprob_entry(e: &Value, top: usize) {
    let logprob = e["logprob"].as_f64().unwrap_or_else(|| panic!("no logprob: {e}"));
    assert!(logprob <= 0.0, "{e}");
    let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
    assert_eq!(String::from_utf8_lossy(&bytes), e["token"].as_str().unwrap(), "{e}");
    let alternatives = e["top_logprobs"].as_array().unwrap();
    assert_eq!(alternatives.len(), top, "{e}");
    let values: Vec<f64> = alternatives.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]), "not in descending order: {e}");
    assert_eq!(alternatives[0]["token"], e["token"], "greedy picks the most likely token: {e}");
    assert!((values[0] - logprob).abs() < 1e-4, "{e}");
}

/// `logprobs` + `top_logprobs` through Chat Completions, plain and streamed,
/// and `logprobs: N` through Completions, as OpenAI shapes them: one entry
/// per generated token whose text adds up to the answer.
#[tokio::test]
async fn logprobs_come_back_in_openai_shapes() {
    let s = common::start(vec![], Limits::default()).await;
    let body = json!({"model": MODEL, "messages": conversation(), "max_tokens": 16, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let (status, c) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{c}");
    let entries = c["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len() as u64, c["usage"]["completion_tokens"].as_u64().unwrap(), "{c}");
    entries.iter().for_each(|e| check_logprob_entry(e, 3));
    let joined: String = entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(Some(joined.as_str()), c["choices"][0]["message"]["content"].as_str(), "{c}");
    // Streamed: the same entries, spread over the chunks.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = common::http().post(format!("{}/v1/chat/completions", s.base)).json(&streamed).send().await.unwrap().text().await.unwrap();
    let chunks: Vec<Value> = text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let streamed_entries: Vec<Value> = chunks.iter().flat_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(&streamed_entries, entries, "streamed logprobs differ from the plain response's");
    // With tools (the tool-call parser reads the text), a text answer keeps its entries.
    let mut with_tools = body.clone();
    with_tools["tools"] = json!([{"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]);
    let (status, t) = post(&s, "/v1/chat/completions", with_tools).await;
    assert_eq!(status, 200, "{t}");
    let content = t["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    let tool_entries = t["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let joined: String = tool_entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert!(!content.is_empty() && joined.trim() == content.trim(), "{t}");
    // The Responses API gives the same entries when `include` asks for them.
    let body = json!({"model": MODEL, "input": conversation(), "max_output_tokens": 16, "temperature": 0, "store": false,
        "include": ["message.output_text.logprobs"], "top_logprobs": 3});
    let (status, r) = post(&s, "/v1/responses", body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"][0]["content"][0]["logprobs"].as_array(), Some(entries), "{r}");
    // Completions: parallel arrays, `top_logprobs` as token → logprob maps.
    let (status, t) = post(&s, "/v1/completions", json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 2})).await;
    assert_eq!(status, 200, "{t}");
    let lp = &t["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(tokens.len() as u64, t["usage"]["completion_tokens"].as_u64().unwrap(), "{t}");
    assert_eq!(tokens.concat(), t["choices"][0]["text"].as_str().unwrap(), "{t}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len(), "{t}");
    let tops = lp["top_logprobs"].as_array().unwrap();
    assert!(tops.iter().all(|m| m.as_object().is_some_and(|m| (1..=2).contains(&m.len()))), "{t}");
}
