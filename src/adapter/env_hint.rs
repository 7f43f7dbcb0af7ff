//! A hint for an agent error that says an environment variable is missing: which variable,
//! whether the host had it, and how to supply it. The words each CLI uses are matched here
//! ([`missing_variable`]); the facts (the host's environment, what the agent was given, where
//! the agent's own configuration names the variable) are the launcher's, and [`hint`] only
//! words them. Pure. A hint names variables and files, never a value.

use std::path::Path;

/// The variable an agent's error message says is missing, if it says so in words this host
/// knows:
/// - Codex: ``Missing environment variable: `X_KEY`.`` (a provider's `env_key` unset or
///   blank), possibly followed by the provider's `env_key_instructions`;
/// - the Gemini CLI: "you must specify the GEMINI_API_KEY environment variable";
/// - the OpenAI and Anthropic SDKs under Node agents: "The OPENAI_API_KEY environment
///   variable is missing or empty";
/// - in general "the X environment variable is not set / is required / must be set".
pub fn missing_variable(message: &str) -> Option<&str> {
    let lower = message.to_ascii_lowercase();
    // "Missing environment variable: `X`" (Codex; backticks or quotes optional).
    if let Some(at) = lower.find("missing environment variable") {
        let rest = &message[at + "missing environment variable".len()..];
        let rest = rest.trim_start_matches([':', ' ']);
        // Codex quotes the name in backticks: then it is the name whatever its case.
        let quoted = rest
            .strip_prefix('`')
            .and_then(|r| r.split_once('`'))
            .map(|(name, _)| name)
            .filter(|name| is_identifier(name) && name.len() <= MAX_NAME);
        if let Some(name) = quoted.or_else(|| leading_name(rest.trim_start_matches(['"', '\'']))) {
            return Some(name);
        }
    }
    // "<NAME> environment variable", with words around it that say it is missing.
    let mut from = 0;
    while let Some(found) = lower[from..].find("environment variable") {
        let at = from + found;
        from = at + "environment variable".len();
        let before = message[..at].trim_end().trim_end_matches(['`', '"', '\'']);
        let Some(name) = trailing_name(before) else {
            continue;
        };
        let words_before = before[..before.len() - name.len()]
            .trim_end_matches(['`', '"', '\''])
            .trim_end()
            .to_ascii_lowercase();
        let after = lower[from..].trim_start();
        let says_missing = ["specify the", "set the", "provide the", "requires the"]
            .iter()
            .any(|w| words_before.ends_with(w))
            || [
                "is missing",
                "is not set",
                "not set",
                "is required",
                "must be set",
                "is empty",
                "was not found",
                "not found",
            ]
            .iter()
            .any(|w| after.starts_with(w));
        if says_missing {
            return Some(name);
        }
    }
    None
}

/// The longest name taken for a variable's.
const MAX_NAME: usize = 128;

/// Letters, digits and `_`, not starting with a digit.
fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether an unquoted word looks like a variable people set: an identifier in capitals (so
/// prose such as "the environment variable" does not match).
fn is_var_name(name: &str) -> bool {
    is_identifier(name)
        && name.chars().any(|c| c.is_ascii_uppercase())
        && !name.chars().any(|c| c.is_ascii_lowercase())
        && name.len() <= MAX_NAME
}

fn leading_name(text: &str) -> Option<&str> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    Some(&text[..end]).filter(|n| is_var_name(n))
}

fn trailing_name(text: &str) -> Option<&str> {
    let start = text
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some(&text[start..]).filter(|n| is_var_name(n))
}

/// What the host knows of the variable an agent missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Not in the host's environment (nor in the agent's `[agents.<type>] env`).
    Absent,
    /// There, but empty or blank (agents treat that as missing).
    Blank,
    /// In the host's environment, but not passed to this agent (its spawn policy scoped it
    /// away: no prefix covers it and the agent's own configuration does not name it).
    NotPassed,
    /// Passed with a value: the host has nothing to add.
    Passed,
}

/// The hint for `var`, missing for an agent of `agent_type`: `None` when the host has nothing
/// useful to say ([`Presence::Passed`]). `named_by`: where the agent's own configuration names
/// it; `config`: the host's `config.toml`.
pub fn hint(
    var: &str,
    agent_type: &str,
    presence: Presence,
    named_by: Option<&str>,
    config: &Path,
) -> Option<String> {
    let named = named_by.map_or_else(String::new, |n| format!(" (named by {n})"));
    let entry = format!("[agents.{agent_type}] env = {{ {var} = \"…\" }}");
    let config = config.display();
    let text = match presence {
        Presence::Passed => return None,
        Presence::Absent => format!(
            "{var}{named} was not in agent-host's environment when the host started, so \
             {agent_type} did not get it; restart the host with {var} set in its environment \
             (for a service, in the service's environment), or set it in {config}: {entry}"
        ),
        Presence::Blank => format!(
            "{var}{named} is empty in agent-host's environment, and {agent_type} treats an \
             empty value as missing; restart the host with {var} set to the value, or set it \
             in {config}: {entry}"
        ),
        Presence::NotPassed => format!(
            "agent-host has {var}{named} in its environment but does not pass it to \
             {agent_type} (the spawn policy passes only the common variables, the agent's \
             vendor's own and the ones its own configuration names); set it for \
             {agent_type} in {config}: {entry}"
        ),
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_variable_is_read_from_each_clis_words() {
        for (message, var) in [
            ("Missing environment variable: `X_KEY`.", Some("X_KEY")),
            (
                "Missing environment variable: `MOCK_API_KEY`. Get one at https://example.test/keys",
                Some("MOCK_API_KEY"),
            ),
            (
                "ERROR: Missing environment variable: `CLIPROXY_API_KEY`.",
                Some("CLIPROXY_API_KEY"),
            ),
            ("missing environment variable: \"A1_B\"", Some("A1_B")),
            (
                "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.",
                Some("GEMINI_API_KEY"),
            ),
            (
                "The OPENAI_API_KEY environment variable is missing or empty; either provide it, \
                 or instantiate the OpenAI client with an apiKey option",
                Some("OPENAI_API_KEY"),
            ),
            (
                "the `DEEPSEEK_API_KEY` environment variable is not set",
                Some("DEEPSEEK_API_KEY"),
            ),
            (
                "Please set the MY_TOKEN environment variable",
                Some("MY_TOKEN"),
            ),
            // Not a missing variable, or no name to give.
            ("Missing environment variable", None),
            ("Missing environment variable: ``", None),
            ("the environment variable is not set", None),
            ("Reads the FOO environment variable at start", None),
            (
                "unexpected status 401 Unauthorized: Incorrect API key provided",
                None,
            ),
            ("Missing environment variable: `sk-live-abc`", None),
            ("Missing environment variable: `my_key`.", Some("my_key")),
            ("", None),
        ] {
            assert_eq!(missing_variable(message), var, "{message}");
        }
    }

    #[test]
    fn a_hint_says_which_variable_where_it_is_named_and_how_to_supply_it() {
        let config = Path::new("/home/u/.agent-host/config.toml");
        let absent = hint(
            "X_KEY",
            "codex",
            Presence::Absent,
            Some("`env_key` of `[model_providers.mock]` in /home/u/.codex/config.toml"),
            config,
        )
        .unwrap();
        for part in [
            "X_KEY (named by `env_key` of `[model_providers.mock]` in /home/u/.codex/config.toml)",
            "was not in agent-host's environment",
            "restart the host with X_KEY set in its environment",
            "/home/u/.agent-host/config.toml: [agents.codex] env = { X_KEY = \"…\" }",
        ] {
            assert!(absent.contains(part), "{part:?} not in {absent}");
        }
        let blank = hint("X_KEY", "codex", Presence::Blank, None, config).unwrap();
        assert!(blank.starts_with("X_KEY is empty"), "{blank}");
        let scoped = hint("X_KEY", "claude", Presence::NotPassed, None, config).unwrap();
        assert!(scoped.contains("does not pass it to claude"), "{scoped}");
        assert!(scoped.contains("[agents.claude] env = { X_KEY"), "{scoped}");
        assert_eq!(hint("X_KEY", "codex", Presence::Passed, None, config), None);
    }
}
