//! `spindle-bench`: a load generator for any Open Responses (`/v1/responses`)
//! or OpenAI-compatible (`/v1/chat/completions`) streaming endpoint, with
//! closed-loop and open-loop load, fixed/synthetic/file/agent workloads,
//! per-request latency records, aggregates with goodput under SLOs, a JSON
//! file of a stable schema, a result file in `vllm bench serve` layout, and
//! a self-contained HTML report with SVG plots.
//!
//! The JSON schema (version 1) is documented in `docs/spindle-bench.md`.

pub mod args;
pub mod client;
pub mod diagnose;
pub mod metrics;
pub mod plots;
pub mod report;
pub mod run;
pub mod sse;
pub mod vllm;
pub mod workload;
