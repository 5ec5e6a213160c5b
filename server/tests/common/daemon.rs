//! `spindle serve` as a child process on a free loopback port, for tests
//! that must go through the binary (its CLI, its model wiring).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the daemon may take to load the model and answer `/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// A running `spindle serve`; killed when dropped.
pub struct Daemon {
    /// The process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// GET `path` on the loopback port; the status code and body, or None if no answer.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// Start `spindle serve` on a free port and wait until `/ready` says 200.
/// Retries on a fresh port if the daemon dies first (the port may have been
/// taken between picking it and binding it).
pub fn start_daemon(model: &Path, dir: &Path, extra_args: &[&str]) -> Daemon {
    start_daemon_with(model, dir, extra_args, |_| {})
}

/// [`start_daemon`] with the command adjusted by `configure` first (e.g. a
/// resource limit for the child).
pub fn start_daemon_with(model: &Path, dir: &Path, extra_args: &[&str], configure: impl Fn(&mut Command)) -> Daemon {
    let mut last_log = String::new();
    for attempt in 0..3 {
        let port = free_port();
        let log = dir.join(format!("daemon-{attempt}.log"));
        let out = std::fs::File::create(&log).expect("daemon log");
        let err = out.try_clone().expect("daemon log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_spindle"));
        configure(&mut command);
        let child = command
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--store-path")
            .arg(dir.join("responses.sqlite3"))
            .args(["--kv-cache-memory-mib", "256"])
            .args(extra_args)
            .env_remove("SPINDLE_API_KEYS")
            .env("SPINDLE_HOME", dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn spindle serve");
        let mut daemon = Daemon { child, port, log };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = daemon.child.try_wait().expect("try_wait") {
                last_log = format!("exited with {status}:\n{}", daemon.log_text());
                break;
            }
            if let Some((200, _)) = http_get(port, "/ready") {
                return daemon;
            }
            assert!(Instant::now() < deadline, "daemon not ready after {READY_TIMEOUT:?}; log:\n{}", daemon.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("spindle serve failed to start three times; last {last_log}");
}

