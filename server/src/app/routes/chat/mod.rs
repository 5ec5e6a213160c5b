//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's older
//! APIs, which gateways and load generators speak, on the same validator,
//! scheduler, tool-call and reasoning parsers, tenants and limits as
//! `/v1/responses` ([`request`] maps the bodies in, [`response`] maps the
//! output back).

pub mod request;
pub mod response;
pub mod wire;

use crate::app::access::auth::Tenant;
use crate::app::runtime::drive::{drive, Outgoing, Sink, STREAM_BUFFER};
use crate::app::runtime::start::{start_valid, validate_for, StartedTurn, TurnPrompt};
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::request::ValidRequest;
use crate::protocol::ResponseStatus;
use crate::app::http::extract::JsonBody;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use request::{chat_to_responses, ChatBody, ChatExtras, CompletionsBody, Prompt};
use response::{chat_completion, text_completion, Api, ChunkMapper};
use wire::StreamData;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Completions' default `max_tokens` (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// POST /v1/chat/completions
pub async fn chat_completions(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, JsonBody(body): JsonBody<ChatBody>) -> Result<Response, ApiError> {
    let (responses_body, extras) = chat_to_responses(body)?;
    let req = validate_for(&state, responses_body).map_err(|e| e.renamed_param("input", "messages").renamed_param("text.format", "response_format"))?;
    let req = with_extras(&state, req, &extras)?;
    let turn = start_valid(&state, req, TurnPrompt::Chat(None), &tenant).await.map_err(|e| e.renamed_param("input", "messages"))?;
    run(state, turn, Api::Chat, &extras).await
}

/// POST /v1/completions: a raw prompt (text or token ids), no chat template.
pub async fn completions(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, JsonBody(body): JsonBody<serde_json::Value>) -> Result<Response, ApiError> {
    let body = CompletionsBody::parse(body)?;
    body.check_supported()?;
    let prompt = completion_prompt(&state, body.own.prompt.clone())?;
    let (responses_body, mut extras) = chat_to_responses(body.into_chat())?;
    extras.max_tokens = Some(extras.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS));
    let req = with_extras(&state, validate_for(&state, responses_body)?, &extras)?;
    let turn = start_valid(&state, req, TurnPrompt::Raw(prompt), &tenant).await?;
    run(state, turn, Api::Completions, &extras).await
}

/// The prompt's token ids: a string is tokenized (with the model's BOS), a
/// list of ids is taken as it is.
fn completion_prompt(state: &AppState, prompt: Option<Prompt>) -> Result<Vec<u32>, ApiError> {
    let vocab = state.model.tokenizer.vocab_size();
    let in_vocab = |(i, &t): (usize, &i64)| {
        u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
            ApiError::invalid(format!("prompt[{i}]"), format!("Token id {t} is not in the vocabulary (0..{vocab})."))
        })
    };
    let ids = match prompt {
        Some(Prompt::Text(text)) => state.model.tokenizer.encode(&text, true).map_err(|e| ApiError::internal(format!("tokenizer: {e}")))?,
        Some(Prompt::Texts(mut texts)) if texts.len() == 1 => return completion_prompt(state, texts.pop().map(Prompt::Text)),
        Some(Prompt::Texts(_)) => return Err(ApiError::invalid("prompt", "Send one prompt per request: a string or a list of token ids.")),
        Some(Prompt::Ids(ids)) => ids.iter().enumerate().map(in_vocab).collect::<Result<Vec<u32>, _>>()?,
        None => return Err(ApiError::invalid_with_code("prompt", "missing_required_parameter", "Missing required parameter: 'prompt'.")),
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "The prompt is empty."));
    }
    Ok(ids)
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
        if let Some(error) = response.error.as_ref().filter(|_| response.status == ResponseStatus::Failed) {
            return Err(ApiError::model_error(error.message.clone()));
        }
        let body = match api {
            Api::Chat => chat_completion(&response, extras.logprobs),
            Api::Completions => text_completion(&response, extras.logprobs),
        };
        return Ok(Json(body).into_response());
    }
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(drive(state, stream, mapper, Some(Sink::new(tx)), persist));
    let mut chunks = ChunkMapper::new(api, extras.include_usage, extras.logprobs);
    let frames = ReceiverStream::new(rx).filter_map(move |out| match out {
        Outgoing::Event(event) => Some(chunks.push(&event).iter().map(data_frame).collect::<String>()).filter(|text| !text.is_empty()),
        Outgoing::KeepAlive => Some(crate::app::http::sse::KEEP_ALIVE.to_string()),
        Outgoing::Done => Some(crate::app::http::sse::DONE.to_string()),
    });
    Ok(crate::app::http::sse::streamed(frames))
}

/// One `data:` line of the stream.
fn data_frame(data: &StreamData) -> String {
    match serde_json::to_string(data) {
        Ok(json) => format!("data: {json}\n\n"),
        Err(e) => {
            tracing::error!("a chunk could not be serialized: {e}");
            String::new()
        }
    }
}
