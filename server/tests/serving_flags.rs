//! `spindle serve`'s vLLM-style serving flags, through the binary:
//! `--served-model-name` aliases, `--max-model-len`, `--chat-template`,
//! `--no-enable-prefix-caching`, `--default-max-output-tokens`, given in a
//! `--config` file that the command line overrides, and the start-up line
//! that states them.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::{json, Value};

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = common::http().post(format!("{base}{path}")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn serving_flags_shape_the_served_model() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("plain.jinja");
    std::fs::write(&template, "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}### assistant:").unwrap();
    // The flags come from a --config file, except one the command line overrides.
    let config = dir.path().join("spindle.toml");
    let toml = format!("served_model_name = [\"tiny\", \"tiny-alias\"]\nmax-model-len = 512\nchat_template = \"{}\"\nno_enable_prefix_caching = true\ndefault_max_output_tokens = 30\n", template.display());
    std::fs::write(&config, toml).unwrap();
    let args = ["--config", config.to_str().unwrap(), "--default-max-output-tokens", "20"];
    let daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &args);
    let base = daemon.base();
    let models: Value = common::http().get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["tiny", "tiny-alias"], "{models}");
    assert_eq!(models["data"][0]["max_model_len"], 512);
    // An alias is accepted; the response names the first.
    let body = json!({"model": "tiny-alias", "input": "Tell me a long story about the sea.", "temperature": 0, "ignore_eos": true});
    let (status, r) = post(&base, "/v1/responses", body.clone()).await;
    assert_eq!((status, r["model"].as_str()), (200, Some("tiny")), "{r}");
    assert_eq!(r["usage"]["output_tokens"], 20, "the default max_output_tokens: {}", r["usage"]);
    // No prefix cache: the same prompt again reuses nothing.
    let (_, again) = post(&base, "/v1/responses", body).await;
    assert_eq!(again["usage"]["input_tokens_details"]["cached_tokens"], 0, "{}", again["usage"]);
    // The prompt is rendered with the given template.
    let (status, t) = post(&base, "/tokenize", json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(status, 200, "{t}");
    let (_, text) = post(&base, "/detokenize", json!({"tokens": t["tokens"]})).await;
    assert_eq!(text["prompt"], "### user: hi\n### assistant:", "{text}");
    // --max-model-len bounds the prompt …
    let long = "word ".repeat(600);
    let (status, refused) = post(&base, "/v1/responses", json!({"input": long, "max_output_tokens": 16})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{refused}");
    // … and the prompt plus the output: a 300-token prompt gets 212 tokens
    // of output, not the 400 asked for, and ends incomplete.
    let prompt = "word ".repeat(300);
    let (status, t) = post(&base, "/tokenize", json!({"messages": [{"role": "user", "content": prompt}]})).await;
    assert_eq!(status, 200, "{t}");
    let body = json!({"input": prompt, "max_output_tokens": 400, "ignore_eos": true, "temperature": 0});
    let (status, cut) = post(&base, "/v1/responses", body).await;
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut["usage"]["input_tokens"], t["count"], "{}", cut["usage"]);
    let total = cut["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(total, 512, "prompt plus output fill the 512-token context exactly: {}", cut["usage"]);
    assert_eq!((cut["status"].as_str(), cut["incomplete_details"]["reason"].as_str()), (Some("incomplete"), Some("max_output_tokens")), "{cut}");
    let (status, unknown) = post(&base, "/v1/responses", json!({"model": "other", "input": "hi"})).await;
    assert_eq!(status, 404, "{unknown}");
    let log = daemon.log_text();
    assert!(log.contains("serving tiny (also as [\"tiny-alias\"]); context 512 tokens; prefix caching off; default max_output_tokens 20"), "{log}");
}
