//! Constrained decoding's cost per generated token on the SmolLM2 vocabulary
//! (49,152 tokens): compute the grammar's mask, apply it to the logits, and
//! advance past the token, walking a valid output token by token. Grammars:
//! five tools with `tool_choice: required` (a call with its arguments under
//! the tool's schema), five tools with `auto` (free text, the common case),
//! and a `text.format` json_schema. Reported per token (criterion's
//! elements/s).
//!
//! `cargo bench -p spindle-benches --bench grammar`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};
use spindle_engine::grammar::{GrammarCompiler, SharedConstraint};
use spindle_engine::load::load_model;
use spindle_server::app::constrain::{constraint_for, CallFormat};
use spindle_server::protocol::{validate, RequestLimits};

/// Five tools as an agent would declare them.
pub fn five_tools() -> Value {
    let object = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    json!([
        {"type": "function", "name": "get_weather", "parameters": object(json!({"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}), json!(["city"]))},
        {"type": "function", "name": "search_web", "parameters": object(json!({"query": {"type": "string"}, "max_results": {"type": "integer"}}), json!(["query"]))},
        {"type": "function", "name": "send_email", "parameters": object(json!({"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}}), json!(["to", "subject", "body"]))},
        {"type": "function", "name": "create_event", "parameters": object(json!({"title": {"type": "string"}, "date": {"type": "string"}, "attendees": {"type": "array", "items": {"type": "string"}}}), json!(["title", "date"]))},
        {"type": "function", "name": "convert_currency", "parameters": object(json!({"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}}), json!(["amount", "from", "to"]))},
    ])
}

fn constraint(compiler: &GrammarCompiler, extra: Value) -> SharedConstraint {
    let mut body = json!({"input": "x"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let req = validate(body, &RequestLimits::default()).expect("valid request");
    constraint_for(Some(compiler), CallFormat::Hermes, &req).expect("compiles").expect("constrained")
}

fn bench(c: &mut Criterion) {
    let Some(path) = spindle_benches::smollm2_path() else {
        eprintln!("skipped: SmolLM2 not installed (run scripts/fetch-model.sh or set SPINDLE_MODEL_GGUF)");
        return;
    };
    let m = load_model(&path.to_string_lossy(), &mut |_, _| {}).expect("model");
    let vocab = m.model.config().vocab_size;
    let compiler = GrammarCompiler::new(&m.tokenizer, vocab).expect("grammar compiler");
    let schema = json!({"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}}, "required": ["person", "tags"], "additionalProperties": false});
    let cases = [
        ("tools5_required_call", json!({"tools": five_tools(), "tool_choice": "required"}),
         "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {\"to\": \"alice@example.com\", \"subject\": \"Meeting moved\", \"body\": \"Hi Alice, the meeting moved to Friday at 10am. See you there.\"}}\n</tool_call>"),
        ("tools5_auto_text", json!({"tools": five_tools(), "tool_choice": "auto"}),
         "The weather in Lisbon is usually mild in spring, with sunny days and cool evenings. Bring a light jacket."),
        ("json_schema_nested", json!({"text": {"format": {"type": "json_schema", "name": "p", "schema": schema, "strict": true}}}),
         "{\"person\": {\"name\": \"Ada Lovelace\", \"age\": 36}, \"tags\": [\"a\", \"c\", \"b\"]}"),
    ];
    let mut group = c.benchmark_group("grammar_mask_per_token");
    for (name, extra, output) in cases {
        let tokens = m.tokenizer.encode(output, false).expect("encode");
        group.throughput(Throughput::Elements(tokens.len() as u64));
        let mut logits = vec![0.5f32; vocab];
        group.bench_function(name, |b| {
            b.iter_batched(
                || constraint(&compiler, extra.clone()),
                |shared| {
                    let mut c = shared.lock().expect("lock");
                    for &t in &tokens {
                        logits.fill(0.5); // fresh logits, as each step brings
                        c.mask_logits(&mut logits);
                        assert!(logits[t as usize].is_finite(), "{name}: token {t} refused");
                        c.accept(t).expect("accept");
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
