//! The step loop's health is visible: the KV gauges describe the empty pool
//! before any request, and an executor that panics ends the step loop in a
//! way the handle reports (`is_running` false, submissions refused, open
//! streams ended) instead of leaving requests waiting forever.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{ForwardBatch, StepOutput};
use spindle_engine::runner::{Executor, KvGeometry};
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle, SubmitError};
use std::time::{Duration, Instant};

/// An executor whose first step panics (a bug in a kernel, say).
struct Panics;

impl Executor for Panics {
    fn execute(&mut self, _batch: &ForwardBatch) -> spindle_engine::Result<StepOutput> {
        panic!("a deliberate panic in the executor");
    }

    fn context_length(&self) -> usize {
        64
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry { block_size: 4, num_blocks: 8, bytes_per_block: 0 }
    }
}

fn request() -> GenerationRequest {
    GenerationRequest {
        prompt: vec![104, 105, 106],
        sampling: SamplingParams::default(),
        stop: StopConditions { max_tokens: 4, ..StopConditions::default() },
        cache_salt: None,
        constraint: None,
    }
}

#[test]
fn a_panicking_step_loop_is_reported_and_refuses_work() {
    let handle = SchedulerHandle::spawn(SchedulerConfig::default(), Panics, toy::toy());
    assert!(handle.is_running());
    let gauges = handle.metrics().snapshot();
    assert_eq!((gauges.blocks_free, gauges.blocks_used), (8, 0), "the gauges describe the pool before the first request");

    let mut stream = handle.submit(request()).expect("submitted while running");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut events = Vec::new();
        while let Some(e) = stream.blocking_recv() {
            events.push(e);
        }
        let _ = tx.send(events);
    });
    let events = rx.recv_timeout(Duration::from_secs(10)).expect("the open stream ends when the step loop dies");
    assert!(!events.iter().any(|e| matches!(e, GenerationEvent::Finished { .. })), "{events:?}");

    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.is_running() {
        assert!(Instant::now() < deadline, "the handle still reports a running step loop");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(handle.submit(request()), Err(SubmitError::ShutDown)), "a dead step loop refuses new work");
}
