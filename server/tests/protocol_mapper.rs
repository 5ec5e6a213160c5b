//! The response mapper: exact event sequences (digest §5c text, §5d function
//! call), incomplete and failed endings, and the non-streaming reply equal to
//! the final streamed response.
#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::{json, Value};
use spindle_server::protocol::{
    validate, ApiError, FinishKind, MapperInput, RequestLimits, ResponseMapper, ResponseObject,
    ResponseStatus, StreamEvent, UsageCounts, ValidRequest,
};

fn request(extra: Value) -> ValidRequest {
    let mut b = json!({"model": "smol", "input": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    validate(b, &RequestLimits::default()).unwrap()
}

fn mapper(req: &ValidRequest) -> ResponseMapper {
    ResponseMapper::new("resp_test".into(), 1_700_000_000, req).with_clock(|| 1_700_000_009)
}

fn usage() -> UsageCounts {
    UsageCounts {
        input_tokens: 12,
        cached_tokens: 0,
        output_tokens: 3,
        reasoning_tokens: 0,
    }
}

/// Runs `inputs` after `start`, returning every event as JSON.
fn run(m: &mut ResponseMapper, inputs: Vec<MapperInput>) -> Vec<Value> {
    let mut events = m.start();
    for i in inputs {
        events.extend(m.push(i));
    }
    events
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn assert_sequence_numbers(events: &[Value]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
}

#[test]
fn text_answer_follows_5c_exactly() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::Started { cached_tokens: 4 },
            MapperInput::TextDelta("Hel".into()),
            MapperInput::TextDelta(String::new()),
            MapperInput::TextDelta("lo!".into()),
            MapperInput::Finished {
                reason: FinishKind::Stop,
                usage: usage(),
            },
        ],
    );
    assert_eq!(
        types(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_sequence_numbers(&ev);
    for e in &ev[..2] {
        let r = &e["response"];
        assert_eq!(
            (r["id"].as_str(), r["status"].as_str()),
            (Some("resp_test"), Some("in_progress"))
        );
        assert_eq!(
            (
                r["output"].clone(),
                r["usage"].clone(),
                r["completed_at"].clone()
            ),
            (json!([]), Value::Null, Value::Null)
        );
    }
    let id = ev[2]["item"]["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msg_"));
    assert_eq!(ev[2]["output_index"], 0);
    assert_eq!(
        ev[2]["item"],
        json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []})
    );
    let empty_part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
    assert_eq!(
        ev[3],
        json!({"type": "response.content_part.added", "sequence_number": 3, "item_id": id, "output_index": 0, "content_index": 0, "part": empty_part})
    );
    assert_eq!(
        ev[4],
        json!({"type": "response.output_text.delta", "sequence_number": 4, "item_id": id, "output_index": 0, "content_index": 0, "delta": "Hel", "logprobs": []})
    );
    assert_eq!(ev[5]["delta"], "lo!");
    assert_eq!(
        ev[6],
        json!({"type": "response.output_text.done", "sequence_number": 6, "item_id": id, "output_index": 0, "content_index": 0, "text": "Hello!", "logprobs": []})
    );
    let part = json!({"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []});
    assert_eq!(
        ev[7],
        json!({"type": "response.content_part.done", "sequence_number": 7, "item_id": id, "output_index": 0, "content_index": 0, "part": part})
    );
    let item = json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]});
    assert_eq!(
        ev[8],
        json!({"type": "response.output_item.done", "sequence_number": 8, "output_index": 0, "item": item})
    );
    let done = &ev[9]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["completed_at"], 1_700_000_009);
    assert_eq!(done["output"], json!([item]));
    assert_eq!(
        done["usage"],
        json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
    );
    assert_eq!(m.response().output_text(), "Hello!");
    assert!(m.is_finished());
}

#[test]
fn function_call_follows_5d_exactly() {
    let req = request(json!({"tools": [{"type": "function", "name": "get_weather"}]}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::Started { cached_tokens: 0 },
            MapperInput::FunctionCallStarted {
                call_id: "call_Y".into(),
                name: "get_weather".into(),
            },
            MapperInput::FunctionCallArgumentsDelta("{\"loc".into()),
            MapperInput::FunctionCallArgumentsDelta("ation\":\"SF\"}".into()),
            MapperInput::FunctionCallDone,
            MapperInput::Finished {
                reason: FinishKind::Stop,
                usage: usage(),
            },
        ],
    );
    assert_eq!(
        types(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_sequence_numbers(&ev);
    let id = ev[2]["item"]["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("fc_"));
    assert_eq!(
        ev[2]["item"],
        json!({"type": "function_call", "id": id, "call_id": "call_Y", "name": "get_weather", "arguments": "", "status": "in_progress"})
    );
    assert_eq!(
        ev[3],
        json!({"type": "response.function_call_arguments.delta", "sequence_number": 3, "item_id": id, "output_index": 0, "delta": "{\"loc"})
    );
    let args = "{\"location\":\"SF\"}";
    assert_eq!(
        ev[5],
        json!({"type": "response.function_call_arguments.done", "sequence_number": 5, "item_id": id, "output_index": 0, "arguments": args})
    );
    let item = json!({"type": "function_call", "id": id, "call_id": "call_Y", "name": "get_weather", "arguments": args, "status": "completed"});
    assert_eq!(ev[6]["item"], item);
    assert_eq!(ev[7]["response"]["output"], json!([item]));
    assert_eq!(ev[7]["response"]["status"], "completed");
}

#[test]
fn text_then_parallel_calls_use_increasing_output_indexes() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::TextDelta("Checking.".into()),
            MapperInput::FunctionCallStarted {
                call_id: "call_1".into(),
                name: "a".into(),
            },
            MapperInput::FunctionCallArgumentsDelta("{}".into()),
            MapperInput::FunctionCallStarted {
                call_id: "call_2".into(),
                name: "b".into(),
            },
            MapperInput::FunctionCallArgumentsDelta("{}".into()),
            MapperInput::Finished {
                reason: FinishKind::Stop,
                usage: usage(),
            },
        ],
    );
    assert_sequence_numbers(&ev);
    let added: Vec<i64> = ev
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["output_index"].as_i64().unwrap())
        .collect();
    let done: Vec<i64> = ev
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["output_index"].as_i64().unwrap())
        .collect();
    assert_eq!((added, done), (vec![0, 1, 2], vec![0, 1, 2]));
    let out = &ev.last().unwrap()["response"]["output"];
    assert_eq!(out.as_array().unwrap().len(), 3);
    assert_eq!(
        (
            out[0]["type"].as_str(),
            out[1]["call_id"].as_str(),
            out[2]["call_id"].as_str()
        ),
        (Some("message"), Some("call_1"), Some("call_2"))
    );
    assert!(out
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["status"] == "completed"));
}

#[test]
fn max_output_tokens_makes_item_and_response_incomplete() {
    let req = request(json!({"max_output_tokens": 16}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::TextDelta("partial".into()),
            MapperInput::Finished {
                reason: FinishKind::MaxOutputTokens,
                usage: usage(),
            },
        ],
    );
    let t = types(&ev);
    assert_eq!(t.last(), Some(&"response.incomplete"));
    assert!(!t.contains(&"response.completed"));
    let item_done = ev
        .iter()
        .find(|e| e["type"] == "response.output_item.done")
        .unwrap();
    assert_eq!(item_done["item"]["status"], "incomplete");
    let r = &ev.last().unwrap()["response"];
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["max_output_tokens"], 16);
    assert_eq!(r["completed_at"], Value::Null);
    assert_eq!(r["output"][0]["status"], "incomplete");
    assert_eq!(m.response().status, ResponseStatus::Incomplete);
}

#[test]
fn failure_emits_error_then_response_failed() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::TextDelta("par".into()),
            MapperInput::Failed {
                message: "engine exploded".into(),
            },
        ],
    );
    let t = types(&ev);
    assert_eq!(&t[t.len() - 2..], ["error", "response.failed"]);
    assert_sequence_numbers(&ev);
    let err = &ev[ev.len() - 2];
    assert_eq!(
        err["error"],
        json!({"type": "server_error", "code": "server_error", "message": "engine exploded", "param": null})
    );
    let r = &ev.last().unwrap()["response"];
    assert_eq!(r["status"], "failed");
    assert_eq!(
        r["error"],
        json!({"code": "server_error", "message": "engine exploded"})
    );
    assert_eq!(r["output"][0]["status"], "incomplete");
    // Nothing after the terminal event.
    assert!(m.push(MapperInput::TextDelta("more".into())).is_empty());
    assert!(m.fail(&ApiError::internal("again")).is_empty());
}

#[test]
fn failure_before_any_output_is_created_in_progress_error_failed() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev: Vec<Value> = m
        .fail(&ApiError::context_length_exceeded(10, 5))
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(
        types(&ev),
        [
            "response.created",
            "response.in_progress",
            "error",
            "response.failed"
        ]
    );
    assert_eq!(
        ev[3]["response"]["error"]["code"],
        "context_length_exceeded"
    );
    assert_eq!(ev[2]["error"]["param"], "input");
}

#[test]
fn non_streaming_reply_equals_final_streamed_response() {
    let req = request(json!({"metadata": {"k": "v"}, "instructions": "Be nice."}));
    let mut m = mapper(&req);
    let mut last: Option<ResponseObject> = None;
    let mut events = m.start();
    for input in [
        MapperInput::ReasoningDelta("think".into()),
        MapperInput::TextDelta("Hi".into()),
        MapperInput::Finished {
            reason: FinishKind::Stop,
            usage: usage(),
        },
    ] {
        events.extend(m.push(input));
    }
    for e in &events {
        if e.is_terminal() {
            last = e.response().cloned();
        }
    }
    let last = last.unwrap();
    assert_eq!(m.response(), last);
    assert_eq!(
        serde_json::to_value(m.response()).unwrap(),
        serde_json::to_value(&last).unwrap()
    );
    assert_eq!(last.metadata["k"], "v");
    assert_eq!(last.instructions.as_deref(), Some("Be nice."));
    // The snapshot of every lifecycle event keeps the same id.
    assert!(events
        .iter()
        .filter_map(StreamEvent::response)
        .all(|r| r.id == "resp_test"));
}

#[test]
fn reasoning_item_streams_before_the_message() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![
            MapperInput::ReasoningDelta("Let me think".into()),
            MapperInput::TextDelta("42".into()),
            MapperInput::Finished {
                reason: FinishKind::Stop,
                usage: UsageCounts {
                    reasoning_tokens: 2,
                    ..usage()
                },
            },
        ],
    );
    assert_eq!(
        types(&ev)[2..9],
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning.delta",
            "response.reasoning.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
        ]
    );
    let rs = &ev[2]["item"];
    assert!(rs["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(rs["summary"], json!([]));
    assert_eq!(ev[3]["part"], json!({"type": "reasoning_text", "text": ""}));
    assert_eq!(ev[5]["text"], "Let me think");
    let r = &ev.last().unwrap()["response"];
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "reasoning_text", "text": "Let me think"}])
    );
    assert_eq!(
        (
            r["output"][1]["type"].as_str(),
            r["output"][1]["status"].as_str()
        ),
        (Some("message"), Some("completed"))
    );
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
}

#[test]
fn finishing_without_output_still_gives_one_message() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = run(
        &mut m,
        vec![MapperInput::Finished {
            reason: FinishKind::Stop,
            usage: usage(),
        }],
    );
    assert_eq!(types(&ev).len(), 8);
    let out = &ev.last().unwrap()["response"]["output"];
    assert_eq!(out[0]["content"][0]["text"], "");
    assert_eq!(out[0]["status"], "completed");
}

#[test]
fn background_enqueue_then_start() {
    let req = request(json!({"background": true}));
    let mut m = mapper(&req);
    let q: Vec<Value> = m
        .enqueue()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(types(&q), ["response.created", "response.queued"]);
    assert_eq!(q[0]["response"]["status"], "queued");
    assert_eq!(q[0]["response"]["background"], true);
    let s = m.start();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].event_type(), "response.in_progress");
    assert_eq!(s[0].sequence_number(), 2);
    assert!(m.start().is_empty());
}

#[test]
fn push_before_start_starts_implicitly_and_stray_inputs_are_ignored() {
    let req = request(json!({}));
    let mut m = mapper(&req);
    let ev = m.push(MapperInput::FunctionCallArgumentsDelta("{}".into()));
    assert_eq!(
        ev.iter().map(StreamEvent::event_type).collect::<Vec<_>>(),
        ["response.created", "response.in_progress"]
    );
    assert!(m.push(MapperInput::FunctionCallDone).is_empty());
    assert_eq!(m.next_sequence_number(), 2);
}

#[test]
fn logprobs_flow_into_delta_done_and_part() {
    use spindle_server::protocol::LogProb;
    let req = request(json!({"include": ["message.output_text.logprobs"]}));
    let mut m = mapper(&req);
    let lp = LogProb {
        token: "Hi".into(),
        logprob: -0.5,
        bytes: b"Hi".to_vec(),
        top_logprobs: vec![],
    };
    let ev = run(
        &mut m,
        vec![
            MapperInput::TextDeltaWithLogprobs {
                text: "Hi".into(),
                logprobs: vec![lp],
            },
            MapperInput::Finished {
                reason: FinishKind::Stop,
                usage: usage(),
            },
        ],
    );
    let expected =
        json!([{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]);
    assert_eq!(ev[4]["logprobs"], expected);
    assert_eq!(ev[5]["logprobs"], expected);
    assert_eq!(ev[6]["part"]["logprobs"], expected);
}
