//! Pairing remote bots (issue 21, part S): `pair.create`, `pair.list` and `pair.revoke` over
//! the real IPC socket, the code they hand out, and a bot that pairs with it through the
//! host's own `PairRegistry` and then connects — the Noise handshakes and a sealed channel
//! in-process, since the relay transport between them is another part's. Then the CLI: the
//! real `agent-host pair` in a pseudo-terminal prints the QR, the code and its validity, and
//! piped prints the reply line as `pair.create` does.
//!
//! Nothing sleeps to wait for a condition: every wait is a reply, a process exit or a
//! terminal closing, each bounded.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use crate::common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agent_host::config::{Config, RelayConfig, RelayTiming};
use agent_host::protocol::envelope::{ErrorCode, Reply};
use agent_host::protocol::scope::Scope;
use agent_host::seal::pairs::PairRegistry;
use agent_host::seal::{
    Accepted, BotHandshake, BotKey, HandshakeKind, HostHandshake, HostKey, PairingCode, key_id,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{TestHost, WAIT};
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");

/// A host in this process (the real `agent_host::run`) whose `[relay]` points at a relay's
/// `/host` (nothing listens there: the code only names it); `pairs` is its registry.
async fn in_process(home: &Path) -> TestHost {
    let mut config = Config::with_home(home).unwrap();
    config.relay = Some(RelayConfig {
        url: "ws://127.0.0.1:9/host".into(),
        token: "t".into(),
        scope: Scope::default(),
        timing: RelayTiming::default(),
    });
    TestHost::start_config(config).await
}

/// The host's half of a pairing as its relay client runs it: the secret by the `Open`
/// frame's `secret_id`, message 1 read with it, the bot stored, message 2.
async fn host_side_of_pairing(
    pairs: &PairRegistry,
    secret_id: &str,
    message1: &[u8],
) -> (agent_host::seal::Channel, Vec<u8>, String) {
    let pending = pairs.begin_pair(secret_id).await.unwrap();
    let host = pairs.host_key().await.unwrap();
    let (handshake, hello) =
        HostHandshake::read(HandshakeKind::Pair, &host, Some(&pending.psk), message1).unwrap();
    let bot = pairs
        .complete_pair(secret_id, hello.bot_public, &hello.name)
        .await
        .unwrap();
    let (channel, message2) = handshake
        .accept(&Accepted {
            host_id: host.host_id(),
            bot_id: bot.bot_id.clone(),
            scope: bot.scope.clone(),
        })
        .unwrap();
    (channel, message2, bot.bot_id)
}

#[tokio::test]
async fn a_code_from_pair_create_pairs_a_bot_that_then_connects_until_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let host = in_process(&home).await;

    // Nothing paired yet, and no key made before it is needed.
    assert_eq!(host.ok("pair.list", json!({})).await, json!({"bots": []}));
    assert!(!home.join("relay.key").exists());
    let unknown = host.ipc("pair.revoke", json!({"bot": "nobody"})).await;
    assert_eq!(unknown.error_code(), Some(ErrorCode::BotNotFound));
    assert_eq!(unknown.code, 5002);
    assert_eq!(
        unknown.data,
        json!({"error": "bot_not_found", "bot_id": "nobody"})
    );
    let refused = host.ipc("pair.create", json!({"ttl_s": 3601})).await;
    assert_eq!(refused.error_code(), Some(ErrorCode::InvalidParams));

    let made = host
        .ok(
            "pair.create",
            json!({"scope": {"sessions": ["s1"], "permissions": true}, "ttl_s": 120, "name": "phone"}),
        )
        .await;
    // The code decodes to this host's id and key, which are relay.key's (0600).
    let key_file = home.join("relay.key");
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let key = HostKey::load_or_create(&home).unwrap();
    let code = PairingCode::decode(made["code"].as_str().unwrap()).unwrap();
    assert_eq!(code.host_id, key.host_id());
    assert_eq!(code.host_public, key.public());
    assert_eq!(key_id(&code.host_public), code.host_id);
    assert_eq!(made["host_id"], json!(key.host_id()));
    assert_eq!(
        made["host_public"],
        json!(URL_SAFE_NO_PAD.encode(key.public()))
    );
    assert_eq!(made["secret_id"], json!(code.secret_id));
    assert_eq!(made["expires_at_ms"], json!(code.expires_at_ms));
    assert_eq!(made["relay_urls"], json!(["ws://127.0.0.1:9/bot"]));
    assert_eq!(code.relay_urls, ["ws://127.0.0.1:9/bot"]);
    assert_eq!(
        made["scope"],
        json!({"sessions": ["s1"], "prompt": true, "permissions": true, "create_sessions": false})
    );
    assert!(made["qr"].as_str().unwrap().contains('\u{2588}'));
    let validity = code.expires_at_ms - agent_host::store::now_ms();
    assert!((110_000..=120_000).contains(&validity), "{validity}");
    // The secret is in the code only: not in the database.
    let db = std::fs::read(home.join("host.db")).unwrap();
    let wal = std::fs::read(home.join("host.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(
            !bytes.windows(32).any(|w| w == code.secret),
            "secret stored"
        );
    }

    // A bot pairs with it.
    let bot = BotKey::generate().unwrap();
    let (bot_side, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &bot,
        &code.host_public,
        Some(&code.secret),
        "my-telegram-bot",
    )
    .unwrap();
    let (mut host_channel, m2, bot_id) =
        host_side_of_pairing(&host.pairs, &code.secret_id, &m1).await;
    assert_eq!(bot_id, bot.bot_id());
    let (mut bot_channel, accepted) = bot_side.finish(&m2).unwrap();
    assert_eq!(accepted.host_id, key.host_id());
    assert_eq!(accepted.scope.sessions, Some(vec!["s1".to_owned()]));
    let frame = vec![7u8; 1024 * 1024];
    let mut got = None;
    for sealed in host_channel.seal(&frame).unwrap() {
        got = bot_channel.open(&sealed).unwrap();
    }
    assert_eq!(got.as_deref(), Some(frame.as_slice()));

    // The code is used: a second bot with it is refused before any handshake.
    assert!(host.pairs.begin_pair(&code.secret_id).await.is_err());

    // Listed under the code's label, with its scope.
    let listed = host.ok("pair.list", json!({})).await;
    let bots = listed["bots"].as_array().unwrap();
    assert_eq!(bots.len(), 1, "{listed}");
    assert_eq!(bots[0]["bot_id"], json!(bot_id));
    assert_eq!(bots[0]["name"], json!("phone"));
    assert_eq!(bots[0]["scope"]["sessions"], json!(["s1"]));
    assert_eq!(bots[0]["revoked_at_ms"], Value::Null);
    assert_eq!(bots[0]["connected"], json!(false));
    assert!(bots[0].get("public_key").is_none());

    // A later connection: IK, no secret; the host knows the key.
    let (bot_side, m1) =
        BotHandshake::start(HandshakeKind::Connect, &bot, &code.host_public, None, "b").unwrap();
    let (handshake, hello) = HostHandshake::read(HandshakeKind::Connect, &key, None, &m1).unwrap();
    let record = host.pairs.bot(&hello.bot_public).await.unwrap().unwrap();
    assert!(!record.is_revoked());
    let (_, m2) = handshake
        .accept(&Accepted {
            host_id: key.host_id(),
            bot_id: record.bot_id.clone(),
            scope: record.scope.clone(),
        })
        .unwrap();
    bot_side.finish(&m2).unwrap();
    // A key that never paired is unknown.
    let stranger = BotKey::generate().unwrap();
    assert_eq!(host.pairs.bot(&stranger.public()).await.unwrap(), None);

    // Revoked over IPC: heard at once, and still listed.
    let mut revocations = host.pairs.revocations();
    let revoked = host.ok("pair.revoke", json!({"bot": bot_id})).await;
    assert_eq!(revoked, json!({"bot_id": bot_id, "revoked": true}));
    let heard = tokio::time::timeout(Duration::from_secs(1), revocations.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(heard, bot_id);
    assert!(
        host.pairs
            .bot(&bot.public())
            .await
            .unwrap()
            .unwrap()
            .is_revoked()
    );
    let listed = host.ok("pair.list", json!({})).await;
    assert!(listed["bots"][0]["revoked_at_ms"].is_i64(), "{listed}");

    // A restart forgets pending secrets (their codes are refused) and keeps the key.
    let pending = host.ok("pair.create", json!({})).await;
    let pending = PairingCode::decode(pending["code"].as_str().unwrap()).unwrap();
    assert!(host.pairs.begin_pair(&pending.secret_id).await.is_ok());
    host.stop().await;
    let host = in_process(&home).await;
    assert!(host.pairs.begin_pair(&pending.secret_id).await.is_err());
    assert_eq!(host.pairs.host_key().await.unwrap().public(), key.public());
    assert_eq!(
        host.ok("pair.list", json!({})).await["bots"][0]["bot_id"],
        json!(bot_id)
    );
    host.stop().await;
}

/// A private home with a detached host (the real binaries), killed by its pid if a test
/// fails before its shutdown.
struct Home {
    _dir: tempfile::TempDir,
    home: PathBuf,
}

impl Home {
    fn start() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = Home {
            home: dir.path().join("home"),
            _dir: dir,
        };
        let (out, ok) = home.piped(&["host.start"]);
        assert!(ok, "host.start: {out}");
        home
    }

    /// Run `agent-host` with stdout a pipe: its stdout and whether it exited 0.
    fn piped(&self, args: &[&str]) -> (String, bool) {
        let out = Command::new(BIN)
            .args(args)
            .env("AGENT_HOST_HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        (String::from_utf8(out.stdout).unwrap(), out.status.success())
    }

    /// One reply line, as the CLI prints it.
    fn reply(&self, args: &[&str]) -> (String, Reply, bool) {
        let (out, ok) = self.piped(args);
        assert!(
            out.ends_with('\n') && out.matches('\n').count() == 1,
            "{args:?}: {out:?}"
        );
        let reply: Reply = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(ok, reply.is_ok(), "{args:?}: {out}");
        (out, reply, ok)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        common::reap::kill_lock_holder(&self.home.join("host.lock"));
    }
}

/// What a command wrote to its terminal (`\r\n` read as `\n`) and whether it exited 0.
fn in_terminal(home: &Path, args: &[&str]) -> (String, bool) {
    let pty = native_pty_system()
        .openpty(PtySize {
            rows: 80,
            cols: 160,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(BIN);
    cmd.args(args);
    cmd.env("AGENT_HOST_HOME", home);
    cmd.env("TERM", "xterm-256color");
    let mut child = pty.slave.spawn_command(cmd).unwrap();
    drop(pty.slave);
    let mut reader = pty.master.try_clone_reader().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 8192];
        // Until the terminal closes: EOF, or EIO once the last writer is gone.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
        }
        let _gone = tx.send(bytes);
    });
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _gone = done_tx.send(child.wait().unwrap());
    });
    let status = done_rx
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("agent-host {args:?} did not exit in {WAIT:?}"));
    let bytes = rx
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("agent-host {args:?}: its terminal never closed"));
    drop(pty.master);
    let text = String::from_utf8(bytes).unwrap().replace("\r\n", "\n");
    (text, status.success())
}

#[test]
fn agent_host_pair_prints_a_qr_on_a_terminal_and_the_reply_line_when_piped() {
    let home = Home::start();

    // On a terminal: the QR, the code, how long it is valid.
    let (screen, ok) = in_terminal(&home.home, &["pair", "--name", "phone", "--ttl", "300"]);
    assert!(ok, "{screen}");
    let lines: Vec<&str> = screen.lines().collect();
    let code_at = lines
        .iter()
        .position(|l| l.starts_with("ahpair1."))
        .unwrap_or_else(|| panic!("no code in {screen}"));
    assert!(code_at > 10, "a QR above the code: {screen}");
    for line in &lines[..code_at] {
        assert!(
            !line.is_empty()
                && line
                    .chars()
                    .all(|c| " \u{2580}\u{2584}\u{2588}".contains(c)),
            "{line:?}"
        );
    }
    let code = PairingCode::decode(lines[code_at]).unwrap();
    let key = HostKey::load_or_create(&home.home).unwrap();
    assert_eq!(code.host_id, key.host_id());
    assert_eq!(code.host_public, key.public());
    assert!(
        lines[code_at + 1].starts_with("valid for 4 min")
            || lines[code_at + 1].starts_with("valid for 5 min"),
        "{screen}"
    );
    assert!(screen.contains("no relay is configured"), "{screen}");
    assert!(!screen.contains('{'), "not JSON: {screen}");

    // Piped, and with --json on a terminal: the reply line of pair.create, same keys, same
    // serialization (each code is new, so the bytes of two runs differ only there).
    let (line, reply, _) = home.reply(&["pair", "--ttl", "60"]);
    assert_eq!(line, format!("{}\n", reply.to_line()));
    let (direct_line, direct, _) = home.reply(&["pair.create", r#"{"ttl_s":60}"#]);
    assert_eq!(direct_line, format!("{}\n", direct.to_line()));
    let keys = |r: &Reply| -> Vec<String> { r.data.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&reply), keys(&direct));
    assert_eq!(
        keys(&reply),
        [
            "code",
            "expires_at_ms",
            "host_id",
            "host_public",
            "qr",
            "relay_urls",
            "scope",
            "secret_id"
        ]
    );
    assert_eq!(reply.data["host_id"], direct.data["host_id"]);
    assert_eq!(reply.data["scope"], direct.data["scope"]);
    assert_eq!(
        reply.data["qr"],
        json!(
            PairingCode::decode(reply.data["code"].as_str().unwrap())
                .unwrap()
                .qr()
                .unwrap()
        )
    );
    let (json_screen, ok) = in_terminal(&home.home, &["pair", "--json"]);
    assert!(ok, "{json_screen}");
    let on_terminal: Reply = serde_json::from_str(json_screen.trim_end()).unwrap();
    assert_eq!(keys(&on_terminal), keys(&direct));

    // The scope travels; bad options are refused with their codes.
    let (_, scoped, _) = home.reply(&["pair", "--scope", r#"{"sessions":["a"],"prompt":false}"#]);
    assert_eq!(
        scoped.data["scope"],
        json!({"sessions": ["a"], "prompt": false, "permissions": false, "create_sessions": false})
    );
    for (args, error) in [
        (&["pair", "--scope", "{nope"][..], "invalid_json"),
        (
            &["pair", "--scope", r#"{"admin":true}"#][..],
            "invalid_params",
        ),
        (&["pair", "--ttl", "0"][..], "invalid_params"),
        (&["pair", "--ttl", "3601"][..], "invalid_params"),
        (&["pair", "extra"][..], "invalid_envelope"),
        (&["session.list", "--ttl", "5"][..], "invalid_envelope"),
    ] {
        let (_, refused, ok) = home.reply(args);
        assert!(!ok);
        assert_eq!(
            refused.data["error"],
            json!(error),
            "{args:?}: {}",
            refused.to_line()
        );
    }

    // Nothing is paired by making codes; revoking an unknown bot says so.
    let (_, list, _) = home.reply(&["pair.list"]);
    assert_eq!(list.data, json!({"bots": []}));
    let (table, ok) = in_terminal(&home.home, &["pair.list"]);
    assert!(ok && table.starts_with("no paired bots"), "{table}");
    let (_, unknown, ok) = home.reply(&["pair.revoke", r#"{"bot":"0123"}"#]);
    assert!(!ok);
    assert_eq!(unknown.code, 5002);
    assert_eq!(unknown.data["bot_id"], json!("0123"));

    let (out, ok) = home.piped(&["host.shutdown"]);
    assert!(ok, "{out}");
}
