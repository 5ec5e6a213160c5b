//! The daemon's sockets stay its own, against `spindle serve` as a process:
//! a slowloris crowd larger than its file-descriptor limit does not stop
//! `/health` from answering, headers and bodies that trickle in are cut off
//! after their timeouts, and upgraded WebSockets count against
//! `--max-connections` until they close (and close with 1001 when the
//! daemon stops).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// Limits the child to `n` open files, soft and hard (so it cannot raise it).
fn fd_limit(n: u64) -> impl Fn(&mut std::process::Command) {
    move |command| {
        // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit { rlim_cur: n, rlim_max: n };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// GET /health on a fresh connection: its status and how long it took.
fn health(port: u16) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let status = common::daemon::http_get(port, "/health").map(|(status, _)| status);
    (status, started.elapsed())
}

/// Reads until the server closes the connection (or `within` passes):
/// what it sent, and whether it closed in time.
fn read_until_closed(s: TcpStream, within: Duration) -> (String, bool) {
    let (got, closed) = read_bytes_until_closed(s, within);
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// [`read_until_closed`], as raw bytes.
fn read_bytes_until_closed(mut s: TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[test]
fn health_answers_within_a_second_under_a_slowloris_crowd_beyond_the_fd_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = common::daemon::start_daemon_with(&spindle_testenv::smollm2_gguf(), dir.path(), &[], fd_limit(256));
    assert!(daemon.log_text().contains("at most 192 open connections"), "{}", daemon.log_text());
    let mut crowd = Vec::new();
    for _ in 0..300 {
        // Partial headers, never finished.
        if let Ok(mut s) = connect(daemon.port) {
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
            crowd.push(s);
        }
    }
    assert!(crowd.len() >= 250, "only {} of 300 connections opened", crowd.len());
    for attempt in 0..5 {
        let (status, took) = health(daemon.port);
        assert_eq!(status, Some(200), "attempt {attempt}: /health did not answer ({took:?}); log:\n{}", daemon.log_text());
        assert!(took < Duration::from_secs(1), "attempt {attempt}: /health took {took:?}");
    }
    drop(crowd);
    assert!(daemon.child.try_wait().unwrap().is_none(), "the daemon died");
}

#[test]
fn trickled_headers_and_bodies_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--header-read-timeout-s", "2", "--body-read-timeout-s", "2"];
    let daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &args);
    // Headers that never end: the connection is closed.
    let mut headers = connect(daemon.port).unwrap();
    headers.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(headers, Duration::from_secs(20));
    assert!(closed, "a connection with unfinished headers stayed open for 20 s");
    assert!(started.elapsed() >= Duration::from_millis(1500), "closed after {:?}, before the timeout", started.elapsed());
    // A body that never arrives in full: 408 in the protocol's shape.
    let mut body = connect(daemon.port).unwrap();
    body.write_all(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"input\": ").unwrap();
    let (answer, closed) = read_until_closed(body, Duration::from_secs(20));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?} (closed: {closed})");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    // An idle keep-alive connection is closed after the same timeout.
    let mut idle = connect(daemon.port).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let (answer, closed) = read_until_closed(idle, Duration::from_secs(20));
    assert!(answer.starts_with("HTTP/1.1 200") && closed, "{answer:?} (closed: {closed})");
}

/// Opens a WebSocket on `/v1/responses` by hand: the upgrade's status line.
fn open_websocket(port: u16) -> (TcpStream, String) {
    let mut s = connect(port).unwrap();
    s.write_all(
        b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert!(Instant::now() < deadline, "no upgrade answer within 10 s: {:?}", String::from_utf8_lossy(&got));
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!("the upgrade answer ended early ({other:?}): {:?}", String::from_utf8_lossy(&got)),
        }
    }
    let status = String::from_utf8_lossy(&got).lines().next().unwrap_or_default().to_string();
    (s, status)
}

#[test]
fn open_websockets_count_against_max_connections_until_they_close() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &["--max-connections", "3"]);
    // The readiness probe's connection may still hold its place for a
    // moment after the client saw it close: a 503 while filling the cap is
    // retried for up to 2 s.
    let sockets: Vec<TcpStream> = (0..3)
        .map(|i| {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let (s, status) = open_websocket(daemon.port);
                if status.starts_with("HTTP/1.1 503") && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                assert!(status.starts_with("HTTP/1.1 101"), "WebSocket {i}: {status}");
                break s;
            }
        })
        .collect();
    // Three upgraded sockets fill the cap: a fourth connection is told so
    // at once (read before sending anything, so the refusal is not lost to
    // a reset of unread request bytes).
    let (answer, closed) = read_until_closed(connect(daemon.port).unwrap(), Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 503"), "with 3 open WebSockets and --max-connections 3: {answer:?} (closed: {closed}); log:\n{}", daemon.log_text());
    drop(sockets);
    // Closed sockets give their places back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = health(daemon.port);
        if status == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "/health still {status:?} 10 s after the WebSockets closed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stop_signal_closes_open_websockets_with_1001_and_the_daemon_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &[]);
    let (socket, status) = open_websocket(daemon.port);
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(daemon.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let (frames, closed) = read_bytes_until_closed(socket, Duration::from_secs(10));
    // An unmasked close frame (0x88) whose code is 1001 (0x03e9).
    assert!(closed && frames.len() >= 4 && frames[0] == 0x88 && frames[2..4] == [0x03, 0xe9], "frames {frames:?} (closed: {closed})");
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the daemon did not exit within 10 s of SIGTERM with a WebSocket open; log:\n{}", daemon.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}
