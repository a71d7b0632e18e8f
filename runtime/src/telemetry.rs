//! Logging set-up: structured `tracing` output, plain or JSON.

use tracing_subscriber::EnvFilter;

use crate::args::{LogArgs, LogFormat};

/// Installs the global subscriber. Fails on an invalid filter so that a
/// typo in `--log-level` is reported instead of silently logging nothing.
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&args.level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", args.level))?;
    // Logs go to stderr; colours only when a person is watching.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match args.format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
