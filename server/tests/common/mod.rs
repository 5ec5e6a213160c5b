//! A daemon on a real loopback socket with the real model, for end-to-end tests.
#![allow(clippy::expect_used, dead_code)]

pub mod daemon;

use axum::serve::ListenerExt;
use spindle_engine::load::load_model;
use spindle_engine::runner::ModelRunner;
use spindle_scheduler::{SchedulerConfig, SchedulerHandle};
use spindle_server::app::{self, access::auth::ApiKeys, metrics::HttpMetrics, AppState, Limits, ModelInfo};
use spindle_server::store::{ResponseStore, SqliteStore, StoreConfig};
use std::sync::Arc;
use std::time::Duration;

/// How long any one test request (its whole body included) may take: a
/// server that stops answering fails the test instead of hanging it.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(180);

/// An HTTP client whose every request has [`REQUEST_DEADLINE`].
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(REQUEST_DEADLINE).build().expect("HTTP client")
}

/// A running test server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its state (scheduler, store, limits).
    pub state: Arc<AppState>,
    _dir: tempfile::TempDir,
}

/// Starts a server with `keys` and `limits` (256 KV blocks, a SQLite store) on
/// the real model (the test fails when it is not installed).
pub async fn start(keys: Vec<String>, limits: Limits) -> Server {
    start_custom(keys, limits, 256, |s| Arc::new(s)).await
}

/// [`start`] with a KV pool of `blocks` blocks and the store wrapped by `wrap`
/// (e.g. to slow it down).
pub async fn start_custom(
    keys: Vec<String>,
    limits: Limits,
    blocks: usize,
    wrap: fn(SqliteStore) -> Arc<dyn ResponseStore>,
) -> Server {
    let path = spindle_testenv::smollm2_gguf();
    start_model(&path.to_string_lossy(), "smollm2-135m-instruct", keys, limits, blocks, wrap).await
}

/// A server on the model at `path` (a GGUF file or an HF directory), served as `name`.
pub async fn start_model(
    path: &str,
    name: &str,
    keys: Vec<String>,
    limits: Limits,
    blocks: usize,
    wrap: fn(SqliteStore) -> Arc<dyn ResponseStore>,
) -> Server {
    start_model_with(path, name, keys, limits, wrap, |model| ModelRunner::new(model, blocks, 16)).await
}

/// A server on the model file that environment variable `var` names (the
/// test fails when it is unset: `scripts/test.sh` sets it), served as `name`.
pub async fn start_env_model(var: &str, name: &str) -> Server {
    let path = std::env::var(var).unwrap_or_else(|_| panic!("{var} must name the {name} GGUF file (scripts/test.sh sets it)"));
    start_model(&path, name, vec![], Limits::default(), 256, |s| Arc::new(s)).await
}

/// POSTs `body` with its `model` set to `name` to `/v1/responses` (300 s
/// deadline: real models on two cores), requires 200 and returns the JSON.
pub async fn post_response(s: &Server, name: &str, mut body: serde_json::Value) -> serde_json::Value {
    body["model"] = serde_json::json!(name);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build().expect("client");
    let r = client.post(format!("{}/v1/responses", s.base)).json(&body).send().await.expect("send");
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.expect("json body");
    assert_eq!(status, 200, "{v}");
    v
}

/// [`start_model`] with the executor made by `executor` from the loaded
/// model (e.g. one wrapped to misbehave).
pub async fn start_model_with<E: spindle_engine::runner::Executor + 'static>(
    path: &str,
    name: &str,
    keys: Vec<String>,
    limits: Limits,
    wrap: fn(SqliteStore) -> Arc<dyn ResponseStore>,
    executor: impl FnOnce(spindle_engine::model::LlamaModel) -> E,
) -> Server {
    start_scheduled(path, name, keys, limits, wrap, SchedulerConfig::default(), executor, None).await
}

/// [`start`] whose accepted sockets have a send buffer of `bytes` (the
/// kernel doubles it): a client that stops reading blocks the server's
/// writes after a few kB instead of the megabytes loopback buffers take.
pub async fn start_with_send_buffer(limits: Limits, bytes: usize) -> Server {
    let path = spindle_testenv::smollm2_gguf();
    let executor = |model| ModelRunner::new(model, 256, 16);
    start_scheduled(&path.to_string_lossy(), "smollm2-135m-instruct", vec![], limits, |s| Arc::new(s), SchedulerConfig::default(), executor, Some(bytes)).await
}

/// [`start`] with the scheduler configured by `config` (e.g. one running
/// sequence at a time, so that others queue).
pub async fn start_with_scheduler(limits: Limits, config: SchedulerConfig) -> Server {
    let path = spindle_testenv::smollm2_gguf();
    let executor = |model| ModelRunner::new(model, 256, 16);
    start_scheduled(&path.to_string_lossy(), "smollm2-135m-instruct", vec![], limits, |s| Arc::new(s), config, executor, None).await
}

/// The whole of [`start_model_with`], with a scheduler configuration.
#[allow(clippy::too_many_arguments)]
async fn start_scheduled<E: spindle_engine::runner::Executor + 'static>(
    path: &str,
    name: &str,
    keys: Vec<String>,
    limits: Limits,
    wrap: fn(SqliteStore) -> Arc<dyn ResponseStore>,
    config: SchedulerConfig,
    executor: impl FnOnce(spindle_engine::model::LlamaModel) -> E,
    send_buffer: Option<usize>,
) -> Server {
    let m = load_model(path, &mut |_, _| {}).expect("model");
    let context_length = m.model.config().context_length;
    let vocab_size = m.model.config().vocab_size;
    let scheduler = SchedulerHandle::spawn(config, executor(m.model), m.tokenizer.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("r.sqlite3"), StoreConfig::new(Duration::from_secs(3600), 1000)).expect("store");
    let state = Arc::new(AppState {
        scheduler,
        sealer: spindle_server::app::access::seal::Sealer::random(),
        idempotency: Default::default(),
        tasks: Default::default(),
        model: ModelInfo::new(name.into(), m.tokenizer, m.template, context_length, vocab_size, 0),
        store: wrap(store),
        keys: ApiKeys::new(keys),
        limits,
        metrics: HttpMetrics::default(),
        running: Default::default(),
        slots: Default::default(),
        draining: tokio::sync::watch::channel(false).0,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = app::app(state.clone());
    let listener = listener.tap_io(move |tcp| {
        let _ = tcp.set_nodelay(true);
        if let Some(bytes) = send_buffer {
            set_send_buffer(tcp, bytes);
        }
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    Server { base, state, _dir: dir }
}

/// Sets `SO_SNDBUF` on an accepted socket (which also stops the kernel
/// from growing it).
fn set_send_buffer(tcp: &tokio::net::TcpStream, bytes: usize) {
    use std::os::fd::AsRawFd;
    let size = libc::c_int::try_from(bytes).expect("a buffer size that fits a C int");
    // SAFETY: a valid socket descriptor, and a pointer to a c_int with its size.
    let rc = unsafe {
        libc::setsockopt(tcp.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, std::ptr::from_ref(&size).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    };
    assert_eq!(rc, 0, "setsockopt(SO_SNDBUF): {}", std::io::Error::last_os_error());
}

/// Waits until the KV pool is empty again; fails after `secs` seconds.
pub async fn assert_blocks_freed(s: &Server, secs: u64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let usage = s.state.scheduler.check_kv().expect("kv");
        if usage.used == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: blocks still held: {usage:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a `spindle` command, killing it and failing the test past `limit`.
pub fn run_with_deadline(mut cmd: std::process::Command, limit: Duration) -> std::process::Output {
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn spindle");
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = std::process::Command::new("kill").arg(id.to_string()).status();
            panic!("spindle ran past {limit:?}");
        }
    }
}
