//! Tracing setup for the host process: `logs/host.log` under the home, plus stderr when a
//! person runs the host in the foreground; for CLI commands, warnings on stderr; for the
//! interactive `follow`, `logs/follow.log` and never the terminal it draws on. Secrets
//! (tokens, env values, API keys) are never passed to a tracing macro, and tungstenite's
//! handshake tracing (which prints request headers) is capped below `trace`, so they cannot
//! reach either. The cap only ever lowers tungstenite's level: at the CLI's `warn` its debug
//! lines stay out.
//!
//! The host's log rotates by size ([`RotatingFile`]: `host.log`, then `host.log.1` … the
//! newest older one first, a bounded number kept), and its filter can be replaced while the
//! host runs ([`set_host_filter`], used by a `config.toml` reload): the filter sits in a
//! `tracing_subscriber::reload` layer whose handle is kept here, beside the global subscriber
//! it belongs to.
//!
//! Every line goes through [`Escaped`]: a logged string (a URL from a command, an agent's
//! stderr, an error message) that holds a newline or a control sequence is written escaped,
//! so it can neither forge a separate log line nor drive the terminal of whoever reads the
//! log.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tracing_appender::non_blocking::WorkerGuard;

use tracing::Subscriber;
use tracing_subscriber::filter::combinator::And;
use tracing_subscriber::filter::{FilterExt, LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::Config;

/// Install the global subscriber. Keep the guard alive until exit so buffered lines are written.
pub fn init_host_logging(config: &Config, also_stderr: bool) -> Option<WorkerGuard> {
    config.ensure_home().ok()?;
    let file = match RotatingFile::open(&config.log_path(), config.log_max_bytes, config.log_files)
    {
        Ok(file) => file,
        Err(e) => {
            // Nowhere to log to: say so where someone may see it, once.
            let _unseen = writeln!(
                io::stderr(),
                "cannot open {}: {e}",
                config.log_path().display()
            );
            return None;
        }
    };
    let (file, guard) = tracing_appender::non_blocking(file);
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let installed = if also_stderr {
        install_reloadable(Escaped(file.and(std::io::stderr)), filter)
    } else {
        install_reloadable(Escaped(file), filter)
    };
    installed.then_some(guard)
}

/// Replaces the host log's filter; set once, by [`init_host_logging`].
type SetFilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;
static HOST_FILTER: OnceLock<SetFilter> = OnceLock::new();

/// Whether `directives` is a filter [`set_host_filter`] would take (`Err`: why not).
pub fn check_filter(directives: &str) -> Result<(), String> {
    EnvFilter::try_new(directives)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Log at `directives` from now on (a `config.toml` reload). `Ok(false)`: this process has no
/// host log to change (the host embedded in a test or a benchmark, which logs as its caller
/// set up). The handshake cap ([`quiet_handshakes`]) stays whatever is asked.
pub fn set_host_filter(directives: &str) -> Result<bool, String> {
    let filter = EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
    match HOST_FILTER.get() {
        Some(set) => set(filter).map(|()| true),
        None => Ok(false),
    }
}

/// [`install`] with the filter in a reload layer, whose handle [`set_host_filter`] uses.
fn install_reloadable<W>(writer: W, filter: EnvFilter) -> bool
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter, handle) =
        tracing_subscriber::reload::Layer::new(quiet_handshakes::<Registry>(filter));
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer)
        .with_filter(filter);
    if tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .is_err()
    {
        return false;
    }
    let _set_once = HOST_FILTER.set(Box::new(move |filter| {
        handle
            .reload(quiet_handshakes::<Registry>(filter))
            .map_err(|e| e.to_string())
    }));
    true
}

/// The host's log file, rotated by size: once a line would take `host.log` past `max_bytes`,
/// `host.log.{n-1}` becomes `host.log.{n}` (the oldest, `host.log.{keep}`, is replaced), …,
/// `host.log` becomes `host.log.1`, and a new `host.log` is started. So at most `keep` older
/// logs stay, and `tail -F host.log` follows across a rotation. Files are 0600: a log can name
/// sessions and paths. Written only by the non-blocking writer's one thread.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    written: u64,
}

impl RotatingFile {
    /// Open (append to) `path`, which rotates at `max_bytes` keeping `keep` older files.
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<RotatingFile> {
        let file = open_log(path)?;
        let written = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_owned(),
            max_bytes,
            keep,
            file,
            written,
        })
    }

    /// The `n`th older file: `host.log.n`.
    fn older(&self, n: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        if self.keep == 0 {
            self.file.set_len(0)?;
        } else {
            for n in (1..self.keep).rev() {
                match std::fs::rename(self.older(n), self.older(n + 1)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            std::fs::rename(&self.path, self.older(1))?;
            self.file = open_log(&self.path)?;
        }
        self.written = 0;
        Ok(())
    }
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        if self.written > 0 && self.written.saturating_add(len) > self.max_bytes {
            // A rotation that fails (a full disk, a renamed directory) keeps writing where it
            // was: a log that grows beats a log that stops.
            let _kept_writing = self.rotate();
        }
        self.file.write_all(buf)?;
        self.written = self.written.saturating_add(len);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// One fmt layer writing to `writer`, filtered by `filter` with [`quiet_handshakes`], as the
/// global subscriber; `false` if one was installed already. No colours: [`Escaped`] would show
/// their escape sequences as text (`\x1b[2m…`).
fn install<W>(writer: W, filter: EnvFilter) -> bool
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer)
        .with_filter(quiet_handshakes(filter));
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .is_ok()
}

/// tungstenite logs whole handshake requests at `trace`, `Authorization` header included, and
/// every frame's payload (prompts, agent output): neither the relay token nor a conversation
/// may reach a log whatever level a user asks for. The user's filter AND a cap of `debug` for
/// those two crates: an event passes only if both let it, so the cap lowers their level and
/// never raises it (an `EnvFilter` directive `tungstenite=debug` would override a default of
/// `warn`, and printed a debug line on every connect).
fn quiet_handshakes<S>(filter: EnvFilter) -> And<EnvFilter, Targets, S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let cap = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("tungstenite", LevelFilter::DEBUG)
        .with_target("tokio_tungstenite", LevelFilter::DEBUG);
    filter.and(cap)
}

/// The filter a CLI invocation logs at: `AGENT_HOST_LOG`, else `warn`.
fn cli_filter() -> EnvFilter {
    EnvFilter::try_from_env("AGENT_HOST_LOG").unwrap_or_else(|_| EnvFilter::new("warn"))
}

/// For CLI invocations: warnings and errors to stderr only, stdout stays one JSON line.
pub fn init_cli_logging() {
    let _already_set = install(Escaped(std::io::stderr), cli_filter());
}

/// For the interactive `follow`, which owns the terminal: the CLI's level, appended to
/// `logs/follow.log` under the home, or nowhere when that file cannot be opened. Never stderr:
/// a line written there would land on the drawn screen.
pub fn init_tui_logging(config: &Config) {
    let file = std::fs::create_dir_all(config.logs_dir()).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(config.logs_dir().join("follow.log"))
    });
    if let Ok(file) = file {
        let _already_set = install(Escaped(std::sync::Mutex::new(file)), cli_filter());
    }
}

/// A [`MakeWriter`] whose writers escape what they are given. The fmt layer formats a whole
/// event into one buffer and writes it at once, so a buffer is one log line: its final newline
/// is kept, and any other control character in it (a newline inside a field, `ESC`, carriage
/// return, a C1 control) becomes a visible escape such as `\n` or `\x1b`.
pub struct Escaped<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Escaped<M> {
    type Writer = EscapedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapedWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        EscapedWriter(self.0.make_writer_for(meta))
    }
}

/// The writer of [`Escaped`].
pub struct EscapedWriter<W>(W);

impl<W: Write> Write for EscapedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(&escape_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// One formatted log line with every control character but its final newline (and tabs)
/// escaped.
pub fn escape_line(line: &[u8]) -> Vec<u8> {
    let (body, end) = match line.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (line, &b""[..]),
    };
    let mut out = Vec::with_capacity(line.len() + 8);
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.push(b),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            // U+0080..U+009F in UTF-8: C2 80..C2 9F (C1 controls, e.g. the one-byte CSI).
            0xc2 if body.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)) => {
                let n = body[i + 1];
                out.extend_from_slice(format!("\\u{{{:04x}}}", u32::from(n)).as_bytes());
                i += 1;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    out.extend_from_slice(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records `LEVEL target` of every event that reaches it.
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let meta = event.metadata();
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {}", meta.level(), meta.target()));
        }
    }

    fn passed(directives: &str) -> Vec<String> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let layer = Seen(seen.clone()).with_filter(quiet_handshakes(EnvFilter::new(directives)));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "tungstenite::handshake::client", "client handshake done");
            tracing::trace!(target: "tungstenite::protocol", "frame payload");
            tracing::warn!(target: "tungstenite::protocol", "a warning");
            tracing::debug!(target: "tokio_tungstenite", "connected");
            tracing::debug!(target: "agent_host::follow", "ours");
            tracing::trace!(target: "agent_host::follow", "ours in detail");
        });
        seen.lock().unwrap().clone()
    }

    #[test]
    fn the_handshake_cap_lowers_tungstenite_and_never_raises_it() {
        // The CLI's default: no tungstenite debug line on a connect.
        assert_eq!(passed("warn"), ["WARN tungstenite::protocol"]);
        // Asked for everything: tungstenite stops at debug, the rest goes through.
        assert_eq!(
            passed("trace"),
            [
                "DEBUG tungstenite::handshake::client",
                "WARN tungstenite::protocol",
                "DEBUG tokio_tungstenite",
                "DEBUG agent_host::follow",
                "TRACE agent_host::follow",
            ]
        );
        // Asked for tungstenite's trace by name: still capped.
        assert_eq!(
            passed("warn,tungstenite=trace"),
            [
                "DEBUG tungstenite::handshake::client",
                "WARN tungstenite::protocol"
            ]
        );
        assert_eq!(passed("agent_host=debug,warn").len(), 2);
    }

    #[test]
    fn the_log_rotates_by_size_and_keeps_a_bounded_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.log");
        let mut log = RotatingFile::open(&path, 100, 3).unwrap();
        let line = |i: usize| format!("{i:02} {}\n", "x".repeat(46)); // 50 bytes
        for i in 0..12 {
            log.write_all(line(i).as_bytes()).unwrap();
        }
        log.flush().unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        // Two lines a file; the newest in host.log, then .1, .2, .3; older ones are gone.
        assert_eq!(read(&path), format!("{}{}", line(10), line(11)));
        assert_eq!(read(&log.older(1)), format!("{}{}", line(8), line(9)));
        assert_eq!(read(&log.older(3)), format!("{}{}", line(4), line(5)));
        assert!(!log.older(4).exists());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Reopened, it counts what the file already holds.
        drop(log);
        let mut log = RotatingFile::open(&path, 100, 3).unwrap();
        log.write_all(line(12).as_bytes()).unwrap();
        assert_eq!(read(&path), line(12));
        // A line longer than the limit still goes out whole, alone in its file.
        let long = format!("{}\n", "y".repeat(300));
        log.write_all(long.as_bytes()).unwrap();
        assert_eq!(read(&path), long);
    }

    #[test]
    fn a_logged_newline_cannot_forge_a_line() {
        let line = b"INFO relay set url=ws://x\n2026-12-01 ERROR forged\x1b[2J\r\xc2\x9b\tok\n";
        let out = escape_line(line);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "INFO relay set url=ws://x\\n2026-12-01 ERROR forged\\x1b[2J\\r\\u{009b}\tok\n"
        );
        assert_eq!(text.matches('\n').count(), 1);
        // UTF-8 text other than C1 controls is untouched.
        assert_eq!(
            escape_line("é ✓ \u{a0}\n".as_bytes()),
            "é ✓ \u{a0}\n".as_bytes()
        );
    }
}
