//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's older
//! APIs, which gateways and load generators speak, on the same validator,
//! scheduler, tool-call and reasoning parsers, tenants and limits as
//! `/v1/responses` ([`request`] maps the bodies in, [`response`] maps the
//! output back).

pub mod request;
pub mod response;

use super::auth::Tenant;
use super::drive::{drive, Sink};
use super::responses::{start_valid, validate_for, StartedTurn, TurnPrompt};
use super::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::request::ValidRequest;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use request::{chat_to_responses, stop_strings, ChatExtras};
use response::{chat_completion, text_completion, Api, ChunkMapper};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Completions' default `max_tokens` (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// POST /v1/chat/completions
pub async fn chat_completions(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(chat_inner(state, body, tenant).await)
}

/// The handler's response, or its error in OpenAI's shape.
fn answer(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn chat_inner(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, tenant: Tenant) -> Result<Response, ApiError> {
    let value = parse_body(&state, body)?;
    let (responses_body, extras) = chat_to_responses(&value)?;
    let req = validate_for(&state, responses_body).map_err(|e| e.renamed_param("input", "messages").renamed_param("text.format", "response_format"))?;
    let req = with_extras(&state, req, &extras)?;
    let turn = start_valid(&state, req, TurnPrompt::Chat(None), &tenant).await.map_err(|e| e.renamed_param("input", "messages"))?;
    run(state, turn, Api::Chat, &extras).await
}

/// POST /v1/completions: a raw prompt (text or token ids), no chat template.
pub async fn completions(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(completions_inner(state, body, tenant).await)
}

async fn completions_inner(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, tenant: Tenant) -> Result<Response, ApiError> {
    let value = parse_body(&state, body)?;
    for (field, why) in [("echo", "echo is not supported"), ("suffix", "suffix is not supported"), ("best_of", "best_of is not supported")] {
        if value.get(field).is_some_and(|v| !v.is_null() && *v != json!(false) && *v != json!(1)) {
            return Err(ApiError::invalid(field, format!("{why}.")));
        }
    }
    let prompt = completion_prompt(&state, value.get("prompt"))?;
    let mut chat_like = value.clone();
    if let Some(o) = chat_like.as_object_mut() {
        o.remove("prompt");
        o.insert("messages".into(), json!([{"role": "user", "content": "(raw completion)"}]));
        if let Some(n) = o.remove("logprobs").filter(|v| !v.is_null()) {
            o.insert("logprobs".into(), json!(true));
            o.insert("top_logprobs".into(), n);
        }
    }
    let (responses_body, mut extras) = chat_to_responses(&chat_like)?;
    extras.max_tokens = Some(extras.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS));
    extras.stop = stop_strings(value.get("stop"))?;
    let req = with_extras(&state, validate_for(&state, responses_body)?, &extras)?;
    let turn = start_valid(&state, req, TurnPrompt::Raw(prompt), &tenant).await?;
    run(state, turn, Api::Completions, &extras).await
}

/// The prompt's token ids: a string is tokenized (with the model's BOS), a
/// list of ids is taken as it is.
fn completion_prompt(state: &AppState, prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let vocab = state.model.tokenizer.vocab_size();
    let ids = match prompt {
        Some(Value::String(text)) => {
            state.model.tokenizer.encode(text, true).map_err(|e| ApiError::internal(format!("tokenizer: {e}")))?
        }
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => return completion_prompt(state, items.first()),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_u64().and_then(|t| u32::try_from(t).ok()).filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid(format!("prompt[{i}]"), format!("Token id {t} is not in the vocabulary (0..{vocab})."))
                })
            })
            .collect::<Result<Vec<u32>, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::invalid("prompt", "Send one prompt per request: a string or a list of token ids.")),
        _ => return Err(ApiError::invalid_with_code("prompt", "missing_required_parameter", "Missing required parameter: 'prompt'.")),
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "The prompt is empty."));
    }
    Ok(ids)
}

fn parse_body(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let body = body.map_err(|_| ApiError::payload_too_large(state.limits.max_body_bytes))?;
    serde_json::from_slice(&body).map_err(ApiError::invalid_json)
}

/// Sets what the Responses fields cannot carry: the token cap (any
/// positive value up to the server's limit) and the stop strings.
fn with_extras(state: &AppState, mut req: ValidRequest, extras: &ChatExtras) -> Result<ValidRequest, ApiError> {
    if let Some(max) = extras.max_tokens {
        if max as usize > state.limits.max_output_tokens {
            return Err(ApiError::invalid("max_tokens", format!("max_tokens is at most {} on this server.", state.limits.max_output_tokens)));
        }
        req.max_output_tokens = Some(max);
    }
    req.stop = extras.stop.clone();
    Ok(req)
}

/// Drives the turn: the final object as JSON, or chunks over SSE.
async fn run(state: Arc<AppState>, turn: StartedTurn, api: Api, extras: &ChatExtras) -> Result<Response, ApiError> {
    let StartedTurn { stream, mapper, persist, .. } = turn;
    if !extras.stream {
        let response = drive(state, stream, mapper, None, persist).await;
        if response["status"] == "failed" {
            return Err(ApiError::model_error(response["error"]["message"].as_str().unwrap_or("generation failed").to_string()));
        }
        let body = match api {
            Api::Chat => chat_completion(&response, extras.logprobs),
            Api::Completions => text_completion(&response, extras.logprobs),
        };
        return Ok(Json(body).into_response());
    }
    let (engine_tx, mut engine_rx) = mpsc::channel::<String>(64);
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(drive(state, stream, mapper, Some(Sink::json(engine_tx)), persist));
    let mut chunks = ChunkMapper::new(api, extras.include_usage, extras.logprobs);
    tokio::spawn(async move {
        while let Some(text) = engine_rx.recv().await {
            let Ok(event) = serde_json::from_str::<Value>(&text) else { continue };
            for chunk in chunks.push(&event) {
                if tx.send(format!("data: {chunk}\n\n")).await.is_err() {
                    return; // the client left: dropping engine_rx stops the generation
                }
            }
        }
        let _ = tx.send(super::sse::DONE.to_string()).await;
    });
    let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>)));
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    Ok(r)
}
