//! Every authenticated route, over a real socket: no key, a wrong key and a
//! malformed `Authorization` header are each a 401 in the route's own error
//! shape (OpenAI's `{"error": ...}` for `/v1`, problem+json for `/lmsp`),
//! while the right key gets past authentication on every one of them.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use reqwest::Method;
use serde_json::{json, Value};
use spindle_server::app::Limits;

const KEY: &str = "key-one";

/// Which error shape a route family answers in.
#[derive(Clone, Copy, Debug)]
enum Shape {
    OpenAi,
    Problem,
}

/// Every route behind a key: (method, path, body, error shape).
fn routes() -> Vec<(Method, &'static str, Option<Value>, Shape)> {
    let create = json!({"model": "smollm2-135m-instruct", "input": "hi", "max_output_tokens": 1});
    vec![
        (Method::POST, "/v1/responses", Some(create.clone()), Shape::OpenAi),
        (Method::GET, "/v1/responses", None, Shape::OpenAi), // the WebSocket upgrade
        (Method::POST, "/v1/responses/compact", Some(json!({"model": "smollm2-135m-instruct", "input": "hi"})), Shape::OpenAi),
        (Method::GET, "/v1/responses/resp_nope", None, Shape::OpenAi),
        (Method::DELETE, "/v1/responses/resp_nope", None, Shape::OpenAi),
        (Method::POST, "/v1/responses/resp_nope/cancel", None, Shape::OpenAi),
        (Method::GET, "/v1/responses/resp_nope/input_items", None, Shape::OpenAi),
        (Method::GET, "/v1/models", None, Shape::OpenAi),
        (Method::POST, "/v1/chat/completions", Some(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})), Shape::OpenAi),
        (Method::POST, "/v1/completions", Some(json!({"prompt": "hi", "max_tokens": 1})), Shape::OpenAi),
        (Method::POST, "/tokenize", Some(json!({"prompt": "hi"})), Shape::OpenAi),
        (Method::POST, "/detokenize", Some(json!({"tokens": [1, 2]})), Shape::OpenAi),
        (Method::GET, "/metrics", None, Shape::OpenAi),
        (Method::POST, "/lmsp/v1/responses", Some(create.clone()), Shape::Problem),
        (Method::GET, "/lmsp/v1/responses/resp_nope", None, Shape::Problem),
        (Method::GET, "/lmsp/v1/capabilities", None, Shape::Problem),
        (Method::POST, "/lmsp/v1/tasks", Some(create), Shape::Problem),
        (Method::GET, "/lmsp/v1/tasks/task_nope", None, Shape::Problem),
        (Method::GET, "/lmsp/v1/tasks/task_nope/events", None, Shape::Problem),
        (Method::POST, "/lmsp/v1/tasks/task_nope/cancel", None, Shape::Problem),
    ]
}

async fn call(s: &common::Server, method: &Method, path: &str, body: &Option<Value>, auth: Option<&str>) -> reqwest::Response {
    let mut req = common::http().request(method.clone(), format!("{}{path}", s.base));
    if let Some(body) = body {
        req = req.json(body);
    }
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    req.send().await.expect("send")
}

/// The 401 is in the route family's own shape.
async fn assert_unauthorized(r: reqwest::Response, shape: Shape, what: &str) {
    assert_eq!(r.status().as_u16(), 401, "{what}");
    let content_type = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body: Value = r.json().await.unwrap_or_else(|e| panic!("{what}: the 401 body is not JSON: {e}"));
    match shape {
        Shape::OpenAi => {
            assert!(content_type.starts_with("application/json"), "{what}: {content_type}");
            let e = &body["error"];
            assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some("authentication_error"), Some("invalid_api_key")), "{what}: {body}");
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
        }
        Shape::Problem => {
            assert_eq!(content_type, "application/problem+json", "{what}");
            assert_eq!(body["status"], 401, "{what}: {body}");
            assert!(body["title"].is_string() && body["type"].is_string(), "{what}: {body}");
        }
    }
}

#[tokio::test]
async fn every_route_refuses_a_missing_wrong_or_malformed_key_in_its_own_shape() {
    let s = common::start(vec![KEY.into(), "key-two".into()], Limits::default()).await;
    let wrong = [None, Some("Bearer key-three"), Some("Bearer key-one-and-more"), Some("Basic a2V5LW9uZQ=="), Some(KEY), Some("Bearer ")];
    for (method, path, body, shape) in routes() {
        for auth in wrong {
            let r = call(&s, &method, path, &body, auth).await;
            assert_unauthorized(r, shape, &format!("{method} {path} with {auth:?}")).await;
        }
        // The right key (either one) passes authentication: whatever the
        // route answers then, it is not a 401.
        for key in [KEY, "key-two"] {
            let r = call(&s, &method, path, &body, Some(&format!("Bearer {key}"))).await;
            assert_ne!(r.status().as_u16(), 401, "{method} {path} refused a valid key");
        }
    }
    // Health and readiness stay open for probes.
    for path in ["/health", "/ready"] {
        let r = call(&s, &Method::GET, path, &None, None).await;
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
}
