//! The protocol layer's cost per streamed token:
//! - `mapper_sse/token`: one text delta through the response mapper, JSON
//!   serialization and SSE framing;
//! - `overhead/{direct,http_sse}`: a 256-token response from a scheduler whose
//!   runner returns instantly, read directly from the `EventStream` versus
//!   through `POST /v1/responses` with `stream: true` over a loopback socket;
//!   the difference divided by 256 is the server's overhead per token.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use spindle_engine::batch::{ForwardBatch, SeqOutput, StepOutput};
use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_engine::tokenizer::{SpecialTokens, Tokenizer};
use spindle_engine::EngineError;
use spindle_scheduler::output::StopConditions;
use spindle_engine::runner::{Executor, KvGeometry};
use spindle_scheduler::{GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle};
use spindle_server::app::{self, access::auth::ApiKeys, metrics::HttpMetrics, AppState, Limits, ModelInfo};
use spindle_server::protocol::{validate, MapperInput, RequestLimits, ResponseMapper};
use spindle_server::store::MemoryStore;
use axum::serve::ListenerExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKENS: usize = 256;

struct InstantRunner(u32);

impl Executor for InstantRunner {
    fn context_length(&self) -> usize {
        1 << 16
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry { block_size: 16, num_blocks: 4096, bytes_per_block: 0 }
    }

    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput, EngineError> {
        self.0 = self.0.wrapping_add(1);
        let token = 97 + self.0 % 20;
        let seqs = batch
            .seqs
            .iter()
            .map(|s| SeqOutput {
                grammar_ended: false,
                logits: Vec::new(),
                sampled: s.sampling.as_ref().map(|_| SampledToken { token, logprob: -0.1, top_logprobs: Vec::new() }),
            })
            .collect();
        Ok(StepOutput { seqs })
    }
}

fn tiny_tokenizer() -> Tokenizer {
    let dir = std::env::temp_dir().join(format!("spindle-bench-proto-{}", std::process::id()));
    let opts = spindle_tools::tiny_model::TinyModelOptions::default();
    spindle_tools::tiny_model::write_tiny_model(&opts, &dir).expect("tiny model");
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), SpecialTokens::default()).expect("tokenizer");
    let _ = std::fs::remove_dir_all(&dir);
    tok
}

fn bench_mapper(c: &mut Criterion) {
    let req = validate(json!({"model": "m", "input": "hi", "stream": true}), &RequestLimits::default()).expect("valid");
    let mut g = c.benchmark_group("mapper_sse");
    g.throughput(Throughput::Elements(1));
    let mut mapper = ResponseMapper::new("resp_bench".into(), 0, &req);
    mapper.start();
    mapper.push(MapperInput::Started { cached_tokens: 0 });
    g.bench_function("token", |b| {
        b.iter(|| {
            let mut out = String::new();
            for e in mapper.push(MapperInput::TextDelta(" word".into())) {
                out.push_str(&e.to_sse().expect("serializable"));
            }
            out
        })
    });
    g.finish();
}

fn scheduler(tok: &Tokenizer) -> SchedulerHandle {
    SchedulerHandle::spawn(SchedulerConfig::default(), InstantRunner(0), tok.clone())
}

fn direct(handle: &SchedulerHandle, rt: &tokio::runtime::Runtime) -> Duration {
    let request = GenerationRequest {
        prompt: (0..32).collect(),
        sampling: SamplingParams::default(),
        stop: StopConditions { max_tokens: TOKENS, ..StopConditions::default() },
        cache_salt: None,
        constraint: None,
    };
    let start = Instant::now();
    rt.block_on(async {
        let mut s = handle.submit(request).expect("submit");
        while let Some(ev) = s.recv().await {
            if matches!(ev, GenerationEvent::Finished { .. } | GenerationEvent::Failed { .. }) {
                break;
            }
        }
    });
    start.elapsed()
}

fn bench_overhead(c: &mut Criterion) {
    let tok = tiny_tokenizer();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let state = Arc::new(AppState {
        scheduler: scheduler(&tok),
        sealer: spindle_server::app::access::seal::Sealer::random(),
        idempotency: Default::default(),
        tasks: Default::default(),
        model: ModelInfo::new("m".into(), tok.clone(), ChatTemplate::chatml_default(), 1 << 16, tok.vocab_size(), 0),
        store: Arc::new(MemoryStore::default()),
        keys: ApiKeys::default(),
        limits: Limits::default(),
        metrics: HttpMetrics::default(),
        running: Default::default(),
        slots: Default::default(),
        draining: tokio::sync::watch::channel(false).0,
    });
    let base = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let router = app::app(state.clone());
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move { axum::serve(listener, router).await });
        base
    });
    let client = reqwest::Client::new();
    let body = json!({"model": "m", "input": "hi", "stream": true, "store": false, "max_output_tokens": TOKENS});
    let mut g = c.benchmark_group("overhead");
    g.sample_size(20).throughput(Throughput::Elements(TOKENS as u64));
    let direct_handle = scheduler(&tok);
    g.bench_function("direct", |b| b.iter_custom(|n| (0..n).map(|_| direct(&direct_handle, &rt)).sum()));
    g.bench_function("http_sse", |b| {
        b.iter_custom(|n| {
            let start = Instant::now();
            for _ in 0..n {
                rt.block_on(async {
                    let r = client.post(format!("{base}/v1/responses")).json(&body).send().await.expect("send");
                    let text = r.text().await.expect("body");
                    assert!(text.ends_with("data: [DONE]\n\n"));
                });
            }
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_mapper, bench_overhead);
criterion_main!(benches);
