//! Tracing setup for the host process: `logs/host.log` under the home, plus stderr when a
//! person runs the host in the foreground. Secrets (tokens, env values, API keys) are never
//! passed to a tracing macro, and tungstenite's handshake tracing (which prints request
//! headers) is capped below `trace`, so they cannot reach either.
//!
//! Every line goes through [`Escaped`]: a logged string (a URL from a command, an agent's
//! stderr, an error message) that holds a newline or a control sequence is written escaped,
//! so it can neither forge a separate log line nor drive the terminal of whoever reads the
//! log.

use std::io::{self, Write};
use tracing_appender::non_blocking::WorkerGuard;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
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
        builder
            .with_writer(Escaped(file.and(std::io::stderr)))
            .try_init()
    } else {
        builder.with_writer(Escaped(file)).try_init()
    };
    installed.ok().map(|()| guard)
}

/// tungstenite logs whole handshake requests at `trace`, `Authorization` header included, and
/// every frame's payload (prompts, agent output): neither the relay token nor a conversation
/// may reach a log whatever level a user asks for.
fn quiet_handshakes(filter: EnvFilter) -> EnvFilter {
    ["tungstenite=debug", "tokio_tungstenite=debug"]
        .into_iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, EnvFilter::add_directive)
}

/// For CLI invocations: warnings and errors to stderr only, stdout stays one JSON line.
pub fn init_cli_logging() {
    let filter =
        EnvFilter::try_from_env("AGENT_HOST_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let filter = quiet_handshakes(filter);
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Escaped(std::io::stderr))
        .try_init();
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
