//! Streaming a tool call as it is generated: the call's head
//! (`{"name": "f", "arguments": ` or Llama 3's `"parameters"`) names the
//! function as soon as it is complete, and the arguments' JSON is then passed
//! on chunk by chunk until its closing bracket. Under constrained decoding
//! the model writes exactly this head, so calls stream; other spellings go
//! through `ToolCallParser`'s whole-object path.

/// The head's opening, up to the function name.
const NAME_OPEN: &str = "{\"name\": \"";
/// What may follow the name's closing quote.
const ARGS_KEYS: [&str; 2] = [", \"arguments\": ", ", \"parameters\": "];

/// How far `body` matches a streamable call head.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// A head naming a known function, `len` bytes long; the arguments
    /// object starts right after it.
    Complete {
        /// The function.
        name: String,
        /// Bytes of the head.
        len: usize,
    },
    /// `body` could still become a head: wait for more text.
    Partial,
    /// Not a streamable head.
    NoMatch,
}

/// Matches a call head at the start of `body` (see [`Head`]).
pub fn match_head(body: &str, names: &[String]) -> Head {
    let Some(rest) = body.strip_prefix(NAME_OPEN) else {
        return if NAME_OPEN.starts_with(body) { Head::Partial } else { Head::NoMatch };
    };
    let Some(quote) = rest.find('"') else {
        return if names.iter().any(|n| n.starts_with(rest)) { Head::Partial } else { Head::NoMatch };
    };
    let name = &rest[..quote];
    if !names.iter().any(|n| n == name) {
        return Head::NoMatch;
    }
    let after = &rest[quote + 1..];
    for key in ARGS_KEYS {
        if let Some(args) = after.strip_prefix(key) {
            return match args.chars().next() {
                None => Head::Partial,
                Some('{') => Head::Complete { name: name.to_string(), len: body.len() - args.len() },
                Some(_) => Head::NoMatch,
            };
        }
        if key.starts_with(after) {
            return Head::Partial;
        }
    }
    Head::NoMatch
}

/// Finds the end of a JSON object fed in pieces (bracket depth outside strings).
#[derive(Debug, Default, Clone)]
pub struct ArgScanner {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ArgScanner {
    /// Consumes from `text`: `(bytes that belong to the arguments, whether they closed)`.
    pub fn feed(&mut self, text: &str) -> (usize, bool) {
        for (i, b) in text.bytes().enumerate() {
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return (i + 1, true);
                    }
                }
                _ => {}
            }
        }
        (text.len(), false)
    }
}

/// Result of scanning for the end of a JSON object.
pub(crate) enum Scan {
    /// The object (or a mismatched bracket) ends after this many bytes.
    Complete(usize),
    /// More text is needed.
    Incomplete,
}

/// Finds where the JSON value opening `text` (a `{`) closes, by bracket
/// depth outside strings.
pub(crate) fn scan_object(text: &str) -> Scan {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Scan::Complete(i + 1);
                }
            }
            _ => {}
        }
    }
    Scan::Incomplete
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_match_known_names_and_wait_on_prefixes() {
        let names = vec!["get_weather".to_string(), "search".to_string()];
        let full = "{\"name\": \"search\", \"arguments\": {\"q\": 1}}";
        assert_eq!(match_head(full, &names), Head::Complete { name: "search".into(), len: full.find("{\"q").unwrap_or(0) });
        for cut in 1..full.find("{\"q").unwrap_or(0) + 1 {
            assert_eq!(match_head(&full[..cut], &names), Head::Partial, "{:?}", &full[..cut]);
        }
        assert_eq!(match_head("{\"name\": \"other\", \"arguments\": {}", &names), Head::NoMatch);
        assert_eq!(match_head("{\"name\": \"ot", &names), Head::NoMatch);
        assert_eq!(match_head("{\"function\": 1", &names), Head::NoMatch);
        assert_eq!(match_head("{\"name\": \"search\", \"parameters\": {}", &names), Head::Complete { name: "search".into(), len: 33 });
        assert_eq!(match_head("{\"name\": \"search\", \"arguments\": \"x\"", &names), Head::NoMatch);
    }

    #[test]
    fn the_scanner_finds_the_closing_bracket_across_pieces_and_strings() {
        let mut s = ArgScanner::default();
        assert_eq!(s.feed("{\"a\": \"}{\\\""), (11, false));
        assert_eq!(s.feed("\", \"b\": [1, {}]"), (15, false));
        assert_eq!(s.feed("}}\n</tool_call>"), (1, true));
    }
}
