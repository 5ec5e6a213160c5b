//! The backend seam on a machine without a GPU: the one generic decoder over
//! the CPU backend and over a deliberately simple reference backend (plain
//! f32 loops, `spindle_tests::reference_backend`) gives the same logits on
//! tiny Llama (GQA), Qwen3 (q/k norms, bf16) and Qwen2 (q/k/v biases)
//! models, over a batch that mixes prefill chunks, decode steps and
//! scattered block tables.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use spindle_engine::backend::cpu::CpuBackend;
use spindle_engine::backend::{Backend, KvSize};
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput};
use spindle_engine::model::{Decoder, MatmulPrecision};
use spindle_engine::open::open_decoder;
use spindle_tests::reference_backend::ReferenceBackend;
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyDtype, TinyModelOptions};

const BLOCK: usize = 16;

fn seq(tokens: Vec<u32>, start_pos: usize, table: &[u32], logits: LogitsRequest) -> SeqInput {
    SeqInput { id: 0, tokens, start_pos, block_table: table.to_vec().into(), logits, sampling: None }
}

/// Two steps: A's prefill (all logits) beside B's first chunk; then A's
/// decode step beside B's second chunk (all logits). Tables are scattered.
fn steps() -> Vec<ForwardBatch> {
    let a: Vec<u32> = (0..37).map(|i| (i * 29 + 7) % 300).collect();
    let b: Vec<u32> = (0..21).map(|i| (i * 13 + 101) % 300).collect();
    let (ta, tb) = ([4u32, 0, 2], [5u32, 1]);
    vec![
        ForwardBatch { seqs: vec![seq(a.clone(), 0, &ta, LogitsRequest::All), seq(b[..5].to_vec(), 0, &tb, LogitsRequest::Last)] },
        ForwardBatch { seqs: vec![seq(vec![a[3]], a.len(), &ta, LogitsRequest::Last), seq(b[5..].to_vec(), 5, &tb, LogitsRequest::All)] },
    ]
}

fn run<B: Backend>(model: &mut Decoder<B>) -> Vec<Vec<Vec<f32>>> {
    steps().iter().map(|s| model.forward(s).expect("step")).collect()
}

fn open<B: Backend>(dir: &std::path::Path, make: impl FnOnce(&spindle_engine::config::ModelConfig) -> spindle_engine::Result<B>) -> Decoder<B> {
    open_decoder(dir.to_str().unwrap(), make, KvSize::Blocks(8), BLOCK).expect("open").0
}

#[test]
fn the_cpu_backend_and_the_reference_backend_give_the_same_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let mut llama = TinyModelOptions::new(TinyArch::Llama);
    llama.kv_heads = 1;
    let mut qwen3 = TinyModelOptions::new(TinyArch::Qwen3);
    qwen3.dtype = TinyDtype::Bf16;
    qwen3.head_dim = Some(32);
    let qwen2 = TinyModelOptions { seed: 5, ..TinyModelOptions::new(TinyArch::Qwen2) };
    for (name, opts) in [("llama", llama), ("qwen3", qwen3), ("qwen2", qwen2)] {
        let dir = tmp.path().join(name);
        write_tiny_model(&opts, &dir).unwrap();
        let cpu = run(&mut open(&dir, |_| Ok(CpuBackend::new(MatmulPrecision::Exact))));
        let reference = run(&mut open(&dir, |_| Ok(ReferenceBackend::default())));
        let mut rows = 0;
        for (step, (c, r)) in cpu.iter().zip(&reference).enumerate() {
            for (i, (cl, rl)) in c.iter().zip(r).enumerate() {
                assert_eq!(cl.len(), rl.len(), "{name}: step {step} sequence {i}: logits length");
                assert!(!cl.is_empty(), "{name}: step {step} sequence {i}: logits were asked for");
                let scale = rl.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = cl.iter().zip(rl).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(worst <= 1e-4 * scale.max(1.0), "{name}: step {step} sequence {i}: max |cpu - reference| = {worst} (logits up to {scale})");
                rows += cl.len() / opts_vocab(&dir);
            }
        }
        // 37 + 1 rows for A, 1 + 16 for B.
        assert_eq!(rows, 55, "{name}: every requested row compared");
    }
}

fn opts_vocab(dir: &std::path::Path) -> usize {
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["vocab_size"].as_u64().unwrap() as usize
}

#[test]
fn the_comparison_catches_a_backend_that_drops_the_qwen2_biases() {
    let tmp = tempfile::tempdir().unwrap();
    write_tiny_model(&TinyModelOptions { seed: 5, ..TinyModelOptions::new(TinyArch::Qwen2) }, tmp.path()).unwrap();
    let cpu = run(&mut open(tmp.path(), |_| Ok(CpuBackend::new(MatmulPrecision::Exact))));
    let biased = run(&mut open(tmp.path(), |_| Ok(ReferenceBackend::default())));
    let unbiased = run(&mut open(tmp.path(), |_| Ok(ReferenceBackend::dropping_biases())));
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff(&cpu[0][0], &biased[0][0]) < 1e-3);
    assert!(diff(&cpu[0][0], &unbiased[0][0]) > 1e-2, "the biases change the logits");
}

#[test]
fn tables_sent_as_deltas_give_the_logits_of_whole_tables_and_are_released() {
    use spindle_engine::batch::BlockTable;
    let tmp = tempfile::tempdir().unwrap();
    write_tiny_model(&TinyModelOptions::new(TinyArch::Llama), tmp.path()).unwrap();
    let mut whole = open(tmp.path(), |_| Ok(CpuBackend::new(MatmulPrecision::Exact)));
    let mut delta = open(tmp.path(), |_| Ok(CpuBackend::new(MatmulPrecision::Exact)));
    let prompt: Vec<u32> = (0..20).map(|i| (i * 31 + 3) % 300).collect();
    let first = |table: BlockTable| ForwardBatch { seqs: vec![SeqInput { id: 7, tokens: prompt[..14].to_vec(), start_pos: 0, block_table: table, logits: LogitsRequest::Last, sampling: None }] };
    let second = |table: BlockTable| ForwardBatch { seqs: vec![SeqInput { id: 7, tokens: prompt[14..].to_vec(), start_pos: 14, block_table: table, logits: LogitsRequest::All, sampling: None }] };
    whole.forward(&first(BlockTable::Full(vec![3]))).unwrap();
    delta.forward(&first(BlockTable::Full(vec![3]))).unwrap();
    let want = whole.forward(&second(BlockTable::Full(vec![3, 6]))).unwrap();
    let got = delta.forward(&second(BlockTable::Append(vec![6]))).unwrap();
    assert_eq!(got, want, "an appended block gives the same step as the whole table");
    assert_eq!(delta.kept_tables(), 1);
    delta.release(&[7]);
    assert_eq!(delta.kept_tables(), 0, "released");
    let err = delta.forward(&second(BlockTable::Append(vec![6]))).unwrap_err().to_string();
    assert!(err.contains("does not hold"), "appending to a released table is an error: {err}");
}
