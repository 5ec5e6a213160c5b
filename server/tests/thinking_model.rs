//! A thinking model end to end: a tiny random Qwen3-shaped model whose
//! vocabulary has `<think>`/`</think>` as single tokens and whose template
//! uses them. Under a `json_schema` format the first token may open a
//! reasoning block (free text, no grammar) or start the JSON; after
//! `</think>` the grammar applies. Over seeded sampled requests: every
//! response that reasons has a `reasoning` item first (streamed as
//! `response.reasoning.delta`) and its `reasoning_tokens` counted, and every
//! completed answer parses under the schema.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use spindle_server::app::access::auth::Tenant;

use serde_json::{json, Value};
use spindle_server::app::Limits;
use spindle_server::protocol::{validate, RequestLimits};
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyModelOptions};
use std::path::Path;
use std::sync::Arc;

const TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}{%- if message['role'] == 'assistant' and message.reasoning_content %}{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}{{- message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// DeepSeek-R1 style: the generation prompt already opens the reasoning.
const R1_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

/// Renames the first two reserved tokens to `<think>`/`</think>` (not
/// special, so they decode as text) and installs `template`.
fn make_thinking(dir: &Path, template: &str) {
    let rename = |v: &mut Value| {
        for (from, to) in [("<|reserved_0|>", "<think>"), ("<|reserved_1|>", "</think>")] {
            if v["content"] == from {
                v["content"] = json!(to);
                v["special"] = json!(false);
            }
        }
    };
    let path = dir.join("tokenizer.json");
    let mut tok: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    tok["added_tokens"].as_array_mut().unwrap().iter_mut().for_each(rename);
    std::fs::write(&path, tok.to_string()).unwrap();
    let path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["added_tokens_decoder"].as_object_mut().unwrap().values_mut().for_each(rename);
    config["chat_template"] = json!(template);
    std::fs::write(&path, config.to_string()).unwrap();
}

#[tokio::test]
async fn reasoning_is_a_separate_item_and_the_grammar_applies_to_the_answer_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("thinker");
    write_tiny_model(&TinyModelOptions::new(TinyArch::Qwen3), &dir).unwrap();
    make_thinking(&dir, TEMPLATE);
    let s = common::start_model(dir.to_str().unwrap(), "thinker", vec![], Limits::default(), 256, |s| Arc::new(s)).await;
    assert!(s.state.model.think_tags.is_some(), "the tags are single tokens and the template uses them");

    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let (mut reasoned, mut direct) = (0, 0);
    for seed in 0..40 {
        let body = json!({"model": "thinker", "input": "Is it ok?", "max_output_tokens": 160, "temperature": 1.0, "top_k": 0,
                          "top_p": 1.0, "min_p": 0.0, "seed": seed, "stream": true,
                          "text": {"format": {"type": "json_schema", "name": "ok", "schema": schema, "strict": true}}});
        let text = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().text().await.unwrap();
        let events: Vec<Value> = text.split("\n\n").filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
        let response = &events.last().unwrap()["response"];
        let output = response["output"].as_array().unwrap();
        let reasoning_tokens = response["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
        let message = output.iter().find(|i| i["type"] == "message");
        if output[0]["type"] == "reasoning" {
            let text = output[0]["content"][0]["text"].as_str().unwrap_or("");
            // (A random model may sample `<think>` again inside; only the tags that open and close it are dropped.)
            assert!(!text.starts_with("<think>") && !text.contains("</think>"), "the tags are not part of the reasoning: {text:?}");
            assert!(reasoning_tokens >= 1 && reasoning_tokens <= response["usage"]["output_tokens"].as_u64().unwrap());
            assert!(events.iter().any(|e| e["type"] == "response.reasoning.delta") || text.is_empty());
            if let Some(m) = message.filter(|_| response["status"] == "completed") {
                let answer = m["content"][0]["text"].as_str().unwrap();
                let doc: Value = serde_json::from_str(answer).unwrap_or_else(|e| panic!("seed {seed}: {e}: {answer:?}"));
                assert!(doc["ok"].is_boolean(), "{doc}");
                reasoned += 1;
            }
        } else {
            assert_eq!(reasoning_tokens, 0);
            let m = message.unwrap();
            if response["status"] == "completed" {
                let doc: Value = serde_json::from_str(m["content"][0]["text"].as_str().unwrap()).unwrap();
                assert!(doc["ok"].is_boolean(), "{doc}");
                direct += 1;
            }
        }
    }
    println!("thinking model: {reasoned} answers after reasoning, {direct} without, of 40 seeds");
    assert!(reasoned >= 1, "no seed reasoned and then answered under the grammar");
    assert!(direct >= 1, "no seed answered directly under the grammar");
}

/// R1 style: the prompt ends in `<think>\n`, so the output starts inside the
/// reasoning; the output cannot end before `</think>`, and the answer after it
/// follows the grammar.
#[tokio::test]
async fn a_prompt_that_opens_the_reasoning_starts_inside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r1");
    write_tiny_model(&TinyModelOptions::new(TinyArch::Qwen3), &dir).unwrap();
    make_thinking(&dir, R1_TEMPLATE);
    let s = common::start_model(dir.to_str().unwrap(), "r1", vec![], Limits::default(), 256, |s| Arc::new(s)).await;
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let mut answered = 0;
    for seed in 0..24 {
        let body = json!({"model": "r1", "input": "Is it ok?", "max_output_tokens": 120, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                          "min_p": 0.0, "seed": seed, "text": {"format": {"type": "json_schema", "name": "ok", "schema": schema, "strict": true}}});
        let r: Value = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().json().await.unwrap();
        let output = r["output"].as_array().unwrap();
        assert_eq!(output[0]["type"], "reasoning", "seed {seed}: {r}");
        assert!(r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() >= 1);
        if r["status"] == "completed" {
            let m = output.iter().find(|i| i["type"] == "message").unwrap_or_else(|| panic!("seed {seed}: completed without an answer: {r}"));
            let doc: Value = serde_json::from_str(m["content"][0]["text"].as_str().unwrap()).unwrap();
            assert!(doc["ok"].is_boolean(), "{doc}");
            answered += 1;
        } else {
            assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens", "seed {seed}: the reasoning may not end the output: {r}");
        }
    }
    println!("R1-style: {answered} of 24 seeds closed the reasoning and answered");
    assert!(answered >= 1, "no seed closed the reasoning and answered under the grammar");
}

/// An agent loop on a thinking model: turn 1 reasons and calls a tool, turn 2
/// sends the result back (by `previous_response_id`, and statelessly by
/// re-sending the reasoning and call items). Turn 2's prompt starts with
/// exactly turn 1's prompt and generated ids (not a re-tokenization of their
/// text, which a random model's output often does not survive), so the
/// blocks computed for the generated tokens are prefix-cache hits.
#[tokio::test]
async fn a_tool_loop_turn_extends_the_last_turn_token_for_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("looper");
    // Room for the tools section (the tiny vocabulary has few merges).
    write_tiny_model(&TinyModelOptions { max_position: 2048, ..TinyModelOptions::new(TinyArch::Qwen3) }, &dir).unwrap();
    make_thinking(&dir, TEMPLATE);
    let s = common::start_model(dir.to_str().unwrap(), "looper", vec![], Limits::default(), 512, |s| Arc::new(s)).await;
    let tok = &s.state.model.tokenizer;
    let tools = json!([{"type": "function", "name": "lookup", "strict": true,
                        "parameters": {"type": "object", "properties": {"q": {"enum": ["hello world", "the ring"]}}, "required": ["q"], "additionalProperties": false}}]);
    let client = common::http();
    let post = |body: Value| {
        let (client, url) = (client.clone(), format!("{}/v1/responses", s.base));
        async move { client.post(url).json(&body).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let (mut extended, mut retokenized_differs) = (0, 0);
    for seed in 0..12 {
        let first = post(json!({"model": "looper", "input": "Look it up.", "tools": tools, "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 120,
                                "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed})).await;
        if first["status"] != "completed" {
            continue;
        }
        let call = first["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap().clone();
        let recorded = s.state.model.ledger.tokens(first["id"].as_str().unwrap()).unwrap();
        let result = json!({"type": "function_call_output", "call_id": call["call_id"], "output": "{\"found\": true}"});
        let chained = json!({"model": "looper", "previous_response_id": first["id"], "input": [result], "tools": tools,
                             "tool_choice": "none", "max_output_tokens": 16, "temperature": 0.0});
        let resent: Vec<Value> = [json!({"role": "user", "content": "Look it up."})]
            .into_iter()
            .chain(first["output"].as_array().unwrap().iter().cloned())
            .chain([result.clone()])
            .collect();
        let stateless = json!({"model": "looper", "input": resent,
                               "tools": tools, "tool_choice": "none", "max_output_tokens": 16, "temperature": 0.0, "store": false});
        let mut prompts = Vec::new();
        for body in [&chained, &stateless] {
            let req = validate(body.clone(), &RequestLimits::default()).unwrap();
            let history = spindle_server::app::runtime::turn::history(&s.state, req.previous_response_id.as_deref(), &Tenant::anonymous()).unwrap();
            prompts.push(spindle_server::app::runtime::turn::prepare(&s.state, &req, history, &Tenant::anonymous()).unwrap().prompt);
        }
        assert_eq!(prompts[0], prompts[1], "seed {seed}: chained and stateless turns render the same ids");
        if !prompts[0].starts_with(&recorded) {
            // The turn's text does not re-render the same (whitespace before
            // the answer belongs to no item; a random model writes special
            // tokens inside its reasoning): tokenized whole, never spliced.
            assert_eq!(prompts[0], tok.encode(&tok.decode(&prompts[0], false).unwrap(), false).unwrap());
            continue;
        }
        extended += 1;
        if tok.encode(&tok.decode(&recorded, false).unwrap(), false).unwrap() != recorded {
            retokenized_differs += 1;
        }
        let second = post(chained).await;
        let cached = second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
        assert_eq!(second["usage"]["input_tokens"].as_u64().unwrap() as usize, prompts[0].len());
        // Every full block of turn 1's computed tokens (all but the last sampled one) is a hit.
        assert!(cached >= (recorded.len() - 1) / 16 * 16, "seed {seed}: {cached} cached of {} recorded", recorded.len());
    }
    println!("tool loop: {extended} of 12 seeds extended token for token; {retokenized_differs} would not survive re-tokenizing");
    assert!(extended >= 3, "too few seeds completed a call whose turn re-renders exactly");
    assert!(retokenized_differs >= 1, "no seed showed the difference re-tokenizing makes");
}

/// `reasoning.summary`: the model's reasoning is summarized by a side
/// generation and streamed as the reasoning item's `summary_text` part,
/// after its raw reasoning and before the item (and the answer) close.
#[tokio::test]
async fn a_summary_asked_for_streams_as_the_reasoning_items_summary_part() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("summarizer");
    write_tiny_model(&TinyModelOptions::new(TinyArch::Qwen3), &dir).unwrap();
    make_thinking(&dir, R1_TEMPLATE);
    let s = common::start_model(dir.to_str().unwrap(), "summarizer", vec![], Limits::default(), 256, |s| Arc::new(s)).await;
    let mut summarized = 0;
    for seed in 0..6 {
        let body = json!({"model": "summarizer", "input": "Is it ok?", "max_output_tokens": 48, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                          "min_p": 0.0, "seed": seed, "stream": true, "reasoning": {"summary": "concise"}});
        let text = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().text().await.unwrap();
        let events: Vec<Value> = text.split("\n\n").filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let response = &events.last().unwrap()["response"];
        let item = &response["output"][0];
        assert_eq!(item["type"], "reasoning", "R1-style output starts inside the reasoning: {response}");
        let Some(added) = kinds.iter().position(|k| *k == "response.reasoning_summary_part.added") else {
            assert_eq!(item["summary"], json!([]), "no summary events, no summary");
            continue;
        };
        let summary = item["summary"][0]["text"].as_str().unwrap();
        assert_eq!(item["summary"][0]["type"], "summary_text");
        assert!(!summary.is_empty());
        let pos = |k: &str| kinds.iter().position(|x| *x == k).unwrap_or_else(|| panic!("no {k}: {kinds:?}"));
        let deltas: String = events.iter().filter(|e| e["type"] == "response.reasoning_summary_text.delta")
            .map(|e| e["delta"].as_str().unwrap()).collect();
        assert_eq!(deltas, summary);
        assert!(pos("response.reasoning.done") < added, "the raw reasoning closes first: {kinds:?}");
        assert!(added < pos("response.reasoning_summary_text.done"));
        assert!(pos("response.reasoning_summary_text.done") < pos("response.reasoning_summary_part.done"));
        let item_done = kinds.iter().position(|k| *k == "response.output_item.done").unwrap();
        assert!(pos("response.reasoning_summary_part.done") < item_done, "the summary closes before its item: {kinds:?}");
        assert_eq!(events[item_done]["item"]["summary"][0]["text"], summary);
        summarized += 1;
    }
    println!("summaries: {summarized} of 6 seeds");
    assert!(summarized >= 3, "too few summaries");
    // Without `reasoning.summary` there is none.
    let body = json!({"model": "summarizer", "input": "Is it ok?", "max_output_tokens": 24, "seed": 1});
    let r: Value = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["output"][0]["summary"], json!([]), "{r}");
}

/// The model's own steps, slowed down, with `</think>` forced as the third
/// token: a reasoning item ends early and the answer runs on for a while.
struct ClosesThinkingEarly {
    inner: spindle_engine::runner::ModelRunner,
    close: u32,
    steps: usize,
}

impl spindle_engine::runner::Executor for ClosesThinkingEarly {
    fn execute(&mut self, batch: &spindle_engine::batch::ForwardBatch) -> spindle_engine::Result<spindle_engine::batch::StepOutput> {
        let mut out = self.inner.execute(batch)?;
        self.steps += 1;
        for seq in &mut out.seqs {
            if let Some(sampled) = seq.sampled.as_mut() {
                if self.steps == 3 {
                    sampled.token = self.close;
                } else if sampled.token == self.close {
                    sampled.token = 100;
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(15));
        Ok(out)
    }

    fn context_length(&self) -> usize {
        self.inner.context_length()
    }

    fn kv_geometry(&self) -> spindle_engine::runner::KvGeometry {
        self.inner.kv_geometry()
    }
}

#[tokio::test]
async fn a_background_response_stores_each_finished_item_while_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r1");
    write_tiny_model(&TinyModelOptions::new(TinyArch::Qwen3), &dir).unwrap();
    make_thinking(&dir, R1_TEMPLATE);
    let tok: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
    let close = tok["added_tokens"].as_array().unwrap().iter().find(|t| t["content"] == "</think>").unwrap()["id"].as_u64().unwrap() as u32;
    let s = common::start_model_with(dir.to_str().unwrap(), "r1", vec![], Limits::default(), |s| Arc::new(s), |model| ClosesThinkingEarly {
        inner: spindle_engine::runner::ModelRunner::new(model, 256, 16),
        close,
        steps: 0,
    })
    .await;
    let body = json!({"model": "r1", "input": "Think, then answer at length.", "background": true, "max_output_tokens": 300, "ignore_eos": true});
    let created: Value = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().json().await.unwrap();
    let id = created["id"].as_str().expect("an id").to_string();
    // While the answer is still being written, the stored response already
    // holds the finished reasoning item, and its events replay so far.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let running = loop {
        let r: Value = common::http().get(format!("{}/v1/responses/{id}", s.base)).send().await.unwrap().json().await.unwrap();
        assert_ne!(r["status"], "completed", "the response finished before any progress was stored: {r}");
        assert_ne!(r["status"], "incomplete", "the response finished before any progress was stored: {r}");
        if r["status"] == "in_progress" && !r["output"].as_array().unwrap().is_empty() {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "no progress stored in time: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(running["output"][0]["type"], "reasoning", "{running}");
    assert_eq!(running["output"][0]["status"], "completed", "{running}");
    let replay = common::http().get(format!("{}/v1/responses/{id}?stream=true", s.base)).send().await.unwrap().text().await.unwrap();
    assert!(replay.contains("event: response.output_item.done"), "{replay}");
    assert!(!replay.contains("event: response.incomplete"), "the replay is of a running response: {replay}");
    // And it still ends as it should, with every event stored once.
    let done = loop {
        let r: Value = common::http().get(format!("{}/v1/responses/{id}", s.base)).send().await.unwrap().json().await.unwrap();
        if r["status"] != "in_progress" {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "the response did not end in time: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(done["status"], "incomplete", "300 tokens with ignore_eos end at the cap: {done}");
    assert_eq!(done["output"][1]["type"], "message", "{done}");
    let replay = common::http().get(format!("{}/v1/responses/{id}?stream=true", s.base)).send().await.unwrap().text().await.unwrap();
    let sequence: Vec<u64> = replay
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(sequence, (0..sequence.len() as u64).collect::<Vec<_>>(), "each event once, in order");
}
