//! Stored responses: the persistence behind `store: true`, `previous_response_id`,
//! `background: true`, GET/DELETE `/v1/responses/{id}`, `/cancel`, `/input_items` and
//! stream replay (`GET ?stream=true&starting_after=N`).
//!
//! Records are typed (the [`ResponseObject`] and its [`InputItem`]s); the backends turn them into
//! JSON only where they write them. Stream events are kept as the JSON that was streamed (a replay
//! sends them back byte for byte). Two backends implement [`ResponseStore`]:
//!
//! - [`SqliteStore`]: embedded SQLite in WAL mode, the default (`--store-path`). Every write is one
//!   transaction; a committed write survives `kill -9` of the daemon (see [`sqlite`]).
//! - [`MemoryStore`]: a bounded in-process map, for deployments that never persist and for tests.
//!
//! Both keep the store bounded: a TTL ([`ResponseStore::expire`], called periodically by the
//! server) and a size cap (rows and bytes) enforced on every [`ResponseStore::put`], evicting the
//! oldest *finished* responses first and never a `queued`/`in_progress` one.

pub mod memory;
mod memory_tasks;
pub mod owned;
pub mod sqlite;
mod sqlite_tasks;
pub mod tasks;

use std::str::FromStr;
use std::time::Duration;


use crate::protocol::error::ResponseError;
use crate::protocol::events::ResponseEvent;
use crate::protocol::{InputItem, ResponseObject, ResponseStatus, StreamEvent};
pub use memory::MemoryStore;
pub use owned::Owned;
pub use sqlite::SqliteStore;
pub use tasks::{TaskEvent, TaskRecord, TaskStore};

/// How deep [`ResponseStore::chain`] follows `previous_response_id` links before giving up.
pub const MAX_CHAIN_DEPTH: usize = 1000;

/// Status a response has before the scheduler picks it up (background mode).
pub const STATUS_QUEUED: &str = "queued";
/// Status a response has while it is being generated.
pub const STATUS_IN_PROGRESS: &str = "in_progress";
/// Status set by [`ResponseStore::mark_unfinished_failed`] and on generation failure.
pub const STATUS_FAILED: &str = "failed";

/// Whether `status` means the response is still running (`queued` or `in_progress`).
///
/// Unfinished responses are never evicted by the size cap or expired by the TTL, and are the
/// ones [`ResponseStore::mark_unfinished_failed`] fails at daemon start.
pub fn is_unfinished_status(status: &str) -> bool {
    status == STATUS_QUEUED || status == STATUS_IN_PROGRESS
}

/// The `error` put on responses that were still running when the daemon stopped.
pub fn restart_error() -> ResponseError {
    ResponseError {
        code: "server_error".to_owned(),
        message: "The server restarted before this response finished; it was marked failed.".to_owned(),
    }
}

/// Marks a response object `failed` with [`restart_error`]. Used by both
/// backends' [`ResponseStore::mark_unfinished_failed`].
pub fn fail_for_restart(response: &mut ResponseObject) {
    response.status = ResponseStatus::Failed;
    response.error = Some(restart_error());
}

/// The terminal stream event appended to a failed-at-restart response's stored events, so that a
/// replay (`GET ?stream=true`) ends with a terminal event instead of hanging.
///
/// `sequence_number` is `next_seq` (one past the last stored event).
pub fn restart_failed_event(response: &ResponseObject, next_seq: u64) -> StreamEvent {
    StreamEvent::Failed(ResponseEvent { sequence_number: next_seq, response: Box::new(response.clone()) })
}

/// One stored response: the full response object plus what the endpoints need to find it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The response id (`resp_...`), the key.
    pub id: String,
    /// Creation time, unix seconds (the response object's `created_at`). TTL and eviction order.
    pub created_at: i64,
    /// `queued`, `in_progress`, `completed`, `failed`, `incomplete`, `cancelled`, ...
    pub status: String,
    /// The response this one continues, if any (`previous_response_id`).
    pub previous_response_id: Option<String>,
    /// Whether it was created with `background: true`.
    pub background: bool,
    /// The full response object (digest §3) as last written.
    pub response: ResponseObject,
    /// This turn's input items, normalized, each with an `id` (oldest first).
    pub input_items: Vec<InputItem>,
    /// The tenant that created it (empty: the anonymous tenant of a server
    /// without keys). Only [`Owned`] views of the same tenant see it.
    pub tenant: String,
}

impl StoredResponse {
    /// The record of `response` as it stands, with this turn's input items.
    pub fn new(response: ResponseObject, input_items: &[InputItem], background: bool, tenant: &str) -> Self {
        Self {
            id: response.id.clone(),
            created_at: response.created_at,
            status: response.status.as_str().to_string(),
            previous_response_id: response.previous_response_id.clone(),
            background,
            response,
            input_items: input_items.to_vec(),
            tenant: tenant.to_string(),
        }
    }

    /// Whether the response is still `queued` or `in_progress`.
    pub fn is_unfinished(&self) -> bool {
        is_unfinished_status(&self.status)
    }
}

/// Listing order for [`ResponseStore::input_items`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// The order the items were given in.
    Asc,
    /// Newest first (the default of OpenAI's `GET /input_items`).
    #[default]
    Desc,
}

impl FromStr for Order {
    type Err = StoreError;

    /// Parses the `order` query parameter: `asc` or `desc`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "asc" => Ok(Order::Asc),
            "desc" => Ok(Order::Desc),
            other => Err(StoreError::Invalid(format!(
                "order must be \"asc\" or \"desc\", got {other:?}"
            ))),
        }
    }
}

/// Bounds of a store: nothing grows without limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// How long a response is kept after its `created_at` ([`ResponseStore::expire`]).
    pub ttl: Duration,
    /// Most responses kept; past it, `put` evicts the oldest finished ones.
    pub max_responses: usize,
    /// Most bytes kept (response JSON + input items + events); past it, `put` evicts the oldest
    /// finished ones.
    pub max_bytes: u64,
}

impl StoreConfig {
    /// A config with the given TTL and row cap, and the default byte cap (1 GiB).
    pub fn new(ttl: Duration, max_responses: usize) -> Self {
        StoreConfig {
            ttl,
            max_responses,
            ..StoreConfig::default()
        }
    }
}

impl Default for StoreConfig {
    /// 30 days, 10 000 responses, 1 GiB.
    fn default() -> Self {
        StoreConfig {
            ttl: Duration::from_secs(30 * 24 * 3600),
            max_responses: 10_000,
            max_bytes: 1 << 30,
        }
    }
}

/// Errors from a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The SQLite library reported an error (I/O, locking, constraint, ...).
    #[error("sqlite: {0}")]
    Sqlite(String),
    /// Stored data could not be decoded, or the schema is not one this build understands.
    #[error("store is corrupt: {0}")]
    Corrupt(String),
    /// The operation needs a response that is not stored (e.g. `append_events`).
    #[error("response {0} is not stored")]
    NotFound(String),
    /// A `previous_response_id` chain has a cycle or is deeper than [`MAX_CHAIN_DEPTH`].
    #[error("previous_response_id chain: {0}")]
    Chain(String),
    /// A caller-supplied value is invalid (e.g. an unknown `order`).
    #[error("invalid: {0}")]
    Invalid(String),
    /// A file-system operation around the database failed (e.g. creating its directory).
    #[error("io: {0}")]
    Io(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(format!("bad JSON: {e}"))
    }
}

/// A store of responses. Object safe: the server holds an `Arc<dyn ResponseStore>`.
///
/// Methods are synchronous. [`MemoryStore`] never blocks for long; [`SqliteStore`] does disk
/// I/O (usually well under a millisecond per call with WAL, but a checkpoint or a busy database
/// can take longer), so async code should call it through `tokio::task::spawn_blocking`.
pub trait ResponseStore: TaskStore + Send + Sync {
    /// Inserts or replaces a response (by `rec.id`): used at creation (`queued`/`in_progress`)
    /// and again on completion. Replaces the input items; keeps stored events. Then enforces the
    /// size cap, evicting the oldest finished responses (never `rec` itself, never an unfinished
    /// one).
    fn put(&self, rec: &StoredResponse) -> Result<(), StoreError>;

    /// [`ResponseStore::put`] and [`ResponseStore::append_events`] as one
    /// write: a reader (or a crash) sees both or neither. The default does
    /// them one after the other, for backends without transactions.
    fn put_with_events(&self, rec: &StoredResponse, events: &[StreamEvent]) -> Result<(), StoreError> {
        self.put(rec)?;
        self.append_events(&rec.id, events)
    }

    /// The stored response with this id, or `None`.
    fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError>;

    /// The tenant that owns the response with this id, or `None` when it is
    /// not stored (a cheaper read than [`ResponseStore::get`]).
    fn tenant_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.get(id)?.map(|r| r.tenant))
    }

    /// Deletes a response with its input items and events. `true` if it existed.
    fn delete(&self, id: &str) -> Result<bool, StoreError>;

    /// A page of a response's input items (`None` if the response is not stored).
    ///
    /// `after` is an item id: the page starts just past it in the requested `order` (an unknown
    /// id gives an empty page). At most `limit` items; ask for `limit + 1` to learn `has_more`.
    fn input_items(
        &self,
        id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Option<Vec<InputItem>>, StoreError>;

    /// Appends stream events to a stored response (for later replay), each keyed by its
    /// `sequence_number` (a repeated number replaces the earlier event). `Err(NotFound)` if the
    /// response is not stored.
    fn append_events(&self, id: &str, events: &[StreamEvent]) -> Result<(), StoreError>;

    /// Stored events in sequence order, only those with `sequence_number > starting_after` when
    /// given. `None` if the response is not stored.
    fn events(
        &self,
        id: &str,
        starting_after: Option<u64>,
    ) -> Result<Option<Vec<StreamEvent>>, StoreError>;

    /// The conversation ending at `id`: follows `previous_response_id` back to the root and
    /// returns the responses oldest first (`id` last).
    ///
    /// `Ok(None)` if `id` or any earlier link is not stored (map to 404
    /// `previous_response_not_found`); `Err(Chain)` on a cycle or past [`MAX_CHAIN_DEPTH`].
    fn chain(&self, id: &str) -> Result<Option<Vec<StoredResponse>>, StoreError>;

    /// At daemon start: every `queued`/`in_progress` response becomes `failed` with
    /// [`restart_error`] (column and response object). A response with stored events also gets a
    /// terminal `response.failed` event ([`restart_failed_event`]). Returns how many changed.
    fn mark_unfinished_failed(&self) -> Result<usize, StoreError>;

    /// Deletes finished responses whose `created_at + ttl <= now` (unix seconds). Returns how many
    /// were deleted. Call it periodically (e.g. once a minute) and at start.
    fn expire(&self, now: i64) -> Result<usize, StoreError>;

    /// How many responses are stored.
    fn len(&self) -> Result<usize, StoreError>;

    /// Whether the store holds no responses.
    fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

/// Follows `previous_response_id` links from `id` using `get`, oldest first. Shared by the
/// backends; `get` reads one record.
pub(crate) fn follow_chain(
    id: &str,
    mut get: impl FnMut(&str) -> Result<Option<StoredResponse>, StoreError>,
) -> Result<Option<Vec<StoredResponse>>, StoreError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut next = Some(id.to_owned());
    while let Some(cur) = next {
        if !seen.insert(cur.clone()) {
            return Err(StoreError::Chain(format!("cycle at {cur}")));
        }
        if out.len() >= MAX_CHAIN_DEPTH {
            return Err(StoreError::Chain(format!(
                "deeper than {MAX_CHAIN_DEPTH} responses"
            )));
        }
        let Some(rec) = get(&cur)? else {
            return Ok(None);
        };
        next = rec.previous_response_id.clone();
        out.push(rec);
    }
    out.reverse();
    Ok(Some(out))
}

/// Serialized size of a value (what the byte cap counts).
pub(crate) fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_string(v).map_or(0, |s| s.len() as u64)
}

/// Serialized size of a record's response and input items (what the byte cap counts).
pub(crate) fn record_len(rec: &StoredResponse) -> u64 {
    json_len(&rec.response) + rec.input_items.iter().map(json_len).sum::<u64>()
}

/// TTL in whole seconds, saturating.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)
}
