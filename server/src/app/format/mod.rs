//! The model's output formats, independent of the server: tool-call syntax
//! (rendering tools into prompts, parsing calls out of text, streaming their
//! arguments), the grammars that constrain decoding to them, reasoning tags,
//! and the ledger of tokens the model produced.

pub mod constrain;
pub mod ledger;
pub mod reasoning;
pub mod tool_parser;
pub mod tool_stream;
pub mod tools;
