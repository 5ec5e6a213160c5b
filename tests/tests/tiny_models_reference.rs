//! Tiny random HF models, loaded through the whole HF path (`load_model`:
//! config.json, safetensors, tokenizer.json, tokenizer_config.json,
//! generation_config.json), match an independent float64 numpy forward
//! (`tools/reference/numpy_forward.py`) at every position.
//!
//! Four models cover the HF code paths: Llama f32 (untied lm_head, GQA 2:1),
//! Llama bf16 (tied embeddings, GQA 4:1), Qwen3 bf16 (per-head q/k
//! RMSNorm, head_dim 32 ≠ hidden/heads = 16) and Gemma 3 bf16 (the (1 + w)
//! norms before and after attention and MLP, q/k norms, GELU-tanh MLP,
//! scaled embeddings, `query_pre_attn_scalar` 24 ≠ head_dim 16, and a
//! 6-position sliding window on layer 0 with its own RoPE base, from
//! `layer_types`; the prompts of 17–40 tokens and the 12 greedy tokens to EOS run past it). Each test regenerates its model
//! in a tempdir with `write_tiny_model` from the seed in the fixture, checks
//! the safetensors sha256 and config.json equal those recorded (so a change to
//! the generator is reported as such, not as a numeric failure), then checks:
//!
//! * the last position's full logit row (all 320) against the reference;
//! * at every position, our logits for the reference's top 5 ids, and our
//!   argmax equal to the reference's (at positions whose top-2 gap exceeds the
//!   tolerance);
//! * 32 greedy tokens equal the reference's, up to its first near-tie.
//!
//! Tolerance 2e-5 absolute on logits of size ≤ ~4 (bf16 weights are exact in
//! f32; the fixture rounds logits to 7 significant digits). Seen: ≤ 1.2e-6.
//!
//! Regenerate the fixtures (after an intended generator change) with the
//! reference venv described in tools/reference/README.md:
//!
//! ```sh
//! P1=277,117,115,101,114,10,270,275,278,10,277,97,115,115,105,115,116,97,110,116,10
//! P2=318,130,183,271,14,238,127,26,80,57,190,240,126,194,278,52,293,127,6,110,208,143,93,199,81,36,71,316,316,227,64,67,0,2,107,110,84,85,148,160
//! P3=293,41,248,133,18,0,74,240,191,163,11,139,250,101,211,275,276
//! T="cargo run -q -p spindle-tools --bin make-tiny-model --"
//! $T --arch llama --seed 1 --out /tmp/tinyref/tiny_llama
//! $T --arch llama --seed 2 --dtype bf16 --tie-embeddings --kv-heads 1 --out /tmp/tinyref/tiny_llama_bf16
//! $T --arch qwen3 --seed 3 --dtype bf16 --head-dim 32 --out /tmp/tinyref/tiny_qwen3
//! $T --arch gemma3 --seed 4 --dtype bf16 --out /tmp/tinyref/tiny_gemma3
//! for m in tiny_llama tiny_llama_bf16 tiny_qwen3 tiny_gemma3; do
//!   /tmp/refvenv-fwd/bin/python tools/reference/make_model_reference.py --hf-dir /tmp/tinyref/$m \
//!     --out tests/fixtures/${m}_ref.json --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3
//! done
//! ```
//!
//! The options in [`case_options`] must stay equal to those command lines.

use serde_json::Value;
use spindle_engine::generate::{generate, GenerateRequest};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::load::load_model;
use spindle_engine::sampling::SamplingParams;
use spindle_tests::{argmax, fixture_path, prompt_logits, runner_for, sha256_file};
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyDtype, TinyModelOptions};

/// Max |logit − reference|.
const TOLERANCE: f32 = 2e-5;

/// The make-tiny-model options behind each fixture (see the module docs).
fn case_options(fixture: &str) -> TinyModelOptions {
    match fixture {
        "tiny_llama_ref.json" => {
            let mut o = TinyModelOptions::new(TinyArch::Llama);
            o.seed = 1;
            o
        }
        "tiny_llama_bf16_ref.json" => {
            let mut o = TinyModelOptions::new(TinyArch::Llama);
            o.seed = 2;
            o.dtype = TinyDtype::Bf16;
            o.tie_word_embeddings = true;
            o.kv_heads = 1;
            o
        }
        "tiny_qwen3_ref.json" => {
            let mut o = TinyModelOptions::new(TinyArch::Qwen3);
            o.seed = 3;
            o.dtype = TinyDtype::Bf16;
            o.head_dim = Some(32);
            o
        }
        "tiny_gemma3_ref.json" => {
            let mut o = TinyModelOptions::new(TinyArch::Gemma3);
            o.seed = 4;
            o.dtype = TinyDtype::Bf16;
            o
        }
        other => panic!("no options for fixture {other}"),
    }
}

fn f(v: &Value) -> f32 {
    v.as_f64().expect("number") as f32
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn check(fixture_name: &str) {
    let path = fixture_path(fixture_name);
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read fixture")).expect("fixture JSON");
    let opts = case_options(fixture_name);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    write_tiny_model(&opts, &dir).expect("write tiny model");

    let regen = "the tiny-model generator changed; if that was intended, regenerate the fixtures \
                 with the commands at the top of tests/tests/tiny_models_reference.rs";
    let sha = sha256_file(&dir.join("model.safetensors")).expect("sha256");
    assert_eq!(
        Some(sha.as_str()),
        fx["model_sha256"].as_str(),
        "{fixture_name}: model.safetensors sha256 differs from the fixture's: {regen}"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config")).expect("json");
    assert_eq!(config, fx["hf_config"], "{fixture_name}: config.json differs from the fixture's: {regen}");

    let loaded = load_model(dir.to_str().expect("utf-8"), &mut |_, _| {}).expect("load_model");
    assert_eq!(loaded.tokenizer.encode("hello world", false).expect("encode"), vec![270, 275]);
    let vocab = loaded.model.config().vocab_size;
    assert_eq!(vocab as u64, fx["model"]["vocab_size"].as_u64().expect("vocab"));
    let mut runner = runner_for(loaded.model, 128);

    let mut worst = 0f32;
    for p in fx["prompts"].as_array().expect("prompts") {
        let name = p["name"].as_str().unwrap_or("?");
        let prompt = ids(&p["ids"]);
        let logits = prompt_logits(&mut runner, &prompt).expect("forward");
        let last = &logits[(prompt.len() - 1) * vocab..];
        let full = p["logits_full"].as_array().expect("logits_full");
        assert_eq!(full.len(), vocab);
        for (id, r) in full.iter().enumerate() {
            let d = (last[id] - f(r)).abs();
            worst = worst.max(d);
            assert!(d <= TOLERANCE, "{fixture_name} {name}: last-position logit {id}: {} vs {}", last[id], f(r));
        }
        let top5 = p["top5_per_position"].as_array().expect("top5 ids");
        let top5_logits = p["top5_logits_per_position"].as_array().expect("top5 logits");
        assert_eq!(top5.len(), prompt.len());
        for (pos, (tids, tl)) in top5.iter().zip(top5_logits).enumerate() {
            let row = &logits[pos * vocab..(pos + 1) * vocab];
            let (tids, tl) = (ids(tids), tl.as_array().expect("logits"));
            for (&id, r) in tids.iter().zip(tl) {
                let d = (row[id as usize] - f(r)).abs();
                worst = worst.max(d);
                assert!(d <= TOLERANCE, "{fixture_name} {name} position {pos} id {id}: {} vs {}", row[id as usize], f(r));
            }
            if f(&tl[0]) - f(&tl[1]) > 2.0 * TOLERANCE {
                assert_eq!(argmax(row) as u32, tids[0], "{fixture_name} {name}: argmax at position {pos}");
            }
        }
    }

    let g = &fx["greedy"];
    let expected = ids(&g["tokens"]);
    let gaps: Vec<f32> = g["top1_top2_gap"].as_array().expect("gaps").iter().map(f).collect();
    let clear = gaps.iter().position(|&x| x < 2.0 * TOLERANCE).unwrap_or(gaps.len());
    let req = GenerateRequest {
        prompt: ids(&g["prompt_ids"]),
        max_tokens: g["max_new_tokens"].as_u64().expect("max_new_tokens") as usize,
        sampling: SamplingParams::default(),
        stop_tokens: g["eos_id"].as_u64().map(|e| vec![e as u32]).unwrap_or_default(),
        prefill_chunk: 16,
    };
    let mut alloc = BlockAllocator::new(runner.kv_geometry().num_blocks);
    let mut got = Vec::new();
    generate(&mut runner, &mut alloc, &req, &mut |t| {
        got.push(t.token);
        true
    })
    .expect("generate");
    // The reference's list includes the EOS token when it stopped; ours does not emit it.
    let n = clear.min(expected.len());
    let ours: Vec<u32> = got.iter().copied().chain(req.stop_tokens.first().copied()).take(n).collect();
    assert_eq!(ours, expected[..n], "{fixture_name}: greedy tokens (first {n}, before any near-tie)");
    println!("{fixture_name}: max |logit - reference| = {worst:.3e}; greedy matched {n}/{} tokens", expected.len());
}

#[test]
fn tiny_llama_f32_matches_the_numpy_reference() {
    check("tiny_llama_ref.json");
}

#[test]
fn tiny_llama_bf16_tied_matches_the_numpy_reference() {
    check("tiny_llama_bf16_ref.json");
}

#[test]
fn tiny_qwen3_bf16_matches_the_numpy_reference() {
    check("tiny_qwen3_ref.json");
}

#[test]
fn tiny_gemma3_bf16_matches_the_numpy_reference() {
    check("tiny_gemma3_ref.json");
}
