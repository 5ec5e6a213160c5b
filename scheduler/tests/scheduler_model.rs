//! The scheduler with the real model: continuous batching gives every request
//! exactly the tokens it gets alone (also under preemption), multi-turn
//! conversations hit the prefix cache, and aborts return every block.

use spindle_engine::load::{load_model, LoadedModel};
use spindle_engine::runner::ModelRunner;
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{EventStream, GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle, Usage};
use std::time::{Duration, Instant};

fn model() -> LoadedModel {
    let path = spindle_testenv::smollm2_gguf();
    load_model(&path.to_string_lossy(), &mut |_, _| {}).expect("load model")
}

fn start(m: LoadedModel, num_blocks: usize, max_num_batched_tokens: usize) -> (SchedulerHandle, Vec<u32>) {
    let config = SchedulerConfig { max_num_seqs: 32, max_num_batched_tokens, ..SchedulerConfig::default() };
    let runner = ModelRunner::new(m.model, num_blocks, 16);
    (SchedulerHandle::spawn(config, runner, m.tokenizer), m.stop_tokens)
}

fn request(prompt: Vec<u32>, stop_tokens: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: SamplingParams::default(),
        stop: StopConditions {
            stop_token_ids: stop_tokens.to_vec(),
            stop_strings: vec![],
            max_tokens,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
        },
        cache_salt: None,
        constraint: None,
    }
}

/// How long reading one request's stream may take.
const STREAM_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `read` on the stream in a thread and waits for its answer until
/// [`STREAM_DEADLINE`]: a scheduler that stalls fails the test, not hangs it.
fn with_deadline<T: Send + 'static>(s: EventStream, read: impl FnOnce(EventStream) -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read(s));
    });
    rx.recv_timeout(STREAM_DEADLINE).expect("the stream answered within the deadline")
}

/// Read a stream to its end: (tokens, usage).
fn collect(s: EventStream) -> (Vec<u32>, Usage) {
    with_deadline(s, |mut s| {
        let mut tokens = Vec::new();
        loop {
            match s.blocking_recv() {
                Some(GenerationEvent::Delta { token, .. }) => tokens.push(token.id),
                Some(GenerationEvent::Finished { usage, .. }) => return (tokens, usage),
                Some(GenerationEvent::Failed { message }) => panic!("request failed: {message}"),
                Some(GenerationEvent::Started { .. }) => {}
                None => panic!("stream ended without a terminal event"),
            }
        }
    })
}

fn prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    let questions = [
        "What is the capital of France?", "Name three colors.", "What is 2 + 2?", "Write a haiku about rain.",
        "Who wrote Hamlet?", "Describe the water cycle.", "What is a prime number?", "Give me a synonym for happy.",
        "What is the boiling point of water?", "Explain gravity in one sentence.", "List two fruits.",
        "What language is spoken in Brazil?", "How many legs does a spider have?", "What is photosynthesis?",
        "Translate 'hello' to Spanish.", "What is the largest planet?",
    ];
    questions.iter().map(|q| m.chat_prompt(q).expect("prompt")).collect()
}

fn assert_pool_returned(h: &SchedulerHandle, total: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let usage = h.check_kv().expect("kv invariants");
        if usage.used == 0 {
            assert_eq!(usage.free + usage.cached_evictable, total, "{usage:?}");
            return;
        }
        assert!(Instant::now() < deadline, "blocks still held: {usage:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_requests_match_their_solo_runs_even_when_preempted() {
    let m = model();
    let prompts = prompts(&m);
    // 24 blocks = 384 token slots for 16 requests of ~40 + 24 tokens: forces preemption.
    let (h, stops) = start(m, 24, 256);
    let solo: Vec<Vec<u32>> = prompts.iter().map(|p| collect(h.submit(request(p.clone(), &stops, 24)).expect("submit")).0).collect();
    assert_pool_returned(&h, 24);
    let streams: Vec<EventStream> =
        prompts.iter().map(|p| h.submit(request(p.clone(), &stops, 24)).expect("submit")).collect();
    let together: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i}: tokens differ between solo and concurrent runs");
    }
    let metrics = h.metrics().snapshot();
    assert!(metrics.preemptions > 0, "the tiny KV budget should have forced preemption: {metrics:?}");
    assert!(metrics.batch_size.iter().skip(3).sum::<u64>() > 0, "steps should have batched > 4 sequences");
    assert_pool_returned(&h, 24);
}

#[test]
fn multi_turn_conversation_hits_the_prefix_cache() {
    let m = model();
    let system = "You are a meticulous assistant. ".repeat(48);
    let mut prompt = m
        .tokenizer
        .encode(&format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"), false)
        .expect("encode");
    let user_turns = ["Tell me a fact.", "Another one.", "Shorter please.", "Thanks, one more."];
    let tok = m.tokenizer.clone();
    let (h, stops) = start(m, 256, 512);
    for turn in 0..5 {
        let input = prompt.len();
        let (output, usage) = collect(h.submit(request(prompt.clone(), &stops, 16)).expect("submit"));
        assert_eq!(usage.input_tokens, input);
        if turn > 0 {
            let rate = usage.cached_tokens as f64 / input as f64;
            assert!(rate >= 0.9, "turn {}: cached {} of {input} tokens ({rate:.2})", turn + 1, usage.cached_tokens);
        }
        if turn < 4 {
            prompt.extend(&output);
            prompt.extend(&stops[..1]);
            let next = format!("\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", user_turns.get(turn).expect("a user turn for each of the first four"));
            prompt.extend(tok.encode(&next, false).expect("encode"));
        }
    }
    assert_pool_returned(&h, 256);
}

#[test]
fn dropping_a_stream_aborts_and_frees_its_blocks() {
    let m = model();
    let p = prompts(&m);
    let (h, stops) = start(m, 64, 256);
    let s = h.submit(request(p[5].clone(), &stops, 200)).expect("submit");
    let s = with_deadline(s, |mut s| {
        let mut deltas = 0;
        while deltas < 3 {
            match s.blocking_recv() {
                Some(GenerationEvent::Delta { .. }) => deltas += 1,
                Some(GenerationEvent::Started { .. }) => {}
                other => panic!("expected three deltas, got {other:?}"),
            }
        }
        s
    });
    assert!(h.check_kv().expect("kv").used > 0);
    drop(s);
    assert_pool_returned(&h, 64);
    let explicit = h.submit(request(p[6].clone(), &stops, 200)).expect("submit");
    h.abort(explicit.id());
    let (_, _) = (explicit, ());
    assert_pool_returned(&h, 64);
    assert!(h.metrics().snapshot().aborts >= 1);
}
