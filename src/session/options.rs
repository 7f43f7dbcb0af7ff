//! A session's options (`session.create`, `session.import`, `session.set_model`) checked before
//! anything is made: first each value on its own ([`validate`], [`check_model`]: a clear
//! `invalid_params`, or `bypass_not_allowed` for a bypass the host's `config.toml` does not
//! allow), then against what the agent's family declares it can do with it
//! ([`check_supported`], [`check_set_model`]: `option_unsupported`, naming the option). An
//! option a family cannot honour is refused here, at create time, never silently ignored at
//! the open.
//!
//! `Negotiated` capabilities (an ACP agent declares them when it starts) are resolved by asking
//! the launcher ([`Launcher::negotiate`]) only when an option that needs one was given; an agent
//! that cannot be asked makes the create fail `agent_unavailable`.
//!
//! Pure checks plus one launcher call: nothing here writes the store or publishes.

use std::collections::HashSet;

use super::SessionError;
use super::agent::{Launcher, ModelSwitch, OptionCaps, Support};
use crate::protocol::options::{
    EnvVar, Header, McpServer, McpTransport, PermissionMode, SessionOptions,
};

/// The longest model name accepted, in characters.
pub const MAX_MODEL_CHARS: usize = 128;
/// The largest standing prompt accepted.
pub const MAX_SYSTEM_PROMPT_BYTES: usize = 32 * 1024;
/// The most MCP servers one session takes.
pub const MAX_MCP_SERVERS: usize = 16;
/// The longest MCP server name.
pub const MAX_MCP_NAME_CHARS: usize = 64;
/// The most arguments of one stdio MCP server.
pub const MAX_MCP_ARGS: usize = 64;
/// The longest command, argument, URL or value of an MCP server.
pub const MAX_MCP_ARG_BYTES: usize = 4096;
/// The most environment variables (stdio) or headers (http, sse) of one MCP server.
pub const MAX_MCP_PAIRS: usize = 64;
/// The longest environment variable or header name.
pub const MAX_MCP_PAIR_NAME: usize = 128;

fn invalid(message: String) -> SessionError {
    SessionError::InvalidParams(message)
}

/// A model name: 1 to [`MAX_MODEL_CHARS`] of letters, digits and `. _ : / @ [ ] -`, not
/// starting with `-` (it is passed as a command-line value).
pub fn check_model(model: &str) -> Result<(), SessionError> {
    let chars = model.chars().count();
    if chars == 0 || chars > MAX_MODEL_CHARS {
        return Err(invalid(format!(
            "model must be 1 to {MAX_MODEL_CHARS} characters, not {chars}"
        )));
    }
    if let Some(bad) = model
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._:/@[]-".contains(*c)))
    {
        return Err(invalid(format!(
            "model {model:?} has {bad:?}; a model name is letters, digits and . _ : / @ [ ] -"
        )));
    }
    if model.starts_with('-') {
        return Err(invalid(format!(
            "model {model:?} starts with '-'; a model name does not"
        )));
    }
    Ok(())
}

/// Each option on its own: the model's name, the standing prompt's size, every MCP server's
/// definition, and a `bypass` permission mode, which needs `allow_bypass` (`config.toml`).
pub fn validate(options: &SessionOptions, allow_bypass: bool) -> Result<(), SessionError> {
    if let Some(model) = &options.model {
        check_model(model)?;
    }
    if let Some(prompt) = &options.system_prompt {
        if prompt.trim().is_empty() {
            return Err(invalid(
                "system_prompt is empty; leave it out for the agent's own".to_owned(),
            ));
        }
        if prompt.len() > MAX_SYSTEM_PROMPT_BYTES {
            return Err(invalid(format!(
                "system_prompt is {} bytes; the limit is {MAX_SYSTEM_PROMPT_BYTES}",
                prompt.len()
            )));
        }
        if prompt.contains('\0') {
            return Err(invalid("system_prompt contains a NUL character".to_owned()));
        }
    }
    check_mcp_servers(&options.mcp_servers)?;
    if options.permission_mode == Some(PermissionMode::Bypass) && !allow_bypass {
        return Err(SessionError::BypassNotAllowed);
    }
    Ok(())
}

fn check_mcp_servers(servers: &[McpServer]) -> Result<(), SessionError> {
    if servers.len() > MAX_MCP_SERVERS {
        return Err(invalid(format!(
            "mcp_servers has {} servers; the limit is {MAX_MCP_SERVERS}",
            servers.len()
        )));
    }
    let mut names = HashSet::new();
    for (i, server) in servers.iter().enumerate() {
        let name = server.name();
        let at = format!("mcp_servers[{i}]");
        let plain = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if name.is_empty() || name.chars().count() > MAX_MCP_NAME_CHARS || !plain {
            return Err(invalid(format!(
                "{at}: name {name:?} must be 1 to {MAX_MCP_NAME_CHARS} letters, digits, '_' or \
                 '-'"
            )));
        }
        if !names.insert(name) {
            return Err(invalid(format!(
                "{at}: name {name:?} is used by two servers; each needs its own"
            )));
        }
        let at = format!("mcp_servers[{i}] ({name})");
        match server {
            McpServer::Stdio {
                command, args, env, ..
            } => {
                if command.trim().is_empty() {
                    return Err(invalid(format!("{at}: command is empty")));
                }
                bounded(&at, "command", command)?;
                if args.len() > MAX_MCP_ARGS {
                    return Err(invalid(format!(
                        "{at}: {} args; the limit is {MAX_MCP_ARGS}",
                        args.len()
                    )));
                }
                for (n, arg) in args.iter().enumerate() {
                    bounded(&at, &format!("args[{n}]"), arg)?;
                }
                check_env(&at, env)?;
            }
            McpServer::Http { url, headers, .. } | McpServer::Sse { url, headers, .. } => {
                check_url(&at, url)?;
                check_headers(&at, headers)?;
            }
        }
    }
    Ok(())
}

/// A value passed to a process or a request: at most [`MAX_MCP_ARG_BYTES`], no NUL.
fn bounded(at: &str, what: &str, value: &str) -> Result<(), SessionError> {
    if value.len() > MAX_MCP_ARG_BYTES {
        return Err(invalid(format!(
            "{at}: {what} is {} bytes; the limit is {MAX_MCP_ARG_BYTES}",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(invalid(format!("{at}: {what} contains a NUL character")));
    }
    Ok(())
}

fn check_env(at: &str, env: &[EnvVar]) -> Result<(), SessionError> {
    if env.len() > MAX_MCP_PAIRS {
        return Err(invalid(format!(
            "{at}: {} env variables; the limit is {MAX_MCP_PAIRS}",
            env.len()
        )));
    }
    for var in env {
        let name = &var.name;
        let sane = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.len() <= MAX_MCP_PAIR_NAME;
        if !sane {
            return Err(invalid(format!(
                "{at}: env name {name:?} must be 1 to {MAX_MCP_PAIR_NAME} letters, digits or \
                 '_', not starting with a digit"
            )));
        }
        bounded(at, &format!("env {name}"), &var.value)?;
    }
    Ok(())
}

fn check_headers(at: &str, headers: &[Header]) -> Result<(), SessionError> {
    if headers.len() > MAX_MCP_PAIRS {
        return Err(invalid(format!(
            "{at}: {} headers; the limit is {MAX_MCP_PAIRS}",
            headers.len()
        )));
    }
    for header in headers {
        let name = &header.name;
        // An HTTP token (RFC 9110 §5.6.2).
        let sane = !name.is_empty()
            && name.len() <= MAX_MCP_PAIR_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
        if !sane {
            return Err(invalid(format!(
                "{at}: header name {name:?} is not an HTTP header name (1 to \
                 {MAX_MCP_PAIR_NAME} letters, digits and !#$%&'*+-.^_`|~)"
            )));
        }
        bounded(at, &format!("header {name}"), &header.value)?;
        if header.value.contains(['\r', '\n']) {
            return Err(invalid(format!(
                "{at}: header {name} has a line break in its value"
            )));
        }
    }
    Ok(())
}

/// An `http://` or `https://` URL with a host.
fn check_url(at: &str, url: &str) -> Result<(), SessionError> {
    bounded(at, "url", url)?;
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(invalid(format!(
            "{at}: url {url:?} must start with http:// or https://"
        )));
    }
    let parsed: tokio_tungstenite::tungstenite::http::Uri = url
        .parse()
        .map_err(|e| invalid(format!("{at}: url {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) {
        return Err(invalid(format!(
            "{at}: url {url:?} must start with http:// or https://"
        )));
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err(invalid(format!("{at}: url {url:?} has no host")));
    }
    Ok(())
}

/// The first option `caps` cannot take: its name and why. `Negotiated` counts as taken (the
/// caller resolves it first, [`needs_negotiation`]).
fn refused(options: &SessionOptions, caps: &OptionCaps) -> Option<(&'static str, String)> {
    if options.model.is_some() && caps.model == Support::Absent {
        return Some(("model", "this agent takes no model choice".to_owned()));
    }
    if options.system_prompt.is_some() && caps.system_prompt == Support::Absent {
        return Some((
            "system_prompt",
            "this agent takes no standing prompt".to_owned(),
        ));
    }
    for server in &options.mcp_servers {
        let transport = server.transport();
        if transport_support(caps, transport) == Support::Absent {
            return Some((
                "mcp_servers",
                format!(
                    "this agent takes no {} MCP servers (server {:?})",
                    transport_name(transport),
                    server.name()
                ),
            ));
        }
    }
    if let Some(mode) = options.permission_mode
        && mode != PermissionMode::Ask
        && !caps.permission_modes.contains(&mode)
    {
        let modes: Vec<&str> = caps.permission_modes.iter().map(|m| m.as_str()).collect();
        return Some((
            "permission_mode",
            format!(
                "this agent has no {:?} permission mode; it takes: {}",
                mode.as_str(),
                if modes.is_empty() {
                    "none (it never asks before its tools: see its permission_policy in \
                     agent.list)"
                        .to_owned()
                } else {
                    modes.join(", ")
                }
            ),
        ));
    }
    None
}

fn transport_support(caps: &OptionCaps, transport: McpTransport) -> Support {
    match transport {
        McpTransport::Stdio => caps.mcp_stdio,
        McpTransport::Http => caps.mcp_http,
        McpTransport::Sse => caps.mcp_sse,
    }
}

fn transport_name(transport: McpTransport) -> &'static str {
    match transport {
        McpTransport::Stdio => "stdio",
        McpTransport::Http => "http",
        McpTransport::Sse => "sse",
    }
}

/// Whether an option that was given is one the agent declares only when it starts. A
/// permission mode other than `ask` counts for a family whose caps are negotiated at all: its
/// static list is only what such agents may take (each agent says which, with the rest).
fn needs_negotiation(options: &SessionOptions, caps: &OptionCaps) -> bool {
    let negotiated = |s: Support| s == Support::Negotiated;
    let family_negotiates = [
        caps.model,
        caps.system_prompt,
        caps.mcp_stdio,
        caps.mcp_http,
        caps.mcp_sse,
        caps.images,
        caps.files,
    ]
    .into_iter()
    .any(negotiated);
    (options.model.is_some() && negotiated(caps.model))
        || (options.system_prompt.is_some() && negotiated(caps.system_prompt))
        || options
            .mcp_servers
            .iter()
            .any(|s| negotiated(transport_support(caps, s.transport())))
        || (options.mode() != PermissionMode::Ask && family_negotiates)
}

/// After negotiation nothing is left to find out: what the agent still did not say it takes,
/// it does not take.
fn settled(mut caps: OptionCaps) -> OptionCaps {
    let settle = |s: &mut Support| {
        if *s == Support::Negotiated {
            *s = Support::Absent;
        }
    };
    settle(&mut caps.model);
    settle(&mut caps.system_prompt);
    settle(&mut caps.mcp_stdio);
    settle(&mut caps.mcp_http);
    settle(&mut caps.mcp_sse);
    caps
}

/// What the family can do with the options given: its declared caps, negotiated with the agent
/// when one of the options needs it.
async fn resolved_caps(
    launcher: &dyn Launcher,
    agent_type: &str,
    options: &SessionOptions,
) -> Result<OptionCaps, SessionError> {
    let caps = launcher.capabilities(agent_type).options;
    if !needs_negotiation(options, &caps) {
        return Ok(caps);
    }
    match launcher.negotiate(agent_type).await {
        Ok(negotiated) => Ok(settled(negotiated)),
        Err(e) => Err(SessionError::AgentUnavailable(format!(
            "{agent_type:?} could not be asked which options it takes: {}",
            e.message
        ))),
    }
}

fn unsupported(agent_type: &str, (option, reason): (&'static str, String)) -> SessionError {
    SessionError::OptionUnsupported {
        option: option.to_owned(),
        agent_type: agent_type.to_owned(),
        reason,
    }
}

/// Whether agents of `agent_type` can honour every option given (each already
/// [`validate`]d): `option_unsupported` naming the first that it cannot.
pub async fn check_supported(
    launcher: &dyn Launcher,
    agent_type: &str,
    options: &SessionOptions,
) -> Result<(), SessionError> {
    if options.is_empty() {
        return Ok(());
    }
    // An agent that never asks (its family declares a policy instead, `agent.list`) cannot
    // be asked to ask: running it would silently do what the user said not to.
    if options.permission_mode == Some(PermissionMode::Ask)
        && launcher.runs_turns(agent_type)
        && !launcher.capabilities(agent_type).permissions
    {
        return Err(unsupported(
            agent_type,
            (
                "permission_mode",
                "this agent does not ask before running its tools (see its permission_policy \
                 in agent.list); choose an agent that asks"
                    .to_owned(),
            ),
        ));
    }
    let caps = resolved_caps(launcher, agent_type, options).await?;
    match refused(options, &caps) {
        Some(refusal) => Err(unsupported(agent_type, refusal)),
        None => Ok(()),
    }
}

/// Whether an imported session (a fork of a native one) can take the options given: a
/// standing prompt only where the family gives a fork one of its own
/// ([`OptionCaps::system_prompt_on_fork`]); elsewhere it would be dropped silently.
pub fn check_import(
    launcher: &dyn Launcher,
    agent_type: &str,
    options: &SessionOptions,
) -> Result<(), SessionError> {
    if options.system_prompt.is_some()
        && !launcher
            .capabilities(agent_type)
            .options
            .system_prompt_on_fork
    {
        return Err(unsupported(
            agent_type,
            (
                "system_prompt",
                "the agent keeps the standing prompt its session started with".to_owned(),
            ),
        ));
    }
    Ok(())
}

/// Whether a session of `agent_type` can change its model between turns
/// (`session.set_model`); the model is [`check_model`]ed. The caps, to say how.
pub async fn check_set_model(
    launcher: &dyn Launcher,
    agent_type: &str,
    model: &str,
) -> Result<OptionCaps, SessionError> {
    check_model(model)?;
    let options = SessionOptions {
        model: Some(model.to_owned()),
        ..SessionOptions::default()
    };
    let caps = resolved_caps(launcher, agent_type, &options).await?;
    if let Some(refusal) = refused(&options, &caps) {
        return Err(unsupported(agent_type, refusal));
    }
    if caps.set_model == ModelSwitch::None {
        return Err(unsupported(
            agent_type,
            (
                "model",
                "this agent cannot change its model once a session started".to_owned(),
            ),
        ));
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::agent::Capabilities;

    fn stdio(name: &str) -> McpServer {
        McpServer::Stdio {
            name: name.to_owned(),
            command: "node".to_owned(),
            args: vec!["server.mjs".to_owned()],
            env: Vec::new(),
        }
    }

    fn http(name: &str, url: &str) -> McpServer {
        McpServer::Http {
            name: name.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
        }
    }

    fn refusal(options: SessionOptions) -> String {
        match validate(&options, false) {
            Err(SessionError::InvalidParams(why)) => why,
            other => panic!("{options:?}: {other:?}"),
        }
    }

    #[test]
    fn a_model_name_is_plain_and_bounded() {
        for good in [
            "claude-sonnet-4-5",
            "gpt-5",
            "openai/gpt-4.1",
            "us.anthropic.claude-3@2024",
            "claude-opus-4-1[1m]",
            "ollama:llama3_8b",
            &"m".repeat(128),
        ] {
            check_model(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, says) in [
            ("", "1 to 128 characters, not 0"),
            (&"m".repeat(129) as &str, "not 129"),
            ("gpt 5", "has ' '"),
            ("gpt;rm", "has ';'"),
            ("mödel", "has 'ö'"),
            ("--dangerous", "starts with '-'"),
        ] {
            let why = check_model(bad).unwrap_err().to_string();
            assert!(why.contains(says), "{bad:?}: {why}");
        }
    }

    #[test]
    fn a_standing_prompt_is_not_empty_and_at_most_32_kib() {
        let with = |p: &str| SessionOptions {
            system_prompt: Some(p.to_owned()),
            ..Default::default()
        };
        validate(&with("Answer in French."), false).unwrap();
        validate(&with(&"x".repeat(32 * 1024)), false).unwrap();
        assert!(refusal(with(" \n")).contains("system_prompt is empty"));
        assert!(refusal(with(&"x".repeat(32 * 1024 + 1))).contains("the limit is 32768"));
        assert!(refusal(with("a\0b")).contains("NUL"));
    }

    #[test]
    fn mcp_servers_are_refused_rule_by_rule() {
        let with = |servers: Vec<McpServer>| SessionOptions {
            mcp_servers: servers,
            ..Default::default()
        };
        validate(
            &with(vec![
                stdio("probe"),
                http("web_1", "https://mcp.example.com/mcp"),
                McpServer::Sse {
                    name: "events".into(),
                    url: "http://127.0.0.1:8080/sse".into(),
                    headers: vec![Header {
                        name: "Authorization".into(),
                        value: "Bearer x".into(),
                    }],
                },
            ]),
            false,
        )
        .unwrap();
        let many: Vec<McpServer> = (0..17).map(|i| stdio(&format!("s{i}"))).collect();
        let stdio_with = |command: &str, args: Vec<String>, env: Vec<EnvVar>| McpServer::Stdio {
            name: "s".into(),
            command: command.into(),
            args,
            env,
        };
        let var = |name: &str, value: &str| EnvVar {
            name: name.into(),
            value: value.into(),
        };
        let header = |name: &str, value: &str| McpServer::Http {
            name: "h".into(),
            url: "https://h.example".into(),
            headers: vec![Header {
                name: name.into(),
                value: value.into(),
            }],
        };
        for (servers, says) in [
            (many, "17 servers; the limit is 16"),
            (vec![stdio("")], "name \"\" must be 1 to 64"),
            (vec![stdio("has space")], "letters, digits, '_' or '-'"),
            (vec![stdio(&"n".repeat(65))], "must be 1 to 64"),
            (vec![stdio("a"), stdio("a")], "used by two servers"),
            (vec![stdio_with(" ", vec![], vec![])], "command is empty"),
            (
                vec![stdio_with("no\0de", vec![], vec![])],
                "command contains a NUL",
            ),
            (
                vec![stdio_with("node", vec!["a".into(); 65], vec![])],
                "65 args; the limit is 64",
            ),
            (
                vec![stdio_with("node", vec!["a".repeat(4097)], vec![])],
                "args[0] is 4097 bytes",
            ),
            (
                vec![stdio_with("node", vec![], vec![var("1BAD", "v")])],
                "env name \"1BAD\"",
            ),
            (
                vec![stdio_with("node", vec![], vec![var("A=B", "v")])],
                "env name \"A=B\"",
            ),
            (
                vec![stdio_with("node", vec![], vec![var("OK", "v\0")])],
                "env OK contains a NUL",
            ),
            (
                vec![http("h", "ftp://h.example/x")],
                "must start with http://",
            ),
            (vec![http("h", "h.example/mcp")], "must start with http://"),
            (vec![http("h", "http:///mcp")], "url"),
            (vec![http("h", "http://exa mple.com/")], "is not a URL"),
            (vec![header("Bad Name", "v")], "not an HTTP header name"),
            (vec![header("X-Ok", "v\r\nX-Evil: 1")], "line break"),
        ] {
            let why = refusal(with(servers.clone()));
            assert!(why.contains(says), "{servers:?}: {why}");
        }
    }

    #[test]
    fn bypass_needs_allow_bypass() {
        let bypass = SessionOptions {
            permission_mode: Some(PermissionMode::Bypass),
            ..Default::default()
        };
        assert!(matches!(
            validate(&bypass, false),
            Err(SessionError::BypassNotAllowed)
        ));
        validate(&bypass, true).unwrap();
        let edits = SessionOptions {
            permission_mode: Some(PermissionMode::AcceptEdits),
            ..Default::default()
        };
        validate(&edits, false).unwrap();
    }

    /// A launcher that only describes a family (nothing is opened).
    struct Described {
        caps: OptionCaps,
        /// What the agent says when asked (`None`: it cannot be asked).
        negotiated: Option<OptionCaps>,
        asked: std::sync::atomic::AtomicUsize,
        /// Whether the agent asks before its tools (`Capabilities::permissions`).
        asks: bool,
    }

    impl Described {
        fn new(caps: OptionCaps, negotiated: Option<OptionCaps>) -> Described {
            Described {
                caps,
                negotiated,
                asked: Default::default(),
                asks: true,
            }
        }
    }

    impl Launcher for Described {
        fn runs_turns(&self, _agent_type: &str) -> bool {
            true
        }

        fn capabilities(&self, _agent_type: &str) -> Capabilities {
            Capabilities {
                options: self.caps,
                permissions: self.asks,
                ..Capabilities::NONE
            }
        }

        fn negotiate<'a>(
            &'a self,
            _agent_type: &'a str,
        ) -> futures_util::future::BoxFuture<
            'a,
            Result<OptionCaps, crate::session::agent::AdapterError>,
        > {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = self.negotiated.ok_or_else(|| {
                crate::session::agent::AdapterError::new(
                    crate::protocol::events::ErrorCategory::BinaryUnavailable,
                    "no such agent binary",
                )
            });
            Box::pin(async move { answer })
        }

        fn open(
            &self,
            _agent_type: &str,
            _cwd: &std::path::Path,
            _host_session_id: &str,
            _native: crate::session::agent::Native,
            _options: &SessionOptions,
        ) -> Result<crate::session::agent::AgentSession, crate::session::agent::AdapterError>
        {
            unreachable!("nothing is opened by a check")
        }

        fn idle_timeout(&self) -> Option<std::time::Duration> {
            None
        }
    }

    const ALL: OptionCaps = OptionCaps {
        model: Support::Native,
        set_model: ModelSwitch::Live,
        system_prompt: Support::Native,
        mcp_stdio: Support::Native,
        mcp_http: Support::Native,
        mcp_sse: Support::Native,
        permission_modes: &[
            PermissionMode::Ask,
            PermissionMode::AcceptEdits,
            PermissionMode::Bypass,
        ],
        images: Support::Native,
        files: Support::Native,
        system_prompt_on_fork: true,
    };

    fn everything() -> SessionOptions {
        SessionOptions {
            model: Some("m1".into()),
            system_prompt: Some("be brief".into()),
            mcp_servers: vec![stdio("probe"), http("web", "https://h.example/mcp")],
            permission_mode: Some(PermissionMode::AcceptEdits),
        }
    }

    fn option_of(result: Result<(), SessionError>) -> (String, String) {
        match result {
            Err(SessionError::OptionUnsupported {
                option,
                agent_type,
                reason,
            }) => {
                assert_eq!(agent_type, "fam");
                (option, reason)
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_family_that_takes_nothing_refuses_each_option_by_name() {
        let none = Described::new(OptionCaps::NONE, None);
        check_supported(&none, "fam", &SessionOptions::default())
            .await
            .unwrap();
        // `ask` is every family's.
        let ask = SessionOptions {
            permission_mode: Some(PermissionMode::Ask),
            ..Default::default()
        };
        check_supported(&none, "fam", &ask).await.unwrap();
        // ... but one that never asks (it declares a policy instead) cannot be told to.
        let never_asks = Described {
            asks: false,
            ..Described::new(ALL, None)
        };
        let (name, reason) = option_of(check_supported(&never_asks, "fam", &ask).await);
        assert_eq!(name, "permission_mode");
        assert!(reason.contains("does not ask"), "{reason}");
        check_supported(&never_asks, "fam", &SessionOptions::default())
            .await
            .unwrap();
        // It lists no mode, and a refusal of another says it takes none.
        let lists_none = Described {
            asks: false,
            ..Described::new(OptionCaps::NEVER_ASKS, None)
        };
        let edits = SessionOptions {
            permission_mode: Some(PermissionMode::AcceptEdits),
            ..Default::default()
        };
        let (name, reason) = option_of(check_supported(&lists_none, "fam", &edits).await);
        assert_eq!(name, "permission_mode");
        assert!(reason.contains("it takes: none (it never asks"), "{reason}");
        let one = |f: fn(&mut SessionOptions)| {
            let mut o = SessionOptions::default();
            f(&mut o);
            o
        };
        for (options, option, says) in [
            (one(|o| o.model = Some("m".into())), "model", "no model"),
            (
                one(|o| o.system_prompt = Some("p".into())),
                "system_prompt",
                "no standing prompt",
            ),
            (
                one(|o| o.mcp_servers = vec![stdio("probe")]),
                "mcp_servers",
                "no stdio MCP servers (server \"probe\")",
            ),
            (
                one(|o| o.permission_mode = Some(PermissionMode::AcceptEdits)),
                "permission_mode",
                "no \"accept_edits\" permission mode; it takes: ask",
            ),
        ] {
            let (name, reason) = option_of(check_supported(&none, "fam", &options).await);
            assert_eq!(name, option);
            assert!(reason.contains(says), "{reason}");
        }
        let full = Described::new(ALL, None);
        check_supported(&full, "fam", &everything()).await.unwrap();
        assert_eq!(full.asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_mcp_transport_the_family_does_not_take_is_refused() {
        let stdio_only = Described::new(
            OptionCaps {
                mcp_http: Support::Absent,
                ..ALL
            },
            None,
        );
        let (option, reason) = option_of(check_supported(&stdio_only, "fam", &everything()).await);
        assert_eq!(option, "mcp_servers");
        assert!(
            reason.contains("no http MCP servers (server \"web\")"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn negotiated_options_are_asked_of_the_agent() {
        let negotiated = OptionCaps {
            model: Support::Negotiated,
            mcp_http: Support::Negotiated,
            ..ALL
        };
        // The agent says it takes models, and says nothing of http MCP servers.
        let says = OptionCaps {
            model: Support::Native,
            ..negotiated
        };
        let asked = Described::new(negotiated, Some(says));
        let model_only = SessionOptions {
            model: Some("m".into()),
            ..Default::default()
        };
        check_supported(&asked, "fam", &model_only).await.unwrap();
        assert_eq!(asked.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        let (option, _) = option_of(check_supported(&asked, "fam", &everything()).await);
        assert_eq!(option, "mcp_servers");
        // An option that needs no negotiation asks nothing.
        let prompt_only = SessionOptions {
            system_prompt: Some("p".into()),
            ..Default::default()
        };
        check_supported(&asked, "fam", &prompt_only).await.unwrap();
        assert_eq!(asked.asked.load(std::sync::atomic::Ordering::SeqCst), 2);

        let unreachable = Described::new(negotiated, None);
        match check_supported(&unreachable, "fam", &model_only).await {
            Err(SessionError::AgentUnavailable(why)) => {
                assert!(why.contains("no such agent binary"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn set_model_needs_a_model_and_a_way_to_switch() {
        let full = Described::new(ALL, None);
        assert_eq!(
            check_set_model(&full, "fam", "m2").await.unwrap().set_model,
            ModelSwitch::Live
        );
        assert!(matches!(
            check_set_model(&full, "fam", "bad name").await,
            Err(SessionError::InvalidParams(_))
        ));
        let fixed = Described::new(
            OptionCaps {
                set_model: ModelSwitch::None,
                ..ALL
            },
            None,
        );
        let (option, reason) = option_of(check_set_model(&fixed, "fam", "m2").await.map(|_| ()));
        assert_eq!(option, "model");
        assert!(reason.contains("cannot change its model"), "{reason}");
        let none = Described::new(OptionCaps::NONE, None);
        let (option, _) = option_of(check_set_model(&none, "fam", "m2").await.map(|_| ()));
        assert_eq!(option, "model");
    }

    /// An ACP-like family lists every mode it may take; the agent says which it does: a mode
    /// other than `ask` is asked of it, and refused when it does not carry it.
    #[tokio::test]
    async fn a_permission_mode_is_negotiated_where_the_family_negotiates() {
        let negotiated = OptionCaps {
            model: Support::Negotiated,
            ..ALL
        };
        let says_ask_only = OptionCaps {
            model: Support::Native,
            permission_modes: &[PermissionMode::Ask],
            ..ALL
        };
        let asked = Described::new(negotiated, Some(says_ask_only));
        let mode = |m| SessionOptions {
            permission_mode: Some(m),
            ..Default::default()
        };
        check_supported(&asked, "fam", &mode(PermissionMode::Ask))
            .await
            .unwrap();
        assert_eq!(asked.asked.load(std::sync::atomic::Ordering::SeqCst), 0);
        let (option, reason) =
            option_of(check_supported(&asked, "fam", &mode(PermissionMode::AcceptEdits)).await);
        assert_eq!(option, "permission_mode");
        assert!(reason.contains("accept_edits"), "{reason}");
        assert_eq!(asked.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        let says_edits = OptionCaps {
            permission_modes: &[PermissionMode::Ask, PermissionMode::AcceptEdits],
            ..says_ask_only
        };
        let takes = Described::new(negotiated, Some(says_edits));
        check_supported(&takes, "fam", &mode(PermissionMode::AcceptEdits))
            .await
            .unwrap();
        assert_eq!(takes.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A family with nothing negotiated is not asked: its list is what it takes.
        let fixed = Described::new(ALL, None);
        check_supported(&fixed, "fam", &mode(PermissionMode::Bypass))
            .await
            .unwrap();
    }

    /// An import forks the native session: a family whose fork keeps its original standing
    /// prompt refuses a new one, by name.
    #[test]
    fn an_import_takes_a_standing_prompt_only_where_a_fork_does() {
        let prompt = SessionOptions {
            system_prompt: Some("p".into()),
            ..Default::default()
        };
        let keeps = Described::new(
            OptionCaps {
                system_prompt_on_fork: false,
                ..ALL
            },
            None,
        );
        let (option, reason) = option_of(check_import(&keeps, "fam", &prompt));
        assert_eq!(option, "system_prompt");
        assert!(reason.contains("keeps the standing prompt"), "{reason}");
        check_import(&keeps, "fam", &everything_but_prompt()).unwrap();
        check_import(&Described::new(ALL, None), "fam", &prompt).unwrap();
    }

    fn everything_but_prompt() -> SessionOptions {
        SessionOptions {
            system_prompt: None,
            ..everything()
        }
    }
}
