//! Redaction of secrets by their shape, for text the host did not write itself and passes on:
//! an agent's stderr (logged at `debug`, and its last lines quoted in the failure messages of
//! a process that went away — `agent_failed`, `result_delivery_unknown` — which are stored and
//! published). The host's own secrets (grant tokens, the relay token, env values) are never
//! handed to a tracing macro in the first place (`logging.rs`); this is the net for what an
//! agent prints about its own — an API key in an error message, a request dump with its
//! `Authorization` header.
//!
//! What is replaced by [`REDACTED`]:
//! - API-key shapes: `sk-…` (OpenAI, including `sk-proj-…`) and `sk-ant-…` (Anthropic);
//! - `Bearer <token>` anywhere;
//! - the value of anything named like a credential, in `name: value`, `name=value` or JSON
//!   `"name": "value"` form: `Authorization`, `x-api-key`, `*API_KEY`, `*_KEY`, `*TOKEN`,
//!   `*SECRET`, `*PASSWORD`.
//!
//! Pure (no I/O); the patterns are compiled once. It errs on the side of hiding: a false
//! positive costs a log line's detail, a false negative a key.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// `(name)(separator)value`: the value goes, the name and separator stay so the line still
/// says what was there. Case-insensitive; a quoted value goes with its quotes, and
/// `Bearer`/`Basic` before an unquoted one goes with it.
static NAMED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)\b((?:[a-z0-9]+[-_])*(?:authorization|api[-_]?key|key|token|secret|password|passwd))(["']?\s*[:=]\s*)(?:"[^"]*"|'[^']*'|(?:(?:bearer|basic|token)\s+)?[^\s"',;&}]+)"#,
    )
    .ok()
});

/// `Bearer <token>` wherever it stands (a curl line, a header dump).
static BEARER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}").ok());

/// API-key shapes: `sk-` then at least 8 key characters (`sk-ant-api03-…`, `sk-proj-…`).
static KEY_SHAPE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\bsk-[A-Za-z0-9_-]{8,}").ok());

/// `text` with every secret-shaped part replaced by [`REDACTED`]; borrowed when nothing was.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    let passes: [(&LazyLock<Option<Regex>>, String); 3] = [
        (&NAMED, format!("${{1}}${{2}}{REDACTED}")),
        (&BEARER, format!("${{1}}{REDACTED}")),
        (&KEY_SHAPE, REDACTED.to_owned()),
    ];
    for (pattern, replacement) in passes {
        let Some(pattern) = pattern.as_ref() else {
            // A pattern that does not compile is a bug caught by the tests below; hide the
            // whole line rather than let a key through.
            return Cow::Owned(REDACTED.to_owned());
        };
        if let Cow::Owned(replaced) = pattern.replace_all(&out, replacement.as_str()) {
            out = Cow::Owned(replaced);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patterns_compile() {
        assert!(NAMED.is_some() && BEARER.is_some() && KEY_SHAPE.is_some());
    }

    #[test]
    fn api_key_shapes_go() {
        let cases = [
            (
                "error: invalid x key sk-ant-api03-AbC_d-123456789xyz given",
                "error: invalid x key [REDACTED] given",
            ),
            ("using sk-proj-0123456789abcdef", "using [REDACTED]"),
            ("sk-0123456789", "[REDACTED]"),
        ];
        for (line, want) in cases {
            assert_eq!(redact(line), want, "{line}");
        }
    }

    #[test]
    fn bearer_tokens_and_credential_values_go() {
        let cases = [
            (
                "curl -H 'Authorization: Bearer abc.def-ghi_123'",
                "curl -H 'Authorization: [REDACTED]'",
            ),
            (
                "> authorization: Basic dXNlcjpwYXNz",
                "> authorization: [REDACTED]",
            ),
            (
                "sent bearer eyJhbGciOiJIUzI1NiJ9.x.y",
                "sent bearer [REDACTED]",
            ),
            (
                "ANTHROPIC_API_KEY=canary-1234 node x",
                "ANTHROPIC_API_KEY=[REDACTED] node x",
            ),
            ("OPENAI_API_KEY: \"abc def\"", "OPENAI_API_KEY: [REDACTED]"),
            (
                "ANTHROPIC_AUTH_TOKEN=tok",
                "ANTHROPIC_AUTH_TOKEN=[REDACTED]",
            ),
            (
                r#"{"apiKey":"k-1","x-api-key": "k-2","client_secret":"s"}"#,
                r#"{"apiKey":[REDACTED],"x-api-key": [REDACTED],"client_secret":[REDACTED]}"#,
            ),
            ("password=hunter2&user=me", "password=[REDACTED]&user=me"),
        ];
        for (line, want) in cases {
            assert_eq!(redact(line), want, "{line}");
        }
    }

    #[test]
    fn ordinary_lines_stay_as_they_are() {
        for line in [
            "",
            "Debugger listening on ws://127.0.0.1:9229",
            "task-list updated; risk-assessment done",
            "max_tokens: 4096, tokens used 12",
            "the bearer of bad news",
            "No conversation found with session ID: 5f0c",
        ] {
            assert!(matches!(redact(line), Cow::Borrowed(_)), "{line}");
        }
    }
}
