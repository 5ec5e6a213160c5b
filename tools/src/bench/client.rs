//! One streamed request against either API, timed on a monotonic clock.

use super::args::Api;
use super::sse::SseParser;
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

/// One client's connection state (a WebSocket, for `--api websocket`).
#[derive(Default)]
pub struct Session {
    ws: Option<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>>,
}

/// An HTTP client for one target.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    api: Api,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
}

impl Client {
    /// For `base_url` (ending in `/v1`).
    pub fn new(base_url: &str, api: Api, model: &str, api_key: Option<String>, timeout: Duration) -> anyhow::Result<Self> {
        let path = match api {
            Api::Responses | Api::Websocket => "responses",
            Api::Chat => "chat/completions",
        };
        // A fresh connection per request: servers that close keep-alive
        // connections after a few requests (cpp-httplib) would otherwise race
        // the client's reuse and fail requests that never reached them.
        let http = reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(0).build()?;
        let url = format!("{}/{path}", base_url.trim_end_matches('/'));
        Ok(Self { http, url, api, model: model.to_string(), api_key, timeout })
    }

    /// The API this client speaks.
    pub fn api(&self) -> Api {
        self.api
    }

    /// Like [`Client::send`], reusing `session`'s WebSocket connection (made
    /// on first use, dropped after a failure); HTTP APIs ignore the session.
    pub async fn send_in(&self, session: &mut Session, spec: &RequestSpec, level_start: Instant) -> RequestRecord {
        let start = Instant::now();
        let mut record = RequestRecord { start_ms: ms(start.duration_since(level_start)), turn: spec.turn, ..RequestRecord::default() };
        let outcome = match self.api {
            Api::Websocket => tokio::time::timeout(self.timeout, self.ws_turn(session, spec, start, &mut record)).await,
            Api::Responses | Api::Chat => tokio::time::timeout(self.timeout, self.stream(spec, start, &mut record)).await,
        };
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(kind)) => record.error = Some(kind),
            Err(_) => record.error = Some("timeout".into()),
        }
        if record.error.is_some() {
            session.ws = None;
        }
        record.e2e_ms = ms(start.elapsed());
        record
    }

    async fn ws_turn(&self, session: &mut Session, spec: &RequestSpec, start: Instant, record: &mut RequestRecord) -> Result<(), String> {
        use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
        if session.ws.is_none() {
            let url = self.url.replacen("http", "ws", 1);
            let mut request = url.into_client_request().map_err(|_| "connect".to_string())?;
            if let Some(key) = &self.api_key {
                let value = format!("Bearer {key}").parse().map_err(|_| "connect".to_string())?;
                request.headers_mut().insert("authorization", value);
            }
            let (ws, _) = tokio_tungstenite::connect_async(request).await.map_err(|_| "connect".to_string())?;
            session.ws = Some(ws);
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
                if record.output_tokens == 0 {
                    record.output_tokens = state.deltas;
                }
                return Ok(());
            }
        }
        Err("incomplete_stream".into())
    }

    /// Sends `spec`, streams the reply, and measures it; never fails (errors are recorded).
    pub async fn send(&self, spec: &RequestSpec, level_start: Instant) -> RequestRecord {
        self.send_in(&mut Session::default(), spec, level_start).await
    }

    async fn stream(&self, spec: &RequestSpec, start: Instant, record: &mut RequestRecord) -> Result<(), String> {
        let mut body = spec.body.clone();
        body["model"] = json!(self.model);
        body["stream"] = json!(true);
        if self.api == Api::Chat {
            body["stream_options"] = json!({"include_usage": true});
        }
        let mut request = self.http.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| if e.is_connect() { "connect".to_string() } else { "send".to_string() })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("http_{}", status.as_u16()));
        }
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|_| "stream".to_string())?;
            let arrived = Instant::now();
            let events = parser.push(&chunk).map_err(|_| "bad_sse".to_string())?;
            for data in events {
                state.handle(self.api, &data, ms(arrived.duration_since(start)), record)?;
            }
            record.client_overhead_us += arrived.elapsed().as_secs_f64() * 1e6;
            if state.finished {
                break;
            }
        }
        if !state.finished {
            return Err("incomplete_stream".into());
        }
        if record.output_tokens == 0 {
            record.output_tokens = state.deltas;
        }
        Ok(())
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
