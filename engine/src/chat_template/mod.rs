//! Chat templates rendered with minijinja, HF-compatible.
//!
//! The environment mirrors the one `transformers` renders `chat_template`
//! with: `trim_blocks` and `lstrip_blocks` on, loop controls
//! (`{% break %}`/`{% continue %}`), Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`... via minijinja-contrib's
//! pycompat), a `tojson` filter that writes what Python's `json.dumps` does,
//! and the globals `raise_exception(msg)` and `strftime_now(fmt)`. The
//! `{% generation %}` block transformers adds is accepted and renders its body.
//! Templates see `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, `tools` (none when absent, like HF), `documents` (none) and any
//! extra keyword arguments.

mod pyjson;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Rest;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::error::{EngineError, Result};

/// Name the template is registered under inside its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Marks errors raised by the template's own `raise_exception`.
const RAISED: &str = "\u{1}raise_exception\u{1}";

/// The ChatML template used for models that ship none:
///
/// ```text
/// {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
/// ```
///
/// (the `default_chat_template` transformers used to fall back to).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turn format, for Gemma vocabularies whose file carries no
/// template (the base models): BOS, then `<start_of_turn>user|model`
/// turns; system text is a user turn.
pub const GEMMA_TURN_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = 'user' %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// A compiled chat template plus the BOS/EOS text it is rendered with.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` (a Jinja chat template, e.g. `tokenizer.chat_template`
    /// from a GGUF or `chat_template` from `tokenizer_config.json`).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_err)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", pyjson::tojson);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(template_err)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Another template source (a user's own) rendered with the same BOS/EOS.
    pub fn with_source(&self, source: &str) -> Result<Self> {
        Self::new(source, &self.bos_token, &self.eos_token)
    }

    /// The ChatML default for models without a template ([`CHATML_TEMPLATE`],
    /// rendered with `bos_token = ""` and `eos_token = "<|im_end|>"`):
    ///
    /// ```text
    /// {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
    /// ```
    pub fn chatml_default() -> Self {
        Self::chatml_with_tokens("", "<|im_end|>")
    }

    /// [`CHATML_TEMPLATE`] rendered with this BOS/EOS text.
    pub fn chatml_with_tokens(bos_token: &str, eos_token: &str) -> Self {
        match Self::new(CHATML_TEMPLATE, bos_token, eos_token) {
            Ok(t) => t,
            // The constant is tested to compile; keep a usable value anyway.
            Err(_) => Self {
                env: Environment::new(),
                source: String::new(),
                bos_token: bos_token.to_string(),
                eos_token: eos_token.to_string(),
            },
        }
    }

    /// The Jinja source the template was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the `tools` variable, i.e. renders tool
    /// definitions itself (Qwen, Hermes, Llama 3.1...). Templates without it
    /// (ChatML, SmolLM2) need the server's default tool format.
    pub fn uses_tools(&self) -> bool {
        self.env
            .get_template(TEMPLATE_NAME)
            .is_ok_and(|t| t.undeclared_variables(false).contains("tools"))
    }

    /// Renders the conversation. `messages` are HF-style message objects
    /// (`{"role": ..., "content": ...}`, maybe `tool_calls` etc.); `tools`
    /// are JSON tool definitions.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`ChatTemplate::render`] with extra template variables (HF's
    /// `apply_chat_template(**kwargs)`, e.g. `enable_thinking`). The fixed
    /// variables win over a kwarg of the same name.
    pub fn render_with_kwargs(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, Value> = kwargs
            .iter()
            .map(|(k, v)| (k.clone(), pyjson::to_value(v)))
            .collect();
        let fixed = [
            (
                "messages",
                Value::from(
                    messages
                        .iter()
                        .map(|m| pyjson::to_value(&alias_reasoning(m)))
                        .collect::<Vec<_>>(),
                ),
            ),
            (
                "tools",
                tools.map_or(Value::from(()), |t| {
                    Value::from(t.iter().map(pyjson::to_value).collect::<Vec<_>>())
                }),
            ),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ];
        for (name, value) in fixed {
            ctx.insert(name.to_string(), value);
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_err)?;
        template.render(Value::from(ctx)).map_err(template_err)
    }
}

/// Names a message's reasoning may come under (transformers 5 reads the first).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// As transformers 5 does: a message with reasoning under any of
/// [`REASONING_FIELDS`] gets it as `reasoning_content` and (unless already
/// set) as `thinking` too, so every template finds it.
fn alias_reasoning(message: &serde_json::Value) -> Cow<'_, serde_json::Value> {
    let Some(obj) = message.as_object() else {
        return Cow::Borrowed(message);
    };
    let found = REASONING_FIELDS
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()));
    let Some(reasoning) = found else {
        return Cow::Borrowed(message);
    };
    let mut out = serde_json::Map::new();
    out.insert("thinking".to_string(), reasoning.clone());
    for (k, v) in obj {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".to_string(), reasoning.clone());
    Cow::Owned(serde_json::Value::Object(out))
}

/// `raise_exception(msg)`: aborts rendering with `msg` (HF templates use it
/// to reject unsupported roles or orderings).
fn raise_exception(args: Rest<Value>) -> std::result::Result<Value, Error> {
    let msg = args
        .0
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

/// `strftime_now(fmt)`: the local time formatted with strftime codes.
fn strftime_now(format: &str) -> std::result::Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format `{format}`"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.iter())
    )
    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: format failed"))?;
    Ok(Value::from(out))
}

/// Turns a minijinja error into an engine error; a `raise_exception` message
/// comes out as-is.
fn template_err(err: Error) -> EngineError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = cur {
        if let Some(mj) = e.downcast_ref::<Error>() {
            if let Some(msg) = mj.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return EngineError::Template(msg.to_string());
            }
        }
        cur = e.source();
    }
    EngineError::Template(err.to_string())
}

/// Rewrites transformers' `{% generation %}`/`{% endgeneration %}` tags (which
/// only mark assistant text) to `{% if true %}`/`{% endif %}`, keeping any
/// whitespace-control markers, so minijinja can parse the template.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let trimmed = inner
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        let replacement = match trimmed {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str("{%");
                out.push_str(&inner.replacen(trimmed, r, 1));
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
