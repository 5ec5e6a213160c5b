//! The handle of a running background response: how `/cancel` and DELETE
//! stop it and wait until its final state is written.

use spindle_scheduler::{RequestId, SchedulerHandle};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long `/cancel` and DELETE wait for a stopped response to be written.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// Why a running background response was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `/cancel`: stored as `cancelled` with what it produced.
    Cancelled,
    /// DELETE: not written again.
    Deleted,
}

/// A running background response, as the cancel and delete routes see it.
#[derive(Debug)]
pub struct Background {
    /// The scheduler request.
    pub request: RequestId,
    stopped: AtomicU8,
    finished: watch::Sender<bool>,
}

impl Background {
    /// The handle of a response running as `request`.
    pub fn new(request: RequestId) -> Arc<Self> {
        Arc::new(Self { request, stopped: AtomicU8::new(0), finished: watch::channel(false).0 })
    }

    /// Why it was stopped, if it was.
    pub fn stopped(&self) -> Option<Stopped> {
        match self.stopped.load(Ordering::Acquire) {
            1 => Some(Stopped::Cancelled),
            2 => Some(Stopped::Deleted),
            _ => None,
        }
    }

    /// Stops it (the scheduler request is aborted) and waits, at most
    /// [`STOP_WAIT`], until its final state is written.
    pub async fn stop(&self, scheduler: &SchedulerHandle, how: Stopped) {
        let code = match how {
            Stopped::Cancelled => 1,
            Stopped::Deleted => 2,
        };
        let _ = self.stopped.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        scheduler.abort(self.request);
        let mut finished = self.finished.subscribe();
        let _ = tokio::time::timeout(STOP_WAIT, finished.wait_for(|f| *f)).await;
    }

    /// Marks its final state written (or skipped).
    pub fn finish(&self) {
        self.finished.send_replace(true);
    }
}
