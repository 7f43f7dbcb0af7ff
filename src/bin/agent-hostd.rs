//! `agent-hostd`, the full binary: the host itself (`host.start`), `follow`, `open`, and every
//! other command too — argv → command envelope → route → one JSON reply line on stdout. Exit
//! status 0 exactly when the reply's code is 0. The small `agent-host` front (`src/main.rs`)
//! answers the frequent one-shot commands itself and hands it the rest. Thin on purpose: routing
//! lives in `agent_host::client`, the host in `agent_host::daemon`.

use std::io::Write;
use std::process::ExitCode;

use agent_host::client;
use agent_host::config::Config;
use agent_host::protocol::envelope::{COMMANDS, Command, ErrorCode, Reply};
use clap::{CommandFactory, FromArgMatches, Parser};

/// Runs coding-agent CLIs and lets many clients drive and follow the same session.
#[derive(Parser, Debug)]
#[command(name = "agent-host", version, arg_required_else_help = true)]
struct Cli {
    /// A whole envelope `{"command":…,"params":…}`, or a command name.
    input: String,
    /// The params JSON, when INPUT is a command name (for `follow` and `open`: a session id).
    /// `-` reads it from standard input (as `-` for INPUT reads a whole envelope).
    params: Option<String>,
    /// `follow` only: print raw canonical events, one JSON object per line.
    #[arg(long)]
    json: bool,
    /// `open` only: print the web UI's URL without starting a browser.
    #[arg(long)]
    print: bool,
}

fn commands_help() -> String {
    let mut text = String::from(
        "Commands (route: local runs here, ipc needs the host, hybrid falls back to the lock file):\n",
    );
    for spec in COMMANDS {
        text.push_str(&format!(
            "  {:<16} [{}] {}\n  {:<16}        params {}\n",
            spec.name,
            spec.route.name(),
            spec.summary,
            "",
            spec.params
        ));
    }
    text.push_str(
        "  follow           [cli]   follow a live stream: agent-host follow [session_id] [--json]\n                          (interactive on a terminal: type to send, Esc cancels, y/n/a answer, /help)\n",
    );
    text.push_str(
        "  open             [cli]   print and open the web UI's URL: agent-host open [session_id] [--print]\n",
    );
    text.push_str(
        "\nExamples:\n  agent-host host.start\n  agent-host '{\"command\":\"session.create\",\"params\":{\"agent_type\":\"claude\",\"cwd\":\"/some/dir\"}}'\n  agent-host session.history '{\"session_id\":\"…\",\"after_seq\":0}'\n\nEnvironment: AGENT_HOST_HOME (default ~/.agent-host), AGENT_HOST_LOG (log filter).\nReply codes: docs/commands.md.",
    );
    text
}

fn print_reply(reply: &Reply) {
    // The reader may be gone (a detached host's parent exits after the ready line): ignore.
    let mut out = std::io::stdout().lock();
    let _gone = writeln!(out, "{}", reply.to_line()).and_then(|()| out.flush());
}

fn exit_code(reply: &Reply) -> ExitCode {
    if reply.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The configuration, or the printed refusal's exit code.
fn load_config() -> Result<Config, ExitCode> {
    Config::from_env().map_err(|e| {
        let reply = Reply::error(
            ErrorCode::HomeUnusable,
            e.to_string(),
            serde_json::Value::Null,
        );
        print_reply(&reply);
        exit_code(&reply)
    })
}

/// `agent-host follow [session_id] [--json]`: a live stream on stdout until Ctrl-C — on a
/// terminal the interactive follower, which owns the screen (tracing goes to
/// `logs/follow.log`, never onto it); a failure to start is one JSON reply line, as for every
/// command.
fn follow(cli: Cli) -> anyhow::Result<ExitCode> {
    let options = agent_host::follow::FollowOptions {
        session_id: cli.params,
        json: cli.json,
    };
    let interactive = agent_host::follow::interactive(&options);
    if !interactive {
        agent_host::logging::init_cli_logging();
    }
    let config = match load_config() {
        Ok(config) => config,
        Err(reply) => return Ok(reply),
    };
    if interactive {
        agent_host::logging::init_tui_logging(&config);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let reply = runtime.block_on(async {
        if interactive {
            return agent_host::follow::run_interactive(&config, options).await;
        }
        let mut out = std::io::stdout();
        let mut status = std::io::stderr();
        agent_host::follow::run(&config, options, &mut out, &mut status).await
    });
    if !reply.is_ok() {
        print_reply(&reply);
    }
    Ok(exit_code(&reply))
}

/// `agent-host open [session_id] [--print]`: one URL line on stdout (and a browser, unless
/// `--print`); a failure is one JSON reply line, as for every command.
fn open(cli: Cli) -> anyhow::Result<ExitCode> {
    agent_host::logging::init_cli_logging();
    let config = match load_config() {
        Ok(config) => config,
        Err(reply) => return Ok(reply),
    };
    let options = agent_host::open::OpenOptions {
        session_id: cli.params,
        print_only: cli.print,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reply = runtime.block_on(async {
        let mut out = std::io::stdout();
        let mut status = std::io::stderr();
        agent_host::open::run(&config, options, &mut out, &mut status).await
    });
    if !reply.is_ok() {
        print_reply(&reply);
    }
    Ok(exit_code(&reply))
}

/// A usage error, answered with one JSON line like every other.
fn usage_error(first: &str) -> ExitCode {
    let reply = Reply::error(
        ErrorCode::InvalidEnvelope,
        format!("{first}; usage: agent-host '<envelope>' | agent-host <command> ['<params>']"),
        serde_json::Value::Null,
    );
    print_reply(&reply);
    exit_code(&reply)
}

/// argv as [`Cli`], or the exit code of what was printed instead (help, the version, a usage
/// error's reply line). The commands' list is formatted only when help is shown.
fn parse_cli() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let e = match parsed {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // The same parse again, now with the commands' list: help is asked for rarely.
            let again = Cli::command()
                .after_help(commands_help())
                .try_get_matches()
                .err()
                .unwrap_or(e);
            again.exit()
        }
        ErrorKind::DisplayVersion => e.exit(),
        _ => {
            // A usage error is still answered with one JSON line.
            let message = e.render().to_string();
            let first = message
                .lines()
                .next()
                .unwrap_or("usage error")
                .trim_start_matches("error: ");
            Err(usage_error(first))
        }
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return Ok(code),
    };
    if cli.input == "follow" {
        return follow(cli);
    }
    if cli.input == "open" {
        return open(cli);
    }
    if cli.print {
        return Ok(usage_error("--print is an option of `open` only"));
    }
    // `-` in either place is read from standard input.
    let stdin = &mut std::io::stdin().lock();
    let args = client::stdin_arg(Some(cli.input), stdin).and_then(|input| {
        Ok((
            input.unwrap_or_default(),
            client::stdin_arg(cli.params, stdin)?,
        ))
    });
    let parsed = args.and_then(|(input, params)| client::parse_argv(&input, params.as_deref()));
    let (command, envelope) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let reply = e.into_reply();
            print_reply(&reply);
            return Ok(exit_code(&reply));
        }
    };
    if matches!(command, Command::Version) {
        // Nothing to read or ask: no configuration, runtime or logging.
        let reply = client::version();
        print_reply(&reply);
        return Ok(exit_code(&reply));
    }
    let config = match load_config() {
        Ok(config) => config,
        Err(reply) => return Ok(reply),
    };
    let reply = match command {
        Command::HostStart(params) if params.foreground => {
            let _guard =
                agent_host::logging::init_host_logging(&config, !client::is_detached_host());
            // This process is the host: the daemon's runtime.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let reply =
                runtime.block_on(client::run_foreground(config, |ready| print_reply(&ready)));
            // Success was announced when the host became ready; only a failure is printed now.
            if !reply.is_ok() {
                print_reply(&reply);
            }
            reply
        }
        command => {
            // One request, one reply: `execute` sets up a runtime and logging only if it
            // needs them.
            let reply = client::execute(command, envelope, &config);
            print_reply(&reply);
            reply
        }
    };
    Ok(exit_code(&reply))
}
