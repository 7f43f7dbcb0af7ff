//! `agent-host-relay`: one instance of the relay service (docs/relay.md, "The relay service";
//! the code is `agent_host::relayd`). Run several on one NATS server behind one URL:
//!
//!     agent-host-relay --listen 0.0.0.0:8787 --nats nats://127.0.0.1:4222 \
//!         --host-token "$HOST_TOKEN" --bot-token "$BOT_TOKEN" [--instance NAME] [--log-file PATH]
//!
//! The tokens may come from `RELAY_HOST_TOKEN` / `RELAY_BOT_TOKEN` instead (a command line is
//! visible to every user of the machine). Prints `relay listening on ws://ADDR` on stdout once
//! it serves, then logs to stderr or `--log-file` (filter `AGENT_HOST_LOG`, default `info`).
//! SIGTERM or SIGINT: a clean stop, exit status 0. A failure to start: one line on stderr,
//! exit status 1. Thin on purpose: everything else is the library's.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use agent_host::logging::Escaped;
use agent_host::relayd::{self, Options};
use clap::Parser;
use tracing_subscriber::filter::{FilterExt, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// One instance of the agent-host relay service: hosts on /host, bots on /bot, instances
/// joined through NATS JetStream.
#[derive(Parser)]
#[command(name = "agent-host-relay", version)]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: String,
    /// The NATS server (JetStream enabled).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// The token hosts present (Authorization: Bearer); else $RELAY_HOST_TOKEN.
    #[arg(long)]
    host_token: Option<String>,
    /// The token bots present (Authorization: Bearer); else $RELAY_BOT_TOKEN.
    #[arg(long)]
    bot_token: Option<String>,
    /// This instance's id (in Welcome frames and the presence bucket); default: random.
    #[arg(long)]
    instance: Option<String>,
    /// Append the log here (created 0600) instead of writing it to stderr.
    #[arg(long)]
    log_file: Option<PathBuf>,
}

/// The log filter: `AGENT_HOST_LOG` (default `info`), with tungstenite and the NATS client
/// capped at `info` whatever is asked — at `trace`/`debug` they print request heads (the
/// token) and message bodies, and no frame may reach the log.
fn init_logging(log_file: Option<&PathBuf>) -> Result<(), String> {
    let filter =
        EnvFilter::try_from_env("AGENT_HOST_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let cap = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("tungstenite", LevelFilter::INFO)
        .with_target("tokio_tungstenite", LevelFilter::INFO)
        .with_target("async_nats", LevelFilter::INFO);
    let layer = tracing_subscriber::fmt::layer().with_ansi(false);
    let installed = match log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            let layer = layer
                .with_writer(Escaped(std::sync::Mutex::new(file)))
                .with_filter(filter.and(cap));
            tracing_subscriber::registry().with(layer).try_init()
        }
        None => {
            let layer = layer
                .with_writer(Escaped(std::io::stderr))
                .with_filter(filter.and(cap));
            tracing_subscriber::registry().with(layer).try_init()
        }
    };
    installed.map_err(|e| format!("cannot set up logging: {e}"))
}

fn token(flag: Option<String>, env: &str, name: &str) -> Result<String, String> {
    flag.or_else(|| std::env::var(env).ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("a {name} token is needed (--{name}-token or ${env})"))
}

fn fail(message: &str) -> ExitCode {
    let mut err = std::io::stderr().lock();
    let _unseen = writeln!(err, "agent-host-relay: {message}");
    ExitCode::FAILURE
}

/// SIGTERM or SIGINT, whichever comes first. The handlers are installed when this is called,
/// not when the future is first polled.
fn stop_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            // Whichever could be installed (the other keeps its default action).
            (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                let _signalled = one.recv().await;
            }
            (Err(_), Err(_)) => std::future::pending().await,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let host_token = match token(args.host_token, "RELAY_HOST_TOKEN", "host") {
        Ok(token) => token,
        Err(e) => return fail(&e),
    };
    let bot_token = match token(args.bot_token, "RELAY_BOT_TOKEN", "bot") {
        Ok(token) => token,
        Err(e) => return fail(&e),
    };
    if let Err(e) = init_logging(args.log_file.as_ref()) {
        return fail(&e);
    }
    let options = Options {
        listen: args.listen,
        nats_url: args.nats,
        host_token,
        bot_token,
        instance: args.instance.unwrap_or_else(relayd::random_instance),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(async {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<relayd::Ready>();
        let announce = async {
            if let Ok(ready) = ready_rx.await {
                let mut out = std::io::stdout().lock();
                // The reader may be gone (a supervisor that does not keep stdout): ignore.
                let _gone = writeln!(out, "relay listening on ws://{}", ready.addr)
                    .and_then(|()| out.flush());
            }
        };
        let (result, ()) = tokio::join!(relayd::run(options, stop_signal(), ready_tx), announce);
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "relay failed");
            fail(&e.to_string())
        }
    }
}
