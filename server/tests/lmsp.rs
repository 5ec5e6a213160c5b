//! The LMSP 1.0 facade with the real model: the seed's response and event
//! shapes, integer event ids from 1, problem documents, version negotiation,
//! capabilities, stored responses, and Idempotency-Key (one generation for
//! ten concurrent duplicates).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::Limits;

fn body(text: &str) -> Value {
    json!({"model": "smollm2-135m-instruct", "max_output_tokens": 16, "temperature": 0,
           "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
           "response_format": {"type": "text"}})
}

async fn post(s: &common::Server, b: &Value, headers: &[(&str, &str)]) -> (u16, String, Value) {
    let mut r = common::http().post(format!("{}/lmsp/v1/responses", s.base)).json(b);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.expect("send");
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert_eq!(r.headers().get("lmsp-version").and_then(|v| v.to_str().ok()), Some("1.0"));
    (status, ct, r.json().await.unwrap_or(Value::Null))
}

fn assert_problem(status: u16, ct: &str, p: &Value, want_status: u16, code: &str) {
    assert_eq!((status, ct), (want_status, "application/problem+json"), "{p}");
    assert_eq!((p["status"].as_u64(), p["code"].as_str()), (Some(u64::from(want_status)), Some(code)), "{p}");
    assert!(p["type"].is_string() && p["title"].is_string() && p["detail"].is_string(), "{p}");
}

#[tokio::test]
async fn responses_streams_and_problems_have_the_seed_shapes() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, ct, r) = post(&s, &body("Describe a local model service in one sentence."), &[("LMSP-Version", "1.0")]).await;
    assert_eq!((status, ct.as_str()), (200, "application/json"), "{r}");
    assert_eq!(r["object"], "response");
    for key in ["id", "created_at", "status", "model", "output", "usage", "error", "incomplete_details"] {
        assert!(r.get(key).is_some(), "missing {key}: {r}");
    }
    let u = &r["usage"];
    assert_eq!(u["total_tokens"].as_u64(), Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()));
    let part = &r["output"][0]["content"][0];
    assert_eq!(part.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["type", "text"], "{part}");

    // Streaming: integer ids 1..n, the seed's event data.
    let mut b = body("Say hello.");
    b["stream"] = json!(true);
    let text = common::http().post(format!("{}/lmsp/v1/responses", s.base)).json(&b).send().await.unwrap().text().await.unwrap();
    let mut ids = Vec::new();
    let mut names = Vec::new();
    for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let field = |name: &str| frame.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("").to_string();
        ids.push(field("id:").parse::<u64>().expect("integer id"));
        names.push(field("event:"));
        let data: Value = serde_json::from_str(&field("data:")).unwrap();
        assert!(data["response_id"].as_str().is_some_and(|id| id.starts_with("resp_")), "{data}");
    }
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(names[0], "response.created");
    assert!(matches!(names.last().map(String::as_str), Some("response.completed" | "response.incomplete")), "{names:?}");
    assert!(names.contains(&"response.output_text.delta".to_string()));

    let mut missing = body("x");
    missing.as_object_mut().unwrap().remove("model");
    let (st, ct, p) = post(&s, &missing, &[]).await;
    assert_problem(st, &ct, &p, 400, "missing_required_parameter");
    let mut schema = body("x");
    let flag = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    schema["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": flag}});
    let (st, _, r) = post(&s, &schema, &[]).await;
    assert_eq!(st, 200, "{r}");
    let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
    let doc: Value = serde_json::from_str(text).expect("structured output parses");
    assert!(doc["ok"].is_boolean() && doc.as_object().unwrap().len() == 1, "{doc}");
    schema["response_format"] = json!({"type": "xml"});
    let (st, ct, p) = post(&s, &schema, &[]).await;
    assert_problem(st, &ct, &p, 400, "invalid_value");
    let (st, ct, p) = post(&s, &body("x"), &[("LMSP-Version", "2.0")]).await;
    assert_problem(st, &ct, &p, 400, "unsupported_version");

    let mut stored = body("Remember this.");
    stored["store"] = json!(true);
    let (_, _, saved) = post(&s, &stored, &[]).await;
    let got: Value = common::http().get(format!("{}/lmsp/v1/responses/{}", s.base, saved["id"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["id"], saved["id"]);
    let r = common::http().get(format!("{}/lmsp/v1/responses/resp_nope", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "response_not_found");
    let caps: Value = common::http().get(format!("{}/lmsp/v1/capabilities", s.base)).send().await.unwrap().json().await.unwrap();
    assert!(caps["capabilities"].as_array().unwrap().contains(&json!("streaming")), "{caps}");
}

#[tokio::test]
async fn ten_concurrent_duplicates_get_one_generation() {
    let s = common::start(vec!["k1".into()], Limits::default()).await;
    let unauthorized = common::http().post(format!("{}/lmsp/v1/responses", s.base)).json(&body("x")).send().await.unwrap();
    assert_eq!(unauthorized.status().as_u16(), 401);
    assert_eq!(unauthorized.headers()["content-type"], "application/problem+json");

    let before = s.state.scheduler.metrics().snapshot().prefix_query_tokens;
    let b = body("Name three rivers.");
    let calls = (0..10).map(|_| {
        let b = b.clone();
        let base = s.base.clone();
        async move {
            let r = common::http()
                .post(format!("{base}/lmsp/v1/responses"))
                .bearer_auth("k1")
                .header("Idempotency-Key", "01J8M5T7Z2K4N6Q8S0V3X5B9DG")
                .json(&b)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    });
    let results = futures_util::future::join_all(calls).await;
    assert!(results.iter().all(|r| r == &results[0]), "ten identical responses");
    assert_eq!(results[0].0, 200, "{}", results[0].1);
    let response: Value = serde_json::from_str(&results[0].1).unwrap();
    let after = s.state.scheduler.metrics().snapshot().prefix_query_tokens;
    assert_eq!(after - before, response["usage"]["input_tokens"].as_u64().unwrap(), "exactly one prompt reached the scheduler");

    let other = common::http()
        .post(format!("{}/lmsp/v1/responses", s.base))
        .bearer_auth("k1")
        .header("Idempotency-Key", "01J8M5T7Z2K4N6Q8S0V3X5B9DG")
        .json(&body("Something else."))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 422);
    assert_eq!(other.json::<Value>().await.unwrap()["code"], "idempotency_key_reused");
}
