//! What to send: synthetic prompts (to exact token counts when a tokenizer
//! is given), prompts from a JSONL file, and agent conversations.

use super::args::Args;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// One single-turn request's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The user message.
    pub text: String,
    /// Output tokens to ask for.
    pub output_len: usize,
}

/// A small deterministic generator (xorshift64*), for prompts and arrivals.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (0 is remapped so the state never sticks at zero).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `base` varied uniformly by ±`spread` (a fraction), at least 1.
    pub fn around(&mut self, base: usize, spread: f64) -> usize {
        let f = 1.0 + spread.clamp(0.0, 1.0) * (2.0 * self.unit() - 1.0);
        ((base as f64 * f).round() as usize).max(1)
    }
}

const WORDS: &[&str] = &[
    "the", "river", "stone", "market", "quiet", "engine", "light", "garden", "winter", "paper", "signal", "harbor",
    "circle", "orange", "letter", "window", "forest", "number", "silver", "morning", "bridge", "story", "travel",
    "machine", "summer", "ocean", "valley", "music", "teacher", "planet", "yellow", "castle", "doctor", "pencil",
];

/// Builds the prompts of a fixed workload.
pub struct PromptSource {
    rng: Rng,
    tokenizer: Option<tokenizers::Tokenizer>,
    file: Vec<Prompt>,
    next_file: usize,
}

impl PromptSource {
    /// From the flags (loads `--prompts` and `--tokenizer` when given), drawing with `seed`.
    pub fn new(args: &Args, seed: u64) -> Result<Self> {
        let tokenizer = match &args.tokenizer {
            Some(path) => Some(load_tokenizer(path)?),
            None => None,
        };
        let file = match &args.prompts {
            Some(path) => read_prompt_file(path, args.output_len)?,
            None => Vec::new(),
        };
        Ok(Self { rng: Rng::new(seed), tokenizer, file, next_file: 0 })
    }

    /// The next prompt: from the file (cycling) or synthetic.
    pub fn next(&mut self, args: &Args) -> Result<Prompt> {
        let output_len = self.rng.around(args.output_len, args.len_spread);
        if !self.file.is_empty() {
            let p = self.file[self.next_file % self.file.len()].clone();
            self.next_file += 1;
            return Ok(p);
        }
        let input_len = self.rng.around(args.input_len, args.len_spread);
        let text = self.synthetic(input_len)?;
        Ok(Prompt { text, output_len })
    }

    /// A prompt of `tokens` tokens (exactly, with a tokenizer; else ~1 token per word).
    pub fn synthetic(&mut self, tokens: usize) -> Result<String> {
        let mut words: Vec<&str> = (0..tokens).map(|_| WORDS[(self.rng.next_u64() % WORDS.len() as u64) as usize]).collect();
        let Some(tok) = &self.tokenizer else { return Ok(words.join(" ")) };
        // Grow, then trim word by word until the count is exact (or as close as words allow).
        let count = |w: &[&str]| {
            tok.encode(w.join(" "), false).map(|e| e.len()).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))
        };
        while count(&words)? < tokens {
            words.push(WORDS[(self.rng.next_u64() % WORDS.len() as u64) as usize]);
        }
        while words.len() > 1 && count(&words)? > tokens {
            words.pop();
        }
        Ok(words.join(" "))
    }
}

fn load_tokenizer(path: &std::path::Path) -> Result<tokenizers::Tokenizer> {
    let name = path.display();
    if path.extension().is_some_and(|e| e == "json") {
        return tokenizers::Tokenizer::from_file(path).map_err(|e| anyhow::anyhow!("loading {name}: {e}"));
    }
    let gguf = spindle_engine::gguf::GgufFile::open(path).with_context(|| format!("opening {name}"))?;
    let spec = spindle_engine::tokenizer::gguf_tokenizer_spec(&gguf).with_context(|| format!("tokenizer of {name}"))?;
    let tokenizer = spindle_engine::tokenizer::Tokenizer::from_gguf_spec(spec)?;
    Ok(tokenizer.hf().clone())
}

/// Reads JSONL prompts: `{"prompt": "...", "output_len": N?}` per line.
pub fn read_prompt_file(path: &std::path::Path, default_output: usize) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let Some(prompt) = v["prompt"].as_str() else { bail!("{}:{}: no string \"prompt\"", path.display(), i + 1) };
        let output_len = v["output_len"].as_u64().map_or(default_output, |n| n as usize);
        out.push(Prompt { text: prompt.to_string(), output_len });
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

/// The tool list every agent turn carries (unchanged across turns, so the
/// rendered prefix can stay cached).
pub fn agent_tools(api: super::args::Api) -> Value {
    let params = json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]});
    let tools = [("search_docs", "Search the documentation."), ("run_tests", "Run the test suite and report failures.")];
    let list: Vec<Value> = tools
        .iter()
        .map(|(name, description)| match api {
            super::args::Api::Responses | super::args::Api::Websocket => {
                json!({"type": "function", "name": name, "description": description, "parameters": params})
            }
            super::args::Api::Chat => {
                json!({"type": "function", "function": {"name": name, "description": description, "parameters": params}})
            }
        })
        .collect();
    Value::Array(list)
}

/// The system instructions of agent conversations.
pub const AGENT_INSTRUCTIONS: &str =
    "You are a coding agent working in a large repository. Think step by step, use the tools when needed, and keep answers short.";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spreads_lengths() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!((0..5).map(|_| a.next_u64()).collect::<Vec<_>>(), (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        let lens: Vec<usize> = (0..1000).map(|_| a.around(100, 0.5)).collect();
        assert!(lens.iter().all(|&l| (50..=150).contains(&l)));
        assert!(lens.iter().any(|&l| l < 60) && lens.iter().any(|&l| l > 140));
        assert!((0..100).all(|_| a.around(100, 0.0) == 100));
    }
}
