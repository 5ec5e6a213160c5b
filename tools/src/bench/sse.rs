//! An incremental server-sent-events parser: feed it bytes as they arrive,
//! get each complete event's `data` (multi-line data joined with `\n`).

/// Buffers partial input across chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    data: Vec<String>,
}

/// Largest event accepted (a server that never ends an event can't grow memory without bound).
const MAX_EVENT_BYTES: usize = 16 << 20;

/// The input was not valid SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event grew past [`MAX_EVENT_BYTES`].
    #[error("an SSE event exceeded {MAX_EVENT_BYTES} bytes")]
    TooLarge,
    /// A line was not UTF-8.
    #[error("an SSE line is not valid UTF-8")]
    NotUtf8,
}

impl SseParser {
    /// Feeds `chunk`; returns the data of every event it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, SseError> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(end) = self.buffer[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buffer[start..start + end];
            start += end + 1;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data.push(value.strip_prefix(' ').unwrap_or(value).to_string());
            }
            // `event:`, `id:`, `retry:` and `:` comments carry nothing the client needs.
        }
        self.buffer.drain(..start);
        if self.buffer.len() > MAX_EVENT_BYTES {
            return Err(SseError::TooLarge);
        }
        Ok(events)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_line_endings() {
        let mut p = SseParser::default();
        assert!(p.push(b"event: a\r\ndata: {\"x\"").unwrap().is_empty());
        assert_eq!(p.push(b":1}\r\n\r\n: keep-alive\n\ndata: one\ndata: two\n").unwrap(), vec!["{\"x\":1}"]);
        assert_eq!(p.push(b"\ndata: [DONE]\n\n").unwrap(), vec!["one\ntwo", "[DONE]"]);
    }
}
