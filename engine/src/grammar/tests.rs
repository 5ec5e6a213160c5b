//! Grammar compilation and masking on the toy byte-level vocabulary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::tokenizer::tests::toy;
use serde_json::json;

fn compiler() -> (GrammarCompiler, Tokenizer) {
    let tok = toy("smollm");
    (GrammarCompiler::new(&tok, tok.vocab_size() + 5).unwrap(), tok)
}

/// Feeds `text` token by token: `true` when every token was allowed.
fn follows(c: &mut Constraint, tok: &Tokenizer, text: &str) -> bool {
    for id in tok.encode(text, false).unwrap() {
        if !c.allowed().is_allowed(id) {
            return false;
        }
        c.accept(id).unwrap();
    }
    true
}

#[test]
fn a_json_schema_allows_only_valid_documents_then_eos() {
    let (g, tok) = compiler();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "e": {"enum": ["a", "b"]}},
                        "required": ["n", "e"], "additionalProperties": false,
                        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}});
    let mut c = g.compile_json_schema(schema.clone()).unwrap();
    assert!(follows(&mut c, &tok, "{\"n\": 12, \"e\": \"b\"}"));
    assert!(c.is_accepting());
    let mask = c.allowed();
    // Nothing but EOS (or nothing at all, once the matcher has stopped).
    assert!(mask.num_set() <= 1, "only EOS after the document");
    assert!(mask.num_set() == 0 || mask.is_allowed(2));

    let mut wrong = g.compile_json_schema(schema.clone()).unwrap();
    assert!(!follows(&mut wrong, &tok, "{\"n\": 12, \"e\": \"c\"}"), "an enum value outside the schema");
    let mut extra = g.compile_json_schema(schema).unwrap();
    assert!(!follows(&mut extra, &tok, "{\"x\""), "an undeclared key");
}

#[test]
fn masked_logits_are_neg_infinity_outside_the_grammar_and_untouched_inside() {
    let (g, tok) = compiler();
    let mut c = g.compile_lark("start: \"hello\" | \"world\"").unwrap();
    let mut logits = vec![1.0f32; tok.vocab_size() + 5];
    c.mask_logits(&mut logits);
    let allowed: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
    assert!(!allowed.is_empty());
    for &i in &allowed {
        assert_eq!(logits[i], 1.0);
        let text = tok.decode(&[i as u32], false).unwrap();
        assert!("hello".starts_with(&text) || "world".starts_with(&text), "token {i} = {text:?}");
    }
    assert!(logits[tok.vocab_size()..].iter().all(|l| *l == f32::NEG_INFINITY), "padding ids are never allowed");
}

#[test]
fn unsupported_schema_keywords_and_bad_grammars_are_errors_naming_them() {
    let (g, _) = compiler();
    let err = g.compile_json_schema(json!({"type": "object", "patternPropertiesX": {}, "if": {"type": "object"}})).unwrap_err();
    assert!(err.to_string().contains("if"), "{err}");
    assert!(g.compile_lark("start: undefined_rule").is_err());
}

#[test]
fn a_finished_grammar_allows_nothing_and_a_dead_end_only_eos() {
    let (g, tok) = compiler();
    let mut c = g.compile_lark("start: \"ab\"").unwrap();
    assert!(follows(&mut c, &tok, "ab"));
    assert_eq!(c.allowed().num_set(), 0, "finished: the sequence ends here, without sampling");
    c.accept(2).unwrap();
    c.accept(5).unwrap(); // ignored after the grammar finished
    let mut dead = g.compile_lark("start: \"ab\"").unwrap();
    let bad = tok.encode("x", false).unwrap()[0];
    assert!(dead.accept(bad).is_err());
    let mask = dead.allowed();
    assert!(mask.is_allowed(2) && mask.num_set() == 1, "a dead end allows only EOS, so the sequence ends instead of failing the batch");
}

#[test]
fn text_may_run_up_to_a_lazy_suffix_and_continue_under_the_grammar() {
    let (g, tok) = compiler();
    let lark = "start: TEXT | pre \"{}\"\nTEXT: /(.|\\n)*/ & ~/(.|\\n)*<tool_call>(.|\\n)*/\npre[suffix=\"<tool_call>\"]: /(.|\\n)*/";
    for (text, ok) in [("hello world", true), ("hi <tool_call>{}", true), ("<tool_call>{}", true), ("a<b>c", true), ("hi <tool_call>x", false)] {
        let mut c = g.compile_lark(lark).unwrap();
        assert_eq!(follows(&mut c, &tok, text), ok, "{text:?}");
    }
}

#[test]
fn a_thinking_gate_leaves_the_reasoning_free_and_constrains_the_answer() {
    let (g, tok) = compiler();
    let think = tok.token_to_id("<think>").unwrap();
    let close = 7u32; // any token id stands in for `</think>` here
    let mut c = g.compile_lark("start: \"ab\"").unwrap().after_thinking(think, close, false);
    let mut logits = vec![0.0f32; tok.vocab_size() + 5];
    c.mask_logits(&mut logits);
    assert!(logits[think as usize].is_finite(), "the first token may open the reasoning");
    c.accept(think).unwrap();
    let mut free = vec![0.0f32; tok.vocab_size() + 5];
    c.mask_logits(&mut free);
    let masked: Vec<usize> = (0..free.len()).filter(|&i| !free[i].is_finite()).collect();
    assert_eq!(masked, vec![2], "while thinking only EOS is masked (the answer must still come)");
    c.accept(100).unwrap();
    c.accept(close).unwrap();
    assert!(follows(&mut c, &tok, "ab"));
    assert!(c.is_accepting());

    let mut direct = g.compile_lark("start: \"ab\"").unwrap().after_thinking(think, close, false);
    assert!(follows(&mut direct, &tok, "ab"), "without reasoning the grammar applies from the first token");
    let mut inside = g.compile_lark("start: \"ab\"").unwrap().after_thinking(think, close, true);
    inside.accept(100).unwrap();
    inside.accept(close).unwrap();
    assert!(follows(&mut inside, &tok, "ab"));
}

#[test]
fn a_dead_end_without_eos_allows_nothing_so_the_sequence_ends() {
    let (mut g, tok) = compiler();
    g.eos.clear();
    let mut c = g.compile_lark("start: \"hello\"").unwrap();
    let bad = tok.encode("x", false).unwrap()[0];
    assert!(c.accept(bad).is_err(), "x is outside the grammar");
    let mut logits = vec![0.0f32; tok.vocab_size() + 5];
    assert!(!c.mask_logits(&mut logits), "no token may follow a dead end when there is no EOS");
    assert!(logits.iter().all(|l| *l == f32::NEG_INFINITY));
    let mut fresh = g.compile_lark("start: \"hello\"").unwrap();
    assert!(fresh.mask_logits(&mut vec![0.0f32; tok.vocab_size() + 5]));
}

#[test]
fn the_guessed_eos_of_a_tokenizer_without_one_is_never_allowed() {
    let (mut g, tok) = compiler();
    g.eos.clear();
    let mut c = g.compile_lark("start: \"hello\"").unwrap();
    assert!(follows(&mut c, &tok, "hello"));
    let mut logits = vec![0.0f32; tok.vocab_size() + 5];
    assert!(!c.mask_logits(&mut logits), "a finished grammar without EOS allows nothing: the sequence ends");
}

#[test]
fn cached_grammars_give_independent_constraints() {
    let (g, tok) = compiler();
    let grammar = "start: \"ab\" | \"cd\"";
    let mut first = g.compile_lark(grammar).unwrap();
    assert!(follows(&mut first, &tok, "ab"));
    assert!(first.is_accepting());
    let mut second = g.compile_lark(grammar).unwrap();
    assert!(!second.is_accepting(), "a cached grammar starts fresh");
    assert!(follows(&mut second, &tok, "cd"));
    for i in 0..(CACHE_CAPACITY + 2) {
        g.compile_lark(&format!("start: \"x{i}\"")).unwrap();
    }
    assert!(g.cache.lock().unwrap().matchers.len() <= CACHE_CAPACITY);
    assert!(follows(&mut g.compile_lark(grammar).unwrap(), &tok, "ab"), "an evicted grammar compiles again");
}

/// `mask_words` (what the GPU sampler applies) forbids exactly what
/// `mask_logits` sets to -inf, at every step: before, inside and after a
/// reasoning gate, through a JSON document and once it is finished.
#[test]
fn mask_words_match_the_masked_logits_at_every_step() {
    let (g, tok) = compiler();
    let vocab = tok.vocab_size() + 5;
    let think = tok.token_to_id("<think>").unwrap();
    let close = 7u32;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false,
                        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}});
    let mut c = g.compile_json_schema(schema).unwrap().after_thinking(think, close, false);
    let mut script = vec![think, 100, close];
    script.extend(tok.encode("{\"n\": 42}", false).unwrap());
    // Step 0 is before the gate (the grammar or the opening token), 1 and 2
    // inside the reasoning, 3 on under the grammar alone.
    let check = |c: &mut Constraint, step: usize| {
        let mut logits = vec![0.5f32; vocab];
        let any = c.mask_logits(&mut logits);
        let Some(words) = c.mask_words(vocab) else {
            // Finished: nothing allowed, and the logits say so too.
            assert!(!any && c.allowed().num_set() == 0 && logits.iter().all(|l| *l == f32::NEG_INFINITY), "step {step}");
            return;
        };
        assert!(any, "step {step}");
        // Independently of mask_words: what the matcher allows, plus the
        // gate's opening token before it, or everything but EOS inside it.
        let allowed = c.allowed();
        for (t, l) in logits.iter().enumerate() {
            let bit = words[t / 32] >> (t % 32) & 1 == 1;
            assert_eq!(bit, l.is_finite(), "step {step}: token {t}: words vs masked logits");
            let expected = match step {
                0 => allowed.is_allowed(t as u32) || t as u32 == think,
                1 | 2 => t != 2,
                _ => allowed.is_allowed(t as u32),
            };
            assert_eq!(bit, expected, "step {step}: token {t}: words vs the matcher");
        }
    };
    for (step, &id) in script.iter().enumerate() {
        check(&mut c, step);
        c.accept(id).unwrap();
    }
    check(&mut c, script.len());
    assert!(c.is_accepting());
}
