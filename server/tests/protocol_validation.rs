//! Request validation: bad inputs give 400 with the right `type`, `code` and
//! `param`; good inputs parse with the documented defaults.
#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::{json, Value};
use spindle_server::protocol::items::{FunctionOutput, InputContent, MessageContent};
use spindle_server::protocol::{
    validate, ApiError, FunctionTool, Include, InputItem, RequestLimits, Role, ServiceTier,
    SpecificToolChoice, TextFormat, ToolChoice, ToolChoiceMode, Truncation,
};

fn limits() -> RequestLimits {
    RequestLimits {
        max_input_items: 4,
        max_tools: 2,
        max_output_tokens: 1000,
    }
}

fn body(extra: Value) -> Value {
    let mut b = json!({"model": "m", "input": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn err(b: Value) -> ApiError {
    match validate(b.clone(), &limits()) {
        Ok(_) => panic!("expected an error for {b}"),
        Err(e) => e,
    }
}

/// (body, code, param) — all are 400 invalid_request_error.
fn bad_inputs() -> Vec<(Value, &'static str, Option<&'static str>)> {
    let weather = json!({"type": "function", "name": "get_weather"});
    vec![
        (json!([1, 2]), "invalid_type", None),
        (body(json!({"model": 5})), "invalid_type", Some("model")),
        (
            body(json!({"temperature": "hot"})),
            "invalid_type",
            Some("temperature"),
        ),
        (
            body(json!({"temperature": 3})),
            "decimal_above_max_value",
            Some("temperature"),
        ),
        (
            body(json!({"top_p": -0.1})),
            "decimal_below_min_value",
            Some("top_p"),
        ),
        (
            body(json!({"presence_penalty": 2.5})),
            "decimal_above_max_value",
            Some("presence_penalty"),
        ),
        (
            body(json!({"max_output_tokens": 5})),
            "integer_below_min_value",
            Some("max_output_tokens"),
        ),
        (
            body(json!({"max_output_tokens": 1.5})),
            "invalid_type",
            Some("max_output_tokens"),
        ),
        (
            body(json!({"max_output_tokens": 5000})),
            "integer_above_max_value",
            Some("max_output_tokens"),
        ),
        (
            body(json!({"max_tool_calls": 0})),
            "integer_below_min_value",
            Some("max_tool_calls"),
        ),
        (
            body(json!({"top_logprobs": 21})),
            "integer_above_max_value",
            Some("top_logprobs"),
        ),
        (
            body(json!({"stream": "yes"})),
            "invalid_type",
            Some("stream"),
        ),
        (body(json!({"input": 42})), "invalid_type", Some("input")),
        (
            json!({"model": "m"}),
            "missing_required_parameter",
            Some("input"),
        ),
        (
            body(json!({"input": [{"content": "hi"}]})),
            "missing_required_parameter",
            Some("input[0].type"),
        ),
        (
            body(json!({"input": [{"type": "message", "role": "robot", "content": "x"}]})),
            "invalid_value",
            Some("input[0].role"),
        ),
        (
            body(json!({"input": [{"role": "user"}]})),
            "missing_required_parameter",
            Some("input[0].content"),
        ),
        (
            body(json!({"input": [{"role": "user", "content": 7}]})),
            "invalid_type",
            Some("input[0].content"),
        ),
        (
            body(json!({"input": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": [{"type": "input_audio", "data": "x"}]}
            ]})),
            "invalid_value",
            Some("input[2].content[0].type"),
        ),
        (
            body(json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "ultra"}
            ]}]})),
            "invalid_value",
            Some("input[0].content[1].detail"),
        ),
        (
            body(json!({"input": [{"type": "input_text", "text": "x"}]})),
            "invalid_value",
            Some("input[0].type"),
        ),
        (
            body(
                json!({"input": [{"type": "function_call", "call_id": "c1", "name": "get weather", "arguments": "{}"}]}),
            ),
            "invalid_value",
            Some("input[0].name"),
        ),
        (
            body(
                json!({"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]}),
            ),
            "empty_string",
            Some("input[0].call_id"),
        ),
        (
            body(json!({"input": [{"type": "function_call_output", "output": "sunny"}]})),
            "missing_required_parameter",
            Some("input[0].call_id"),
        ),
        (
            body(
                json!({"input": [{"type": "reasoning", "summary": [{"type": "text", "text": "x"}]}]}),
            ),
            "invalid_value",
            Some("input[0].summary[0].type"),
        ),
        (
            body(json!({"input": ["a", "b", "c", "d", "e"]})),
            "array_above_max_length",
            Some("input"),
        ),
        (
            body(json!({"tools": [{"type": "web_search"}]})),
            "invalid_value",
            Some("tools[0].type"),
        ),
        (
            body(json!({"tools": [weather.clone(), {"type": "function", "name": "x".repeat(65)}]})),
            "string_above_max_length",
            Some("tools[1].name"),
        ),
        (
            body(json!({"tools": [weather.clone(), weather.clone(), weather.clone()]})),
            "array_above_max_length",
            Some("tools"),
        ),
        (
            body(json!({"tools": [weather.clone(), weather.clone()]})),
            "invalid_value",
            Some("tools[1].name"),
        ),
        (
            body(json!({"tools": [{"type": "function", "name": "f", "parameters": "{}"}]})),
            "invalid_type",
            Some("tools[0].parameters"),
        ),
        (
            body(json!({"tool_choice": "sometimes", "tools": [weather.clone()]})),
            "invalid_value",
            Some("tool_choice"),
        ),
        (
            body(
                json!({"tool_choice": {"type": "function", "name": "nope"}, "tools": [weather.clone()]}),
            ),
            "invalid_value",
            Some("tool_choice.name"),
        ),
        (
            body(json!({"tool_choice": "required"})),
            "invalid_value",
            Some("tool_choice"),
        ),
        (
            body(
                json!({"tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "other"}]}, "tools": [weather]}),
            ),
            "invalid_value",
            Some("tool_choice.tools[0].name"),
        ),
        (
            body(json!({"truncation": "middle"})),
            "invalid_value",
            Some("truncation"),
        ),
        (
            body(json!({"text": {"format": {"type": "xml"}}})),
            "invalid_value",
            Some("text.format.type"),
        ),
        (
            body(json!({"reasoning": {"effort": "minimal"}})),
            "invalid_value",
            Some("reasoning.effort"),
        ),
        (
            body(json!({"include": ["file_search_call.results"]})),
            "invalid_value",
            Some("include[0]"),
        ),
        (
            body(json!({"metadata": {"k": 1}})),
            "invalid_type",
            Some("metadata.k"),
        ),
        (
            body(
                json!({"metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
            ),
            "array_above_max_length",
            Some("metadata"),
        ),
        (
            body(json!({"metadata": {"k": "v".repeat(513)}})),
            "string_above_max_length",
            Some("metadata.k"),
        ),
        (
            body(json!({"safety_identifier": "s".repeat(65)})),
            "string_above_max_length",
            Some("safety_identifier"),
        ),
        (
            body(json!({"service_tier": "batch"})),
            "invalid_value",
            Some("service_tier"),
        ),
        (
            body(json!({"background": true, "store": false})),
            "invalid_value",
            Some("background"),
        ),
        (
            body(json!({"stream_options": {"include_obfuscation": "no"}})),
            "invalid_type",
            Some("stream_options.include_obfuscation"),
        ),
    ]
}

#[test]
fn bad_inputs_get_400_with_type_code_and_param() {
    let cases = bad_inputs();
    assert!(cases.len() >= 15);
    for (b, code, param) in cases {
        let e = err(b.clone());
        assert_eq!(e.status, 400, "{b}: {e:?}");
        let wire = e.to_body();
        assert_eq!(wire["error"]["type"], "invalid_request_error", "{b}");
        assert_eq!(wire["error"]["code"], code, "{b}: {}", e.message);
        assert_eq!(wire["error"]["param"], json!(param), "{b}: {}", e.message);
        assert!(!e.message.is_empty());
    }
}

#[test]
fn error_body_has_exactly_the_spec_shape() {
    let e = ApiError::model_not_found("gpt-x");
    assert_eq!(e.status, 404);
    let b = e.to_body();
    assert_eq!(b["error"]["type"], "not_found");
    assert_eq!(b["error"]["code"], "model_not_found");
    assert_eq!(b["error"]["param"], "model");
    let keys: Vec<&str> = b["error"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["message", "type", "param", "code"]);
    assert_eq!(b.as_object().unwrap().len(), 1);

    let cases = [
        (
            ApiError::previous_response_not_found("resp_x"),
            404,
            "not_found",
            "previous_response_not_found",
        ),
        (
            ApiError::context_length_exceeded(9000, 8192),
            400,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (
            ApiError::unsupported_capability("input[0].content[1]", "no images"),
            400,
            "invalid_request_error",
            "unsupported_capability",
        ),
        (
            ApiError::too_many_requests(Some(3)),
            429,
            "too_many_requests",
            "rate_limit_exceeded",
        ),
        (
            ApiError::payload_too_large(1024),
            413,
            "invalid_request_error",
            "payload_too_large",
        ),
        (
            ApiError::unauthorized(),
            401,
            "authentication_error",
            "invalid_api_key",
        ),
        (
            ApiError::not_found("no such response"),
            404,
            "not_found",
            "not_found",
        ),
        (
            ApiError::internal("boom"),
            500,
            "server_error",
            "server_error",
        ),
        (
            ApiError::model_error("bad output"),
            500,
            "model_error",
            "model_error",
        ),
        (
            ApiError::invalid_json("eof"),
            400,
            "invalid_request_error",
            "invalid_json",
        ),
    ];
    for (e, status, kind, code) in cases {
        assert_eq!(e.status, status);
        assert_eq!(e.to_body()["error"]["type"], kind);
        assert_eq!(e.to_body()["error"]["code"], code);
    }
    assert_eq!(ApiError::too_many_requests(Some(3)).retry_after, Some(3));
    assert_eq!(
        ApiError::previous_response_not_found("r").param.as_deref(),
        Some("previous_response_id")
    );
    let streamed = ApiError::internal("boom").to_payload();
    assert_eq!(
        serde_json::to_value(&streamed).unwrap(),
        json!({"type": "server_error", "code": "server_error", "message": "boom", "param": null})
    );
    assert_eq!(
        ApiError::internal("boom").to_response_error().code,
        "server_error"
    );
}

#[test]
fn string_input_is_one_user_message_with_defaults() {
    let r = validate(
        json!({"model": "m", "input": "Say hi", "unknown_field": {"x": 1}}),
        &limits(),
    )
    .unwrap();
    assert_eq!(r.model.as_deref(), Some("m"));
    assert_eq!(r.input.len(), 1);
    let InputItem::Message(m) = &r.input[0] else {
        panic!()
    };
    assert_eq!(m.role, Role::User);
    assert_eq!(m.content, MessageContent::Text("Say hi".into()));
    assert!(r.store && !r.stream && !r.background && r.parallel_tool_calls);
    assert_eq!(r.truncation, Truncation::Disabled);
    assert_eq!(r.tool_choice, ToolChoice::Mode(ToolChoiceMode::Auto));
    assert_eq!(r.text.format, TextFormat::Text);
    assert_eq!(r.service_tier, ServiceTier::Auto);
    assert!(r.metadata.is_empty() && r.tools.is_empty() && r.include.is_empty());
    assert_eq!(r.reasoning, None);
    assert_eq!(r.max_output_tokens, None);
}

#[test]
fn nulls_count_as_absent() {
    let r = validate(
        json!({"model": null, "input": "x", "temperature": null, "tools": null, "tool_choice": null,
               "text": null, "metadata": null, "store": null, "instructions": null}),
        &limits(),
    )
    .unwrap();
    assert_eq!(r.model, None);
    assert!(r.store);
    assert_eq!(r.sampling.temperature, None);
}

#[test]
fn every_item_kind_parses() {
    let r = validate(
        json!({"input": [
            {"role": "system", "content": "Be brief."},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"type": "message", "role": "user", "id": "msg_1", "status": "received", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                {"type": "input_file", "filename": "a.txt", "file_data": "QQ=="}
            ]},
            {"role": "assistant", "phase": "commentary", "content": [
                {"type": "output_text", "text": "Let me check.", "annotations": []},
                {"type": "refusal", "refusal": "no"}
            ]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}], "content": null},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\":\"SF\"}", "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]},
            {"type": "item_reference", "id": "msg_0"},
            {"id": "msg_00"},
            {"type": "compaction", "encrypted_content": "opaque"}
        ]}),
        &RequestLimits::default(),
    )
    .unwrap();
    let kinds: Vec<&str> = r
        .input
        .iter()
        .map(|i| match i {
            InputItem::Message(_) => "message",
            InputItem::FunctionCall(_) => "function_call",
            InputItem::FunctionCallOutput(_) => "function_call_output",
            InputItem::Reasoning(_) => "reasoning",
            InputItem::Compaction(_) => "compaction",
            InputItem::ItemReference(_) => "item_reference",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "message",
            "message",
            "message",
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "item_reference",
            "item_reference",
            "compaction"
        ]
    );
    let InputItem::Message(user) = &r.input[2] else {
        panic!()
    };
    let MessageContent::Parts(parts) = &user.content else {
        panic!()
    };
    assert!(matches!(parts[1], InputContent::InputImage { .. }));
    let InputItem::FunctionCallOutput(out) = &r.input[6] else {
        panic!()
    };
    assert!(matches!(out.output, FunctionOutput::Parts(_)));
}

#[test]
fn every_field_is_read() {
    let r = validate(
        json!({
            "model": "m", "input": "x", "instructions": "Be nice.", "previous_response_id": "resp_1",
            "stream": true, "stream_options": {"include_obfuscation": false}, "store": true, "background": true,
            "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
            "repetition_penalty": 1.1, "presence_penalty": 0.1, "frequency_penalty": -0.1, "seed": 7,
            "top_logprobs": 3,
            "tools": [{"type": "function", "name": "get_weather", "description": "d", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_weather"}]},
            "parallel_tool_calls": false, "max_tool_calls": 2, "truncation": "auto",
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
            "reasoning": {"effort": "high", "summary": "auto"},
            "include": ["message.output_text.logprobs"], "metadata": {"k": "v"},
            "safety_identifier": "u1", "user": "legacy", "prompt_cache_key": "pck", "service_tier": "flex"
        }),
        &limits(),
    )
    .unwrap();
    assert!(r.stream && r.background && !r.parallel_tool_calls);
    assert_eq!(r.stream_options.unwrap().include_obfuscation, Some(false));
    assert_eq!(r.max_output_tokens, Some(64));
    assert_eq!(r.sampling.temperature, Some(0.5));
    assert_eq!(r.sampling.top_k, Some(40));
    assert_eq!(r.sampling.seed, Some(7));
    assert_eq!(r.sampling.top_logprobs, Some(3));
    assert_eq!(
        r.tools,
        vec![FunctionTool {
            name: "get_weather".into(),
            description: Some("d".into()),
            parameters: Some(json!({"type": "object"})),
            strict: Some(true)
        }]
    );
    let ToolChoice::Specific(SpecificToolChoice::AllowedTools { tools, mode }) = &r.tool_choice
    else {
        panic!()
    };
    assert_eq!((tools.len(), *mode), (1, ToolChoiceMode::Auto));
    assert_eq!(r.max_tool_calls, Some(2));
    assert_eq!(r.truncation, Truncation::Auto);
    let TextFormat::JsonSchema {
        name,
        schema,
        strict,
        ..
    } = &r.text.format
    else {
        panic!()
    };
    assert_eq!(
        (name.as_str(), schema.is_some(), *strict),
        ("w", true, true)
    );
    assert!(r.includes(Include::MessageOutputTextLogprobs));
    assert_eq!(r.metadata["k"], "v");
    assert_eq!(r.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(r.prompt_cache_key.as_deref(), Some("pck"));
    assert_eq!(r.service_tier, ServiceTier::Flex);
    assert_eq!(r.user.as_deref(), Some("legacy"));
}
