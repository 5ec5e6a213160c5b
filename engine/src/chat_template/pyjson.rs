//! JSON the way HF chat templates see it: serde_json values in (keeping key
//! order), Python `json.dumps` text out (the `tojson` filter).

use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// A JSON object that keeps its keys in insertion order (minijinja's own
/// maps are sorted), so `.items()` and `tojson` see the order serde_json has.
#[derive(Debug)]
struct OrderedMap {
    entries: Vec<(String, Value)>,
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.entries
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }
}

/// Converts a serde_json value into a template value.
pub(crate) fn to_value(json: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match json {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        J::Object(map) => Value::from_object(OrderedMap {
            entries: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        }),
    }
}

/// Options of Python's `json.dumps` that HF's `tojson` passes through.
struct Style {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// The `tojson` filter of HF's chat-template environment:
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, all four settable as keyword arguments (or `indent` as
/// the first positional one). Unlike minijinja's built-in filter it does not
/// HTML-escape `<`, `>`, `&` and `'`.
pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(v)?),
        }),
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = Style {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&py_float(f64::try_from(value.clone())?)),
        ValueKind::String | ValueKind::Plain => {
            write_str(out, &value.to_string(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, ('[', ']'), items.len(), |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Map => write_map(out, value, style, depth)?,
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of type {}", value.kind()),
            ))
        }
    }
    Ok(())
}

fn write_map(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    let mut pairs: Vec<(String, Value)> = Vec::new();
    for key in value.try_iter()? {
        let item = value.get_item(&key)?;
        let key = match key.kind() {
            ValueKind::String => key.to_string(),
            ValueKind::None => "null".to_string(),
            ValueKind::Bool | ValueKind::Number => {
                let mut s = String::new();
                write_value(&mut s, &key, style, depth)?;
                s
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
                ))
            }
        };
        pairs.push((key, item));
    }
    if style.sort_keys {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
    }
    write_container(out, style, depth, ('{', '}'), pairs.len(), |out, i| {
        write_str(out, &pairs[i].0, style.ensure_ascii);
        out.push_str(&style.key_sep);
        write_value(out, &pairs[i].1, style, depth + 1)
    })
}

/// Writes `n` items between `open` and `close` the way `json.dumps` lays
/// them out (`[]` when empty; one per line when indenting).
fn write_container<F>(
    out: &mut String,
    style: &Style,
    depth: usize,
    (open, close): (char, char),
    n: usize,
    mut item: F,
) -> Result<(), Error>
where
    F: FnMut(&mut String, usize) -> Result<(), Error>,
{
    out.push(open);
    if n == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    for i in 0..n {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(out, i)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A JSON string literal as Python writes it (`ensure_ascii` escapes every
/// non-ASCII character as `\uXXXX`, using surrogate pairs above U+FFFF).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it: shortest round-trip digits, with an
/// exponent (`1e+16`, `1.5e-05`) outside `1e-4 <= |x| < 1e16`.
pub(crate) fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if x != 0.0 && !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let plain = format!("{x}");
    if plain.contains('.') {
        plain
    } else {
        format!("{plain}.0")
    }
}
