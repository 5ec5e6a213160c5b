//! Parsing of the small JSON side files: tokenizer_config.json and generation_config.json.

use serde_json::Value;

use crate::sampling::SamplingParams;

/// Named chat templates from `tokenizer_config.json`'s `chat_template`, which
/// is either one string (named `default`) or a list of `{name, template}`.
pub(super) fn chat_templates(tokenizer_config: &Value) -> Vec<(String, String)> {
    match tokenizer_config.get("chat_template") {
        Some(Value::String(t)) => vec![("default".to_string(), t.clone())],
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|item| {
                let name = item.get("name")?.as_str()?;
                let template = item.get("template")?.as_str()?;
                Some((name.to_string(), template.to_string()))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A special token given either as a plain string or as an AddedToken object
/// `{"content": ..., ...}`; `None` for null or absent.
pub(super) fn token_string(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Token ids given as one integer or a list of integers.
pub(super) fn token_ids(value: Option<&Value>) -> Vec<u32> {
    let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match value {
        Some(Value::Array(list)) => list.iter().filter_map(as_id).collect(),
        Some(v) => as_id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// Sampling defaults a model ships in `generation_config.json`. Absent fields
/// are `None`; HF's own fall-backs (such as `top_k = 50`) are not applied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `do_sample`: `Some(false)` means the model wants greedy decoding.
    pub do_sample: Option<bool>,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_k`.
    pub top_k: Option<usize>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `max_new_tokens`.
    pub max_new_tokens: Option<usize>,
}

impl GenerationDefaults {
    /// Read the recognised fields of a `generation_config.json` value; values
    /// of the wrong JSON type are ignored.
    pub fn from_json(v: &Value) -> Self {
        let f = |key: &str| v.get(key).and_then(Value::as_f64).map(|x| x as f32);
        let u = |key: &str| {
            v.get(key)
                .and_then(Value::as_u64)
                .and_then(|x| usize::try_from(x).ok())
        };
        Self {
            do_sample: v.get("do_sample").and_then(Value::as_bool),
            temperature: f("temperature"),
            top_k: u("top_k"),
            top_p: f("top_p"),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            max_new_tokens: u("max_new_tokens"),
        }
    }

    /// These defaults as [`SamplingParams`] (vLLM-style: the values are used
    /// as given, except that an explicit `do_sample: false` means greedy).
    /// A value that is out of range is skipped, leaving that knob off.
    pub fn sampling_params(&self) -> SamplingParams {
        let mut p = SamplingParams::default();
        let mut set = |apply: &dyn Fn(&mut SamplingParams)| {
            let mut candidate = p.clone();
            apply(&mut candidate);
            if candidate.validate().is_ok() {
                p = candidate;
            }
        };
        if self.do_sample != Some(false) {
            if let Some(t) = self.temperature {
                set(&|p| p.temperature = t);
            }
            if let Some(k) = self.top_k {
                set(&|p| p.top_k = k);
            }
            if let Some(top_p) = self.top_p {
                set(&|p| p.top_p = top_p);
            }
            if let Some(min_p) = self.min_p {
                set(&|p| p.min_p = min_p);
            }
        }
        if let Some(rp) = self.repetition_penalty {
            set(&|p| p.repetition_penalty = rp);
        }
        p
    }
}
