//! Unit tests for the HF-compatible template environment (no model needed).
#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn render(src: &str, messages: &[serde_json::Value]) -> Result<String> {
    ChatTemplate::new(src, "<s>", "</s>")?.render(messages, None, false)
}

#[test]
fn chatml_default_matches_documented_format() {
    let t = ChatTemplate::chatml_default();
    let msgs = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi"}),
    ];
    let out = t.render(&msgs, None, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = t.render(&msgs[1..], None, false).unwrap();
    assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn raise_exception_becomes_template_error_with_message() {
    let src = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tool role not supported: ' ~ m.role) }}{% endif %}{{ m.content }}{% endfor %}";
    let err = render(src, &[json!({"role": "tool", "content": "x"})]).unwrap_err();
    match err {
        EngineError::Template(msg) => assert_eq!(msg, "Tool role not supported: tool"),
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        render(src, &[json!({"role": "user", "content": "ok"})]).unwrap(),
        "ok"
    );
}

#[test]
fn strftime_now_formats_local_time() {
    let out = render(
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %B %Y') }}",
        &[],
    )
    .unwrap();
    let today = chrono::Local::now();
    let (a, b) = out.split_once('|').unwrap();
    // Allow a midnight rollover between the two clocks.
    let yesterday = today - chrono::Duration::days(1);
    assert!(
        [today, yesterday]
            .iter()
            .any(|d| a == d.format("%Y-%m-%d").to_string()),
        "{a}"
    );
    assert!(
        b.ends_with(&today.format("%Y").to_string())
            || b.ends_with(&yesterday.format("%Y").to_string())
    );
    assert!(render("{{ strftime_now('%Q') }}", &[]).is_err());
}

#[test]
fn loop_controls_work() {
    let src = "{% for m in messages %}{% if m.skip %}{% continue %}{% endif %}{% if m.stop %}{% break %}{% endif %}{{ m.content }};{% endfor %}";
    let msgs = [
        json!({"content": "a"}),
        json!({"content": "b", "skip": true}),
        json!({"content": "c"}),
        json!({"content": "d", "stop": true}),
        json!({"content": "e"}),
    ];
    assert_eq!(render(src, &msgs).unwrap(), "a;c;");
}

#[test]
fn tools_variable_is_none_when_absent_and_list_when_given() {
    let src = "{% if tools is none %}none{% else %}{% for t in tools %}[{{ t.function.name }}:{{ t | tojson }}]{% endfor %}{% endif %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(t.render(&[], None, false).unwrap(), "none");
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"city": "<Paris>"}}}),
    ];
    let out = t.render(&[], Some(&tools), false).unwrap();
    assert_eq!(
        out,
        r#"[get_weather:{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "<Paris>"}}}]"#
    );
}

#[test]
fn trim_and_lstrip_blocks_like_hf() {
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
    let out = render(src, &[json!({"role": "user", "content": "x"})]).unwrap();
    assert_eq!(out, "U:x\n");
}

#[test]
fn python_string_and_dict_methods() {
    let src = "{{ messages[0].content.strip() }}|{{ messages[0].content.startswith('  hi') }}|{% for k, v in messages[0].items() %}{{ k }}={{ v | length }},{% endfor %}|{{ messages[0].get('missing', 'd') }}";
    // Keys are written in sorted order so the result does not depend on
    // serde_json's `preserve_order` feature. Python prints `True`.
    let out = render(src, &[json!({"content": "  hi there  ", "role": "user"})]).unwrap();
    assert_eq!(out, "hi there|True|content=12,role=4,|d");
}

#[test]
fn variables_bos_eos_and_kwargs() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{{ messages | length }}{{ add_generation_prompt }}{{ enable_thinking }}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), json!(false));
    kwargs.insert("bos_token".into(), json!("ignored"));
    let out = t
        .render_with_kwargs(&[json!({"role": "user"})], None, true, &kwargs)
        .unwrap();
    assert_eq!(out, "<s>1TrueFalse</s>");
}

#[test]
fn tojson_matches_python_json_dumps() {
    let msgs =
        [json!({"b": [1, 2.5, 1e20, 0.0001, null, true], "a": "é\"\n<&>", "c": {}, "d": []})];
    let out = render("{{ messages[0] | tojson }}", &msgs).unwrap();
    assert_eq!(
        out,
        r#"{"b": [1, 2.5, 1e+20, 0.0001, null, true], "a": "é\"\n<&>", "c": {}, "d": []}"#
    );
    let out = render("{{ messages[0].b | tojson(indent=2) }}", &msgs).unwrap();
    assert_eq!(
        out,
        "[\n  1,\n  2.5,\n  1e+20,\n  0.0001,\n  null,\n  true\n]"
    );
    let out = render("{{ messages[0].a | tojson(ensure_ascii=true) }}", &msgs).unwrap();
    assert_eq!(out, r#""\u00e9\"\n<&>""#);
    let out = render(
        "{{ {'z': 1, 'y': [1]} | tojson(separators=(',', ':'), sort_keys=true) }}",
        &[],
    )
    .unwrap();
    assert_eq!(out, r#"{"y":[1],"z":1}"#);
}

#[test]
fn python_float_repr() {
    assert_eq!(pyjson::py_float(1.0), "1.0");
    assert_eq!(pyjson::py_float(-0.0), "-0.0");
    assert_eq!(pyjson::py_float(1.5e-5), "1.5e-05");
    assert_eq!(pyjson::py_float(1e16), "1e+16");
    assert_eq!(pyjson::py_float(123456.789), "123456.789");
    assert_eq!(pyjson::py_float(0.1), "0.1");
}

#[test]
fn generation_tags_are_accepted() {
    let src =
        "{% for m in messages %}{%- generation -%}{{ m.content }}{%- endgeneration -%}{% endfor %}";
    assert_eq!(render(src, &[json!({"content": "x"})]).unwrap(), "x");
}

#[test]
fn syntax_errors_are_template_errors() {
    let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
    assert!(matches!(err, EngineError::Template(_)));
}

#[test]
fn namespace_and_slicing_work() {
    let src = "{% set ns = namespace(sys='') %}{% if messages[0].role == 'system' %}{% set ns.sys = messages[0].content %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}[{{ ns.sys }}]{% for m in rest %}{{ m.content }}{% if not loop.last %},{% endif %}{% endfor %}";
    let msgs = [
        json!({"role": "system", "content": "S"}),
        json!({"role": "user", "content": "a"}),
        json!({"role": "assistant", "content": "b"}),
    ];
    assert_eq!(render(src, &msgs).unwrap(), "[S]a,b");
}

#[test]
fn reasoning_fields_are_aliased_like_transformers() {
    let src = "{% for m in messages %}{{ m.reasoning_content }}|{{ m.thinking }}|{{ m.content }};{% endfor %}";
    let msgs = [
        json!({"role": "assistant", "reasoning": "r1", "content": "a"}),
        json!({"role": "assistant", "reasoning_content": "r2", "thinking": "own", "content": "b"}),
        json!({"role": "user", "content": "c"}),
    ];
    assert_eq!(render(src, &msgs).unwrap(), "r1|r1|a;r2|own|b;||c;");
}

#[test]
fn tool_calls_template_like_hf() {
    let src = "{% for m in messages %}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<call>{{ c.function | tojson }}</call>{% endfor %}{% elif m.role == 'tool' %}<resp>{{ m.content }}</resp>{% else %}{{ m.content }}{% endif %}{% endfor %}";
    let msgs = [
        json!({"role": "user", "content": "weather?"}),
        json!({"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": {"city": "Paris"}, "name": "get_weather"}}]}),
        json!({"role": "tool", "content": "sunny"}),
    ];
    assert_eq!(
        render(src, &msgs).unwrap(),
        r#"weather?<call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</call><resp>sunny</resp>"#
    );
}

#[test]
fn the_gemma_turn_default_renders_bos_turns_and_the_model_prompt() {
    let t = ChatTemplate::new(GEMMA_TURN_TEMPLATE, "<bos>", "<eos>").unwrap();
    let messages = [json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": " Hi "}), json!({"role": "assistant", "content": "Hello."})];
    let text = t.render(&messages, None, true).unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>model\n"
    );
}
