//! Subcommands of the `spindle` binary.

pub mod config;
pub mod engine;
pub mod generate;
pub mod models;
pub mod perplexity;
pub mod serve;
pub mod served;

/// Size rayon's global pool, and with it the engine's forward-pass pool (`--threads`, default: all cores).
pub fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    }
    spindle_engine::pool::set_threads(rayon::current_num_threads());
    Ok(())
}
