//! `agent-hostd`, the full binary: the host itself (`host.start`), `follow`, `open`, `pair`
//! (a bot's pairing code as a QR), and every other command too — argv → command envelope → route → one JSON reply line on stdout. Exit
//! status 0 exactly when the reply's code is 0 — on a terminal, the list-like commands print a
//! table instead (`agent_host::human`; `--json` keeps the line). `completions` and `man` print
//! shell completions and the man page, both generated from this command line and the command
//! table. `service` installs the host as a login service and `doctor` checks a home, each one
//! JSON reply line (`agent_host::service`, `agent_host::doctor`). The small `agent-host` front (`src/main.rs`) answers the frequent one-shot commands
//! itself and hands it the rest. Thin on purpose: routing lives in `agent_host::client`, the
//! host in `agent_host::daemon`, the tables in `agent_host::human`.

use std::io::Write;
use std::process::ExitCode;

use agent_host::client;
use agent_host::config::Config;
use agent_host::human;
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
    /// Print the JSON reply line even on a terminal (the list-like commands print a table
    /// there); for `follow`: raw canonical events, one JSON object per line.
    #[arg(long)]
    json: bool,
    /// `open` only: print the web UI's URL without starting a browser.
    #[arg(long)]
    print: bool,
    /// `pair` only: what the paired bot may do, as JSON {sessions?, prompt?, permissions?,
    /// create_sessions?} (default: every session and prompts, nothing more).
    #[arg(long, value_name = "JSON")]
    scope: Option<String>,
    /// `pair` only: how long the code is valid, in seconds (default 600, at most 3600).
    #[arg(long, value_name = "SECONDS")]
    ttl: Option<u32>,
    /// `pair` only: the bot's label in `pair.list`.
    #[arg(long, value_name = "LABEL")]
    name: Option<String>,
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
        "  completions      [cli]   shell completions: agent-host completions bash|zsh|fish\n  man              [cli]   the man page (roff): agent-host man > agent-host.1\n",
    );
    text.push_str(
        "  service          [cli]   the host as a login service: agent-host service install|uninstall|status\n  doctor           [cli]   check the home, host, store, agents, credentials, relay, disk\n",
    );
    text.push_str(
        "  pair             [cli]   pair a remote bot: agent-host pair [--scope JSON] [--ttl SECONDS] [--name LABEL]\n                          (pair.create; on a terminal its QR, the code and how long it is valid)\n",
    );
    let tables: Vec<&str> = human::COMMANDS
        .iter()
        .copied()
        .filter(|name| {
            agent_host::protocol::envelope::spec(name).is_some()
                || CLI_WORDS.iter().any(|(word, _)| word == name)
        })
        .collect();
    text.push_str(&format!(
        "\nOn a terminal these print a table or summary for people: {}.\n--json, or a stdout that is not a terminal, prints the JSON reply line; the exit status is the same.\n",
        tables.join(", ")
    ));
    text.push_str(HELP_TAIL);
    text
}

/// The examples and environment under the commands' list (`--help`, and the man page).
const HELP_TAIL: &str = "\nExamples:\n  agent-host host.start\n  agent-host '{\"command\":\"session.create\",\"params\":{\"agent_type\":\"claude\",\"cwd\":\"/some/dir\"}}'\n  agent-host session.history '{\"session_id\":\"…\",\"after_seq\":0}'\n\nEnvironment: AGENT_HOST_HOME (default ~/.agent-host), AGENT_HOST_LOG (log filter).\nReply codes: docs/commands.md.";

/// The words the command line takes besides the command table's names, with what each does.
const CLI_WORDS: &[(&str, &str)] = &[
    (
        "follow",
        "follow a live stream: follow [session_id] [--json]",
    ),
    (
        "open",
        "print and open the web UI's URL: open [session_id] [--print]",
    ),
    (
        "completions",
        "print shell completions: completions bash|zsh|fish",
    ),
    ("man", "print the man page (roff)"),
    (
        "service",
        "run the host as a login service (systemd user unit / launchd agent): service install|uninstall|status",
    ),
    (
        "doctor",
        "check the home, host, store, agents, credentials, relay and disk: one verdict and fix per check",
    ),
    (
        "pair",
        "make a code that pairs a remote bot, shown as a QR: pair [--scope JSON] [--ttl SECONDS] [--name LABEL]",
    ),
];

/// The command line as documents describe it: [`Cli`] with INPUT's words — every command of
/// the table and [`CLI_WORDS`] — as its possible values, so completions offer them and the man
/// page lists them. Never used to parse (INPUT also takes an envelope).
fn documented_cli(brief: bool) -> clap::Command {
    use clap::builder::{PossibleValue, PossibleValuesParser};
    let words = words(brief)
        .into_iter()
        .map(|(name, help)| PossibleValue::new(name).help(help))
        .collect::<Vec<_>>();
    Cli::command()
        // In place: `mut_arg` would move INPUT after PARAMS.
        .mut_args(|arg| {
            if arg.get_id() == "input" {
                arg.value_parser(PossibleValuesParser::new(words.clone()))
            } else {
                arg
            }
        })
        .long_about(
            "Runs coding-agent CLIs (Claude Code, Codex, any ACP agent) and lets many clients \
             drive and follow the same session. Every command takes an envelope \
             {\"command\": …, \"params\": …} (or a command name and its params JSON) and prints \
             one JSON line {\"code\", \"message\", \"data\"}; the exit status is 0 exactly when \
             code is 0. On a terminal the list-like commands print a table instead; --json keeps \
             the line.",
        )
        .after_help(HELP_TAIL.trim_start())
}

/// Every word INPUT takes, with what it does: the whole summary (the man page), or its first
/// clause (completions, whose menus show one short line).
fn words(brief: bool) -> Vec<(&'static str, String)> {
    COMMANDS
        .iter()
        .map(|spec| (spec.name, spec.route.name(), spec.summary))
        .chain(CLI_WORDS.iter().map(|(name, what)| (*name, "cli", *what)))
        .map(|(name, route, what)| {
            let what = if brief {
                brief_summary(what)
            } else {
                what.to_owned()
            };
            (name, format!("[{route}] {what}"))
        })
        .collect()
}

/// A summary's first clause, at most about 70 characters, without double quotes (which some
/// shells' completion menus take as the end of the description).
fn brief_summary(summary: &str) -> String {
    let clause = [": {", "; ", " — "]
        .iter()
        .filter_map(|sep| summary.find(sep))
        .filter(|at| *at > 0)
        .min()
        .map_or(summary, |at| &summary[..at]);
    let mut out = String::new();
    for word in clause.split_whitespace() {
        if out.chars().count() + word.chars().count() > 70 {
            out.push_str(" …");
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out.replace('"', "'")
}

/// `agent-host completions bash|zsh|fish`: the script on stdout; a missing or unknown shell is
/// a usage error's JSON line.
fn completions(shell: Option<&str>) -> ExitCode {
    use clap_complete::Shell;
    let shell = match shell {
        Some("bash") => Shell::Bash,
        Some("zsh") => Shell::Zsh,
        Some("fish") => Shell::Fish,
        Some(other) => {
            return usage_error(&format!(
                "no completions for shell {other:?}: give bash, zsh or fish"
            ));
        }
        None => return usage_error("completions needs a shell: bash, zsh or fish"),
    };
    let mut cli = documented_cli(true);
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cli, "agent-host", &mut out);
    if shell == Shell::Fish {
        // clap_complete's fish script completes options only: the first word is a command.
        let quote = |text: &str| format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"));
        for (name, help) in words(true) {
            let _gone = writeln!(
                out,
                "complete -c agent-host -n __fish_use_subcommand -f -a {} -d {}",
                quote(name),
                quote(&help)
            );
        }
    }
    let _gone = out.flush();
    ExitCode::SUCCESS
}

/// `agent-host man`: the man page, roff on stdout (`agent-host man > agent-host.1`).
fn man() -> ExitCode {
    let mut page = Vec::new();
    if let Err(e) = clap_mangen::Man::new(documented_cli(false)).render(&mut page) {
        let reply = Reply::error(
            ErrorCode::Internal,
            format!("cannot render the man page: {e}"),
            serde_json::Value::Null,
        );
        print_reply(&reply);
        return exit_code(&reply);
    }
    let mut out = std::io::stdout().lock();
    let _gone = out.write_all(&page).and_then(|()| out.flush());
    ExitCode::SUCCESS
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

/// `agent-host service install|uninstall|status`: one JSON reply line (`agent_host::service`).
fn service(action: Option<&str>) -> ExitCode {
    use agent_host::service;
    let action = match service::Action::parse(action) {
        Ok(action) => action,
        Err(e) => return usage_error(&e),
    };
    agent_host::logging::init_cli_logging();
    let config = match load_config() {
        Ok(config) => config,
        Err(reply) => return reply,
    };
    let reply = match action {
        service::Action::Install => match std::env::current_exe() {
            // This binary is the host the service runs.
            Ok(exe) => service::install(&config, &service::spec_of(&config, exe)),
            Err(e) => Reply::error(
                ErrorCode::ServiceFailed,
                format!("cannot find this binary for the service to run: {e}"),
                serde_json::Value::Null,
            ),
        },
        service::Action::Uninstall => service::uninstall(&config),
        service::Action::Status => service::status(&config),
    };
    print_reply(&reply);
    exit_code(&reply)
}

/// `agent-host doctor`: every check's verdict (`agent_host::doctor`); on a terminal, one line
/// per check, else (or with `--json`) the reply line. Exit status non-zero when a check failed.
fn doctor(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.params.is_some() {
        return Ok(usage_error("doctor takes no argument"));
    }
    agent_host::logging::init_cli_logging();
    // A config.toml that does not read is one of the checks, not a refusal.
    let home = match agent_host::config::home_from_env() {
        Ok(home) => home,
        Err(_) => return Ok(load_config().err().unwrap_or(ExitCode::FAILURE)),
    };
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reply = runtime.block_on(agent_host::doctor::run(&home, config));
    let screen = if cli.json {
        None
    } else {
        human::terminal("doctor")
    };
    match screen {
        Some(screen) => human::show("doctor", &reply, &screen),
        None => print_reply(&reply),
    }
    Ok(exit_code(&reply))
}

/// `agent-host pair [--scope JSON] [--ttl SECONDS] [--name LABEL]`: `pair.create` with those
/// params; on a terminal its QR, the code and how long it is valid, else (or with `--json`)
/// the reply line, byte for byte `pair.create`'s.
fn pair(cli: Cli) -> ExitCode {
    if cli.params.is_some() {
        return usage_error(
            "pair takes options only: pair [--scope JSON] [--ttl SECONDS] [--name LABEL]",
        );
    }
    let mut params = serde_json::Map::new();
    if let Some(scope) = &cli.scope {
        match agent_host::protocol::strict_json::parse(scope) {
            Ok(scope) => {
                params.insert("scope".to_owned(), scope);
            }
            Err(e) => {
                let reply = Reply::error(
                    ErrorCode::InvalidJson,
                    format!("--scope is not valid JSON: {e}"),
                    serde_json::Value::Null,
                );
                print_reply(&reply);
                return exit_code(&reply);
            }
        }
    }
    if let Some(ttl) = cli.ttl {
        params.insert("ttl_s".to_owned(), ttl.into());
    }
    if let Some(name) = cli.name {
        params.insert("name".to_owned(), name.into());
    }
    let envelope =
        agent_host::protocol::envelope::envelope("pair.create", serde_json::Value::Object(params));
    let command = match Command::parse_value(envelope.clone()) {
        Ok(command) => command,
        Err(e) => {
            let reply = e.into_reply();
            print_reply(&reply);
            return exit_code(&reply);
        }
    };
    let config = match load_config() {
        Ok(config) => config,
        Err(code) => return code,
    };
    let screen = if cli.json {
        None
    } else {
        human::terminal("pair.create")
    };
    let reply = client::execute(command, envelope, &config);
    match screen {
        Some(screen) => human::show("pair.create", &reply, &screen),
        None => print_reply(&reply),
    }
    exit_code(&reply)
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
    if cli.input == "completions" {
        return Ok(completions(cli.params.as_deref()));
    }
    if cli.input == "man" {
        return Ok(match cli.params {
            None => man(),
            Some(_) => usage_error("man takes no argument"),
        });
    }
    if cli.print {
        return Ok(usage_error("--print is an option of `open` only"));
    }
    if cli.input == "pair" {
        return Ok(pair(cli));
    }
    if cli.scope.is_some() || cli.ttl.is_some() || cli.name.is_some() {
        return Ok(usage_error(
            "--scope, --ttl and --name are options of `pair` only",
        ));
    }
    if cli.input == "service" {
        return Ok(service(cli.params.as_deref()));
    }
    if cli.input == "doctor" {
        return doctor(cli);
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
            // needs them. A person at a terminal reads a list-like reply as a table.
            let name = command.name();
            let screen = if cli.json {
                None
            } else {
                human::terminal(name)
            };
            let reply = client::execute(command, envelope, &config);
            match screen {
                Some(screen) => human::show(name, &reply, &screen),
                None => print_reply(&reply),
            }
            reply
        }
    };
    Ok(exit_code(&reply))
}
