//! Developer tools for Spindle.

pub mod tiny_model;
pub mod bench;
