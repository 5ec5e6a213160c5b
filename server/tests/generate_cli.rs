//! `spindle generate` runs through the same scheduler, sampler, stop rules
//! and grammar compiler as the server: greedy output under a JSON Schema
//! equals the server's for the same prompt and `text.format`, and `--stop`
//! ends the output just before the stop string.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use spindle_server::app::Limits;
use std::process::Command;
use std::time::Duration;

mod common;

const PROMPT: &str = "List three colours.";

/// `spindle generate` on the test model with `extra` flags: its stdout
/// without the final newline (fails the test on a non-zero exit).
fn generate(model: &str, extra: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["generate", "--model", model, "--device", "cpu", "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "40"]).args(extra);
    let out = common::run_with_deadline(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, "required": ["colours"], "additionalProperties": false})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_matches_the_server_under_a_json_schema_and_honours_stop_strings() {
    let s = common::start(vec![], Limits::default()).await;
    let model = spindle_testenv::smollm2_gguf().to_string_lossy().into_owned();
    let body = json!({"model": "smollm2-135m-instruct", "input": PROMPT, "temperature": 0, "max_output_tokens": 40,
        "text": {"format": {"type": "json_schema", "name": "output", "schema": schema(), "strict": true}}});
    let request = common::http().post(format!("{}/v1/responses", s.base)).json(&body).timeout(Duration::from_secs(120)).send();
    let r: Value = request.await.expect("send").json().await.expect("json");
    let served = r["output"][0]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {r}")).to_string();

    let model2 = model.clone();
    let schema_arg = schema().to_string();
    let generated = tokio::task::spawn_blocking(move || generate(&model2, &["--json-schema", &schema_arg])).await.unwrap();
    assert_eq!(generated, served, "generate and the server agree under the same schema");
    let parsed: Value = serde_json::from_str(&generated).unwrap_or_else(|e| panic!("not JSON ({e}): {generated}"));
    assert!(parsed["colours"].is_array(), "{parsed}");

    let free = tokio::task::spawn_blocking({
        let model = model.clone();
        move || generate(&model, &[])
    })
    .await
    .unwrap();
    // A stop string from the middle of the free output: the output ends just before it.
    let chars: Vec<(usize, char)> = free.char_indices().collect();
    assert!(chars.len() > 12, "the free output is long enough to cut: {free:?}");
    let at = chars[chars.len() / 2].0;
    let end = chars.get(chars.len() / 2 + 3).map_or(free.len(), |c| c.0);
    let stop = free[at..end].to_string();
    let expected = free[..free.find(&stop).unwrap()].to_string();
    let stopped = tokio::task::spawn_blocking(move || generate(&model, &["--stop", &stop])).await.unwrap();
    assert_eq!(stopped, expected, "output up to the stop string");
}
