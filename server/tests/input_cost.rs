//! A huge input costs little: `spindle serve` refuses a 7 MB text input as
//! too long for the context window before rendering or tokenizing it, with a
//! small rise in the daemon's peak memory (read from `/proc`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::{json, Value};
use std::time::Instant;

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_7_mb_input_is_refused_with_little_memory() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &[]);
    // Warm up the request path so that one-time allocations do not count.
    let small = json!({"input": "Say hi.", "max_output_tokens": 16});
    let r = common::http().post(format!("{}/v1/responses", daemon.base())).json(&small).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Reset the peak to the current resident set (Linux: 5 > clear_refs).
    std::fs::write(format!("/proc/{}/clear_refs", daemon.child.id()), "5").unwrap();
    let before = peak_rss_kib(daemon.child.id());
    let words = "the quick brown fox jumps over the lazy dog ".repeat(7 * 1024 * 1024 / 44);
    let body = serde_json::to_vec(&json!({"input": words, "max_output_tokens": 16})).unwrap();
    assert!(body.len() > 7_000_000 && body.len() < 8 << 20, "{}", body.len());
    let started = Instant::now();
    let r = common::http().post(format!("{}/v1/responses", daemon.base())).header("content-type", "application/json").body(body).send().await.unwrap();
    let took = started.elapsed();
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap();
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{answer}");
    let extra_mib = peak_rss_kib(daemon.child.id()).saturating_sub(before) / 1024;
    println!("7 MB input refused in {took:?}; peak RSS rose by {extra_mib} MiB");
    assert!(extra_mib < 50, "peak RSS rose by {extra_mib} MiB");
}
