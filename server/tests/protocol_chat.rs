//! Input items → chat-template messages, for every item kind.
#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::{json, Value};
use spindle_server::protocol::{to_chat_messages, validate, InputItem, RequestLimits};

/// The template messages as JSON (what the template sees).
fn chat(instructions: Option<&str>, items: &[InputItem]) -> Result<Vec<Value>, spindle_server::protocol::error::ApiError> {
    let messages = to_chat_messages(instructions, items)?;
    Ok(messages.iter().map(|m| serde_json::to_value(m).unwrap()).collect())
}

fn items(input: Value) -> Vec<InputItem> {
    validate(json!({"input": input}), &RequestLimits::default())
        .unwrap()
        .input
}

#[test]
fn instructions_and_messages_of_every_role() {
    let input = items(json!([
        {"role": "system", "content": "S"},
        {"role": "developer", "content": [{"type": "input_text", "text": "D1"}, {"type": "input_text", "text": "D2"}]},
        {"role": "user", "content": "U"},
        {"role": "assistant", "phase": "final_answer", "content": [{"type": "output_text", "text": "A", "annotations": []}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "R"}]}
    ]));
    let msgs = chat(Some("Be brief."), &input).unwrap();
    assert_eq!(
        msgs,
        vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "system", "content": "S"}),
            json!({"role": "system", "content": "D1\nD2"}),
            json!({"role": "user", "content": "U"}),
            json!({"role": "assistant", "content": "A"}),
            json!({"role": "assistant", "content": "R"}),
        ]
    );
    assert_eq!(
        chat(Some(""), &items(json!("hi"))).unwrap(),
        vec![json!({"role": "user", "content": "hi"})]
    );
}

#[test]
fn function_calls_and_outputs() {
    let input = items(json!([
        {"role": "user", "content": "Weather in SF and LA?"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need tools"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\":\"SF\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rainy"}]},
        {"role": "assistant", "content": "SF sunny, LA rainy."},
        {"type": "function_call", "call_id": "call_3", "name": "log", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_unknown", "output": "ok"}
    ]));
    let msgs = chat(None, &input).unwrap();
    assert_eq!(
        msgs,
        vec![
            json!({"role": "user", "content": "Weather in SF and LA?"}),
            json!({"role": "assistant", "content": "", "reasoning_content": "need tools", "tool_calls": [
                {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"location": "SF"}}},
                {"type": "function", "id": "call_2", "function": {"name": "get_weather", "arguments": "not json"}}
            ]}),
            json!({"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}),
            json!({"role": "tool", "content": "rainy", "tool_call_id": "call_2", "name": "get_weather"}),
            json!({"role": "assistant", "content": "SF sunny, LA rainy.", "tool_calls": [
                {"type": "function", "id": "call_3", "function": {"name": "log", "arguments": {}}}
            ]}),
            json!({"role": "tool", "content": "ok", "tool_call_id": "call_unknown"}),
        ]
    );
}

#[test]
fn reasoning_goes_to_the_next_assistant_message_or_its_own() {
    let input = items(json!([
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "raw"}]},
        {"role": "assistant", "content": "answer"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "dangling"}]}
    ]));
    assert_eq!(
        chat(None, &input).unwrap(),
        vec![
            json!({"role": "assistant", "content": "answer", "reasoning_content": "raw"}),
            json!({"role": "assistant", "content": "", "reasoning_content": "dangling"}),
        ]
    );
}

#[test]
fn images_files_video_are_unsupported_with_param() {
    let cases = [
        (
            json!([{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]),
            "input[0].content[1]",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_file", "file_data": "QQ=="}]}]),
            "input[1].content[0]",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_video", "video_url": "https://v"}]}]),
            "input[0].output[0]",
        ),
    ];
    for (input, param) in cases {
        let e = chat(None, &items(input)).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code.as_deref(), Some("unsupported_capability"));
        assert_eq!(e.param.as_deref(), Some(param));
        assert_eq!(e.to_body()["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn unresolved_references_and_compaction_are_errors() {
    let e = chat(
        None,
        &items(json!([{"type": "item_reference", "id": "msg_1"}])),
    )
    .unwrap_err();
    assert_eq!((e.status, e.param.as_deref()), (400, Some("input[0].id")));
    let e = chat(
        None,
        &items(json!([{"type": "compaction", "encrypted_content": "x"}])),
    )
    .unwrap_err();
    assert_eq!(
        (e.status, e.code.as_deref()),
        (400, Some("unsupported_capability"))
    );
}

#[test]
fn tools_render_for_templates() {
    let req = validate(
        json!({"input": "x", "tools": [
            {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}},
            {"type": "function", "name": "noop"}
        ]}),
        &RequestLimits::default(),
    )
    .unwrap();
    assert_eq!(
        req.tools[0].to_template_tool(),
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}})
    );
    assert_eq!(
        req.tools[1].to_template_tool(),
        json!({"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}})
    );
}
