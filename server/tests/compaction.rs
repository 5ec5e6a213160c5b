//! POST /v1/responses/compact with the real model: a sealed, model-written
//! summary plus the latest turn, usable as the next chain's input; forged or
//! altered items are refused.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::Limits;

async fn post(s: &common::Server, path: &str, body: Value) -> (u16, Value) {
    let r = common::http().post(format!("{}{path}", s.base)).json(&body).send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn compaction_seals_a_summary_that_round_trips_as_input() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, missing) = post(&s, "/v1/responses/compact", json!({"input": "hi"})).await;
    assert_eq!((status, missing["error"]["param"].clone()), (400, json!("model")), "{missing}");

    let (status, first) = post(&s, "/v1/responses", json!({"model": "smollm2-135m-instruct", "temperature": 0,
        "input": "My name is Ada Lovelace and my boat is called Analytical.", "max_output_tokens": 32})).await;
    assert_eq!(status, 200, "{first}");
    let (status, compacted) = post(&s, "/v1/responses/compact", json!({"model": "smollm2-135m-instruct",
        "previous_response_id": first["id"], "input": "What is my boat called?"})).await;
    assert_eq!(status, 200, "{compacted}");
    assert_eq!(compacted["object"], "response.compaction");
    assert!(compacted["id"].is_string() && compacted["created_at"].is_i64());
    let output = compacted["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "compaction");
    let sealed = output[0]["encrypted_content"].as_str().unwrap();
    assert!(!sealed.contains("Ada") && !sealed.contains("Analytical"), "the summary must not be readable");
    let last = output.last().unwrap();
    assert_eq!((last["type"].clone(), last["role"].clone()), (json!("message"), json!("user")), "the latest turn is kept: {last}");
    assert!(compacted["usage"]["output_tokens"].as_u64().unwrap() > 0, "the model wrote the summary: {compacted}");

    // The output is the next chain's base input.
    let mut input = output.clone();
    input.push(json!({"role": "user", "content": "Answer briefly."}));
    let (status, next) = post(&s, "/v1/responses", json!({"model": "smollm2-135m-instruct", "input": input,
        "max_output_tokens": 16, "temperature": 0})).await;
    assert_eq!(status, 200, "{next}");
    let (status, bare) = post(&s, "/v1/responses", json!({"model": "smollm2-135m-instruct",
        "input": [output.last().unwrap().clone(), {"role": "user", "content": "Answer briefly."}], "max_output_tokens": 16})).await;
    assert_eq!(status, 200, "{bare}");
    assert!(next["usage"]["input_tokens"].as_u64() > bare["usage"]["input_tokens"].as_u64(), "the summary is in the prompt");

    // Altered or foreign content is refused, naming the item.
    let mut forged = output.clone();
    let mut bytes = sealed.to_string();
    bytes.replace_range(bytes.len() - 2.., if bytes.ends_with("00") { "11" } else { "00" });
    forged[0]["encrypted_content"] = json!(bytes);
    let (status, refused) = post(&s, "/v1/responses", json!({"model": "smollm2-135m-instruct", "input": forged})).await;
    assert_eq!((status, refused["error"]["param"].clone()), (400, json!("input[0].encrypted_content")), "{refused}");
}
