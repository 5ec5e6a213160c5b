//! The Open Responses protocol, pure: request validation, input items, the
//! response object, output items, streaming events, errors, and the one
//! state machine ([`ResponseMapper`]) that turns generation output into
//! events and the final response. No HTTP here: statuses are plain `u16`.
//!
//! Layout: [`request`] (validation → [`ValidRequest`]), [`items`] (input
//! items), [`config`] (echoed settings), [`chat`] (items → chat-template
//! messages), [`response`] (the response object), [`output`] (output items),
//! [`events`] (the event enum, the one source of event names), [`error`]
//! ([`ApiError`]), [`mapper`] (the state machine).

pub mod chat;
pub mod config;
pub mod error;
pub mod events;
pub mod items;
pub mod lmsp;
pub mod mapper;
pub mod output;
mod parse;
pub mod request;
pub mod response;

pub use chat::{to_chat_messages, TemplateMessage};
pub use config::{
    FunctionTool, Include, NamedFunction, ReasoningConfig, ReasoningEffort, ReasoningSummary,
    ServiceTier, SpecificToolChoice, StreamOptions, TextConfig, TextFormat, ToolChoice,
    ToolChoiceMode, Truncation, Verbosity,
};
pub use error::{codes, ApiError, ErrorKind, ErrorPayload, ResponseError};
pub use events::{StreamEvent, EVENT_TYPES, SSE_DONE};
pub use items::{
    FunctionOutput, InputContent, InputItem, InputMessage, MessageContent, Phase, Role,
};
pub use mapper::{
    new_call_id, new_id, new_response_id, unix_now, FinishKind, MapperInput, ResponseMapper,
    UsageCounts,
};
pub use output::{ItemStatus, LogProb, OutputContent, OutputItem};
pub use request::{validate, RequestLimits, Sampling, ValidRequest};
pub use response::{ResponseObject, ResponseStatus, Usage};
