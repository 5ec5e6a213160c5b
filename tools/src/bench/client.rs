//! One streamed request against either API, timed on a monotonic clock.

use super::args::{Api, Args, Header};
use super::diagnose::{describe, hint};
use super::sse::SseParser;
use reqwest::header::{HeaderMap, HeaderValue};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// What one request sends.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Request body without `model`/`stream` (added by [`Client::send`]).
    pub body: Value,
    /// Conversation turn (agent workload), from 0.
    pub turn: Option<usize>,
}

/// Everything measured about one request. Times are milliseconds; `start_ms`
/// is relative to the start of its load level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// When the request was sent.
    pub start_ms: f64,
    /// Time to the first streamed output delta.
    pub ttft_ms: Option<f64>,
    /// Gaps between consecutive output deltas.
    pub itl_ms: Vec<f64>,
    /// Time to the end of the stream.
    pub e2e_ms: f64,
    /// Output tokens (the server's usage; the delta count if it sends none).
    pub output_tokens: u64,
    /// Input tokens (server usage).
    pub input_tokens: u64,
    /// Input tokens served from the prefix cache (server usage).
    pub cached_tokens: u64,
    /// Conversation turn (agent workload).
    pub turn: Option<usize>,
    /// Error kind when the request failed (`http_500`, `timeout`, `connect`, ...).
    pub error: Option<String>,
    /// Microseconds the client spent parsing and bookkeeping this stream.
    pub client_overhead_us: f64,
    /// The response id (responses API), for chaining.
    #[serde(skip)]
    pub response_id: Option<String>,
    /// The assistant text, for resending history (chat API).
    #[serde(skip)]
    pub text: String,
}

impl RequestRecord {
    /// Time per output token after the first: `(e2e − ttft) / (output − 1)`.
    pub fn tpot_ms(&self) -> Option<f64> {
        let ttft = self.ttft_ms?;
        (self.output_tokens > 1).then(|| (self.e2e_ms - ttft) / (self.output_tokens - 1) as f64)
    }
}

/// A client's WebSocket connection.
type WsStream = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One client's connection state (a WebSocket, for `--api websocket`).
#[derive(Default)]
pub struct Session {
    ws: Option<WsStream>,
}

/// How long a finished stream's remaining bytes are read so its connection
/// can go back to the pool (a server that never ends the body costs no more).
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// The longest pool warming waits for its answers (a slow `/models` must
/// not hold up the run).
const WARM_LIMIT: Duration = Duration::from_secs(10);

/// Builds the one HTTP client of a run: rustls for `https://`, `headers` on
/// every request, and a keep-alive pool, or a fresh connection per request
/// when `fresh_connections`.
pub fn http_client(headers: &[Header], fresh_connections: bool) -> anyhow::Result<reqwest::Client> {
    let mut map = HeaderMap::new();
    for h in headers {
        map.append(h.name.clone(), h.value.clone());
    }
    let builder = reqwest::Client::builder().use_rustls_tls().tcp_nodelay(true).default_headers(map);
    let builder = if fresh_connections { builder.pool_max_idle_per_host(0) } else { builder.pool_idle_timeout(Duration::from_secs(60)) };
    Ok(builder.build()?)
}

/// An HTTP client for one target. Clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    url: String,
    api: Api,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    headers: Vec<Header>,
    fresh_connections: bool,
}

impl Client {
    /// For `base_url` (ending in `/v1`, `http://` or `https://`), with a
    /// keep-alive pool and no extra headers.
    pub fn new(base_url: &str, api: Api, model: &str, api_key: Option<String>, timeout: Duration) -> anyhow::Result<Self> {
        check_scheme(base_url)?;
        let path = match api {
            Api::Responses | Api::Websocket => "responses",
            Api::Chat => "chat/completions",
        };
        let base_url = base_url.trim_end_matches('/').to_string();
        let url = format!("{base_url}/{path}");
        let http = http_client(&[], false)?;
        Ok(Self { http, base_url, url, api, model: model.to_string(), api_key, timeout, headers: Vec::new(), fresh_connections: false })
    }

    /// From the flags: `--header`s and `--include-connect-time` too.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        let mut client = Self::new(&args.base_url, args.api, &args.model, args.api_key.clone(), args.timeout())?;
        client.http = http_client(&args.headers, args.include_connect_time)?;
        client.headers = args.headers.clone();
        client.fresh_connections = args.include_connect_time;
        Ok(client)
    }

    /// The API this client speaks.
    pub fn api(&self) -> Api {
        self.api
    }

    /// Opens up to `n` pooled connections (concurrent `GET {base}/models`,
    /// answers ignored) so the level's requests don't pay for connecting.
    /// Does nothing with `--include-connect-time` or over WebSocket (whose
    /// clients connect before their first request's clock starts).
    pub async fn warm_pool(&self, n: usize) {
        if self.fresh_connections || self.api == Api::Websocket {
            return;
        }
        let url = format!("{}/models", self.base_url);
        let gets = (0..n).map(|_| async {
            if let Ok(response) = self.authorized(self.http.get(&url)).send().await {
                let _ = response.bytes().await;
            }
        });
        let _ = tokio::time::timeout(self.timeout.min(WARM_LIMIT), futures_util::future::join_all(gets)).await;
        // A connection rejoins the pool just after its answer is read.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// Like [`Client::send`], reusing `session`'s WebSocket connection (made
    /// on first use, dropped after a failure); HTTP APIs ignore the session.
    pub async fn send_in(&self, session: &mut Session, spec: &RequestSpec, level_start: Instant) -> RequestRecord {
        if self.api == Api::Websocket && !self.fresh_connections && session.ws.is_none() {
            // Connect before the clock starts: TTFT excludes the handshake.
            let start = Instant::now();
            if let Err(kind) = self.connect_ws(session).await {
                let e2e_ms = ms(start.elapsed());
                return RequestRecord { start_ms: ms(start.duration_since(level_start)), turn: spec.turn, e2e_ms, error: Some(kind), ..RequestRecord::default() };
            }
        }
        let start = Instant::now();
        let mut record = RequestRecord { start_ms: ms(start.duration_since(level_start)), turn: spec.turn, ..RequestRecord::default() };
        let outcome = match self.api {
            Api::Websocket => tokio::time::timeout(self.timeout, self.ws_turn(session, spec, start, &mut record)).await.map(|r| r.map(|()| None)),
            Api::Responses | Api::Chat => tokio::time::timeout(self.timeout, self.stream(spec, start, &mut record)).await,
        };
        match outcome {
            Ok(Ok(rest)) => drain(rest).await,
            Ok(Err(kind)) => record.error = Some(kind),
            Err(_) => record.error = Some("timeout".into()),
        }
        if record.error.is_some() {
            session.ws = None;
            record.e2e_ms = ms(start.elapsed());
        }
        record
    }

    /// `--base-url` with `http` → `ws` (`https` → `wss`) and the API path.
    fn ws_url(&self) -> String {
        self.url.replacen("http", "ws", 1)
    }

    /// Opens a WebSocket to the responses endpoint with the run's auth and headers.
    async fn open_ws(&self) -> Result<WsStream, tokio_tungstenite::tungstenite::Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = self.ws_url().into_client_request()?;
        for h in &self.headers {
            request.headers_mut().append(h.name.clone(), h.value.clone());
        }
        if let Some(key) = &self.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|e| tokio_tungstenite::tungstenite::Error::HttpFormat(e.into()))?;
            request.headers_mut().insert("authorization", value);
        }
        Ok(tokio_tungstenite::connect_async(request).await?.0)
    }

    async fn connect_ws(&self, session: &mut Session) -> Result<(), String> {
        let ws = tokio::time::timeout(self.timeout, self.open_ws()).await.map_err(|_| "timeout".to_string())?;
        session.ws = Some(ws.map_err(|_| "connect".to_string())?);
        Ok(())
    }

    async fn ws_turn(&self, session: &mut Session, spec: &RequestSpec, start: Instant, record: &mut RequestRecord) -> Result<(), String> {
        use tokio_tungstenite::tungstenite::Message;
        if session.ws.is_none() {
            self.connect_ws(session).await?;
        }
        let ws = session.ws.as_mut().ok_or("connect")?;
        let mut body = spec.body.clone();
        body["type"] = json!("response.create");
        body["model"] = json!(self.model);
        ws.send(Message::Text(body.to_string().into())).await.map_err(|_| "send".to_string())?;
        let mut state = StreamState::default();
        while let Some(message) = ws.next().await {
            let Message::Text(text) = message.map_err(|_| "stream".to_string())? else { continue };
            let arrived = Instant::now();
            if let Some(envelope) = serde_json::from_str::<Value>(text.as_str()).ok().filter(|v| v["type"] == "error") {
                let code = envelope["error"]["code"].as_str().unwrap_or("unknown");
                return Err(format!("ws_error_{code}"));
            }
            state.handle(Api::Responses, text.as_str(), ms(arrived.duration_since(start)), record)?;
            record.client_overhead_us += arrived.elapsed().as_secs_f64() * 1e6;
            if state.finished {
                state.finish(record, start);
                return Ok(());
            }
        }
        Err("incomplete_stream".into())
    }

    /// Sends `spec`, streams the reply, and measures it; never fails (errors are recorded).
    pub async fn send(&self, spec: &RequestSpec, level_start: Instant) -> RequestRecord {
        self.send_in(&mut Session::default(), spec, level_start).await
    }

    /// POSTs `body`. On a pooled connection, a send that fails without an
    /// answer is tried once more: the server may have closed the idle
    /// connection just as it was reused (servers that end keep-alive after
    /// a few requests, like cpp-httplib's).
    async fn post(&self, body: &Value) -> Result<reqwest::Response, String> {
        let request = || self.authorized(self.http.post(&self.url).json(body)).send();
        let response = match request().await {
            Err(e) if !self.fresh_connections && !e.is_connect() && !e.is_timeout() => request().await,
            other => other,
        };
        let response = response.map_err(|e| if e.is_connect() { "connect".to_string() } else { "send".to_string() })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("http_{}", status.as_u16()));
        }
        Ok(response)
    }

    /// Streams one HTTP request; returns the response, whose rest (after
    /// the terminal event) is to be drained.
    async fn stream(&self, spec: &RequestSpec, start: Instant, record: &mut RequestRecord) -> Result<Option<reqwest::Response>, String> {
        let mut body = spec.body.clone();
        body["model"] = json!(self.model);
        body["stream"] = json!(true);
        if self.api == Api::Chat {
            body["stream_options"] = json!({"include_usage": true});
        }
        let mut response = self.post(&body).await?;
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        while let Some(chunk) = response.chunk().await.map_err(|_| "stream".to_string())? {
            let arrived = Instant::now();
            let events = parser.push(&chunk).map_err(|_| "bad_sse".to_string())?;
            for data in events {
                state.handle(self.api, &data, ms(arrived.duration_since(start)), record)?;
            }
            record.client_overhead_us += arrived.elapsed().as_secs_f64() * 1e6;
            if state.finished {
                state.finish(record, start);
                return Ok(Some(response));
            }
        }
        Err("incomplete_stream".into())
    }
}

/// Reads what is left of a finished response (briefly), so its connection
/// returns to the pool instead of being closed.
async fn drain(response: Option<reqwest::Response>) {
    if let Some(mut response) = response {
        let _ = tokio::time::timeout(DRAIN_GRACE, async { while let Ok(Some(_)) = response.chunk().await {} }).await;
    }
}

fn check_scheme(base_url: &str) -> anyhow::Result<()> {
    if base_url.starts_with("http://") || base_url.starts_with("https://") {
        Ok(())
    } else {
        anyhow::bail!("--base-url must start with http:// or https:// (got `{base_url}`)")
    }
}

/// The model to benchmark when `--model` is left out: the first `id` that
/// `GET {base-url}/models` lists (sent with the run's auth and headers).
pub async fn discover_model(args: &Args) -> anyhow::Result<String> {
    check_scheme(&args.base_url)?;
    let base = args.base_url.trim_end_matches('/');
    let url = format!("{base}/models");
    let mut request = http_client(&args.headers, true)?.get(&url).timeout(args.timeout());
    if let Some(key) = &args.api_key {
        request = request.bearer_auth(key);
    }
    let fail = |kind: &str| anyhow::anyhow!("could not discover a model: GET {url} failed ({}); {} (or pass --model)", describe(kind), models_hint(kind, base));
    let response = request.send().await.map_err(|e| fail(if e.is_connect() { "connect" } else if e.is_timeout() { "timeout" } else { "send" }))?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(&format!("http_{}", status.as_u16())));
    }
    let listing: Value = response.json().await.map_err(|_| fail("bad_json"))?;
    let first = listing["data"].as_array().and_then(|models| models.iter().find_map(|m| m["id"].as_str()));
    first.map(str::to_string).ok_or_else(|| anyhow::anyhow!("could not discover a model: GET {url} listed no models; pass --model"))
}

/// The hint for a failed model query: a 404 most likely means `/v1` is missing.
fn models_hint(kind: &str, base_url: &str) -> String {
    if kind == "http_404" && !base_url.ends_with("/v1") {
        return hint(kind, base_url);
    }
    match kind {
        "http_404" | "bad_json" => "the server does not list its models".to_string(),
        _ => hint(kind, base_url),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Per-stream parsing state.
#[derive(Debug, Default)]
struct StreamState {
    last_delta_ms: Option<f64>,
    deltas: u64,
    finished: bool,
}

impl StreamState {
    /// Records the end of a finished stream: its E2E time, and the delta
    /// count as output tokens when the server reported no usage.
    fn finish(&self, record: &mut RequestRecord, start: Instant) {
        record.e2e_ms = ms(start.elapsed());
        if record.output_tokens == 0 {
            record.output_tokens = self.deltas;
        }
    }

    fn handle(&mut self, api: Api, data: &str, at_ms: f64, record: &mut RequestRecord) -> Result<(), String> {
        if data == "[DONE]" {
            self.finished = true;
            return Ok(());
        }
        let event: Value = serde_json::from_str(data).map_err(|_| "bad_json".to_string())?;
        let delta = match api {
            Api::Responses | Api::Websocket => self.responses_event(&event, record)?,
            Api::Chat => self.chat_chunk(&event, record)?,
        };
        if let Some(text) = delta {
            record.text.push_str(&text);
            match self.last_delta_ms {
                None => record.ttft_ms = Some(at_ms),
                Some(last) => record.itl_ms.push(at_ms - last),
            }
            self.last_delta_ms = Some(at_ms);
            self.deltas += 1;
        }
        Ok(())
    }

    /// Returns the text of an output delta, if `event` is one.
    fn responses_event(&mut self, event: &Value, record: &mut RequestRecord) -> Result<Option<String>, String> {
        match event["type"].as_str().unwrap_or("") {
            "response.output_text.delta" | "response.function_call_arguments.delta" | "response.reasoning.delta" => {
                Ok(Some(event["delta"].as_str().unwrap_or("").to_string()))
            }
            "response.completed" | "response.incomplete" => {
                let response = &event["response"];
                read_usage(&response["usage"], "input_tokens", "output_tokens", "input_tokens_details", record);
                record.response_id = response["id"].as_str().map(str::to_string);
                self.finished = true;
                Ok(None)
            }
            "response.failed" | "error" => Err("server_error".into()),
            _ => Ok(None),
        }
    }

    fn chat_chunk(&mut self, chunk: &Value, record: &mut RequestRecord) -> Result<Option<String>, String> {
        if chunk.get("error").is_some() {
            return Err("server_error".into());
        }
        if chunk["usage"].is_object() {
            read_usage(&chunk["usage"], "prompt_tokens", "completion_tokens", "prompt_tokens_details", record);
        }
        let delta = &chunk["choices"][0]["delta"];
        let mut text = String::new();
        for key in ["content", "reasoning_content"] {
            text.push_str(delta[key].as_str().unwrap_or(""));
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for call in calls {
                text.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        Ok((!text.is_empty()).then_some(text))
    }
}

fn read_usage(usage: &Value, input: &str, output: &str, details: &str, record: &mut RequestRecord) {
    record.input_tokens = usage[input].as_u64().unwrap_or(0);
    record.output_tokens = usage[output].as_u64().unwrap_or(0);
    record.cached_tokens = usage[details]["cached_tokens"].as_u64().unwrap_or(0);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn responses_events_give_deltas_usage_and_end() {
        let mut state = StreamState::default();
        let mut r = RequestRecord::default();
        let delta = r#"{"type":"response.output_text.delta","delta":"Hi"}"#;
        state.handle(Api::Responses, delta, 10.0, &mut r).unwrap();
        state.handle(Api::Responses, delta, 25.0, &mut r).unwrap();
        let done = r#"{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":4}}}}"#;
        state.handle(Api::Responses, done, 26.0, &mut r).unwrap();
        assert!(state.finished);
        assert_eq!((r.ttft_ms, r.itl_ms.clone(), r.text.as_str()), (Some(10.0), vec![15.0], "HiHi"));
        assert_eq!((r.input_tokens, r.output_tokens, r.cached_tokens), (7, 2, 4));
        assert_eq!(r.response_id.as_deref(), Some("resp_1"));
        assert!(state.handle(Api::Responses, r#"{"type":"response.failed"}"#, 30.0, &mut r).is_err());
    }

    /// A listener that reports the first bytes of each connection, then hangs up.
    async fn first_bytes_listener() -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<Vec<u8>>) {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 3];
                let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buf)).await.unwrap_or(Ok(0)).unwrap_or(0);
                let _ = tx.send(buf[..n].to_vec()).await;
            }
        });
        (addr, rx)
    }

    /// A TLS connection opens with a handshake record: 0x16, then version 3.x.
    async fn assert_tls_hello(rx: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) {
        let first = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("no connection within 30 s").expect("listener ended");
        assert_eq!(first.get(..2), Some(&[0x16, 0x03][..]), "not a TLS ClientHello: {first:?} (empty = end of stream)");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn https_and_wss_base_urls_speak_tls() {
        let (addr, mut rx) = first_bytes_listener().await;
        let spec = RequestSpec { body: json!({"input": "hi"}), turn: None };
        let https = Client::new(&format!("https://{addr}/v1"), Api::Responses, "m", None, Duration::from_secs(10)).expect("https client");
        let record = tokio::time::timeout(Duration::from_secs(30), https.send(&spec, Instant::now())).await.expect("deadline");
        assert_tls_hello(&mut rx).await;
        // The handshake failed (the peer hung up): a connect error, not an unsupported scheme.
        assert_eq!(record.error.as_deref(), Some("connect"), "{record:?}");

        let wss = Client::new(&format!("https://{addr}/v1"), Api::Websocket, "m", None, Duration::from_secs(10)).expect("wss client");
        assert_eq!(wss.ws_url(), format!("wss://{addr}/v1/responses"));
        let outcome = tokio::time::timeout(Duration::from_secs(30), wss.open_ws()).await.expect("deadline");
        assert_tls_hello(&mut rx).await;
        let err = outcome.expect_err("the peer hung up");
        assert!(!matches!(err, tokio_tungstenite::tungstenite::Error::Url(_)), "{err:?}");
        assert!(Client::new("127.0.0.1:8080/v1", Api::Chat, "m", None, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn chat_chunks_give_deltas_and_usage() {
        let mut state = StreamState::default();
        let mut r = RequestRecord::default();
        state.handle(Api::Chat, r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, 1.0, &mut r).unwrap();
        state.handle(Api::Chat, r#"{"choices":[{"delta":{"content":"a"}}]}"#, 5.0, &mut r).unwrap();
        state.handle(Api::Chat, r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#, 6.0, &mut r).unwrap();
        state.handle(Api::Chat, "[DONE]", 6.5, &mut r).unwrap();
        assert!(state.finished);
        assert_eq!((r.ttft_ms, r.input_tokens, r.output_tokens), (Some(5.0), 3, 1));
        r.e2e_ms = 11.0;
        r.output_tokens = 3;
        assert_eq!(r.tpot_ms(), Some(3.0));
    }
}
