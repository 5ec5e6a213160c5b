//! Preparing one turn: the conversation so far (from `previous_response_id`),
//! the chat-template prompt, truncation, and submission to the scheduler.

use crate::app::access::auth::Tenant;
use crate::app::runtime::state::AppState;
use crate::app::runtime::truncate;
use crate::app::format::tools;
use crate::protocol::error::ApiError;
use crate::protocol::request::ValidRequest;
use crate::protocol::{InputItem, OutputItem, Truncation};
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{EventStream, GenerationRequest, SubmitError};

/// A turn ready to run.
pub struct PreparedTurn {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// The conversation's earlier items (previous turns' inputs and outputs).
    pub history: Vec<InputItem>,
}

/// The conversation before this turn: `local_history` when the caller has
/// it (a WebSocket connection's memory), else [`history`] from the store,
/// off the async threads.
pub async fn resolve_history(
    state: &std::sync::Arc<AppState>,
    previous: Option<String>,
    local_history: Option<Vec<InputItem>>,
    tenant: &Tenant,
) -> Result<Vec<InputItem>, ApiError> {
    if let Some(items) = local_history {
        return Ok(items);
    }
    let (st, tenant) = (state.clone(), tenant.clone());
    tokio::task::spawn_blocking(move || history(&st, previous.as_deref(), &tenant))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

/// Items of every earlier turn, oldest first (only the tenant's own:
/// another tenant's response is not found).
pub fn history(state: &AppState, previous: Option<&str>, tenant: &Tenant) -> Result<Vec<InputItem>, ApiError> {
    let Some(id) = previous else { return Ok(Vec::new()) };
    let chain = crate::store::Owned::new(state.store.as_ref(), tenant.as_str())
        .chain(id)
        .map_err(|e| ApiError::internal(format!("response store: {e}")))?
        .ok_or_else(|| ApiError::previous_response_not_found(id))?;
    let mut items = Vec::new();
    for turn in chain {
        items.extend(turn.input_items);
        items.extend(turn.response.output.iter().map(OutputItem::to_input));
    }
    Ok(items)
}

/// Render and tokenize; with `truncation: auto` drop the oldest history items
/// until the prompt leaves room for at least one output token.
pub fn prepare(state: &AppState, req: &ValidRequest, history: Vec<InputItem>, tenant: &Tenant) -> Result<PreparedTurn, ApiError> {
    check_call_ids(&history, &req.input)?;
    // The prompt must fit the context window and, with room for one output
    // token, the KV pool.
    let limit = state.model.context_length.min(state.scheduler.limits().cache_tokens());
    check_size_before_rendering(state, req, &history, limit)?;
    let parsed = open_compactions(state, &history, "previous_response_id", tenant)?;
    let input = open_compactions(state, &req.input, "input", tenant)?;
    let without = |skip: usize| -> Vec<InputItem> { parsed[skip..].iter().chain(input.iter()).cloned().collect() };
    let fits = |prompt: Vec<u32>| if prompt.len() < limit { Ok(prompt) } else { Err(prompt.len()) };
    let fitting = |skip: usize| -> Result<truncate::Rendered, ApiError> {
        let items = without(skip);
        let prompt = render(state, req, &items, true)?;
        if prompt.len() < limit {
            return Ok(Ok(prompt));
        }
        // The earlier turns' sampled ids can outnumber a re-tokenization.
        Ok(fits(render(state, req, &items, false)?))
    };
    let too_long = match fitting(0)? {
        Ok(prompt) => return Ok(PreparedTurn { prompt, history }),
        Err(len) => len,
    };
    if req.truncation != Truncation::Auto || parsed.is_empty() {
        return Err(ApiError::context_length_exceeded(too_long, limit));
    }
    // `truncation: auto` keeps the longest suffix of the history that fits,
    // steered by what each item adds at least (its text, tokenized once).
    // The search compares re-tokenized prompts (lengths that agree with the
    // bounds); the prompt kept is then the exact one when it fits too.
    let bounds: Vec<usize> = parsed.iter().map(|item| tokens_at_least(state, item)).collect();
    let (dropped, plain) = truncate::drop_oldest_until_fits(&bounds, too_long, limit, |skip| Ok(fits(render(state, req, &without(skip), false)?)))?;
    let exact = render(state, req, &without(dropped), true)?;
    let prompt = if exact.len() < limit { exact } else { plain };
    Ok(PreparedTurn { prompt, history })
}

/// Tokens `item` adds to a prompt at least: its verbatim texts tokenized
/// alone, less one at each edge (where the prompt's tokens may merge across).
fn tokens_at_least(state: &AppState, item: &InputItem) -> usize {
    item.verbatim_texts()
        .into_iter()
        .map(|text| state.model.tokenizer.encode(text, false).map_or(0, |ids| ids.len().saturating_sub(2)))
        .sum()
}

/// Refuses, before anything is rendered or tokenized, a request whose text
/// cannot fit: what the template must write verbatim (the instructions, this
/// input, and the history unless `truncation: auto` may drop it) is at least
/// its bytes over the longest token's bytes in tokens.
fn check_size_before_rendering(state: &AppState, req: &ValidRequest, history: &[InputItem], limit: usize) -> Result<(), ApiError> {
    let mut bytes = req.instructions.as_deref().map_or(0, |t| t.trim().len());
    bytes += req.input.iter().map(InputItem::verbatim_text_len).sum::<usize>();
    if req.truncation != Truncation::Auto {
        bytes += history.iter().map(InputItem::verbatim_text_len).sum::<usize>();
    }
    let at_least = bytes / state.model.max_token_bytes;
    if at_least >= limit {
        let mut error = ApiError::context_length_exceeded(at_least, limit);
        error.message = format!(
            "The input is at least {at_least} tokens, but this model's context window leaves room for at most {limit}. \
             Shorten the input or set truncation to \"auto\"."
        );
        return Err(error);
    }
    Ok(())
}

/// Replaces each `compaction` item with the summary it seals (as a message);
/// one this server did not seal for this model and tenant is a 400 naming
/// the item.
pub fn open_compactions(state: &AppState, items: &[InputItem], param: &str, tenant: &Tenant) -> Result<Vec<InputItem>, ApiError> {
    let context = crate::app::runtime::compaction::seal_context(state, tenant);
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            InputItem::Compaction(c) => {
                let invalid = || {
                    ApiError::invalid(
                        format!("{param}[{i}].encrypted_content"),
                        "The compaction item's encrypted_content was not produced by this server for this model.",
                    )
                };
                let plain = state.sealer.open(&c.encrypted_content, &context).map_err(|_| invalid())?;
                let sealed: crate::app::runtime::compaction::SealedSummary = serde_json::from_slice(&plain).map_err(|_| invalid())?;
                Ok(crate::app::runtime::compaction::summary_message(&sealed.summary))
            }
            other => Ok(other.clone()),
        })
        .collect()
}

/// Every `function_call_output` must answer a `function_call` of this
/// conversation (earlier turns or this input).
fn check_call_ids(history: &[InputItem], input: &[InputItem]) -> Result<(), ApiError> {
    let known: std::collections::HashSet<&str> = history
        .iter()
        .chain(input)
        .filter_map(|i| match i {
            InputItem::FunctionCall(c) => Some(c.call_id.as_str()),
            _ => None,
        })
        .collect();
    for (i, item) in input.iter().enumerate() {
        if let InputItem::FunctionCallOutput(o) = item {
            if !known.contains(o.call_id.as_str()) {
                return Err(ApiError::invalid(
                    format!("input[{i}].call_id"),
                    format!("No tool call found for function call output with call_id '{}'.", o.call_id),
                ));
            }
        }
    }
    Ok(())
}

/// Tools go through the chat template, or the default tool format when the
/// template has none ([`tools::render_prompt`]).
/// With `exact`, the ids extend a recorded earlier turn's ids exactly where
/// the text allows ([`crate::app::format::ledger`]); else the text is tokenized whole.
fn render(state: &AppState, req: &ValidRequest, items: &[InputItem], exact: bool) -> Result<Vec<u32>, ApiError> {
    let text = tools::render_prompt(&state.model.template, req, items)?;
    tracing::debug!(prompt = %text, "rendered the prompt");
    if !exact {
        return state.model.tokenizer.encode(&text, false).map_err(|e| ApiError::internal(format!("tokenizer: {e}")));
    }
    let item_ids: Vec<&str> = req.input.iter().filter_map(InputItem::item_id).collect();
    state
        .model
        .ledger
        .encode(&state.model.tokenizer, &text, req.previous_response_id.as_deref(), &item_ids)
        .map_err(|e| ApiError::internal(format!("tokenizer: {e}")))
}

/// Submit to the scheduler with the request's sampling and limits, its
/// prompt cached under the tenant's salt.
pub fn submit(state: &AppState, req: &ValidRequest, prompt: Vec<u32>, tenant: &Tenant) -> Result<EventStream, ApiError> {
    let s = &req.sampling;
    let sampling = SamplingParams {
        temperature: s.temperature.unwrap_or(1.0) as f32,
        top_p: s.top_p.unwrap_or(1.0) as f32,
        top_k: s.top_k.unwrap_or(0) as usize,
        min_p: s.min_p.unwrap_or(0.0) as f32,
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0) as f32,
        presence_penalty: s.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0) as f32,
        seed: s.seed,
        top_logprobs: s.top_logprobs.unwrap_or(0) as usize,
        logprobs: req.wants_logprobs(),
    };
    // The whole sequence, prompt and output, stays within the served context
    // length (`--max-model-len`); `prepare` left room for one token at least.
    let room = state.model.context_length.saturating_sub(prompt.len()).max(1);
    let max_tokens = req.max_output_tokens.map_or(state.limits.default_output_tokens, |m| m as usize).min(room);
    let constraint = state.model.constraint_for(req, &prompt)?;
    let request = GenerationRequest {
        prompt,
        sampling,
        stop: StopConditions {
            stop_token_ids: if s.ignore_eos { Vec::new() } else { state.model.tokenizer.eos_ids().to_vec() },
            max_tokens,
            stop_strings: req.stop.clone(),
            ..StopConditions::default()
        },
        cache_salt: tenant.cache_salt(req.prompt_cache_key.as_deref()),
        constraint,
    };
    state.scheduler.submit(request).map_err(submit_error)
}

/// Whether the prompt ends inside a reasoning block (R1-style templates end
/// with `<think>` or `<think>\n`): an opening tag among the last few tokens,
/// after any closing one.
pub fn prompt_opens_thinking(state: &AppState, prompt: &[u32]) -> bool {
    state.model.prompt_opens_thinking(prompt)
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { retry_after, .. } => ApiError::too_many_requests(Some(retry_after.as_secs().max(1))),
        SubmitError::ContextLengthExceeded { len, max } => ApiError::context_length_exceeded(len, max),
        SubmitError::TooLargeForCache { .. } => ApiError::invalid("input", e.to_string()),
        SubmitError::EmptyPrompt => ApiError::invalid("input", e.to_string()),
        SubmitError::InvalidSampling(m) => ApiError::invalid("temperature", m),
        SubmitError::ShutDown => ApiError::unavailable("The scheduler is not running; the server cannot generate until it restarts."),
    }
}
