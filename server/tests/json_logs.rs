//! `spindle --log-format json serve`: every log line on stderr is one JSON
//! object, and the access line carries the request id, route and status.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn logs_are_one_json_object_per_line() {
    let model = spindle_testenv::smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap();
    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["--log-format", "json", "serve", "--port", &port.to_string(), "--kv-cache-memory-mib", "64", "--threads", "2"])
        .arg("--model")
        .arg(&model)
        .arg("--store-path")
        .arg(dir.path().join("r.sqlite3"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !common::http().get(format!("{base}/ready")).send().await.is_ok_and(|r| r.status() == 200) {
        assert!(Instant::now() < deadline, "daemon did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = common::http().get(format!("{base}/v1/models")).send().await.unwrap();
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    // A stream read to its end, and one the client leaves early.
    let streamed = Instant::now();
    let body = serde_json::json!({"input": "Tell me a story.", "stream": true, "max_output_tokens": 32, "ignore_eos": true});
    let r = common::http().post(format!("{base}/v1/responses")).header("x-request-id", "req_full").json(&body).send().await.unwrap();
    let full_text = r.text().await.unwrap();
    let streamed_ms = streamed.elapsed().as_millis() as u64;
    let long = serde_json::json!({"input": "Tell me a story.", "stream": true, "max_output_tokens": 2000, "ignore_eos": true});
    let mut left = common::http().post(format!("{base}/v1/responses")).header("x-request-id", "req_left").json(&long).send().await.unwrap();
    let _first = tokio::time::timeout(Duration::from_secs(60), left.chunk()).await.expect("a first chunk in time").unwrap();
    drop(left);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = Command::new("kill").args(["-TERM", &daemon.id().to_string()]).status();
    let stopped = Instant::now() + Duration::from_secs(30);
    while daemon.try_wait().unwrap().is_none() {
        if Instant::now() > stopped {
            let _ = daemon.kill();
            panic!("the daemon did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(lines.len() >= 3, "{text}");
    assert!(lines.iter().all(|l| l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string()));
    let access = lines.iter().find(|l| l["request_id"] == request_id.as_str()).expect("an access line for the request");
    assert_eq!((access["route"].as_str(), access["status"].as_u64()), (Some("/v1/models"), Some(200)), "{access}");
    // A stream's line is written when it ends: its real duration and bytes.
    let full = lines.iter().find(|l| l["request_id"] == "req_full").expect("the full stream's access line");
    assert_eq!((full["stream"].as_str(), full["bytes"].as_u64()), (Some("complete"), Some(full_text.len() as u64)), "{full}");
    assert!(full["ms"].as_u64().unwrap() + 50 >= streamed_ms / 2, "{full} vs {streamed_ms} ms seen by the client");
    let left = lines.iter().find(|l| l["request_id"] == "req_left").expect("the abandoned stream's access line");
    assert_eq!(left["stream"], "client_closed", "{left}");
}
