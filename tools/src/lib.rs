//! Developer tools for Spindle.
