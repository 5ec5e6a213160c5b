//! The Model Server Protocol's metrics under vLLM's names, scraped from
//! `/metrics` while the real model works: each has its type and the
//! `model_name` label, running requests and KV-cache usage rise while a
//! long response generates and fall back to their idle values after it;
//! waiting requests are counted while the scheduler's batch is full.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::json;
use spindle_scheduler::SchedulerConfig;
use spindle_server::app::Limits;
use std::time::Duration;

/// `name{model_name="…"}`'s value in a scrape.
fn value(scrape: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{model_name=\"smollm2-135m-instruct\"}} ");
    let line = scrape.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix} in:\n{scrape}"));
    line[prefix.len()..].parse().unwrap()
}

async fn scrape(s: &common::Server) -> String {
    common::http().get(format!("{}/metrics", s.base)).send().await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn msp_metrics_have_vllm_names_types_and_follow_the_load() {
    let s = common::start(vec![], Limits::default()).await;
    let idle = scrape(&s).await;
    // The Prometheus text format by default (what vLLM serves and gateways parse).
    for (name, kind) in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"), ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:gpu_cache_usage_perc", "gauge"), ("vllm:cache_config_info", "gauge"), ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"), ("vllm:prefix_cache_queries_total", "counter"), ("vllm:prefix_cache_hits_total", "counter")]
    {
        assert!(idle.contains(&format!("# TYPE {name} {kind}\n")), "{name} {kind}:\n{idle}");
    }
    assert!(!idle.contains("# EOF"), "{idle}");
    // OpenMetrics when asked: a counter's family is named without `_total`.
    let r = common::http().get(format!("{}/metrics", s.base)).header("accept", "application/openmetrics-text; version=1.0.0").send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let open = r.text().await.unwrap();
    assert!(open.contains("# TYPE vllm:prompt_tokens counter\n") && open.contains("# TYPE vllm:cache_config info\n"), "{open}");
    assert!(open.ends_with("# EOF\n"), "{open}");
    assert!(idle.contains("vllm:cache_config_info{model_name=\"smollm2-135m-instruct\",block_size=\"16\",num_gpu_blocks=\"256\"} 1"), "{idle}");
    assert_eq!((value(&idle, "vllm:num_requests_running"), value(&idle, "vllm:kv_cache_usage_perc")), (0.0, 0.0));
    // One finished request: each phase histogram counts it once.
    let short = json!({"model": "smollm2-135m-instruct", "input": "Say hi.", "max_output_tokens": 16, "store": false});
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(&short).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let done = scrape(&s).await;
    for name in ["vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds", "vllm:time_to_first_token_seconds"]
    {
        assert!(done.contains(&format!("# TYPE {name} histogram\n")), "{name}:\n{done}");
        assert_eq!(value(&done, &format!("{name}_count")), 1.0, "{name}");
    }
    let e2e = value(&done, "vllm:e2e_request_latency_seconds_sum");
    let parts = ["vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum"]
        .iter()
        .map(|n| value(&done, n))
        .sum::<f64>();
    assert!(e2e > 0.0 && (e2e - parts).abs() < 0.01, "the phases add up to the whole: {e2e} vs {parts}");
    let body = json!({"model": "smollm2-135m-instruct", "input": "Write a long story.", "max_output_tokens": 4000, "ignore_eos": true,
        "background": true, "store": true, "temperature": 0});
    let made: serde_json::Value = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().json().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let busy = loop {
        let now = scrape(&s).await;
        if value(&now, "vllm:num_requests_running") >= 1.0 && value(&now, "vllm:kv_cache_usage_perc") > 0.02 {
            break now;
        }
        assert!(std::time::Instant::now() < deadline, "never saw the response running:\n{now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(value(&busy, "vllm:kv_cache_usage_perc") <= 1.0);
    let id = made["id"].as_str().unwrap();
    common::http().post(format!("{}/v1/responses/{id}/cancel", s.base)).send().await.unwrap();
    common::assert_blocks_freed(&s, 5, "after the cancel").await;
    let after = scrape(&s).await;
    assert_eq!((value(&after, "vllm:num_requests_running"), value(&after, "vllm:kv_cache_usage_perc")), (0.0, 0.0), "{after}");
    assert!(value(&after, "vllm:prefix_cache_queries_total") > 0.0, "{after}");
}

/// With one sequence allowed to run, two more background requests wait:
/// `vllm:num_requests_waiting` counts them (and agrees with
/// `spindle_queue_depth`), and both gauges fall to 0 once they are cancelled.
#[tokio::test]
async fn waiting_requests_are_counted_while_the_batch_is_full() {
    let config = SchedulerConfig { max_num_seqs: 1, ..SchedulerConfig::default() };
    let s = common::start_with_scheduler(Limits::default(), config).await;
    let body = json!({"model": "smollm2-135m-instruct", "input": "Write a long story.", "max_output_tokens": 4000, "ignore_eos": true,
        "background": true, "store": true, "temperature": 0});
    let mut ids = Vec::new();
    for _ in 0..3 {
        let made: serde_json::Value = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.unwrap().json().await.unwrap();
        ids.push(made["id"].as_str().unwrap().to_string());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let full = loop {
        let now = scrape(&s).await;
        if value(&now, "vllm:num_requests_running") == 1.0 && value(&now, "vllm:num_requests_waiting") == 2.0 {
            break now;
        }
        assert!(std::time::Instant::now() < deadline, "never saw one running and two waiting:\n{now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(full.lines().any(|l| l == "spindle_queue_depth 2"), "{full}");
    for id in &ids {
        common::http().post(format!("{}/v1/responses/{id}/cancel", s.base)).send().await.unwrap();
    }
    common::assert_blocks_freed(&s, 5, "after the cancels").await;
    let after = scrape(&s).await;
    assert_eq!((value(&after, "vllm:num_requests_running"), value(&after, "vllm:num_requests_waiting")), (0.0, 0.0), "{after}");
}
