//! The interactive `agent-host follow` (issue 17, acceptance 6): the real binary in a
//! pseudo-terminal this test drives, following a session of a host that runs the real `claude`
//! CLI against the project's mock model. The screen is parsed with `vt100` and every check
//! reads it: a streamed answer with its code block set apart, a permission answered with `y`
//! runs the tool, Esc cancels a slow turn, typed text is sent as the next prompt, Ctrl-C
//! restores the terminal — and no log line ever reaches the screen, although the follower
//! logs at `debug`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::io::{Read, Write};
use std::num::NonZeroU16;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::world::{Family, TURN, World, in_netns};
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const ROWS: u16 = 50;
const COLS: u16 = 160;

/// What must never be on the screen: the marks of a tracing line.
const LOG_MARKS: [&str; 6] = [
    " INFO ",
    "DEBUG",
    " WARN ",
    "TRACE",
    "ERROR ",
    "tungstenite",
];

/// The follower in its pseudo-terminal, and the screen as the test sees it.
struct Tui {
    parser: Arc<Mutex<vt100::Parser>>,
    changed: watch::Receiver<u64>,
    /// Every screen state that showed a log mark.
    leaks: Arc<Mutex<Vec<String>>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
}

impl Tui {
    fn spawn(home: &std::path::Path, session: &str) -> Tui {
        let pair = native_pty_system()
            .openpty(PtySize {
                rows: ROWS,
                cols: COLS,
                pixel_width: 0,
                pixel_height: 0,
            })
            .unwrap();
        let mut cmd = CommandBuilder::new(BIN);
        cmd.args(["follow", session]);
        cmd.env("AGENT_HOST_HOME", home);
        cmd.env("AGENT_HOST_LOG", "debug");
        cmd.env("TERM", "xterm-256color");
        let child = pair.slave.spawn_command(cmd).unwrap();
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = pair.master.take_writer().unwrap();
        let parser = Arc::new(Mutex::new(vt100::Parser::new(
            NonZeroU16::new(ROWS).unwrap(),
            NonZeroU16::new(COLS).unwrap(),
            0,
        )));
        let leaks = Arc::new(Mutex::new(Vec::new()));
        let (tx, changed) = watch::channel(0u64);
        let (p, l) = (parser.clone(), leaks.clone());
        // The master must be read all along, or the child blocks writing to the terminal.
        std::thread::spawn(move || {
            let _master = pair.master;
            let mut buf = [0u8; 16384];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut parser = p.lock().unwrap();
                        parser.process(&buf[..n]);
                        let screen = parser.screen().contents();
                        if LOG_MARKS.iter().any(|m| screen.contains(m)) {
                            l.lock().unwrap().push(screen);
                        }
                        drop(parser);
                        tx.send_modify(|n| *n += 1);
                    }
                }
            }
        });
        Tui {
            parser,
            changed,
            leaks,
            writer,
            child,
        }
    }

    fn screen(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    /// Wait until the screen shows `pred`, reading the terminal's output as it comes.
    async fn until(&mut self, what: &str, wait: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            match tokio::time::timeout_at(deadline, self.changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("the terminal closed before {what}; screen:\n{screen}"),
                Err(_) => panic!("no {what} on the screen in {wait:?}; screen:\n{screen}"),
            }
        }
    }

    async fn shows(&mut self, text: &str, wait: Duration) -> String {
        let text = text.to_owned();
        self.until(&format!("{text:?}"), wait, move |s| s.contains(&text))
            .await
    }

    fn keys(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
        self.writer.flush().unwrap();
    }
}

async fn runs(world: &World, session: &str) -> Vec<Value> {
    let data = world
        .host()
        .ok("session.runs", json!({"session_id": session}))
        .await;
    data["runs"].as_array().unwrap().clone()
}

#[test]
fn the_interactive_follow_streams_answers_permissions_cancels_and_sends() {
    let Some(rt) = in_netns(
        Family::Claude,
        "the_interactive_follow_streams_answers_permissions_cancels_and_sends",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut tui = Tui::spawn(&world.host().home, &session);
        tui.shows("connected", TURN).await;

        // Typed text + Enter is sent as a prompt; the answer streams onto the screen.
        tui.keys(b"hello tui\r");
        tui.shows("you ▸ hello tui", TURN).await;
        tui.shows(
            "echo: hello tui [user turns seen: 1; first: hello tui]",
            TURN,
        )
        .await;
        let sent = runs(&world, &session).await;
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(
            sent[0]["client_msg_id"]
                .as_str()
                .unwrap()
                .starts_with("follow-"),
            "{sent:?}"
        );

        // A markdown answer streams in chunks; its code block is set apart.
        tui.keys(b"MARKDOWN please\r");
        let screen = tui.shows("╰─", TURN).await;
        assert!(screen.contains("╭─ rust"), "{screen}");
        assert!(screen.contains("│ fn main() {}"), "{screen}");

        // A tool call asks; `y` on the empty input line allows it, the tool runs.
        tui.keys(b"TOOLCALL `touch tui-approved && echo tui-out`\r");
        tui.shows("[y]", TURN).await;
        // A pasted `y` (bracketed paste) is text, not an answer; Esc clears the draft and
        // does not cancel the waiting turn.
        tui.keys(b"\x1b[200~y\x1b[201~");
        tui.until("the pasted y on the input line", TURN, |s| {
            s.lines().any(|l| l.trim_end() == "› y")
        })
        .await;
        assert!(tui.screen().contains("[y]"), "{}", tui.screen());
        tui.keys(b"\x1b");
        tui.until("the cleared input line", TURN, |s| {
            s.lines().any(|l| l.trim_end() == "›")
        })
        .await;
        // `a` asks before it keeps a lasting rule (or says none is offered); another key
        // takes the question back. Neither types the `a`.
        tui.keys(b"a");
        let asked = tui
            .until("the allow-always question", TURN, |s| {
                s.contains("allow always? a / Enter") || s.contains("offers no allow-always option")
            })
            .await;
        if asked.contains("allow always? a / Enter") {
            assert!(asked.contains("a lasting rule: "), "{asked}");
            tui.keys(b"x");
            tui.shows("allow always: not granted", TURN).await;
        }
        let screen = tui.screen();
        assert!(screen.lines().any(|l| l.trim_end() == "›"), "{screen}");
        assert!(screen.contains("[y]"), "still waiting: {screen}");
        tui.keys(b"y");
        let screen = tui.shows("tool said: tui-out", TURN).await;
        assert!(screen.contains("⚙ Bash touch tui-approved"), "{screen}");
        assert!(screen.contains("✓ 1 line"), "{screen}");
        assert!(screen.contains("→ allow"), "{screen}");
        assert!(!screen.contains("[y]"), "the request is answered: {screen}");
        assert!(world.work.join("tui-approved").exists());
        let history = world
            .host()
            .ok(
                "session.history",
                json!({"session_id": session, "after_seq": 0, "limit": 5000}),
            )
            .await;
        let resolved: Vec<&Value> = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "permission.resolved")
            .collect();
        assert_eq!(resolved.len(), 1, "{resolved:?}");
        assert_eq!(resolved[0]["event"]["decision"], "allow");
        // The tool's output on demand: Tab selects it, Enter unfolds it.
        tui.keys(b"\t");
        tui.shows("» ▸ ⚙ Bash", TURN).await;
        tui.keys(b"\r");
        tui.shows("│ tui-out", TURN).await;
        // Esc on an empty line drops the selection first (it cancels nothing then).
        tui.keys(b"\x1b");
        tui.until("the dropped selection", TURN, |s| !s.contains("» ▾ ⚙ Bash"))
            .await;

        // Esc cancels a slow turn — on an empty line only: with a draft it clears the draft.
        tui.keys(b"SLOW stream\r");
        tui.shows("slow 2 ", TURN).await;
        tui.keys(b"draft");
        tui.shows("› draft", TURN).await;
        tui.keys(b"\x1b");
        tui.until("the cleared draft", TURN, |s| !s.contains("› draft"))
            .await;
        assert!(
            !tui.screen()
                .lines()
                .any(|l| l.contains("── run") && l.contains("cancelled")),
            "Esc with a draft cancelled the turn: {}",
            tui.screen()
        );
        tui.keys(b"\x1b");
        tui.until("the cancelled run", TURN, |s| {
            s.lines()
                .any(|l| l.contains("── run") && l.contains("cancelled"))
        })
        .await;

        // The next typed prompt goes to the same session, and the model sees it.
        tui.keys(b"after cancel\r");
        tui.shows("after cancel [user turns seen: 5", TURN).await;
        // The host says so too (its run rows are written behind the events the screen shows;
        // the session runs one turn at a time, so the cancelled one is closed by now).
        let all = runs(&world, &session).await;
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(all[3]["state"], "cancelled", "{all:?}");

        // Ctrl-C: the follower exits 0 and leaves the terminal as it found it.
        tui.keys(b"\x03");
        let mut child = tui.child;
        let status = tokio::time::timeout(
            common::WAIT,
            tokio::task::spawn_blocking(move || child.wait()),
        )
        .await
        .expect("follow did not exit on Ctrl-C")
        .unwrap()
        .unwrap();
        assert!(status.success(), "follow exited with {status:?}");
        assert!(!tui.parser.lock().unwrap().screen().alternate_screen());
        let subscribers = world.host().ok("subscriber.list", json!({})).await;
        assert_eq!(subscribers["subscribers"], json!([]), "{subscribers}");

        let leaks = tui.leaks.lock().unwrap().clone();
        assert!(
            leaks.is_empty(),
            "a log line reached the screen:\n{}",
            leaks[0]
        );
        // The follower did log (at `debug`), so "no log line on the screen" means something.
        let log = std::fs::read_to_string(world.host().home.join("logs").join("follow.log"))
            .unwrap_or_default();
        assert!(!log.trim().is_empty(), "logs/follow.log is empty");
        // The line follower at the CLI's default level: no tungstenite debug line on stderr
        // for its connect (the handshake filter once raised that crate to `debug`).
        let mut line = tokio::process::Command::new(BIN)
            .args(["follow", &session, "--json"])
            .env("AGENT_HOST_HOME", &world.host().home)
            .env_remove("AGENT_HOST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = line.stdout.take().unwrap();
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let first = tokio::time::timeout(common::WAIT, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.starts_with('{'), "{first}");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(line.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let out = tokio::time::timeout(common::WAIT, line.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("tungstenite") && !stderr.contains("DEBUG"),
            "{stderr}"
        );
        world.host.unwrap().stop().await;
    });
}
