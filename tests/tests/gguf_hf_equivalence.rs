//! The GGUF and HF load paths compute the same model: converting a model
//! from one format into the other and loading both gives the same logits.
//!
//! * Real SmolLM2-135M (`SPINDLE_MODEL_GGUF`, Q4_1/Q8_0): converted to an HF
//!   directory with every tensor dequantized to f32 and the q/k rows
//!   un-permuted (`spindle_tests::convert::gguf_to_hf_dir`). The GGUF runs with
//!   `MatmulPrecision::Exact` (dequantized weight rows, f32 activations), so
//!   both sides multiply by identical f32 weights; what differs is RoPE
//!   pairing (interleaved on the permuted GGUF rows, NeoX on the HF rows),
//!   the weight storage and every name/shape lookup. Logits must agree to
//!   1e-3 with the same argmax at every position.
//! * Tiny random HF models (Llama f32 untied; Llama bf16 tied with 4:1 GQA;
//!   Qwen3 bf16 with q/k norm): converted to F32 GGUFs with tokenizer
//!   metadata (`hf_to_gguf_file`), loaded with `load_model` both ways; logits
//!   agree to 1e-5 with the same argmax everywhere, and the chat prompt
//!   tokenizes identically. The HF → GGUF → HF round trip
//!   gives back the original tensors bit for bit.
//! * A negative control: a Llama GGUF written *without* the q/k permutation
//!   gives clearly different logits, so the check above would catch a
//!   converter or RoPE-style mistake.

use std::path::Path;

use spindle_engine::config::{ModelConfig, RopeStyle};
use spindle_engine::hf::HfModelDir;
use spindle_engine::load::{load_model, LoadedModel};
use spindle_engine::model::{LlamaModel, MatmulPrecision, WeightNaming};
use spindle_tests::convert::{gguf_to_hf_dir, hf_to_gguf, hf_to_gguf_file, read_safetensors_f32};
use spindle_tests::{compare_logits, prompt_logits, runner_for, smollm2_gguf, LogitsComparison};
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyDtype, TinyModelOptions};

/// Required agreement between the two load paths on SmolLM2 (logits up to
/// ~38 in size; seen: 2.5e-5 .. 1.4e-4).
const TOLERANCE: f32 = 1e-3;

/// Required agreement on the tiny models (logits up to ~5; seen: ≤ 1.1e-6,
/// exactly 0 for Qwen3 whose GGUF rows are not permuted).
const TINY_TOLERANCE: f32 = 1e-5;

/// Deterministic pseudo-random token ids in `0..vocab` (an LCG).
fn pseudo_random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn load(path: &Path) -> LoadedModel {
    let path = path.to_str().expect("utf-8 path");
    load_model(path, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {path}: {e}"))
}

/// Both models' logits for `prompt`, compared.
fn compare(a: LlamaModel, b: LlamaModel, prompts: &[Vec<u32>], label: &str) -> Vec<LogitsComparison> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let vocab = a.config().vocab_size;
    let mut ra = runner_for(a, longest);
    let mut rb = runner_for(b, longest);
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let la = prompt_logits(&mut ra, p).expect("forward a");
            let lb = prompt_logits(&mut rb, p).expect("forward b");
            let c = compare_logits(&la, &lb, vocab).expect("compare");
            println!(
                "{label} prompt {i} ({} tokens): max |Δlogit| = {:.3e} (logits up to {:.1}), argmax mismatches {:?}, min top-2 gap {:.3e}",
                p.len(),
                c.max_abs_diff,
                c.max_abs_logit,
                c.argmax_mismatches,
                c.min_top2_gap
            );
            c
        })
        .collect()
}

fn assert_equivalent(results: &[LogitsComparison], label: &str, tolerance: f32) {
    for (i, c) in results.iter().enumerate() {
        assert!(
            c.max_abs_diff < tolerance,
            "{label} prompt {i}: max |Δlogit| {} ≥ {tolerance}",
            c.max_abs_diff
        );
        assert!(
            c.argmax_mismatches.is_empty(),
            "{label} prompt {i}: argmax differs at positions {:?} (smallest top-2 gap {})",
            c.argmax_mismatches,
            c.min_top2_gap
        );
    }
}

/// The configs must agree except for the RoPE pairing, which follows the layout.
fn assert_same_config(gguf: &ModelConfig, hf: &ModelConfig) {
    assert_eq!(gguf.rope_style, RopeStyle::Interleaved, "llama GGUF rows are permuted");
    assert_eq!(hf.rope_style, RopeStyle::Neox);
    let mut g = gguf.clone();
    g.rope_style = RopeStyle::Neox;
    assert_eq!(&g, hf, "GGUF and converted HF configs differ");
}

#[test]
fn smollm2_gguf_and_its_hf_conversion_give_the_same_logits() {
    let Some(gguf_path) = smollm2_gguf() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let hf_path = tmp.path().join("smollm2-hf");
    gguf_to_hf_dir(&gguf_path, &hf_path).expect("convert GGUF to HF");

    let loaded = load(&gguf_path);
    let prompts = vec![
        loaded.tokenizer.encode("The capital of France is Paris, and the capital of Germany is", false).expect("encode"),
        loaded
            .chat_prompt("Write a short poem about the sea, with rhymes, in four lines please.")
            .expect("chat prompt"),
        pseudo_random_ids(40, loaded.model.config().vocab_size, 42),
    ];
    for p in &prompts {
        assert!((10..=60).contains(&p.len()), "prompt of {} tokens", p.len());
    }
    let mut gguf_model = loaded.model;
    gguf_model.set_precision(MatmulPrecision::Exact);

    let dir = HfModelDir::open(&hf_path).expect("open converted HF dir");
    let hf_config = ModelConfig::from_hf_json(dir.config()).expect("HF config");
    assert_same_config(gguf_model.config(), &hf_config);
    assert!(hf_config.tie_word_embeddings, "SmolLM2 ties its embeddings");
    assert_eq!(hf_config.rope_theta, 100_000.0);
    let hf_model = LlamaModel::load(hf_config, &dir, WeightNaming::Hf).expect("load HF");

    let results = compare(gguf_model, hf_model, &prompts, "smollm2 GGUF(exact) vs HF(f32)");
    assert_equivalent(&results, "smollm2", TOLERANCE);
}

/// The tiny model variants converted HF → GGUF.
fn tiny_variants() -> Vec<(&'static str, TinyModelOptions)> {
    let mut llama = TinyModelOptions::new(TinyArch::Llama);
    llama.seed = 11;
    let mut llama_bf16_tied = TinyModelOptions::new(TinyArch::Llama);
    llama_bf16_tied.seed = 12;
    llama_bf16_tied.dtype = TinyDtype::Bf16;
    llama_bf16_tied.tie_word_embeddings = true;
    llama_bf16_tied.kv_heads = 1;
    let mut qwen3 = TinyModelOptions::new(TinyArch::Qwen3);
    qwen3.seed = 13;
    qwen3.dtype = TinyDtype::Bf16;
    vec![("llama-f32", llama), ("llama-bf16-tied-gqa4", llama_bf16_tied), ("qwen3-bf16", qwen3)]
}

fn tiny_prompts(loaded: &LoadedModel) -> Vec<Vec<u32>> {
    let vocab = loaded.model.config().vocab_size;
    vec![
        loaded.chat_prompt("hello world, the string is here").expect("chat prompt"),
        pseudo_random_ids(10, vocab, 1),
        pseudo_random_ids(40, vocab, 2),
    ]
}

#[test]
fn tiny_hf_models_and_their_gguf_conversions_give_the_same_logits() {
    for (label, opts) in tiny_variants() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let hf_path = tmp.path().join("hf");
        let gguf_path = tmp.path().join("tiny.gguf");
        write_tiny_model(&opts, &hf_path).expect("write tiny model");
        hf_to_gguf_file(&hf_path, &gguf_path).expect("convert HF to GGUF");

        let hf = load(&hf_path);
        let gguf = load(&gguf_path);
        if opts.arch == TinyArch::Llama {
            assert_same_config(gguf.model.config(), hf.model.config());
        } else {
            assert_eq!(gguf.model.config(), hf.model.config(), "{label}: configs differ");
        }
        // The converted tokenizer metadata tokenizes (and templates) the same way.
        let prompts = tiny_prompts(&hf);
        assert_eq!(tiny_prompts(&gguf)[0], prompts[0], "{label}: chat prompt tokenizes differently");
        // GGUF holds one EOS id; the HF directory adds generation_config's list.
        assert!(
            gguf.stop_tokens.iter().all(|t| hf.stop_tokens.contains(t)) && !gguf.stop_tokens.is_empty(),
            "{label}: GGUF stop tokens {:?} vs HF {:?}",
            gguf.stop_tokens,
            hf.stop_tokens
        );

        let results = compare(gguf.model, hf.model, &prompts, &format!("tiny {label} GGUF vs HF"));
        assert_equivalent(&results, label, TINY_TOLERANCE);
    }
}

#[test]
fn hf_to_gguf_to_hf_round_trip_preserves_every_tensor() {
    for (label, opts) in tiny_variants() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (hf, gguf, back) = (tmp.path().join("hf"), tmp.path().join("m.gguf"), tmp.path().join("back"));
        write_tiny_model(&opts, &hf).expect("write tiny model");
        hf_to_gguf_file(&hf, &gguf).expect("HF → GGUF");
        gguf_to_hf_dir(&gguf, &back).expect("GGUF → HF");
        let a = read_safetensors_f32(&hf.join("model.safetensors")).expect("read original");
        let b = read_safetensors_f32(&back.join("model.safetensors")).expect("read round trip");
        let mut names: Vec<&String> = a.keys().collect();
        names.sort();
        let mut kb: Vec<&String> = b.keys().collect();
        kb.sort();
        assert_eq!(names, kb, "{label}: tensor names differ after the round trip");
        for name in names {
            assert_eq!(a[name], b[name], "{label}: `{name}` changed in the round trip");
        }
    }
}

#[test]
fn a_gguf_without_the_qk_permutation_is_detected() {
    let (_, opts) = tiny_variants().remove(0);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (hf_path, good, bad) = (tmp.path().join("hf"), tmp.path().join("good.gguf"), tmp.path().join("bad.gguf"));
    write_tiny_model(&opts, &hf_path).expect("write tiny model");
    hf_to_gguf(&hf_path, &good, true).expect("convert");
    hf_to_gguf(&hf_path, &bad, false).expect("convert without permutation");
    let hf = load(&hf_path);
    let prompts = tiny_prompts(&hf);
    let ok = compare(load(&good).model, load(&hf_path).model, &prompts, "permuted GGUF vs HF");
    assert_equivalent(&ok, "permuted", TINY_TOLERANCE);
    let wrong = compare(load(&bad).model, hf.model, &prompts, "unpermuted GGUF vs HF");
    let worst = wrong.iter().map(|c| c.max_abs_diff).fold(0f32, f32::max);
    // Seen: 0.28 .. 0.47 on logits of size ~3, with argmax flips.
    assert!(
        worst > 0.05,
        "an unpermuted q/k GGUF should give different logits (max |Δ| only {worst})"
    );
}
