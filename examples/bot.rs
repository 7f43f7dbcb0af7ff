//! The reference bot (issue 21): a remote bot for the sealed relay fleet, a thin command line
//! over `agent_host::relay::bot::BotClient` — the starting point for a chat-platform bot, whose
//! commands would be chat messages instead of argv.
//!
//! - `pair --code C --key FILE --state FILE [--name N] [--token T]`: pair once with the code
//!   `agent-host pair` printed (the key file is created 0600 when missing; the state file,
//!   0600, remembers the host, its key, the relay URLs and the relay's bot token).
//! - `follow --state FILE [--session ID]`: print every bracket event, one a line, and
//!   `needs you: …` for a permission request and the end of a run; acks what it printed, so a
//!   restarted `follow` goes on where it stopped. Reconnects by itself (another relay
//!   instance, a renewed channel); ends when the host refuses the bot (revoked).
//! - `answer --state FILE --session S --request R --decision allow|deny [--message M]`.
//! - `send --state FILE --session S --text T [--client-msg-id K]`: a retry with the same key
//!   runs the prompt once.
//!
//! The bot token comes from `--token` or `RELAY_BOT_TOKEN` at pairing. Exit status: 0 when the
//! host answered with code 0, 1 otherwise (the reply line says why), 2 on a transport failure.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line bot reports on stdout"
)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agent_host::protocol::envelope::Reply;
use agent_host::relay::bot::{self, BotClient, BotEvent, BotOptions, BotState};
use agent_host::seal::PairingCode;
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "The reference bot of agent-host's sealed relay fleet")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pair with a host by its pairing code.
    Pair {
        #[arg(long)]
        code: String,
        /// The bot's static key (created when missing).
        #[arg(long)]
        key: PathBuf,
        /// Where to write what the bot needs to connect again.
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value = "reference-bot")]
        name: String,
        /// The relay's bot token (default: `RELAY_BOT_TOKEN`).
        #[arg(long)]
        token: Option<String>,
    },
    /// Print events as they come; "needs you:" when a session waits for its user.
    Follow {
        #[arg(long)]
        state: PathBuf,
        /// Only this session's events.
        #[arg(long)]
        session: Option<String>,
    },
    /// Answer a permission request.
    Answer {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        session: String,
        #[arg(long)]
        request: String,
        #[arg(long, value_parser = ["allow", "deny"])]
        decision: String,
        #[arg(long)]
        message: Option<String>,
    },
    /// Send a prompt.
    Send {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        session: String,
        #[arg(long)]
        text: String,
        /// The prompt's idempotency key (a retry with it runs once); one is made when absent.
        #[arg(long)]
        client_msg_id: Option<String>,
    },
}

/// How long one request may take, reconnects included.
const REQUEST_WAIT: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bot: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Cmd::Pair {
            code,
            key,
            state,
            name,
            token,
        } => {
            let code = PairingCode::decode(&code).context("the pairing code")?;
            let token = match token {
                Some(token) => token,
                None => std::env::var("RELAY_BOT_TOKEN")
                    .context("give the relay's bot token: --token or RELAY_BOT_TOKEN")?,
            };
            let paired = bot::pair(&code, &key, &name, &token, &BotOptions::default()).await?;
            paired.save(&state)?;
            println!(
                "paired with host {} as bot {}; scope {}; state in {}",
                paired.host_id,
                paired.bot_id,
                serde_json::to_string(&paired.scope)?,
                state.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Follow { state, session } => follow(&BotState::load(&state)?, session).await,
        Cmd::Answer {
            state,
            session,
            request,
            decision,
            message,
        } => {
            let mut params =
                json!({"session_id": session, "request_id": request, "decision": decision});
            if let Some(message) = message {
                params["message"] = Value::String(message);
            }
            one_request(&BotState::load(&state)?, "permission.respond", params).await
        }
        Cmd::Send {
            state,
            session,
            text,
            client_msg_id,
        } => {
            let key = client_msg_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let params = json!({"session_id": session, "text": text, "client_msg_id": key});
            one_request(&BotState::load(&state)?, "session.send", params).await
        }
    }
}

/// Connect without events, run one command, print its reply line.
async fn one_request(state: &BotState, command: &str, params: Value) -> anyhow::Result<ExitCode> {
    let options = BotOptions {
        events: false,
        ..BotOptions::default()
    };
    let client = BotClient::connect_with(state, options).await?;
    let reply = tokio::time::timeout(REQUEST_WAIT, client.request(command, params))
        .await
        .context("no reply in time")??;
    client.close().await;
    println!("{}", reply.to_line());
    Ok(exit_of(&reply))
}

fn exit_of(reply: &Reply) -> ExitCode {
    if reply.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

async fn follow(state: &BotState, session: Option<String>) -> anyhow::Result<ExitCode> {
    let mut client = BotClient::connect(state).await?;
    println!(
        "following host {} as bot {} ({})",
        state.host_id,
        state.bot_id,
        session.as_deref().unwrap_or("every session in scope")
    );
    loop {
        let event = match client.next_event().await {
            Ok(event) => event,
            Err(e) => {
                println!("ended: {e}");
                return Ok(ExitCode::from(1));
            }
        };
        if event.is_delta || session.as_ref().is_some_and(|s| *s != event.session_id) {
            continue;
        }
        println!("{}", line_of(&event));
        if let Some(needs) = needs_you(&event) {
            println!("{needs}");
        }
        client.ack(event.sequence_id).await?;
    }
}

/// One line for a bracket: sequence id, session, kind, and a short summary.
fn line_of(event: &BotEvent) -> String {
    let e = &event.event;
    let summary = match event.kind() {
        "user.text" | "text.end" | "thinking.end" => short(e["text"].as_str().unwrap_or("")),
        "tool.call" | "tool.exec.start" => e["tool"].as_str().unwrap_or("").to_owned(),
        "tool.exec.end" => short(e["output"].as_str().unwrap_or("")),
        "run.end" => e["state"].as_str().unwrap_or("").to_owned(),
        _ => String::new(),
    };
    format!(
        "{} {} {} {}",
        event.sequence_id,
        event.session_id,
        event.kind(),
        summary
    )
    .trim_end()
    .to_owned()
}

fn needs_you(event: &BotEvent) -> Option<String> {
    let e = &event.event;
    match event.kind() {
        "permission.request" => Some(format!(
            "needs you: permission {} in session {}: {} {} (answer --session {} --request {} --decision allow|deny)",
            e["requestId"].as_str().unwrap_or(""),
            event.session_id,
            e["tool"].as_str().unwrap_or(""),
            short(&e["input"].to_string()),
            event.session_id,
            e["requestId"].as_str().unwrap_or(""),
        )),
        "run.end" => Some(format!(
            "needs you: run {} in session {} ended {}",
            event.run_id,
            event.session_id,
            e["state"].as_str().unwrap_or("")
        )),
        _ => None,
    }
}

/// The first line of a text, at most 80 characters.
fn short(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(80).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}
