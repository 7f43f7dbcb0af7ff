//! The CLI side of the command envelope: route a parsed command (design §4) and produce the
//! one reply line. `local` commands run here, `ipc` ones are forwarded to the live host,
//! `hybrid` ones use IPC when the host answers and the lock file when it does not.
//!
//! Nothing here prints; `main.rs` prints the [`Reply`] it gets back.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::adapter;
use crate::config::Config;
use crate::daemon;
use crate::instance;
use crate::ipc::{self, IpcError};
use crate::protocol::envelope::{
    Command, ErrorCode, MAX_REQUEST_BYTES, Reply, RequestError, Route,
};
use crate::protocol::strict_json;
use crate::request::status_json;

/// How long the CLI waits for the host to answer one request.
const IPC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `host.start` waits for a detached host to report ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `host.shutdown` waits for the host to release its lock.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Set on the detached host so it knows its stderr is a log file, not a terminal.
const DETACHED_ENV: &str = "AGENT_HOST_DETACHED";

/// The argument that stands for standard input: `agent-host session.send -` reads the params
/// JSON from stdin, `agent-host -` a whole envelope. A prompt can be larger than the kernel's
/// limit on one argument (128 KiB), and a secret never shows in `ps`.
pub const STDIN_ARG: &str = "-";

/// Replace a `-` argument with what standard input holds (at most [`MAX_REQUEST_BYTES`], UTF-8).
pub fn stdin_arg(
    arg: Option<String>,
    stdin: &mut impl Read,
) -> Result<Option<String>, RequestError> {
    match arg {
        Some(a) if a == STDIN_ARG => {
            let mut bytes = Vec::new();
            stdin
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| {
                    RequestError::new(
                        ErrorCode::EmptyRequest,
                        format!("reading standard input failed: {e}"),
                    )
                })?;
            if bytes.len() > MAX_REQUEST_BYTES {
                return Err(RequestError::new(
                    ErrorCode::RequestTooLarge,
                    format!("standard input holds more than {MAX_REQUEST_BYTES} bytes"),
                ));
            }
            let text = String::from_utf8(bytes).map_err(|e| {
                RequestError::new(
                    ErrorCode::InvalidEncoding,
                    format!("standard input is not UTF-8: {e}"),
                )
            })?;
            if text.trim().is_empty() {
                return Err(RequestError::new(
                    ErrorCode::EmptyRequest,
                    "standard input was empty",
                ));
            }
            Ok(Some(text))
        }
        other => Ok(other),
    }
}

/// Turn argv into a typed command plus the envelope to forward.
///
/// `input` is either a whole envelope (`{"command":…}`) or a command name, in which case
/// `params` is its params JSON.
pub fn parse_argv(input: &str, params: Option<&str>) -> Result<(Command, Value), RequestError> {
    // Anything that looks like JSON is a whole envelope (and refused as one if it is not an
    // object); anything else is a command name.
    let envelope = if input.trim_start().starts_with(['{', '[', '"']) {
        if params.is_some() {
            return Err(RequestError::new(
                ErrorCode::InvalidEnvelope,
                "give params inside the envelope, not as a second argument",
            ));
        }
        strict_json::parse(input).map_err(|e| {
            RequestError::new(
                ErrorCode::InvalidJson,
                format!("request is not valid JSON: {e}"),
            )
        })?
    } else {
        let params = match params {
            None => Value::Null,
            Some(text) => strict_json::parse(text).map_err(|e| {
                RequestError::new(
                    ErrorCode::InvalidJson,
                    format!("params are not valid JSON: {e}"),
                )
            })?,
        };
        json!({"command": input, "params": params})
    };
    let command = Command::parse_value(envelope.clone())?;
    Ok((command, absolutize_cwd(envelope)))
}

/// A relative `cwd` means relative to the shell the user typed in, not to the host's.
fn absolutize_cwd(mut envelope: Value) -> Value {
    if envelope.get("command").and_then(Value::as_str) != Some("session.create") {
        return envelope;
    }
    if let Some(Value::String(cwd)) = envelope.pointer_mut("/params/cwd")
        && Path::new(cwd.as_str()).is_relative()
        && let Ok(here) = std::env::current_dir()
    {
        *cwd = here.join(&*cwd).display().to_string();
    }
    envelope
}

/// Run a non-foreground command and return its reply.
///
/// A one-shot command pays for nothing it does not use: an `ipc` command (and a `hybrid` one
/// whose host answers) is one blocking socket exchange, with no runtime and no logging set up.
/// What waits on more (the lock-file fallback, `host.start`, `agent.list`'s probes) gets a
/// current-thread runtime, and the CLI's stderr logging, only when it runs.
pub fn execute(command: Command, envelope: Value, config: &Config) -> Reply {
    match command.route() {
        Route::Local => block_on(local(command, config)),
        Route::Ipc => match ipc::request_blocking(&config.ipc_path(), &envelope, IPC_TIMEOUT) {
            Ok(reply) => reply,
            Err(e) => ipc_failure(e, config),
        },
        Route::Hybrid => hybrid(command, envelope, config),
    }
}

/// The full binary, installed beside `agent-host`: the small `agent-host` front hands it every
/// command it does not answer itself (see [`front`]).
pub const FULL_BINARY: &str = "agent-hostd";

/// What the small `agent-host` front does with a parsed command.
#[derive(Debug)]
pub enum FrontStep {
    /// Answered: print it.
    Answered(Reply),
    /// Needs the full binary: run [`FULL_BINARY`] with the envelope.
    Delegate,
}

/// The `agent-host` front's share of the commands, the ones a script or a status line runs
/// often: `version`, and one blocking IPC exchange for an `ipc` command and for `host.status`
/// when its host answers. It needs only the home directory (no `config.toml`, runtime or
/// logging), so the front links a small part of this crate and starts nearly as fast as
/// `/bin/true`. Everything else — `host.start`, the lock-file fallbacks, `host.shutdown`'s wait,
/// `agent.list`'s probes — is [`FrontStep::Delegate`], answered by the full binary exactly as
/// [`execute`] would.
pub fn front(command: &Command, envelope: &Value, home: &Path) -> FrontStep {
    match command {
        Command::Version => FrontStep::Answered(version()),
        Command::HostStatus => {
            match ipc::request_blocking(&crate::config::ipc_path_in(home), envelope, IPC_TIMEOUT) {
                Ok(reply) => FrontStep::Answered(reply),
                // No host answers: the lock file says why, which the full binary reads.
                Err(_) => FrontStep::Delegate,
            }
        }
        command if command.route() == Route::Ipc => {
            let path = crate::config::ipc_path_in(home);
            match ipc::request_blocking(&path, envelope, IPC_TIMEOUT) {
                Ok(reply) => FrontStep::Answered(reply),
                Err(e) => FrontStep::Answered(crate::request::errors::ipc_failure(e, &path)),
            }
        }
        _ => FrontStep::Delegate,
    }
}

/// `local`'s reply for `version`: needs no configuration, runtime or host.
pub fn version() -> Reply {
    Reply::ok(json!({
        "version": crate::VERSION,
        "schema_version": crate::store::SCHEMA_VERSION,
    }))
}

/// Run the async rest of a one-shot command on a current-thread runtime, with the CLI's
/// logging (warnings on stderr) installed first.
fn block_on(work: impl Future<Output = Reply>) -> Reply {
    crate::logging::init_cli_logging();
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(work),
        Err(e) => Reply::error(
            ErrorCode::Internal,
            format!("cannot start a runtime: {e}"),
            Value::Null,
        ),
    }
}

async fn local(command: Command, config: &Config) -> Reply {
    match command {
        Command::Version => version(),
        Command::AgentList => Reply::ok(adapter::agents_report(config).await),
        Command::HostStart(_) => start_detached(config).await,
        other => Reply::error(
            ErrorCode::Internal,
            format!("{} is not a local command", other.name()),
            Value::Null,
        ),
    }
}

fn hybrid(command: Command, envelope: Value, config: &Config) -> Reply {
    match ipc::request_blocking(&config.ipc_path(), &envelope, IPC_TIMEOUT) {
        Ok(reply) => {
            if matches!(command, Command::HostShutdown) && reply.is_ok() {
                return block_on(wait_stopped(config, reply));
            }
            reply
        }
        Err(e) => block_on(async move {
            tracing::debug!(error = %e, "host did not answer on IPC; reading the lock file");
            from_lock_file(command, config).await
        }),
    }
}

async fn from_lock_file(command: Command, config: &Config) -> Reply {
    let lock_path = config.lock_path();
    let held = match instance::lock_held(&lock_path) {
        Ok(held) => held,
        Err(e) => {
            return Reply::error(
                ErrorCode::HomeUnusable,
                format!("cannot read {}: {e}", lock_path.display()),
                Value::Null,
            );
        }
    };
    let info = instance::read_lock_info(&lock_path);
    match (command, held) {
        // No host to ask: the agents as this binary and config see them.
        (Command::AgentList, _) => local(Command::AgentList, config).await,
        (Command::HostStatus, false) => Reply::ok(json!({"running": false})),
        (Command::HostShutdown, false) => Reply::ok(json!({"stopped": false, "running": false})),
        (Command::HostStatus, true) => {
            let mut data = info.as_ref().map_or(json!({}), |i| status_json(i, None));
            data["running"] = json!(true);
            data["responsive"] = json!(false);
            Reply::error(
                ErrorCode::HostUnresponsive,
                "a host holds the lock but does not answer on IPC",
                data,
            )
        }
        (Command::HostShutdown, true) => {
            let Some(pid) = info.map(|i| i.pid) else {
                return Reply::error(
                    ErrorCode::HostUnresponsive,
                    "a host holds the lock but its pid is unknown",
                    Value::Null,
                );
            };
            // It does not answer: ask the process itself, by its pid from the lock file.
            let signalled = i32::try_from(pid).ok().is_some_and(|raw| {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(raw),
                    nix::sys::signal::Signal::SIGTERM,
                )
                .is_ok()
            });
            if signalled && instance::wait_released(&lock_path, STOP_TIMEOUT).await {
                Reply::ok(json!({"stopped": true, "pid": pid, "via": "signal"}))
            } else {
                Reply::error(
                    ErrorCode::HostUnresponsive,
                    format!("host pid {pid} did not stop after SIGTERM"),
                    json!({"pid": pid}),
                )
            }
        }
        (other, _) => Reply::error(
            ErrorCode::Internal,
            format!("{} is not a hybrid command", other.name()),
            Value::Null,
        ),
    }
}

async fn wait_stopped(config: &Config, reply: Reply) -> Reply {
    let pid = reply.data.get("pid").cloned().unwrap_or(Value::Null);
    if instance::wait_released(&config.lock_path(), STOP_TIMEOUT).await {
        Reply::ok(json!({"stopped": true, "pid": pid}))
    } else {
        Reply::error(
            ErrorCode::HostUnresponsive,
            "the host accepted shutdown but still holds its lock",
            json!({"pid": pid}),
        )
    }
}

fn ipc_failure(e: IpcError, config: &Config) -> Reply {
    crate::request::errors::ipc_failure(e, &config.ipc_path())
}

/// `host.start` without `foreground`: spawn this binary as a detached foreground host and
/// relay the line it prints when ready (or its refusal).
async fn start_detached(config: &Config) -> Reply {
    let status = ipc::request(
        &config.ipc_path(),
        &json!({"command": "host.status"}),
        Duration::from_secs(5),
    )
    .await;
    if let Ok(reply) = status
        && reply.is_ok()
    {
        let pid = reply.data.get("pid").cloned().unwrap_or(Value::Null);
        return Reply::error(
            ErrorCode::AlreadyRunning,
            format!("a host is already running (pid {pid})"),
            json!({"pid": pid}),
        );
    }
    if let Err(e) = config.ensure_home() {
        return Reply::error(ErrorCode::HomeUnusable, e.to_string(), Value::Null);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return start_failed(format!("cannot find this binary: {e}")),
    };
    let stderr_path = config.logs_dir().join("host.stderr");
    let stderr = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stderr_path)
    {
        Ok(file) => file,
        Err(e) => return start_failed(format!("cannot open {}: {e}", stderr_path.display())),
    };
    let mut child = match tokio::process::Command::new(exe)
        .arg("host.start")
        .arg(r#"{"foreground":true}"#)
        .env("AGENT_HOST_HOME", &config.home)
        .env(DETACHED_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        // Its own process group: a Ctrl-C in the starting terminal does not reach the host.
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return start_failed(format!("cannot spawn the host: {e}")),
    };
    let Some(stdout) = child.stdout.take() else {
        return start_failed("the host's stdout was not captured".to_owned());
    };
    let mut line = String::new();
    let read =
        tokio::time::timeout(START_TIMEOUT, BufReader::new(stdout).read_line(&mut line)).await;
    match read {
        Ok(Ok(n)) if n > 0 => match serde_json::from_str::<Reply>(line.trim_end()) {
            Ok(reply) => {
                if !reply.is_ok() {
                    // It refused (e.g. lost the race): reap it so no zombie is left.
                    let _status = child.wait().await;
                }
                reply
            }
            Err(e) => {
                stop_child(&mut child).await;
                start_failed(format!("the host printed an unexpected line: {e}"))
            }
        },
        Ok(_) => {
            let status = child.wait().await.ok();
            start_failed(format!(
                "the host exited before it was ready ({status:?}); see {}",
                stderr_path.display()
            ))
        }
        Err(_) => {
            // Not ready in time: stop it, so a failure report never leaves a host behind.
            stop_child(&mut child).await;
            start_failed(format!(
                "the host was not ready within {START_TIMEOUT:?} and was stopped; see {}",
                config.logs_dir().display()
            ))
        }
    }
}

async fn stop_child(child: &mut tokio::process::Child) {
    if let Err(e) = child.kill().await {
        tracing::warn!(error = %e, "could not stop the host that failed to start");
    }
}

fn start_failed(message: String) -> Reply {
    Reply::error(ErrorCode::HostStartFailed, message, Value::Null)
}

/// Whether this process is a host started by `host.start` (stderr is a file, not a person).
pub fn is_detached_host() -> bool {
    std::env::var_os(DETACHED_ENV).is_some()
}

/// `host.start {"foreground": true}`: run the host in this process until a signal or
/// `host.shutdown`. `on_ready` gets the success reply once the host answers on IPC; the
/// returned reply is the final outcome (an error if the host could not start).
pub async fn run_foreground(
    mut config: Config,
    on_ready: impl FnOnce(Reply) + Send + 'static,
) -> Reply {
    // This process is the host and nothing else: it may adopt its agents' orphans.
    config.adopt_orphans = true;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<daemon::Ready>();
    let announcer = tokio::spawn(async move {
        if let Ok(ready) = ready_rx.await {
            on_ready(Reply::ok(status_json(&ready.info, None)));
        }
    });
    let result = daemon::run(config, shutdown_signal(), ready_tx).await;
    let _announced = announcer.await;
    match result {
        Ok(()) => Reply::ok(json!({"stopped": true})),
        Err(e) => crate::request::errors::start_error(e),
    }
}

/// Resolves on SIGINT or SIGTERM. SIGHUP is ignored: a closed terminal must not stop the host.
/// The handlers are installed when this is called, before the host starts: a signal during
/// start-up stops it once it is up, cleanly, rather than killing it half-started.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = handlers else {
            tracing::error!("cannot install signal handlers; stop the host with host.shutdown");
            return std::future::pending().await;
        };
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = hup.recv() => tracing::info!("SIGHUP ignored"),
            }
        }
    }
}
