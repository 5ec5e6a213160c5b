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
