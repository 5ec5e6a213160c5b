//! The independent reference through `spindle serve`: for the chat messages
//! of `tests/fixtures/smollm2_reference.json` (made by transformers' chat
//! template and tokenizer and a float64 numpy forward, see
//! `tools/reference/make_model_reference.py`), the daemon's prompt ids are
//! transformers' ids, `/v1/responses` runs exactly that prompt, and its greedy
//! answer is the reference's greedy answer.
//!
//! The daemon runs with `--precision exact` (f32 activations), which
//! reproduces the reference's greedy tokens exactly (see
//! `engine/tests/smollm2_reference.rs`); a wrong chat template, system prompt
//! or tokenization on the server path changes the ids or the answer.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::daemon::{start_daemon, Daemon};
use serde_json::{json, Value};
use std::path::Path;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id")).collect()
}

async fn post(d: &Daemon, path: &str, body: &Value) -> Value {
    let r = common::http().post(format!("{}{path}", d.base())).json(body).send().await.expect("send");
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("JSON");
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// The reference's chat cases: (name, user message, prompt text, prompt ids).
fn chat_cases(fx: &Value) -> Vec<(String, String, String, Vec<u64>)> {
    let mut cases: Vec<_> = fx["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .filter(|p| p["kind"] == "chat")
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["user_message"].as_str().unwrap().to_string(), p["text"].as_str().unwrap().to_string(), ids(&p["ids"])))
        .collect();
    for name in ["greedy", "greedy_long"] {
        let g = &fx[name];
        cases.push((name.into(), g["user_message"].as_str().unwrap().into(), g["prompt_text"].as_str().unwrap().into(), ids(&g["prompt_ids"])));
    }
    cases
}

#[tokio::test]
async fn the_daemon_builds_transformers_prompt_ids_and_answers_the_reference_greedy_tokens() {
    let fx = fixture();
    let model = spindle_testenv::smollm2_gguf();
    assert_eq!(model.file_name().and_then(|n| n.to_str()), fx["model_file"].as_str(), "the fixture is for another file");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start_daemon(&model, dir.path(), &["--precision", "exact", "--threads", "2"]);

    let cases = chat_cases(&fx);
    assert!(cases.len() >= 3, "the fixture has chat cases");
    for (name, user, text, want) in &cases {
        let messages = json!([{"role": "user", "content": user}]);
        let got = post(&d, "/tokenize", &json!({"messages": messages})).await;
        assert_eq!(ids(&got["tokens"]), *want, "{name}: prompt ids differ from transformers'");
        assert_eq!(got["count"].as_u64(), Some(want.len() as u64));
        let back = post(&d, "/detokenize", &json!({"tokens": want})).await;
        assert_eq!(back["prompt"].as_str(), Some(text.as_str()), "{name}: the reference ids decode to the reference text");
    }

    for name in ["greedy", "greedy_long"] {
        let g = &fx[name];
        let user = g["user_message"].as_str().unwrap();
        let tokens = ids(&g["tokens"]);
        let eos = g["eos_id"].as_u64().unwrap();
        let answer: Vec<u64> = tokens.iter().copied().take_while(|&t| t != eos).collect();
        let want_text = post(&d, "/detokenize", &json!({"tokens": answer})).await["prompt"].as_str().unwrap().to_string();
        let body = json!({"input": user, "temperature": 0,
                          "max_output_tokens": g["max_new_tokens"], "store": false});
        let r = post(&d, "/v1/responses", &body).await;
        assert_eq!(r["usage"]["input_tokens"].as_u64(), Some(ids(&g["prompt_ids"]).len() as u64), "{name}: {r}");
        let text = r["output"][0]["content"][0]["text"].as_str().expect("text");
        assert_eq!(text, want_text, "{name}: greedy answer differs from the reference");
        let finished = if answer.len() < tokens.len() { "completed" } else { "incomplete" };
        assert_eq!(r["status"], finished, "{name}: {r}");
    }
}
