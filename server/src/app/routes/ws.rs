//! The WebSocket transport on `/v1/responses` (digest §7): each turn is a
//! `{"type":"response.create", ...}` message, answered by the same event
//! objects as SSE, one JSON text frame each, exactly one terminal message per
//! turn, at most one response in flight, connection-local continuation for
//! `store: false` chains, and a connection time limit. A
//! `{"type":"response.compact", ...}` message compacts like
//! `POST /v1/responses/compact` (answered by one `response.compaction`
//! message); its output starts a new chain.

use crate::app::access::auth::Tenant;
use crate::app::runtime::drive::{drive, Outgoing, Sink, STREAM_BUFFER};
use crate::app::runtime::start::{start_turn, StartedTurn};
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::{ErrorKind, InputItem, OutputItem, ResponseStatus, StreamEvent};
use crate::net::ConnectionSlot;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use crate::app::http::extract::parse_json;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Responses remembered per connection for `previous_response_id`.
const LOCAL_RESPONSES: usize = 16;
/// How often the server pings an idle connection.
const PING_EVERY: Duration = Duration::from_secs(30);

/// GET /v1/responses with an upgrade: the WebSocket transport.
///
/// The upgraded socket keeps its connection's slot (when served by
/// [`crate::net::serve`]) until it closes, so WebSockets count against
/// `--max-connections` like any other connection; when the server stops, the
/// socket closes with 1001 once its running turn (if any) has ended.
pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    slot: Option<Extension<Arc<ConnectionSlot>>>,
    ws: WebSocketUpgrade,
) -> Response {
    let max = state.limits.max_body_bytes;
    let stopping = slot.as_ref().map(|Extension(slot)| slot.stopping());
    ws.max_message_size(max).max_frame_size(max).on_upgrade(move |socket| async move {
        connection(state, socket, tenant, stopping).await;
        drop(slot);
    })
}

/// The conversations of this connection's recent responses (oldest evicted first).
#[derive(Default)]
struct LocalResponses {
    entries: VecDeque<(String, Vec<InputItem>)>,
}

impl LocalResponses {
    fn get(&self, id: &str) -> Option<Vec<InputItem>> {
        self.entries.iter().find(|(k, _)| k == id).map(|(_, items)| items.clone())
    }

    fn insert(&mut self, id: String, items: Vec<InputItem>) {
        if self.entries.len() >= LOCAL_RESPONSES {
            self.entries.pop_front();
        }
        self.entries.push_back((id, items));
    }

    fn evict(&mut self, id: &str) {
        self.entries.retain(|(k, _)| k != id);
    }
}

/// How a turn ended, for the connection's cache.
struct TurnOutcome {
    id: String,
    /// The whole conversation through this turn, when it succeeded.
    conversation: Option<Vec<InputItem>>,
}

/// The turn in flight on a connection.
struct Running {
    handle: JoinHandle<TurnOutcome>,
    previous: Option<String>,
    /// Set once its terminal event is on the way out.
    ending: Arc<AtomicBool>,
}

/// Updates the connection's memory with a finished turn: remember a success,
/// evict the parent of a failed continuation.
fn settle(local: &mut LocalResponses, previous: Option<String>, outcome: Result<TurnOutcome, tokio::task::JoinError>) {
    match (outcome, previous) {
        (Ok(TurnOutcome { id, conversation: Some(items) }), _) => local.insert(id, items),
        (_, Some(prev)) => local.evict(&prev),
        (_, None) => {}
    }
}

/// The running turn's end (never, when none runs).
async fn finished(running: &mut Option<Running>) -> Result<TurnOutcome, tokio::task::JoinError> {
    match running {
        Some(turn) => (&mut turn.handle).await,
        None => std::future::pending().await,
    }
}

/// Resolves once the server stops (never without a stop signal).
async fn server_stopping(stopping: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match stopping {
        // A dropped sender means the server loop is gone: stopping too.
        Some(rx) => drop(rx.wait_for(|stop| *stop).await),
        None => std::future::pending().await,
    }
}

/// The close frame of a connection the server ends because it shuts down.
fn going_away() -> Message {
    Message::Close(Some(CloseFrame { code: close_code::AWAY, reason: "the server is shutting down".into() }))
}

async fn connection(state: Arc<AppState>, socket: WebSocket, tenant: Tenant, mut stopping: Option<tokio::sync::watch::Receiver<bool>>) {
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (out, mut out_rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            if ws_tx.send(message).await.is_err() {
                break;
            }
        }
        let _ = ws_tx.close().await;
    });
    let limit = tokio::time::sleep(state.limits.websocket_max_connection);
    tokio::pin!(limit);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    let mut local = LocalResponses::default();
    let mut running: Option<Running> = None;
    let mut closing = false;
    loop {
        tokio::select! {
            message = ws_rx.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    if closing {
                        let e = ApiError::new(503, ErrorKind::ServerError, "The server is shutting down; reconnect to continue.").with_code("server_shutting_down");
                        send_error(&out, &e).await;
                        continue;
                    }
                    if let Some(turn) = running.take() {
                        if !turn.ending.load(Ordering::Acquire) {
                            running = Some(turn);
                            let e = ApiError::new(409, ErrorKind::InvalidRequest, "A response is already in progress on this connection; wait for its terminal event or open another connection.")
                                .with_code("response_in_progress");
                            send_error(&out, &e).await;
                            continue;
                        }
                        // Its terminal event is out: let it finish, then take this turn.
                        settle(&mut local, turn.previous, turn.handle.await);
                    }
                    let request: ClientMessage = match parse_json(text.as_bytes()) {
                        Ok(v) => v,
                        Err(e) => {
                            send_error(&out, &e).await;
                            continue;
                        }
                    };
                    let previous = request.previous_response_id.clone();
                    if request.kind == Some(ClientMessageType::Compact) {
                        let history = previous.as_deref().and_then(|id| local.get(id));
                        let ending = Arc::new(AtomicBool::new(false));
                        let handle = tokio::spawn(run_compact(state.clone(), request.into_body(), history, tenant.clone(), out.clone(), ending.clone()));
                        running = Some(Running { handle, previous: None, ending });
                        continue;
                    }
                    match begin(&state, request, &local, &tenant).await {
                        Ok(turn) => {
                            let ending = Arc::new(AtomicBool::new(false));
                            let handle = tokio::spawn(run_turn(state.clone(), turn, out.clone(), ending.clone()));
                            running = Some(Running { handle, previous, ending });
                        }
                        Err(e) => {
                            if let Some(prev) = &previous {
                                local.evict(prev);
                            }
                            send_error(&out, &e).await;
                        }
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    send_error(&out, &ApiError::invalid("type", "Send each response.create as a text message.")).await;
                }
                Some(Ok(_)) => {} // ping/pong (answered by the library)
                Some(Err(e)) => {
                    // A message over the size limit closes with 1009; other
                    // read errors end the connection as a close would.
                    if let Some(close) = close_for(e) {
                        let _ = out.send(close).await;
                    }
                    break;
                }
                None => break, // closed: the running turn is aborted below
            },
            outcome = finished(&mut running), if running.is_some() => {
                let previous = running.take().and_then(|turn| turn.previous);
                settle(&mut local, previous, outcome);
                if closing {
                    let _ = out.send(going_away()).await;
                    break;
                }
            }
            () = server_stopping(&mut stopping), if !closing => {
                // Close now when idle; else once the running turn ends (the
                // drain period ends it at the latest).
                closing = true;
                if running.is_none() {
                    let _ = out.send(going_away()).await;
                    break;
                }
            }
            _ = ping.tick() => {
                if out.send(Message::Ping(Default::default())).await.is_err() {
                    break;
                }
            }
            _ = &mut limit => {
                let e = ApiError::new(400, ErrorKind::InvalidRequest, "The WebSocket connection reached its time limit; reconnect to continue.")
                    .with_code("websocket_connection_limit_reached");
                send_error(&out, &e).await;
                break;
            }
        }
    }
    if let Some(turn) = running {
        // Dropping the turn's event stream aborts generation and frees its blocks.
        turn.handle.abort();
    }
    drop(out);
    let _ = writer.await;
}

/// The close frame that answers a read error: 1009 ("message too big") for a
/// message or frame over the size limit, none for the others.
fn close_for(error: axum::Error) -> Option<Message> {
    let inner = error.into_inner();
    let too_big = matches!(inner.downcast_ref::<tungstenite::Error>(), Some(tungstenite::Error::Capacity(_)));
    too_big.then(|| Message::Close(Some(CloseFrame { code: close_code::SIZE, reason: "message too big".into() })))
}

/// Checks the WebSocket-only rules, then starts the turn with the
/// connection's memory of `previous_response_id` (falling back to the store,
/// which never holds `store: false` responses).
async fn begin(state: &Arc<AppState>, request: ClientMessage, local: &LocalResponses, tenant: &Tenant) -> Result<StartedTurn, ApiError> {
    if request.kind != Some(ClientMessageType::Create) {
        return Err(ApiError::invalid("type", "Expected \"type\": \"response.create\"."));
    }
    for field in ["stream", "stream_options", "background"] {
        if request.body.contains_key(field) {
            return Err(ApiError::invalid(field, format!("'{field}' is not allowed over WebSocket.")));
        }
    }
    let local_history = request.previous_response_id.as_deref().and_then(|id| local.get(id));
    start_turn(state, request.into_body(), local_history, tenant).await
}

/// A client's message: its `type` and the request body.
#[derive(Debug, Deserialize)]
struct ClientMessage {
    #[serde(rename = "type")]
    kind: Option<ClientMessageType>,
    /// The response this one continues.
    previous_response_id: Option<String>,
    #[serde(flatten)]
    body: Map<String, Value>,
}

impl ClientMessage {
    /// The request body without `type` (`previous_response_id` put back).
    fn into_body(mut self) -> Value {
        if let Some(previous) = self.previous_response_id {
            self.body.insert("previous_response_id".to_owned(), previous.into());
        }
        Value::Object(self.body)
    }
}

/// What a client may ask for on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum ClientMessageType {
    /// Start a response (the `/responses` body).
    #[serde(rename = "response.create")]
    Create,
    /// Compact a conversation (the `/responses/compact` body).
    #[serde(rename = "response.compact")]
    Compact,
}

async fn run_turn(state: Arc<AppState>, turn: StartedTurn, out: mpsc::Sender<Message>, ending: Arc<AtomicBool>) -> TurnOutcome {
    let StartedTurn { stream, mapper, persist, id, history, .. } = turn;
    let input_items = persist.input_items.clone();
    let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
    let forward = tokio::spawn(async move {
        while let Some(outgoing) = rx.recv().await {
            let Some(text) = message(outgoing) else { continue };
            if out.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
    });
    let response = drive(state, stream, mapper, Some(Sink::new(tx).with_ending_flag(ending)), persist).await;
    let _ = forward.await;
    let succeeded = matches!(response.status, ResponseStatus::Completed | ResponseStatus::Incomplete);
    let conversation = succeeded.then(|| {
        let mut items = history;
        items.extend(input_items);
        items.extend(response.output.iter().map(OutputItem::to_input));
        items
    });
    TurnOutcome { id, conversation }
}

/// `{"type":"response.compact", ...}` (the `/responses/compact` body): one
/// `response.compaction` message, or an error. A `previous_response_id`
/// resolves from the connection's memory first, so `store: false` chains
/// can be compacted too.
async fn run_compact(
    state: Arc<AppState>,
    body: Value,
    history: Option<Vec<InputItem>>,
    tenant: Tenant,
    out: mpsc::Sender<Message>,
    ending: Arc<AtomicBool>,
) -> TurnOutcome {
    let result = crate::app::routes::compact::compact_value(state, body, history, &tenant).await;
    ending.store(true, Ordering::Release);
    match result {
        Ok(compaction) => {
            let message = WsCompaction { kind: "response.compaction", compaction };
            match serde_json::to_string(&message) {
                Ok(text) => {
                    let _ = out.send(Message::Text(text.into())).await;
                }
                Err(e) => send_error(&out, &ApiError::internal(e.to_string())).await,
            }
        }
        Err(e) => send_error(&out, &e).await,
    }
    TurnOutcome { id: String::new(), conversation: None }
}

/// A compaction as a WebSocket message: the `/compact` answer with a `type`.
#[derive(serde::Serialize)]
struct WsCompaction {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    compaction: crate::app::routes::compact::Compaction,
}

/// What a driven response's [`Outgoing`] is on a WebSocket: one JSON text
/// per event, and exactly one terminal message (a mid-stream failure sends
/// only `response.failed`, whose `error` says why, not the SSE `error`
/// event before it). No keep-alives and no `[DONE]`.
fn message(outgoing: Outgoing) -> Option<String> {
    match outgoing {
        Outgoing::Event(StreamEvent::Error(_)) | Outgoing::KeepAlive | Outgoing::Done => None,
        Outgoing::Event(event) => event.to_json().map_err(|e| tracing::error!("an event could not be serialized: {e}")).ok(),
    }
}

async fn send_error(out: &mpsc::Sender<Message>, e: &ApiError) {
    let _ = out.send(Message::Text(e.to_ws_envelope().to_string().into())).await;
}
