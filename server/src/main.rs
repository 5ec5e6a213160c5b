//! The `spindle` command line.

fn main() {}
