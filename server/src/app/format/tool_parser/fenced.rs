//! An answer that is exactly one JSON object in a Markdown code fence,
//! ```` ```json {"name": "f", "arguments": {...}} ``` ````, which is how
//! Qwen2.5-Coder calls a tool under `tool_choice: "auto"`. [`match_fenced`]
//! reads the held-back answer and says whether it is still such an answer,
//! no longer one, or (at the end of the output) exactly one; the parser then
//! checks the object's name and its arguments against the tool's schema
//! ([`arguments_fit`]). Anything less certain stays text.

use crate::app::format::tool_stream::{scan_object, Scan};
use serde_json::Value;
use std::ops::Range;

/// The fence's backticks.
const FENCE: &str = "```";

/// What a held-back answer is so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Fenced {
    /// It may still be one fenced JSON object; `object` is the object's
    /// byte range once it has closed (it may be checked early).
    Undecided {
        /// The closed object, when it has closed.
        object: Option<Range<usize>>,
    },
    /// It is not (any more) a fence holding one JSON object.
    NotACall,
    /// The whole output is one fenced JSON object, at this byte range.
    Call {
        /// The object.
        object: Range<usize>,
    },
}

/// Whether `text` could open a fence: a prefix of ```` ``` ```` (after
/// whitespace) that needs more text to tell.
pub fn could_open(text: &str) -> bool {
    let t = text.trim_start();
    !t.is_empty() && FENCE.starts_with(t)
}

/// Whether `text` opens a fence (after whitespace).
pub fn opens(text: &str) -> bool {
    text.trim_start().starts_with(FENCE)
}

/// Matches `text`, the answer so far, against "a fence (no language or
/// `json`), one JSON object, the closing fence, nothing else"; `end` says
/// the output is complete.
pub fn match_fenced(text: &str, end: bool) -> Fenced {
    let undecided = |object| if end { Fenced::NotACall } else { Fenced::Undecided { object } };
    let opened = text.len() - text.trim_start().len();
    let Some(after_ticks) = text[opened..].strip_prefix(FENCE) else {
        return Fenced::NotACall;
    };
    let Some(newline) = after_ticks.find('\n') else {
        let language = after_ticks.trim();
        return if "json".starts_with(&language.to_ascii_lowercase()) { undecided(None) } else { Fenced::NotACall };
    };
    let language = after_ticks[..newline].trim();
    if !(language.is_empty() || language.eq_ignore_ascii_case("json")) {
        return Fenced::NotACall;
    }
    let body = &after_ticks[newline + 1..];
    let object_at = text.len() - body.trim_start().len();
    let object_text = &text[object_at..];
    if object_text.is_empty() {
        return undecided(None);
    }
    if !object_text.starts_with('{') || !may_be_call_object(object_text) {
        return Fenced::NotACall;
    }
    let Scan::Complete(len) = scan_object(object_text) else {
        return undecided(None);
    };
    let object = object_at..object_at + len;
    let rest = text[object.end..].trim_start();
    match rest.strip_prefix(FENCE) {
        Some(after) if after.trim().is_empty() => {
            if end {
                Fenced::Call { object }
            } else {
                Fenced::Undecided { object: Some(object) }
            }
        }
        Some(_) => Fenced::NotACall,
        None if FENCE.starts_with(rest) => undecided(Some(object)),
        None => Fenced::NotACall,
    }
}

/// The keys a call object has; its first key must be one of them.
const CALL_KEYS: [&str; 3] = ["name", "arguments", "parameters"];

/// Whether `object` (an object's text, perhaps unfinished) may still be a
/// call: its first key, as far as written, is one of [`CALL_KEYS`]. Code
/// or data in a fence is told apart at its first key, not at its end.
fn may_be_call_object(object: &str) -> bool {
    let inside = object[1..].trim_start();
    let Some(key) = inside.strip_prefix('"') else {
        return inside.is_empty();
    };
    match key.find('"') {
        Some(close) => CALL_KEYS.contains(&&key[..close]),
        None => CALL_KEYS.iter().any(|k| k.starts_with(key)),
    }
}

/// Whether `arguments` (a JSON object's text) fit `schema`; a schema that
/// does not compile fits nothing (the call is not certain).
pub fn arguments_fit(schema: Option<&Value>, arguments: &str) -> bool {
    let Ok(value) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    match schema {
        None => value.is_object(),
        Some(schema) => jsonschema::validator_for(schema).is_ok_and(|v| v.is_valid(&value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CALL: &str = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n```";

    fn object_of(text: &str) -> Option<&str> {
        match match_fenced(text, true) {
            Fenced::Call { object } => Some(&text[object]),
            _ => None,
        }
    }

    #[test]
    fn a_whole_fenced_object_is_a_call_only_at_the_end() {
        assert_eq!(object_of(CALL), Some("{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}"));
        assert_eq!(object_of(&format!("\n  {CALL}\n")), object_of(CALL), "whitespace around the fence");
        assert_eq!(object_of("```\n{\"name\": \"f\"}\n```"), Some("{\"name\": \"f\"}"), "no language");
        assert_eq!(object_of("```JSON\n{\"name\": \"f\"}```"), Some("{\"name\": \"f\"}"));
        let Fenced::Undecided { object: Some(_) } = match_fenced(CALL, false) else {
            panic!("before the end more text may follow");
        };
    }

    #[test]
    fn every_prefix_of_a_call_is_undecided() {
        for cut in FENCE.len()..CALL.len() {
            let prefix = &CALL[..cut];
            assert!(matches!(match_fenced(prefix, false), Fenced::Undecided { .. }), "{prefix:?}");
            assert_eq!(match_fenced(prefix, true), Fenced::NotACall, "{prefix:?} ended there");
        }
    }

    #[test]
    fn anything_else_is_not_a_call() {
        for text in [
            "```python\nprint(1)\n```",
            "```json\n[1, 2]\n```",
            "```json\n{\"name\": \"f\"}\n```\nThat is the call.",
            "```json\n{\"name\": \"f\"} and more\n```",
            "```json\n{\"name\": \"f\"}\n```\n```json\n{\"name\": \"g\"}\n```",
            "Here: ```json\n{\"name\": \"f\"}\n```",
        ] {
            assert!(object_of(text).is_none(), "{text:?}");
        }
        assert_eq!(match_fenced("```py", false), Fenced::NotACall, "a language other than json is known at once");
        assert_eq!(match_fenced("```json\n{\"name\": \"f\"}\n``` x", false), Fenced::NotACall);
    }

    #[test]
    fn an_object_is_given_up_at_its_first_key_when_no_call_has_it() {
        assert_eq!(match_fenced("```json\n{\n  \"user\": {\"id\": 1,", false), Fenced::NotACall, "data, not a call: streams at once");
        assert_eq!(match_fenced("```json\n{\"na", false), Fenced::Undecided { object: None });
        assert_eq!(match_fenced("```json\n{\n  \"arguments\": {", false), Fenced::Undecided { object: None });
        assert_eq!(match_fenced("```json\n{ ", false), Fenced::Undecided { object: None });
    }

    #[test]
    fn arguments_must_fit_the_schema() {
        let schema = json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false});
        assert!(arguments_fit(Some(&schema), "{\"location\": \"Paris\"}"));
        assert!(!arguments_fit(Some(&schema), "{\"location\": 3}"));
        assert!(!arguments_fit(Some(&schema), "{}"));
        assert!(!arguments_fit(Some(&schema), "{\"location\": \"Paris\", \"unit\": \"C\"}"));
        assert!(arguments_fit(None, "{}"));
        assert!(!arguments_fit(Some(&json!({"type": 12})), "{}"), "a schema that does not compile fits nothing");
    }
}
