//! Accepting connections within bounds: the daemon's own accept loop over
//! hyper (in place of `axum::serve`), so that no client can hold the server's
//! sockets.
//!
//! - **Header read timeout**: a connection must deliver each request's
//!   headers within [`ConnectionLimits::header_read_timeout`] of waiting for
//!   them, which also closes idle keep-alive connections after that long.
//! - **A cap on open connections**, sized from the process's file-descriptor
//!   limit ([`ConnectionLimits::from_fd_limit`]). At the cap a new connection
//!   evicts the oldest one that has not yet sent a complete request (the
//!   slowloris kind), so a real client such as a health probe still gets in;
//!   when every open connection has sent a request, the newcomer gets a 503
//!   with `Retry-After`.
//! - **Running out of descriptors** (`EMFILE`) evicts the same way instead of
//!   pausing the accept loop.
//!
//! Request bodies are bounded in time by the application
//! ([`crate::app::Limits::body_read_timeout`]).

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// Descriptors kept back from the connection cap for the model files, the
/// store, logs and the like.
const RESERVED_FDS: u64 = 64;
/// The connection cap never goes below this.
const MIN_CONNECTIONS: usize = 16;
/// The body of the 503 a connection refused at the cap gets.
const AT_CAPACITY_BODY: &str = r#"{"error":{"message":"Too many open connections; retry shortly.","type":"server_error","code":"server_busy"}}"#;

/// How the accept loop bounds its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's complete headers (and for the next
    /// request on an idle keep-alive connection).
    pub header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// A cap that leaves [`RESERVED_FDS`] of the process's descriptor limit
    /// (raised to its hard limit first) for everything else.
    pub fn from_fd_limit(header_read_timeout: Duration) -> Self {
        let fds = raise_fd_limit();
        let max_connections = usize::try_from(fds.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX).max(MIN_CONNECTIONS);
        Self { max_connections, header_read_timeout }
    }
}

/// Raises the soft limit on open files to the hard limit; the soft limit in
/// force afterwards.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// One open connection as the registry sees it.
#[derive(Debug, Default)]
struct Tracked {
    /// Set once a request has reached the application.
    served: AtomicBool,
    /// Closes the connection now.
    evict: Notify,
}

/// The open connections, oldest first.
#[derive(Debug, Default)]
struct Registry {
    open: Mutex<(u64, BTreeMap<u64, Arc<Tracked>>)>,
    emptied: Notify,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, (u64, BTreeMap<u64, Arc<Tracked>>)> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection when there is room (evicting the oldest
    /// connection that has not sent a request if needed); `None` when every
    /// open connection is in use.
    fn admit(&self, max: usize) -> Option<(u64, Arc<Tracked>)> {
        let mut open = self.lock();
        if open.1.len() >= max && !Self::evict_oldest_idle(&mut open.1) {
            return None;
        }
        open.0 += 1;
        let id = open.0;
        let tracked = Arc::new(Tracked::default());
        open.1.insert(id, tracked.clone());
        Some((id, tracked))
    }

    /// Evicts the oldest connection that has not sent a request (for
    /// `EMFILE`); whether there was one.
    fn evict_one(&self) -> bool {
        Self::evict_oldest_idle(&mut self.lock().1)
    }

    fn evict_oldest_idle(open: &mut BTreeMap<u64, Arc<Tracked>>) -> bool {
        let Some(id) = open.iter().find(|(_, t)| !t.served.load(Ordering::Acquire)).map(|(&id, _)| id) else {
            return false;
        };
        if let Some(tracked) = open.remove(&id) {
            tracked.evict.notify_one();
        }
        true
    }

    fn remove(&self, id: u64) {
        let mut open = self.lock();
        open.1.remove(&id);
        if open.1.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    fn len(&self) -> usize {
        self.lock().1.len()
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves,
/// then stops accepting, asks every connection to finish its request in
/// flight and waits for them.
pub async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, shutdown: impl Future<Output = ()> + Send) {
    let registry = Arc::new(Registry::default());
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let http = Arc::new(http);
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                accept_failed(&registry, &e).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match registry.admit(limits.max_connections) {
            Some((id, tracked)) => {
                let connection = Connection { id, tracked, registry: registry.clone(), stopping: stopping.clone() };
                tokio::spawn(connection.run(stream, http.clone(), router.clone()));
            }
            None => {
                tokio::spawn(refuse(stream));
            }
        }
    }
    let _ = stop.send(true);
    while registry.len() > 0 {
        let emptied = registry.emptied.notified();
        if registry.len() == 0 {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), emptied).await;
    }
}

/// An accept error: out of descriptors evicts a connection that never sent
/// a request; anything else is logged and retried after a short pause.
async fn accept_failed(registry: &Registry, e: &std::io::Error) {
    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    if out_of_fds && registry.evict_one() {
        tracing::warn!("out of file descriptors: closed the oldest connection that had sent no request");
        tokio::time::sleep(Duration::from_millis(5)).await;
    } else {
        tracing::warn!("accept error: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tells a connection refused at the cap why, and closes it.
async fn refuse(mut stream: TcpStream) {
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{AT_CAPACITY_BODY}",
        AT_CAPACITY_BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(response.as_bytes())).await;
}

/// A connection's place in the registry, freed when the last holder drops
/// it. Every request carries a clone in its extensions, so a handler that
/// takes the connection over (a WebSocket upgrade, which outlives hyper's
/// connection future) keeps it counted against `--max-connections` until
/// the socket closes. Such a handler must close when [`Self::stopping`]
/// turns true: shutdown waits for every slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    id: u64,
    registry: Arc<Registry>,
    stopping: watch::Receiver<bool>,
}

impl ConnectionSlot {
    /// Turns true (or its sender goes away) when the server stops accepting.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.clone()
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// One accepted connection and its place in the registry.
struct Connection {
    id: u64,
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    async fn run(mut self, stream: TcpStream, http: Arc<auto::Builder<TokioExecutor>>, router: Router) {
        let tracked = self.tracked.clone();
        let slot = Arc::new(ConnectionSlot { id: self.id, registry: self.registry.clone(), stopping: self.stopping.clone() });
        let request_slot = slot.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            tracked.served.store(true, Ordering::Release);
            request.extensions_mut().insert(request_slot.clone());
            let mut router = router.clone();
            async move { tower::Service::call(&mut router, request.map(Body::new)).await }
        });
        let conn = http.serve_connection_with_upgrades(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let mut shutting_down = false;
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                () = self.tracked.evict.notified() => break,
                changed = self.stopping.changed(), if !shutting_down => {
                    shutting_down = true;
                    if changed.is_ok() {
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
        drop(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_connection_without_a_request_makes_room() {
        let registry = Registry::default();
        let admitted: Vec<_> = (0..3).filter_map(|_| registry.admit(3)).collect();
        assert_eq!(admitted.len(), 3);
        admitted[0].1.served.store(true, Ordering::Release);
        let fourth = registry.admit(3);
        assert!(fourth.is_some(), "a newcomer gets in at the cap");
        assert_eq!(registry.len(), 3);
        let open: Vec<u64> = registry.lock().1.keys().copied().collect();
        assert!(open.contains(&admitted[0].0), "the connection that sent a request stays");
        assert!(!open.contains(&admitted[1].0), "the oldest idle one was evicted");
        for t in registry.lock().1.values() {
            t.served.store(true, Ordering::Release);
        }
        assert!(registry.admit(3).is_none(), "with every connection in use the newcomer is refused");
    }

    #[test]
    fn the_cap_leaves_room_for_other_descriptors() {
        let limits = ConnectionLimits::from_fd_limit(Duration::from_secs(1));
        assert!(limits.max_connections >= MIN_CONNECTIONS);
    }
}
