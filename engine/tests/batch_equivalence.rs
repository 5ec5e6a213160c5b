//! A batch mixing prefill and decode sequences gives each sequence exactly
//! (bit for bit) the logits it gets alone: every matmul kernel, whatever the
//! batch size picks, performs the same float operations per token.

mod common;

use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::runner::ModelRunner;

fn seq(tokens: &[u32], start: usize, table: &[u32]) -> SeqInput {
    SeqInput { id: 0, tokens: tokens.to_vec(), start_pos: start, block_table: table.to_vec().into(), logits: LogitsRequest::All, sampling: None }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn mixed_batch_matches_each_sequence_alone() {
    let path = spindle_testenv::smollm2_gguf();
    let model = common::load_smollm2(&path);
    let mut runner = ModelRunner::new(model, 64, 16);
    let mut alloc = BlockAllocator::new(64);
    // Four prompts of different lengths; 0 and 1 get a prefill first so that
    // in the mixed step they decode, while 2 and 3 prefill.
    let prompts: Vec<Vec<u32>> = vec![
        (1..20).collect(),
        (100..137).collect(),
        (500..505).collect(),
        (2000..2050).collect(),
    ];
    let mut tables: Vec<Vec<u32>> = vec![Vec::new(); 4];
    for (p, t) in prompts.iter().zip(tables.iter_mut()) {
        alloc.ensure(t, p.len() + 1, 16).expect("blocks");
    }
    let mut alone = Vec::new();
    for i in 0..2 {
        let prefix = &prompts[i][..prompts[i].len() - 1];
        runner.execute(&ForwardBatch { seqs: vec![seq(prefix, 0, &tables[i])] }).expect("prefill");
        let last = &prompts[i][prompts[i].len() - 1..];
        let out = runner.execute(&ForwardBatch { seqs: vec![seq(last, prefix.len(), &tables[i])] }).expect("decode");
        alone.push(out.seqs[0].logits.clone());
    }
    for i in 2..4 {
        let out = runner.execute(&ForwardBatch { seqs: vec![seq(&prompts[i], 0, &tables[i])] }).expect("prefill");
        alone.push(out.seqs[0].logits.clone());
    }
    // Mixed: sequences 0,1 decode their last token again (same position, the
    // KV rows are overwritten with identical values); 2,3 prefill again.
    let mixed = ForwardBatch {
        seqs: vec![
            seq(&prompts[2], 0, &tables[2]),
            seq(&prompts[0][prompts[0].len() - 1..], prompts[0].len() - 1, &tables[0]),
            seq(&prompts[3], 0, &tables[3]),
            seq(&prompts[1][prompts[1].len() - 1..], prompts[1].len() - 1, &tables[1]),
        ],
    };
    let out = runner.execute(&mixed).expect("mixed");
    let order = [2usize, 0, 3, 1];
    for (k, &i) in order.iter().enumerate() {
        let d = max_diff(&out.seqs[k].logits, &alone[i]);
        assert_eq!(d, 0.0, "sequence {i}: logits differ by up to {d} between batched and alone (must be bit-identical)");
    }
}

/// Sixteen sequences decoding in one step (one group of 16 tokens: on the
/// K-quant layers AMX tiles where the CPU has them, else the grouped VNNI
/// or the multi-token AVX2 kernels)
/// give each sequence exactly the logits it gets decoding alone (the
/// one-token kernels). Qwen2.5-Coder-1.5B Q4_K_M: Q4_K and Q6_K layers.
#[test]
#[ignore = "needs Qwen2.5-Coder-1.5B Q4_K_M: scripts/test.sh fetches it and sets SPINDLE_QWEN15_GGUF"]
fn sixteen_sequences_decoding_on_k_quants_match_each_alone() {
    let path = spindle_testenv::required_file("SPINDLE_QWEN15_GGUF", "Qwen2.5-Coder-1.5B Q4_K_M", "scripts/fetch-model.sh --name qwen2.5-coder-1.5b-instruct");
    let model = common::load_gguf(&path);
    let seqs = 16usize;
    let mut runner = ModelRunner::new(model, 2 * seqs, 16);
    let mut alloc = BlockAllocator::new(2 * seqs);
    // Prompts of 3 to 18 tokens: the decode step reads contexts of different lengths.
    let prompts: Vec<Vec<u32>> = (0..seqs as u32).map(|s| (0..3 + s).map(|t| 100 + 37 * s + 11 * t).collect()).collect();
    let mut tables: Vec<Vec<u32>> = vec![Vec::new(); seqs];
    let mut alone = Vec::new();
    for (p, table) in prompts.iter().zip(tables.iter_mut()) {
        alloc.ensure(table, p.len(), 16).expect("blocks");
        let (prefix, last) = p.split_at(p.len() - 1);
        runner.execute(&ForwardBatch { seqs: vec![seq(prefix, 0, table)] }).expect("prefill");
        let out = runner.execute(&ForwardBatch { seqs: vec![seq(last, prefix.len(), table)] }).expect("decode alone");
        alone.push(out.seqs[0].logits.clone());
    }
    // All sixteen decode their last token again in one step (same position:
    // the KV rows are overwritten with identical values).
    let batch = ForwardBatch { seqs: prompts.iter().zip(&tables).map(|(p, t)| seq(&p[p.len() - 1..], p.len() - 1, t)).collect() };
    let out = runner.execute(&batch).expect("batched decode");
    for (i, want) in alone.iter().enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let d = max_diff(&out.seqs[i].logits, want);
        assert!(bits(&out.seqs[i].logits) == bits(want), "sequence {i}: logits differ by up to {d} between the batch of {seqs} and alone (must be bit-identical)");
    }
}
