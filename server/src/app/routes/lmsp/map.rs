//! Mapping between LMSP 1.0 shapes and the Open Responses engine path:
//! request bodies in (response objects and stream events out are
//! [`crate::protocol::lmsp`]).

use crate::app::http::problem::Problem;
use crate::protocol::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Fields LMSP 1.0 shares with Open Responses, forwarded as sent; anything
/// else (other than `stream`, `response_format` and `extensions`) is ignored.
const FIELDS: &[&str] = &["model", "input", "max_output_tokens", "temperature", "tools", "tool_choice", "store", "previous_response_id"];

/// An LMSP 1.0 request body.
#[derive(Debug, Clone, Deserialize)]
pub struct LmspRequest {
    /// Stream the answer as SSE.
    pub stream: Option<bool>,
    /// Structured output.
    pub response_format: Option<LmspFormat>,
    /// Spindle's extensions.
    pub extensions: Option<Extensions>,
    /// The other fields as sent (the [`FIELDS`] go on to the validator).
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl LmspRequest {
    /// Whether the answer is streamed.
    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }
}

/// LMSP's `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct LmspFormat {
    /// `text` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `{name, schema}` of a `json_schema` format.
    pub json_schema: Option<LmspSchema>,
}

/// `{name, schema}`.
#[derive(Debug, Clone, Deserialize)]
pub struct LmspSchema {
    /// The schema's name.
    pub name: Option<String>,
    /// The JSON Schema.
    pub schema: Option<Map<String, Value>>,
}

/// `extensions`: Spindle's one is `ignore_eos` (generate to the token
/// limit, for load testing); others are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct Extensions {
    /// Keep generating past end-of-sequence.
    pub ignore_eos: Option<bool>,
}

/// The Open Responses create body an LMSP request becomes.
#[derive(Debug, Serialize)]
struct EngineBody {
    #[serde(flatten)]
    fields: Map<String, Value>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextFormat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
}

#[derive(Debug, Serialize)]
struct TextFormat {
    format: SchemaFormat,
}

#[derive(Debug, Serialize)]
struct SchemaFormat {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    schema: Map<String, Value>,
    strict: bool,
}

/// An LMSP request as an Open Responses create body (LMSP's `store`
/// defaults to false). Needs-a-capability-we-lack → 400 `unsupported_capability`.
pub fn request_to_engine(request: &LmspRequest) -> Result<Value, Problem> {
    for required in ["model", "input"] {
        if request.fields.get(required).is_none_or(Value::is_null) {
            return Err(ApiError::invalid(required, format!("Missing required parameter: '{required}'."))
                .with_code("missing_required_parameter")
                .into());
        }
    }
    let mut fields: Map<String, Value> = FIELDS.iter().filter_map(|k| request.fields.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect();
    fields.entry("store").or_insert(Value::Bool(false));
    let body = EngineBody {
        fields,
        stream: request.streaming(),
        text: structured_output(request.response_format.as_ref())?.map(|format| TextFormat { format }),
        ignore_eos: request.extensions.as_ref().and_then(|e| e.ignore_eos),
    };
    serde_json::to_value(body).map_err(|e| ApiError::internal(e.to_string()).into())
}

/// LMSP's `response_format` as an Open Responses `text.format` (`None` for
/// text). JSON Schemas are enforced strictly (the structured_output capability).
fn structured_output(format: Option<&LmspFormat>) -> Result<Option<SchemaFormat>, Problem> {
    let Some(format) = format else { return Ok(None) };
    match format.kind.as_deref() {
        None | Some("text") => Ok(None),
        Some("json_schema") => {
            let spec = format.json_schema.as_ref();
            let Some(schema) = spec.and_then(|s| s.schema.clone()) else {
                return Err(ApiError::invalid("response_format.json_schema.schema", "A JSON Schema object is required.").into());
            };
            let name = spec.and_then(|s| s.name.clone()).unwrap_or_else(|| "response".to_owned());
            Ok(Some(SchemaFormat { kind: "json_schema", name, schema, strict: true }))
        }
        Some(other) => Err(ApiError::invalid("response_format.type", format!("Unknown response_format type '{other}'.")).into()),
    }
}


#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request_to_engine(body: &Value) -> Result<Value, Problem> {
        let request: LmspRequest = crate::app::http::extract::from_value(body.clone())?;
        super::request_to_engine(&request)
    }

    #[test]
    fn requests_map_and_capabilities_are_checked() {
        let body = json!({"model": "m", "input": "hi", "response_format": {"type": "text"}, "extensions": {"x": 1}, "foo": 2});
        let mapped = request_to_engine(&body).unwrap();
        assert_eq!(mapped, json!({"model": "m", "input": "hi", "store": false, "stream": false}));
        let schema = json!({"model": "m", "input": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}});
        assert_eq!(request_to_engine(&schema).unwrap()["text"], json!({"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": true}}));
        let no_schema = json!({"model": "m", "input": "hi", "response_format": {"type": "json_schema", "json_schema": {}}});
        assert_eq!(request_to_engine(&no_schema).unwrap_err().0.param.as_deref(), Some("response_format.json_schema.schema"));
        assert_eq!(request_to_engine(&json!({"input": "hi"})).unwrap_err().0.param.as_deref(), Some("model"));
    }
}
