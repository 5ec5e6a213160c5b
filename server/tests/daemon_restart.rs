//! Stored responses survive `kill -9` of the daemon: after a restart on the
//! same store, a completed response is served unchanged and a background
//! response that was still running is reported `failed`, not `in_progress`.

mod common;

use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(18080)
}

fn spawn(port: u16, store: &std::path::Path, model: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--model", model, "--port", &port.to_string(), "--store-path"])
        .arg(store)
        .args(["--kv-cache-memory-mib", "128", "--threads", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn spindle serve")
}

async fn wait_ready(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(r) = common::http().get(format!("{base}/ready")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("daemon did not become ready");
}

#[tokio::test]
async fn stored_responses_survive_kill_9() {
    let model = spindle_testenv::smollm2_gguf();
    let model = model.to_string_lossy().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("responses.sqlite3");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut daemon = spawn(port, &store, &model);
    wait_ready(&base).await;
    let client = common::http();
    let done: Value = client
        .post(format!("{base}/v1/responses"))
        .json(&json!({"input": "Say hello.", "max_output_tokens": 16}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let bg: Value = client
        .post(format!("{base}/v1/responses"))
        .json(&json!({"input": "Write a very long story.", "background": true, "max_output_tokens": 4000}))
        .send()
        .await
        .expect("create background")
        .json()
        .await
        .expect("json");
    daemon.kill().expect("kill -9"); // SIGKILL on unix
    let _ = daemon.wait();

    let mut daemon = spawn(port, &store, &model);
    wait_ready(&base).await;
    let again: Value = common::http().get(format!("{base}/v1/responses/{}", done["id"].as_str().expect("id"))).send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(again, done, "the stored response must come back unchanged");
    let bg_again: Value = common::http().get(format!("{base}/v1/responses/{}", bg["id"].as_str().expect("id"))).send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(bg_again["status"], "failed", "{bg_again}");
    assert!(bg_again["error"]["message"].is_string());
    let _ = daemon.kill();
    let _ = daemon.wait();
}
