//! A persistent pool for the forward pass's parallel regions: one call runs
//! `n` independent tasks on the calling thread and the pool's workers, and
//! returns when all are done.
//!
//! Why not rayon here: in a decode step of 16 sequences, a thread that
//! finished its share of a matrix waited for the other's last task inside
//! rayon's join, fell asleep on a futex and had to be woken (most of ~690
//! context switches a second in a 16-client wave, each a wake-up on the
//! critical path). Here the caller spins until the last task is done, and
//! idle workers spin a little before parking, so back-to-back regions (a
//! step has a few hundred) start without a system call.
//!
//! Each thread claims tasks from its own contiguous share first, then from
//! the others'; tasks must be independent (the results cannot depend on
//! which thread ran a task). A region started from inside a task, or while
//! another thread's region runs, runs on the calling thread alone (so a
//! task that enters rayon, whose job then starts a region, cannot deadlock).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins on the region counter before it parks:
/// longer than the gaps between the regions of one step, short enough to
/// hand the core back between steps.
const SPIN_BEFORE_PARKING: Duration = Duration::from_micros(200);

/// The most contiguous shares a region's tasks are split into (threads
/// beyond it share them).
const MAX_SHARES: usize = 16;

/// One thread's contiguous share of a region's tasks: the next one to
/// claim, and the end (in a cache line of its own).
#[repr(align(64))]
struct Share {
    next: AtomicUsize,
    end: usize,
}

/// One parallel region, on its caller's stack while it runs.
struct Region<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    /// Thread `k` starts with share `k % shares`, then helps with the others.
    shares: [Share; MAX_SHARES],
    used: usize,
    pending: AtomicUsize,
    /// The first panic of a task, raised by the caller once all are done.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<'a> Region<'a> {
    /// `tasks` tasks in `shares` contiguous shares (each thread runs its
    /// own in order first, as rayon's halving did: a thread's rows stay one
    /// stream for the memory prefetchers and the kernels' prefetches).
    fn new(task: &'a (dyn Fn(usize) + Sync), tasks: usize, shares: usize) -> Self {
        let used = shares.clamp(1, MAX_SHARES).min(tasks.max(1));
        let shares = std::array::from_fn(|k| {
            let (start, end) = if k < used { (k * tasks / used, (k + 1) * tasks / used) } else { (0, 0) };
            Share { next: AtomicUsize::new(start), end }
        });
        Self { task, shares, used, pending: AtomicUsize::new(tasks), panic: Mutex::new(None) }
    }

    /// Thread `me`: claims and runs its share's tasks, then the others'.
    fn work(&self, me: usize) {
        for k in 0..self.used {
            let share = &self.shares[(me + k) % self.used];
            loop {
                let i = share.next.fetch_add(1, SeqCst);
                if i >= share.end {
                    break;
                }
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.task)(i))) {
                    self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
                }
                self.pending.fetch_sub(1, SeqCst);
            }
        }
    }
}

/// What the caller and the workers share.
struct Shared {
    /// Incremented when a region is published (or at shutdown).
    epoch: AtomicUsize,
    /// The region being run, null between regions.
    region: AtomicPtr<Region<'static>>,
    /// Workers holding a pointer to the region.
    busy: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// The pool: `threads - 1` workers (the caller is the other thread).
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Serializes regions started by different threads.
    caller: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running a region's task (a region started
    /// from inside one runs inline).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

impl Pool {
    /// A pool that runs regions on `threads` threads (the caller and
    /// `threads - 1` workers).
    pub fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            region: AtomicPtr::new(std::ptr::null_mut()),
            busy: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..threads.max(1))
            .filter_map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new().name(format!("spindle-pool-{i}")).spawn(move || worker(&shared, i)).ok()
            })
            .collect();
        Self { shared, workers, caller: Mutex::new(()) }
    }

    /// Threads a region runs on (the caller included).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(0) .. task(tasks - 1)`, each once, on the caller and the
    /// workers; returns when all have finished. A panic in a task is
    /// raised here once every task has finished.
    pub fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 || self.workers.is_empty() || IN_TASK.get() {
            (0..tasks).for_each(task);
            return;
        }
        let _one_region = match self.caller.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                (0..tasks).for_each(task);
                return;
            }
        };
        let region = Region::new(task, tasks, self.threads());
        let shared = &*self.shared;
        // SAFETY (of the workers' dereference): the pointer is cleared below,
        // and this function waits until no worker holds it, before `region`
        // goes out of scope; the lifetime is erased only for the store.
        shared.region.store(&region as *const Region<'_> as *mut Region<'static>, SeqCst);
        shared.epoch.fetch_add(1, SeqCst);
        if shared.parked.load(SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        IN_TASK.set(true);
        region.work(0);
        IN_TASK.set(false);
        spin_until(|| region.pending.load(SeqCst) == 0);
        shared.region.store(std::ptr::null_mut(), SeqCst);
        spin_until(|| shared.busy.load(SeqCst) == 0);
        if let Some(payload) = region.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(payload);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        self.shared.epoch.fetch_add(1, SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Spins (yielding now and then, in case the thread it waits for was
/// preempted) until `done`.
fn spin_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 12) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Worker `me` (1..): waits for each new region and takes its share of the tasks.
fn worker(shared: &Shared, me: usize) {
    IN_TASK.set(true);
    let mut seen = 0;
    loop {
        seen = wait_for_epoch(shared, seen);
        if shared.shutdown.load(SeqCst) {
            return;
        }
        shared.busy.fetch_add(1, SeqCst);
        let region = shared.region.load(SeqCst);
        // SAFETY: non-null, the region is alive until `busy` drops back
        // (the caller clears the pointer, then waits for `busy` to be 0).
        if let Some(region) = unsafe { region.as_ref() } {
            region.work(me);
        }
        shared.busy.fetch_sub(1, SeqCst);
    }
}

/// Waits (spinning, then parked) until the epoch differs from `seen`; returns it.
fn wait_for_epoch(shared: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let epoch = shared.epoch.load(SeqCst);
        if epoch != seen {
            return epoch;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        if start.elapsed() < SPIN_BEFORE_PARKING {
            continue;
        }
        let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.parked.fetch_add(1, SeqCst);
        while shared.epoch.load(SeqCst) == seen {
            guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        shared.parked.fetch_sub(1, SeqCst);
    }
}

/// Threads for the [`global`] pool, set before its first use (0: the CPUs).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets how many threads the [`global`] pool runs regions on (the
/// server's `--threads`); returns false, changing nothing, once the pool
/// exists.
pub fn set_threads(threads: usize) -> bool {
    THREADS.store(threads.max(1), SeqCst);
    POOL.get().is_none()
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// The process's pool for the CPU backend: [`set_threads`] threads, or as
/// many as the machine has CPUs.
pub fn global() -> &'static Pool {
    POOL.get_or_init(|| {
        let threads = match THREADS.load(SeqCst) {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Pool::new(threads)
    })
}

/// Runs `task(0) .. task(tasks - 1)` on the [`global`] pool.
pub fn run(tasks: usize, task: impl Fn(usize) + Sync) {
    global().run(tasks, &task);
}

/// Runs `task(i, &mut items[i])` for every item on the [`global`] pool.
pub fn for_each_mut<T: Send>(items: &mut [T], task: impl Fn(usize, &mut T) + Sync) {
    let base = ItemsPtr(items.as_mut_ptr());
    run(items.len(), |i| {
        // SAFETY: i < items.len(), and each index is given to exactly one
        // task, so this is the only reference to item i while it runs.
        task(i, unsafe { &mut *base.at(i) })
    });
}

/// A pointer to the items of [`for_each_mut`], shared by its tasks.
struct ItemsPtr<T>(*mut T);

impl<T> ItemsPtr<T> {
    /// Item `i` (a method, so closures capture the whole wrapper).
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

// SAFETY: the tasks touch disjoint items (see `for_each_mut`), which are Send.
unsafe impl<T: Send> Sync for ItemsPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once_in_many_regions_of_every_size() {
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        for tasks in [0usize, 1, 2, 3, 7, 64, 1000] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|i| {
                    counts[i].fetch_add(1, SeqCst);
                });
                assert!(counts.iter().all(|c| c.load(SeqCst) == 1), "{tasks} tasks");
            }
        }
    }

    #[test]
    fn workers_take_tasks_and_wake_after_parking() {
        let pool = Pool::new(2);
        let caller = std::thread::current().id();
        let seen_other = AtomicBool::new(false);
        for round in 0..3 {
            if round > 0 {
                // Longer than the spin: the worker is parked and must be woken.
                std::thread::sleep(SPIN_BEFORE_PARKING * 5);
            }
            // 64 ms of sleeping tasks: the worker gets a core even when
            // other tests keep both busy.
            pool.run(64, &|_| {
                if std::thread::current().id() != caller {
                    seen_other.store(true, SeqCst);
                }
                std::thread::sleep(Duration::from_millis(1));
            });
        }
        assert!(seen_other.load(SeqCst), "the worker never took a task");
    }

    #[test]
    fn for_each_mut_gives_every_item_to_one_task() {
        let mut items: Vec<(usize, u32)> = (0..100).map(|i| (i, 0)).collect();
        for_each_mut(&mut items, |i, item| {
            assert_eq!(item.0, i);
            item.1 += 1;
        });
        assert!(items.iter().all(|&(_, n)| n == 1));
    }

    #[test]
    fn a_region_inside_a_task_runs_inline() {
        let pool = Pool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(8, &|_| {
            pool.run(4, &|_| {
                total.fetch_add(1, SeqCst);
            });
        });
        assert_eq!(total.load(SeqCst), 32);
    }

    #[test]
    fn a_panicking_task_is_raised_after_the_region_and_the_pool_keeps_working() {
        let pool = Pool::new(2);
        let finished = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|i| {
                assert!(i != 5, "task 5 fails");
                finished.fetch_add(1, SeqCst);
            })
        }));
        let payload = result.expect_err("the task's panic is raised by the caller");
        let message = payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied());
        assert_eq!(message, Some("task 5 fails"), "the task's own payload");
        assert_eq!(finished.load(SeqCst), 15, "every other task still ran");
        let after = AtomicUsize::new(0);
        pool.run(16, &|_| {
            after.fetch_add(1, SeqCst);
        });
        assert_eq!(after.load(SeqCst), 16);
    }

    #[test]
    fn regions_from_several_threads_do_not_mix() {
        let pool = Pool::new(2);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..100 {
                        let counts: Vec<AtomicUsize> = (0..33).map(|_| AtomicUsize::new(0)).collect();
                        pool.run(33, &|i| {
                            counts[i].fetch_add(1, SeqCst);
                        });
                        assert!(counts.iter().all(|c| c.load(SeqCst) == 1));
                    }
                });
            }
        });
    }
}
