//! Tracing setup for the host process: `logs/host.log` under the home, plus stderr when a
//! person runs the host in the foreground. Secrets (tokens, env values, API keys) are never
//! passed to a tracing macro, and tungstenite's handshake tracing (which prints request
//! headers) is capped below `trace`, so they cannot reach either.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

use crate::config::Config;

/// Install the global subscriber. Keep the guard alive until exit so buffered lines are written.
pub fn init_host_logging(config: &Config, also_stderr: bool) -> Option<WorkerGuard> {
    config.ensure_home().ok()?;
    let file = tracing_appender::rolling::never(config.logs_dir(), "host.log");
    let (file, guard) = tracing_appender::non_blocking(file);
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = quiet_handshakes(filter);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let installed = if also_stderr {
        builder.with_writer(file.and(std::io::stderr)).try_init()
    } else {
        builder.with_writer(file).try_init()
    };
    installed.ok().map(|()| guard)
}

/// tungstenite logs whole handshake requests at `trace`, `Authorization` header included: the
/// relay token must not reach a log whatever level a user asks for.
fn quiet_handshakes(filter: EnvFilter) -> EnvFilter {
    match "tungstenite::handshake=debug".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// For CLI invocations: warnings and errors to stderr only, stdout stays one JSON line.
pub fn init_cli_logging() {
    let filter =
        EnvFilter::try_from_env("AGENT_HOST_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let filter = quiet_handshakes(filter);
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
