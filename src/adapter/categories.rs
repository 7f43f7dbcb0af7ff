//! The shared error categories (design §9) read from what an agent said, for the drivers to
//! fall back on when its protocol carries no structured code for a failure: an HTTP status in
//! the message, or the words the CLIs use for a rate limit, a refused credential, a lost
//! connection to the model, or an exhausted context. Pure; each family's translator tries its
//! own structured fields first and only then this.

use crate::protocol::events::ErrorCategory;

/// The category of an HTTP status from a model provider, if it names one.
pub fn from_http_status(status: u64) -> Option<ErrorCategory> {
    match status {
        429 => Some(ErrorCategory::RateLimited),
        401 | 403 => Some(ErrorCategory::AuthRequired),
        _ => None,
    }
}

/// The category a failure message names, if any.
pub fn from_text(text: &str) -> Option<ErrorCategory> {
    let lower = text.to_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    // A status as a word of its own ("(429)", "status: 401", "429 Too Many Requests").
    let status = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|t| t.parse::<u64>().ok())
        .find_map(from_http_status);
    if has(&[
        "prompt is too long",
        "context_length_exceeded",
        "context window",
        "maximum context length",
    ]) {
        return Some(ErrorCategory::ContextExhausted);
    }
    if has(&[
        "too many requests",
        "rate limit",
        "rate_limit",
        "resource_exhausted",
    ]) {
        return Some(ErrorCategory::RateLimited);
    }
    if has(&[
        "unauthorized",
        "invalid api key",
        "invalid x-api-key",
        "authentication",
        "failed to authenticate",
        "api key not valid",
        "permission_denied: api key",
    ]) {
        return Some(ErrorCategory::AuthRequired);
    }
    if status.is_some() {
        return status;
    }
    if has(&[
        "econnreset",
        "connection to the api was lost",
        "stream disconnected",
        "socket hang up",
        "network error",
        "connection reset",
        "premature close",
        "terminated",
        "connection closed",
    ]) {
        return Some(ErrorCategory::TransportLost);
    }
    None
}

/// `category`, unless it is the catch-all `agent_failed` and the message names a better one.
pub fn refine(category: ErrorCategory, message: &str) -> ErrorCategory {
    if category == ErrorCategory::AgentFailed {
        from_text(message).unwrap_or(category)
    } else {
        category
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_real_clis_said_is_read() {
        let cases = [
            // Codex 0.171.0.
            (
                "exceeded retry limit, last status: 429 Too Many Requests",
                Some(ErrorCategory::RateLimited),
            ),
            (
                "unexpected status 401 Unauthorized: mock: invalid API key, url: http://x",
                Some(ErrorCategory::AuthRequired),
            ),
            (
                "stream disconnected before completion: Transport error: network error: error \
                 decoding response body",
                Some(ErrorCategory::TransportLost),
            ),
            // claude-agent-acp 0.49.0 / Claude Code 2.1.197.
            (
                "Internal error: API Error: Request rejected (429) · mock: rate limit exceeded",
                Some(ErrorCategory::RateLimited),
            ),
            (
                "Internal error: Failed to authenticate. API Error: 401 mock: invalid API key",
                Some(ErrorCategory::AuthRequired),
            ),
            (
                "API Error: Connection to the API was lost (ECONNRESET). This is usually \
                 temporary — try again.",
                Some(ErrorCategory::TransportLost),
            ),
            ("Prompt is too long", Some(ErrorCategory::ContextExhausted)),
            ("the model said something odd", None),
            // A number that is not a status says nothing.
            ("wrote 4290 bytes", None),
        ];
        for (text, want) in cases {
            assert_eq!(from_text(text), want, "{text}");
        }
        assert_eq!(
            refine(ErrorCategory::Cancelled, "429"),
            ErrorCategory::Cancelled
        );
    }
}
