//! Stored responses survive the daemon dying: a child process (this test binary re-executed on
//! the ignored helper test) writes through `SqliteStore` and is killed with SIGKILL mid-stream of
//! writes, or aborts itself; the parent reopens the database and finds every committed record.
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod store_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spindle_server::store::{ResponseStore, SqliteStore};
use store_common::{big, event, rec};

/// Selects the child's behaviour; unset means "not a child" and the helper returns at once.
const ENV_MODE: &str = "SPINDLE_STORE_KILL_MODE";
const ENV_DIR: &str = "SPINDLE_STORE_KILL_DIR";
const HELPER: &str = "kill_child_writer";

/// Child side. Mode `loop`: put records `resp_0, resp_1, ...` with events (every 3rd left
/// `in_progress`), recording the last committed index in `mark` (atomically, by rename) after
/// each commit, until killed (gives up after 60 s). Mode `abort`: put one unfinished background
/// record with events, then `std::process::abort()`.
#[test]
#[ignore = "helper: run in a child process by the kill tests"]
fn kill_child_writer() {
    let (Ok(mode), Ok(dir)) = (std::env::var(ENV_MODE), std::env::var(ENV_DIR)) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let store = SqliteStore::open(dir.join("store.db"), big()).unwrap();
    if mode == "abort" {
        let mut r = rec("resp_bg", 1, "in_progress", None);
        r.background = true;
        store.put(&r).unwrap();
        store
            .append_events("resp_bg", &[event(0, "response.created")])
            .unwrap();
        std::process::abort();
    }
    let start = Instant::now();
    for i in 0i64.. {
        let id = format!("resp_{i}");
        let status = if i % 3 == 0 {
            "in_progress"
        } else {
            "completed"
        };
        store.put(&rec(&id, i, status, None)).unwrap();
        store
            .append_events(&id, &[event(0, "response.created")])
            .unwrap();
        let tmp = dir.join("mark.tmp");
        std::fs::write(&tmp, i.to_string()).unwrap();
        std::fs::rename(&tmp, dir.join("mark")).unwrap();
        if start.elapsed() > Duration::from_secs(60) {
            return;
        }
    }
}

fn spawn_child(mode: &str, dir: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            HELPER,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_MODE, mode)
        .env(ENV_DIR, dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn read_mark(dir: &Path) -> Option<i64> {
    std::fs::read_to_string(dir.join("mark"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
fn survives_sigkill_during_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_child("loop", dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_mark(dir.path()).is_none_or(|m| m < 200) {
        assert!(
            Instant::now() < deadline,
            "child did not write 200 records in time"
        );
        assert!(child.try_wait().unwrap().is_none(), "child exited early");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }
    let last = read_mark(dir.path()).unwrap();
    assert!(
        dir.path().join("store.db-wal").exists(),
        "killed before a clean close"
    );

    let store = SqliteStore::open(dir.path().join("store.db"), big()).unwrap();
    store.integrity_check().unwrap();
    for i in 0..=last {
        let id = format!("resp_{i}");
        let got = store
            .get(&id)
            .unwrap()
            .unwrap_or_else(|| panic!("{id} lost"));
        let status = if i % 3 == 0 {
            "in_progress"
        } else {
            "completed"
        };
        assert_eq!(got, rec(&id, i, status, None));
        assert_eq!(
            store.events(&id, None).unwrap().unwrap(),
            [event(0, "response.created")]
        );
    }
    // the restart path: every unfinished one becomes failed, nothing else changes
    let total = store.len().unwrap();
    let failed = store.mark_unfinished_failed().unwrap();
    let committed_unfinished = usize::try_from(last / 3 + 1).unwrap();
    assert!(
        failed >= committed_unfinished && failed <= total,
        "{failed} of {total}"
    );
    assert_eq!(store.get("resp_0").unwrap().unwrap().status, "failed");
    assert_eq!(store.get("resp_1").unwrap().unwrap().status, "completed");
}

#[test]
fn survives_abort_and_fails_unfinished_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let status = spawn_child("abort", dir.path()).wait().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "child should die of SIGABRT: {status:?}"
        );
    }
    let store = SqliteStore::open(dir.path().join("store.db"), big()).unwrap();
    store.integrity_check().unwrap();
    let before = store.get("resp_bg").unwrap().unwrap();
    assert_eq!(before.status, "in_progress");
    assert!(before.background);
    assert_eq!(store.mark_unfinished_failed().unwrap(), 1);
    let after = store.get("resp_bg").unwrap().unwrap();
    assert_eq!(after.status, "failed");
    assert_eq!(after.response.error.map(|e| e.code).as_deref(), Some("server_error"));
    let events = store.events("resp_bg", None).unwrap().unwrap();
    assert_eq!(events.len(), 2);
    assert!(matches!(events[1], spindle_server::protocol::StreamEvent::Failed(_)), "{:?}", events[1]);
}
