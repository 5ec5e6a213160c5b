//! The async facade: a step-loop thread owns all scheduling state; callers
//! talk to it through [`SchedulerHandle`] and read [`EventStream`]s.

use crate::config::{ModelLimits, SchedulerConfig};
use crate::core::Scheduler;
use crate::kv_cache::KvUsage;
use crate::metrics::Metrics;
use crate::request::{GenerationEvent, GenerationRequest};
use crate::sequence::{RequestId, Sequence};
use spindle_engine::runner::Executor;
use spindle_engine::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Why `submit` refused a request.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full; try again later.
    #[error("too many requests: {waiting} already waiting")]
    QueueFull {
        /// The queue limit.
        waiting: usize,
        /// Suggested client back-off.
        retry_after: Duration,
    },
    /// The prompt does not fit the context window (with room for one token).
    #[error("prompt of {len} tokens exceeds the context length of {max}")]
    ContextLengthExceeded {
        /// Prompt tokens.
        len: usize,
        /// Context length.
        max: usize,
    },
    /// The request could never fit in the KV pool, even alone.
    #[error("prompt of {len} tokens needs {needed} KV blocks; the pool has {total}")]
    TooLargeForCache {
        /// Prompt tokens.
        len: usize,
        /// Blocks needed.
        needed: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// The prompt is empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Sampling parameters are out of range.
    #[error("{0}")]
    InvalidSampling(String),
    /// The step loop has stopped.
    #[error("the scheduler has shut down")]
    ShutDown,
}

enum Command {
    Submit(Box<Sequence>),
    Abort(RequestId),
    CheckKv(mpsc::Sender<Result<KvUsage, String>>),
}

/// Cheap to clone; all clones feed the same step loop.
#[derive(Clone)]
pub struct SchedulerHandle {
    commands: mpsc::Sender<Command>,
    /// True while the step loop's thread runs (false once it has ended or panicked).
    alive: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
    config: Arc<SchedulerConfig>,
    limits: ModelLimits,
    tokenizer: Tokenizer,
    metrics: Arc<Metrics>,
}

/// The events of one request. Dropping it aborts the request and frees its
/// KV blocks within one step.
pub struct EventStream {
    id: RequestId,
    events: UnboundedReceiver<GenerationEvent>,
    commands: mpsc::Sender<Command>,
    finished: bool,
}

impl EventStream {
    /// The request's id (for [`SchedulerHandle::abort`]).
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, or `None` after the terminal one.
    pub async fn recv(&mut self) -> Option<GenerationEvent> {
        let event = self.events.recv().await;
        self.note(&event);
        event
    }

    /// Blocking variant for non-async callers (not from inside a runtime).
    pub fn blocking_recv(&mut self) -> Option<GenerationEvent> {
        let event = self.events.blocking_recv();
        self.note(&event);
        event
    }

    fn note(&mut self, event: &Option<GenerationEvent>) {
        if matches!(event, None | Some(GenerationEvent::Finished { .. } | GenerationEvent::Failed { .. })) {
            self.finished = true;
        }
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort(self.id));
        }
    }
}

impl SchedulerHandle {
    /// Start the step loop on its own thread, driving `runner` (whose KV
    /// cache shape and context window the scheduler adopts).
    pub fn spawn(config: SchedulerConfig, runner: impl Executor + 'static, tokenizer: Tokenizer) -> Self {
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let limits = ModelLimits::of(&runner);
        let scheduler = Scheduler::new(config.clone(), limits, metrics.clone());
        let loop_metrics = metrics.clone();
        let alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(alive.clone());
        let largest = LargestStep::of(&config);
        std::thread::Builder::new()
            .name("spindle-step-loop".into())
            .spawn(move || {
                let _guard = guard;
                let mut runner = runner;
                largest.reserve(&mut runner);
                step_loop(scheduler, runner, rx, loop_metrics)
            })
            .map(|_| ())
            .unwrap_or_else(|e| {
                alive.store(false, Ordering::Release);
                tracing::error!("could not start the step loop: {e}");
            });
        Self { commands: tx, alive, next_id: Arc::new(AtomicU64::new(1)), config: Arc::new(config), limits, tokenizer, metrics }
    }

    /// Whether the step loop is running: false once its thread has ended
    /// (or panicked), when no request can be served any more.
    pub fn is_running(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Queue a request; its events arrive on the returned stream.
    pub fn submit(&self, request: GenerationRequest) -> Result<EventStream, SubmitError> {
        self.validate(&request)?;
        if !self.metrics.try_enqueue(self.config.max_waiting) {
            return Err(SubmitError::QueueFull { waiting: self.config.max_waiting, retry_after: Duration::from_secs(1) });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        let seq = Sequence::new(id, request, self.tokenizer.clone(), self.config.model_salt, tx);
        if self.commands.send(Command::Submit(Box::new(seq))).is_err() {
            self.metrics.admitted();
            return Err(SubmitError::ShutDown);
        }
        Ok(EventStream { id, events: rx, commands: self.commands.clone(), finished: false })
    }

    fn validate(&self, request: &GenerationRequest) -> Result<(), SubmitError> {
        let len = request.prompt.len();
        if len == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if len >= self.limits.context_length {
            return Err(SubmitError::ContextLengthExceeded { len, max: self.limits.context_length });
        }
        let needed = (len + 1).div_ceil(self.limits.block_size);
        if needed > self.limits.num_blocks {
            return Err(SubmitError::TooLargeForCache { len, needed, total: self.limits.num_blocks });
        }
        request.sampling.validate().map_err(|e| SubmitError::InvalidSampling(e.to_string()))
    }

    /// Abort a request (its stream ends with `Failed { "aborted" }`).
    pub fn abort(&self, id: RequestId) {
        let _ = self.commands.send(Command::Abort(id));
    }

    /// Ask the step loop to verify the KV cache's invariants (between steps)
    /// and report block usage; for tests and debugging.
    pub fn check_kv(&self) -> Result<KvUsage, String> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::CheckKv(tx)).map_err(|_| "scheduler has shut down".to_string())?;
        rx.recv().map_err(|_| "scheduler has shut down".to_string())?
    }

    /// Live counters and gauges.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The executor's KV cache shape and context window.
    pub fn limits(&self) -> ModelLimits {
        self.limits
    }
}

/// Clears the liveness flag when the step loop's thread ends, by return or by panic.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
        if std::thread::panicking() {
            tracing::error!("the scheduler's step loop panicked: no request can be served until a restart");
        }
    }
}

fn step_loop(mut scheduler: Scheduler, mut runner: impl Executor, rx: mpsc::Receiver<Command>, metrics: Arc<Metrics>) {
    let mut stalled = false;
    loop {
        let cmd = if !scheduler.has_work() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return, // every handle and stream is gone
            }
        } else if stalled {
            // Work exists but nothing could be scheduled: wait for a change
            // (a new request or an abort) instead of spinning.
            rx.recv_timeout(Duration::from_millis(5)).ok()
        } else {
            rx.try_recv().ok()
        };
        if let Some(c) = cmd {
            apply(&mut scheduler, c);
            while let Ok(c) = rx.try_recv() {
                apply(&mut scheduler, c);
            }
        }
        stalled = !run_step(&mut scheduler, &mut runner, &metrics);
    }
}

/// The largest step a configuration allows: its token budget (a step never
/// takes more tokens) and one logits row per sequence (no more than the
/// tokens).
struct LargestStep {
    rows: usize,
    logit_rows: usize,
}

impl LargestStep {
    fn of(config: &SchedulerConfig) -> Self {
        let rows = config.max_num_batched_tokens;
        Self { rows, logit_rows: config.max_num_seqs.min(rows) }
    }

    /// Has the runner set aside what such a step needs before the first
    /// request; an error from the runner only leaves that step to allocate
    /// it later.
    fn reserve(&self, runner: &mut impl Executor) {
        if let Err(e) = runner.reserve(self.rows, self.logit_rows) {
            tracing::warn!("could not set aside the workspace for {}-token steps: {e}", self.rows);
        }
    }
}

fn apply(scheduler: &mut Scheduler, cmd: Command) {
    match cmd {
        Command::Submit(seq) => scheduler.add(*seq),
        Command::Abort(id) => scheduler.abort(id),
        Command::CheckKv(reply) => {
            let _ = reply.send(scheduler.kv().check_invariants().map(|()| scheduler.kv().usage()));
        }
    }
}

/// Tell the executor which sequences' tables to forget.
fn release(scheduler: &mut Scheduler, runner: &mut impl Executor) {
    let released = scheduler.take_released();
    if !released.is_empty() {
        runner.release(&released);
    }
}

/// Run one step; false when nothing could be scheduled.
fn run_step(scheduler: &mut Scheduler, runner: &mut impl Executor, metrics: &Metrics) -> bool {
    let Some(step) = scheduler.schedule() else {
        release(scheduler, runner);
        return false;
    };
    // Before the step: a sequence preempted and re-admitted in this
    // schedule is released first, then sent whole.
    release(scheduler, runner);
    let started = Instant::now();
    match runner.execute(&step.batch) {
        Ok(output) => scheduler.update(&step, output),
        Err(e) => scheduler.fail(&step, &e.to_string()),
    }
    release(scheduler, runner);
    let elapsed = started.elapsed();
    tracing::debug!(
        seqs = step.batch.seqs.len(),
        tokens = step.batch.num_tokens(),
        ms = elapsed.as_secs_f64() * 1e3,
        "step"
    );
    metrics.record_step(elapsed, step.plan.len());
    true
}
