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
use serde_json::json;
use spindle_engine::grammar::GrammarCompiler;
use spindle_engine::load::load_model;

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
        ("tools5_required_call", json!({"tools": spindle_benches::five_tools(), "tool_choice": "required"}),
         "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {\"to\": \"alice@example.com\", \"subject\": \"Meeting moved\", \"body\": \"Hi Alice, the meeting moved to Friday at 10am. See you there.\"}}\n</tool_call>"),
        ("tools5_auto_text", json!({"tools": spindle_benches::five_tools(), "tool_choice": "auto"}),
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
                || spindle_benches::request_constraint(&compiler, &extra).expect("constrained"),
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
