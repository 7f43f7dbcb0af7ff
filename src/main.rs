//! The `agent-host` command: a small front that answers the commands run most often — `version`,
//! and every `ipc` command and `host.status` when a host answers — with one blocking socket
//! exchange, and hands everything else to the full binary, `agent-hostd`, installed beside it.
//!
//! Why two binaries: a one-shot command's cost was the loading of the whole daemon (a 24 MB
//! position-independent binary whose relocated data the loader writes page by page before
//! `main`), not anything the command did. This front links only argv routing, the envelope, the
//! IPC client and the reply; the host, the agents, the store, the web UI and `follow` are in
//! `agent-hostd`, which also takes every command itself.
//!
//! It parses no options: argv of the shape `INPUT [PARAMS]` (neither starting with `-`, except
//! `-` itself for standard input), where INPUT is an envelope, `-` or a name in the command
//! table, is a command; anything else — `--help`, `--version`, a flag, `follow`, `open`, an
//! unknown word, a usage error — goes to `agent-hostd` unchanged, whose command-line parser
//! answers it. A command read from standard input is handed on as its envelope, so nothing is
//! read twice. Output and exit status are byte for byte the full binary's: on a terminal, a
//! list-like command's reply is the same table ([`agent_host::human`], linked here rather than
//! handed to the full binary: it adds about 150 KB to this 2.2 MB front and nothing measurable
//! to its start), elsewhere the same envelope line.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use agent_host::client::{self, FULL_BINARY, FrontStep};
use agent_host::human;
use agent_host::protocol::envelope::{ErrorCode, Reply, RequestError};

fn print_reply(reply: &Reply) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let _gone = writeln!(out, "{}", reply.to_line()).and_then(|()| out.flush());
    exit_code(reply)
}

fn exit_code(reply: &Reply) -> ExitCode {
    if reply.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `INPUT [PARAMS]` when argv is exactly a command the front may answer, else `None`.
fn command_args(args: &[OsString]) -> Option<(String, Option<String>)> {
    let plain = |arg: &OsString| {
        let text = arg.to_str()?;
        (text == client::STDIN_ARG || !text.starts_with('-')).then(|| text.to_owned())
    };
    let (input, params) = match args {
        [input] => (plain(input)?, None),
        [input, params] => (plain(input)?, Some(plain(params)?)),
        _ => return None,
    };
    // An envelope, standard input, or a command of the table; any other word (`follow`,
    // `open`, and every command of the full binary's own) is the full binary's to parse.
    let command = input.trim_start().starts_with(['{', '[', '"'])
        || input == client::STDIN_ARG
        || agent_host::protocol::envelope::spec(&input).is_some();
    command.then_some((input, params))
}

/// Replace this process with `agent-hostd ARGS`; returns only when that cannot start.
fn delegate(args: &[OsString]) -> ExitCode {
    let argv0 = std::env::args_os()
        .next()
        .unwrap_or_else(|| OsString::from("agent-host"));
    let full = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(FULL_BINARY),
        Err(e) => {
            return print_reply(&Reply::error(
                ErrorCode::Internal,
                format!("cannot find this binary to find {FULL_BINARY} beside it: {e}"),
                serde_json::Value::Null,
            ));
        }
    };
    let e = std::process::Command::new(&full)
        .arg0(argv0)
        .args(args)
        .exec();
    let code = match e.kind() {
        // An envelope read from standard input is handed on as one argument.
        std::io::ErrorKind::ArgumentListTooLong => ErrorCode::RequestTooLarge,
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            ErrorCode::InstallIncomplete
        }
        _ => ErrorCode::Internal,
    };
    print_reply(&Reply::error(
        code,
        format!(
            "cannot run {}: {e}; it is built and installed with agent-host (`cargo build \
             --release`, `cargo install --path .`)",
            full.display()
        ),
        serde_json::Value::Null,
    ))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some((input, params)) = command_args(&args) else {
        return delegate(&args);
    };
    let stdin = &mut std::io::stdin().lock();
    let parsed = client::stdin_arg(Some(input), stdin)
        .and_then(|input| Ok((input.unwrap_or_default(), client::stdin_arg(params, stdin)?)))
        .and_then(|(input, params)| client::parse_argv(&input, params.as_deref()));
    let (command, envelope) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return print_reply(&RequestError::into_reply(e)),
    };
    let Ok(home) = agent_host::config::home_from_env() else {
        // The full binary says what is wrong with the home, as for every command.
        return delegate(&[OsString::from(envelope.to_string())]);
    };
    match client::front(&command, &envelope, &home) {
        // A person at a terminal reads a list-like reply as a table (`--json`, a flag, is the
        // full binary's to honour); everyone else gets the envelope line.
        FrontStep::Answered(reply) => match human::terminal(command.name()) {
            Some(screen) => {
                human::show(command.name(), &reply, &screen);
                exit_code(&reply)
            }
            None => print_reply(&reply),
        },
        FrontStep::Delegate => delegate(&[OsString::from(envelope.to_string())]),
    }
}
