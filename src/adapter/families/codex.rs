//! Codex (`codex app-server`, JSON-RPC over stdio): the family. Its rollout files live under
//! `$CODEX_HOME/sessions/…/rollout-*-<thread id>.jsonl`; Codex refuses a second writer by
//! itself, so there is no registry of live holders.
//!
//! Its `$CODEX_HOME/config.toml` is read here, each time it is needed (a change applies to the
//! next agent started): the provider and model it selects (top level, or the `profile` it
//! names), and every variable it names for Codex to read from its environment
//! ([`named_vars`]), which the host then passes on from its own environment.

use std::path::Path;

use crate::adapter::family::{AgentFamily, NamedVar, Vars};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, ModelSwitch, OpenSpec, OptionCaps,
    ProcessModel, ResumeKind, Support, codex, codex_native, codex_process,
};
use crate::protocol::options::PermissionMode;
use crate::session::agent::NativeFile;

pub struct Codex;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "codex",
    protocol: "codex app-server JSON-RPC",
    default_binary: "codex",
    binary_env: "AGENT_HOST_CODEX_BIN",
    version_args: &["--version"],
    capabilities: Capabilities {
        resume: ResumeKind::NativeId,
        permissions: true,
        cancel: true,
        // `turn/steer` into the running turn: the model's next request in that turn carries the
        // text, and the turn ends once (tests/suite/steer.rs,
        // `codex_a_steer_reaches_the_running_turn`).
        steer: true,
        fork: Support::Native,
        usage: true,
        process: ProcessModel::Persistent,
        binding: true,
        // Each as the real app-server showed it against the mock (tests/suite/codex_host.rs, the
        // `codex_driver_*` tests and `codex_session_options_reach_the_model`,
        // `codex_set_model_between_turns`, `codex_image_attachment_reaches_the_model`):
        // `model` and the standing prompt (developer instructions) on
        // `thread/start`/`resume`/`fork`, MCP servers over stdio and streamable HTTP as
        // `config` overrides, `bypass` as approval `never` + sandbox `danger-full-access`,
        // `set_model` as the per-turn override, images as `localImage` inputs. Not declared:
        // MCP over SSE (Codex has no SSE transport), `accept_edits` (no Codex mode of its
        // own: edits in the workspace already run unasked under `ask`), file attachments (no
        // Codex input for them).
        options: OptionCaps {
            model: Support::Native,
            set_model: ModelSwitch::NextTurn,
            system_prompt: Support::Native,
            mcp_stdio: Support::Native,
            mcp_http: Support::Native,
            mcp_sse: Support::Absent,
            permission_modes: &[PermissionMode::Ask, PermissionMode::Bypass],
            images: Support::Native,
            files: Support::Absent,
            // `thread/fork` keeps the thread's original developer instructions.
            system_prompt_on_fork: false,
        },
    },
    turns: true,
    permission_policy: None,
};

impl AgentFamily for Codex {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn protocol_name(&self) -> Option<&'static str> {
        Some("codex-app-server")
    }

    fn foreign_env(&self) -> &'static [&'static str] {
        &[
            "ANTHROPIC_",
            "CLAUDE_CODE_",
            "CLAUDE_CONFIG_DIR",
            "GEMINI_",
            "GOOGLE_",
        ]
    }

    /// The native binary behind an npm launcher ([`codex_native`]), else the program found.
    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        codex_process::open(prefer_native(spec))
    }

    /// `$CODEX_HOME/config.toml`'s selected provider ([`selected`]: its
    /// `[model_providers.<name>]` `base_url`, and the value of its `env_key` variable); else
    /// OpenAI's (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
    fn provider(&self, vars: &Vars<'_>) -> Option<crate::protocol::options::ProviderIdentity> {
        codex_provider(vars, codex_config(vars).as_ref().map(|(_, c)| c))
    }

    /// `$CODEX_HOME/config.toml`'s `model` (its selected profile's first).
    fn default_model(&self, vars: &Vars<'_>) -> Option<String> {
        let (_, config) = codex_config(vars)?;
        selected(&config, "model").map(str::to_owned)
    }

    /// What `$CODEX_HOME/config.toml` names ([`named_vars`]).
    fn config_env(&self, vars: &Vars<'_>) -> Vec<NamedVar> {
        codex_config(vars)
            .map(|(path, config)| named_vars(&config, &path))
            .unwrap_or_default()
    }

    fn native_file(&self, vars: &Vars<'_>, _cwd: &Path, native_id: &str) -> NativeFile {
        NativeFile {
            path: vars
                .dir_or_home("CODEX_HOME", ".codex")
                .and_then(|c| codex::rollout_file(&c, native_id)),
            claimants: None,
            entries: None,
        }
    }

    /// The rollouts that record this cwd ([`codex::discover_rollouts`]).
    fn discover(
        &self,
        vars: &Vars<'_>,
        cwd: &Path,
    ) -> Option<Result<Vec<crate::session::discover::Discovered>, String>> {
        let Some(home) = vars.dir_or_home("CODEX_HOME", ".codex") else {
            return Some(Err(
                "neither CODEX_HOME nor HOME is set for codex".to_owned()
            ));
        };
        Some(Ok(codex::discover_rollouts(&home, cwd)))
    }

    /// The conversation of the thread's rollout ([`codex::rollout_history`]); no rollout: an
    /// empty history (Codex decides about the id at the first prompt).
    fn read_history(
        &self,
        vars: &Vars<'_>,
        _cwd: &Path,
        native_id: &str,
    ) -> Option<Result<Vec<crate::session::discover::HistoryEntry>, String>> {
        let home = vars.dir_or_home("CODEX_HOME", ".codex")?;
        let Some(rollout) = codex::rollout_file(&home, native_id) else {
            return Some(Ok(Vec::new()));
        };
        Some(
            codex::rollout_history(&rollout)
                .map_err(|e| format!("cannot read {}: {e}", rollout.display())),
        )
    }

    /// The thread's rollout records the cwd it was started in; another one is another
    /// workspace's, and an unreadable one is refused. No rollout: Codex decides
    /// (`resume_rejected`).
    fn check_binding(&self, vars: &Vars<'_>, cwd: &Path, native_id: &str) -> Result<(), String> {
        let Some(rollout) = vars
            .dir_or_home("CODEX_HOME", ".codex")
            .and_then(|c| codex::rollout_file(&c, native_id))
        else {
            return Ok(());
        };
        // Codex does not scope threads by workspace: a rollout whose cwd cannot be read is
        // refused rather than resumed anywhere.
        let Some(recorded) = codex::rollout_cwd(&rollout) else {
            return Err(format!(
                "the cwd Codex thread {native_id} was started in cannot be read from {}",
                rollout.display()
            ));
        };
        let same = |a: &Path, b: &Path| {
            a == b
                || std::fs::canonicalize(a)
                    .is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
        };
        if same(&recorded, cwd) {
            Ok(())
        } else {
            Err(format!(
                "Codex thread {native_id} was started in {}, not {}",
                recorded.display(),
                cwd.display()
            ))
        }
    }
}

/// `spec` with the native binary an npm launcher would start, and the launcher's variables
/// (the host's scoping is kept: the launcher passes its environment on as it is, plus its
/// own); the program itself when it is no launcher or its binary is missing. Says which.
fn prefer_native(mut spec: OpenSpec) -> OpenSpec {
    let env: Vec<(String, String)> = spec
        .base_env
        .iter()
        .chain(&spec.extra_env)
        .cloned()
        .collect();
    match codex_native::native_of(&spec.program, &env) {
        Some(native) => {
            tracing::info!(
                launcher = %spec.program.display(),
                binary = %native.binary.display(),
                "starting the native Codex binary the npm package ships"
            );
            native.scrub(&mut spec.base_env);
            native.scrub(&mut spec.extra_env);
            spec.extra_env.extend(native.env);
            spec.program = native.binary;
        }
        None => tracing::info!(
            binary = %spec.program.display(),
            "starting Codex as found (no npm launcher with a native binary)"
        ),
    }
    spec
}

/// `$CODEX_HOME/config.toml` (its path, and its table); `None` if there is none or it does
/// not parse (Codex itself then refuses to start, which is said where it runs).
fn codex_config(vars: &Vars<'_>) -> Option<(std::path::PathBuf, toml::Table)> {
    let path = vars
        .dir_or_home("CODEX_HOME", ".codex")?
        .join("config.toml");
    let text = std::fs::read_to_string(&path).ok()?;
    match text.parse::<toml::Table>() {
        Ok(table) => Some((path, table)),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "Codex's config.toml does not parse; nothing read from it");
            None
        }
    }
}

/// A top-level setting as Codex resolves it: the selected profile's (`profile = "<name>"`,
/// its `[profiles.<name>]`), else the top level's.
fn selected<'a>(config: &'a toml::Table, key: &str) -> Option<&'a str> {
    config
        .get("profile")
        .and_then(toml::Value::as_str)
        .and_then(|p| config.get("profiles")?.get(p)?.get(key)?.as_str())
        .or_else(|| config.get(key)?.as_str())
}

/// Every variable a Codex configuration names for Codex to read from its environment, in
/// the file's order, each once:
/// - `env_key` (the API key) and the values of `env_http_headers` (header name → variable)
///   of every `[model_providers.<name>]`;
/// - `env_vars` (passed through to the server), `bearer_token_env_var` and the values of
///   `env_http_headers` of every enabled `[mcp_servers.<name>]`.
///
/// Of *every* provider defined, not only the one selected now: Codex picks the provider at
/// several levels the host does not see whole (`model_provider`, the `profile` in use and its
/// `[profiles.<name>] model_provider`, `--profile`, `-c` overrides, a thread's own
/// `modelProvider`), and a key missing for the one it picked is exactly the failure this
/// avoids. Each is a variable the user's own file names as Codex's, so it crosses no
/// vendor's scope: the variables it does not name stay where the spawn policy puts them.
pub fn named_vars(config: &toml::Table, path: &Path) -> Vec<NamedVar> {
    let mut out: Vec<NamedVar> = Vec::new();
    let mut add = |name: &str, named_by: String| {
        if !name.is_empty() && !out.iter().any(|n| n.name == name) {
            out.push(NamedVar {
                name: name.to_owned(),
                named_by: format!("{named_by} in {}", path.display()),
            });
        }
    };
    let tables = |key: &str| {
        config
            .get(key)
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten()
            .filter_map(|(id, v)| Some((id, v.as_table()?)))
    };
    let headers = |entry: &toml::Table| -> Vec<(String, String)> {
        entry
            .get("env_http_headers")
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten()
            .filter_map(|(header, var)| Some((header.clone(), var.as_str()?.to_owned())))
            .collect()
    };
    for (id, provider) in tables("model_providers") {
        if let Some(key) = provider.get("env_key").and_then(toml::Value::as_str) {
            add(key, format!("`env_key` of `[model_providers.{id}]`"));
        }
        for (header, var) in headers(provider) {
            add(
                &var,
                format!("`env_http_headers.{header}` of `[model_providers.{id}]`"),
            );
        }
    }
    for (id, server) in tables("mcp_servers") {
        if server.get("enabled").and_then(toml::Value::as_bool) == Some(false) {
            continue;
        }
        let passed = server
            .get("env_vars")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().or_else(|| v.get("name")?.as_str()));
        for var in passed {
            add(var, format!("`env_vars` of `[mcp_servers.{id}]`"));
        }
        if let Some(var) = server
            .get("bearer_token_env_var")
            .and_then(toml::Value::as_str)
        {
            add(
                var,
                format!("`bearer_token_env_var` of `[mcp_servers.{id}]`"),
            );
        }
        for (header, var) in headers(server) {
            add(
                &var,
                format!("`env_http_headers.{header}` of `[mcp_servers.{id}]`"),
            );
        }
    }
    out
}

/// The provider a Codex configuration names.
fn codex_provider(
    vars: &Vars<'_>,
    config: Option<&toml::Table>,
) -> Option<crate::protocol::options::ProviderIdentity> {
    let openai = || {
        crate::session::binding::provider_identity(
            vars.get("OPENAI_BASE_URL").as_deref(),
            "https://api.openai.com/v1",
            vars.get("OPENAI_API_KEY").as_deref(),
        )
    };
    let Some(name) = config.and_then(|c| selected(c, "model_provider")) else {
        return openai();
    };
    let entry = config
        .and_then(|c| c.get("model_providers"))
        .and_then(|p| p.get(name));
    let Some(entry) = entry else {
        if name == "openai" {
            return openai();
        }
        // One of Codex's built-in providers other than OpenAI's: known by its name.
        return Some(crate::protocol::options::ProviderIdentity {
            host: name.to_owned(),
            key_sha256: None,
        });
    };
    let key = entry
        .get("env_key")
        .and_then(toml::Value::as_str)
        .and_then(|k| vars.get(k));
    let base_url = entry.get("base_url").and_then(toml::Value::as_str);
    crate::session::binding::provider_identity(base_url, name, key.as_deref())
}

#[cfg(test)]
mod binding_tests {
    use super::*;

    #[test]
    fn the_provider_is_the_configured_one_else_openai() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display().to_string();
        let vars_of = |extra: &'static [(&'static str, &'static str)]| {
            let home = home.clone();
            move |name: &str| {
                if name == "CODEX_HOME" {
                    return Some(home.clone());
                }
                extra
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let lookup = vars_of(&[("OPENAI_API_KEY", "sk-o")]);
        let vars = Vars::new(&lookup);
        let p = Codex.provider(&vars).unwrap();
        assert_eq!(p.host, "api.openai.com");
        assert_eq!(
            p.key_sha256.as_deref(),
            Some(&crate::session::binding::key_hash("sk-o")[..])
        );
        assert_eq!(Codex.default_model(&vars), None);
        std::fs::write(
            dir.path().join("config.toml"),
            "model = \"gpt-mock\"\nmodel_provider = \"mock\"\n\
             [model_providers.mock]\nname = \"mock\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             env_key = \"MOCK_API_KEY\"\n",
        )
        .unwrap();
        let lookup = vars_of(&[("OPENAI_API_KEY", "sk-o"), ("MOCK_API_KEY", "mock-secret")]);
        let vars = Vars::new(&lookup);
        let p = Codex.provider(&vars).unwrap();
        assert_eq!(p.host, "127.0.0.1:9");
        assert_eq!(
            p.key_sha256.as_deref(),
            Some(&crate::session::binding::key_hash("mock-secret")[..])
        );
        assert_eq!(Codex.default_model(&vars).as_deref(), Some("gpt-mock"));
    }
}

#[cfg(test)]
mod config_env_tests {
    use std::path::Path;

    use super::*;
    use crate::adapter::Native;
    use crate::adapter::launch::AgentSettings;
    use crate::config::Config;
    use crate::protocol::options::SessionOptions;
    use crate::session::agent::Launcher;

    const CONFIG: &str = r#"
model = "top-model"
model_provider = "mock"
profile = "work"

[model_providers.mock]
name = "Mock"
base_url = "http://127.0.0.1:9/v1"
env_key = "X_KEY"
env_http_headers = { "X-Org" = "X_ORG", "X-Project" = "X_KEY" }

[model_providers.other]
base_url = "http://127.0.0.1:8/v1"
env_key = "OTHER_KEY"

[profiles.work]
model = "work-model"
model_provider = "other"

[profiles.home]
model_provider = "mock"

[mcp_servers.db]
command = "db-mcp"
env_vars = ["DB_URL", { name = "DB_PASSWORD", source = "local" }]

[mcp_servers.web]
url = "http://127.0.0.1:7/mcp"
bearer_token_env_var = "WEB_TOKEN"
env_http_headers = { "X-Web" = "WEB_ORG" }

[mcp_servers.off]
command = "off-mcp"
enabled = false
env_vars = ["OFF_SECRET"]
"#;

    fn names(config: &str) -> Vec<String> {
        let table: toml::Table = config.parse().unwrap();
        named_vars(&table, Path::new("/c/config.toml"))
            .into_iter()
            .map(|n| n.name)
            .collect()
    }

    #[test]
    fn every_provider_and_mcp_server_names_its_variables_once() {
        assert_eq!(
            names(CONFIG),
            [
                "X_KEY",
                "X_ORG",
                "OTHER_KEY",
                "DB_URL",
                "DB_PASSWORD",
                "WEB_TOKEN",
                "WEB_ORG"
            ]
        );
        let table: toml::Table = CONFIG.parse().unwrap();
        let named = named_vars(&table, Path::new("/c/config.toml"));
        assert_eq!(
            named[0].named_by,
            "`env_key` of `[model_providers.mock]` in /c/config.toml"
        );
        assert_eq!(
            named[1].named_by,
            "`env_http_headers.X-Org` of `[model_providers.mock]` in /c/config.toml"
        );
        // Nothing named, or named in shapes Codex would refuse: nothing passes, nothing breaks.
        assert!(names("model = \"m\"").is_empty());
        assert!(names("model_providers = 3\nmcp_servers = \"x\"").is_empty());
        assert!(names("[model_providers.m]\nenv_key = 5\nenv_http_headers = [1]").is_empty());
    }

    #[test]
    fn the_selected_profile_picks_provider_and_model() {
        let table: toml::Table = CONFIG.parse().unwrap();
        assert_eq!(selected(&table, "model_provider"), Some("other"));
        assert_eq!(selected(&table, "model"), Some("work-model"));
        let table: toml::Table = CONFIG
            .replace("profile = \"work\"", "profile = \"home\"")
            .parse()
            .unwrap();
        assert_eq!(selected(&table, "model_provider"), Some("mock"));
        // The profile sets no model: the top level's.
        assert_eq!(selected(&table, "model"), Some("top-model"));
        let table: toml::Table = CONFIG
            .replace("profile = \"work\"", "profile = \"gone\"")
            .parse()
            .unwrap();
        assert_eq!(selected(&table, "model_provider"), Some("mock"));
    }

    /// A host whose environment has `host_env`, with Codex's `config.toml` holding
    /// `codex_config` (none: `None`), and Codex's binary a file that exists.
    fn host_with(
        dir: &Path,
        host_env: &[(&str, &str)],
        codex_config: Option<&str>,
    ) -> (AgentSettings, Config) {
        let codex_home = dir.join("codex-home");
        std::fs::create_dir_all(&codex_home).unwrap();
        if let Some(text) = codex_config {
            std::fs::write(codex_home.join("config.toml"), text).unwrap();
        }
        let bin = dir.join("codex");
        std::fs::write(&bin, "").unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let home = dir.join("host");
        std::fs::create_dir_all(&home).unwrap();
        let mut config = Config::with_home(&home).unwrap();
        config.env = [
            ("PATH", "/usr/bin:/bin"),
            ("CODEX_HOME", codex_home.to_str().unwrap()),
        ]
        .iter()
        .chain(host_env)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for family in ["codex", "claude"] {
            config.agents.insert(
                family.into(),
                crate::config::AgentConfig {
                    binary: Some(bin.display().to_string()),
                    ..Default::default()
                },
            );
        }
        (AgentSettings::from_config(&config), config)
    }

    fn env_of(settings: &AgentSettings, agent_type: &str) -> Vec<(String, String)> {
        settings
            .open_spec(
                agent_type,
                Path::new("/"),
                "s",
                Native::New("n".into()),
                &SessionOptions::default(),
            )
            .unwrap()
            .base_env
    }

    #[test]
    fn codex_gets_what_its_config_names_from_the_hosts_environment_and_no_one_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let host_env = [
            ("X_KEY", "x-secret"),
            ("X_ORG", "org"),
            ("DB_PASSWORD", "pw"),
            ("OFF_SECRET", "never"),
            ("UNNAMED_SECRET", "never"),
            ("OPENAI_API_KEY", "o"),
        ];
        let (settings, _) = host_with(dir.path(), &host_env, Some(CONFIG));
        let codex = env_of(&settings, "codex");
        let names: Vec<&str> = codex.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "CODEX_HOME",
                "OPENAI_API_KEY",
                "X_KEY",
                "X_ORG",
                "DB_PASSWORD"
            ]
        );
        assert!(codex.contains(&("X_KEY".to_owned(), "x-secret".to_owned())));
        // Another family is not given what Codex's config names.
        let claude = env_of(&settings, "claude");
        assert!(
            claude.iter().all(|(k, _)| !k.starts_with("X_")),
            "{claude:?}"
        );
        // The binding's provider is the selected profile's, its key as Codex gets it.
        let (settings, _) = settings_with_profile(dir.path(), &host_env);
        let provider = settings.provider("codex").unwrap();
        assert_eq!(provider.host, "127.0.0.1:9");
        assert_eq!(
            provider.key_sha256.as_deref(),
            Some(&crate::session::binding::key_hash("x-secret")[..])
        );
    }

    fn settings_with_profile(dir: &Path, host_env: &[(&str, &str)]) -> (AgentSettings, Config) {
        let config = CONFIG.replace("profile = \"work\"", "profile = \"home\"");
        host_with(dir, host_env, Some(&config))
    }

    #[test]
    fn a_malformed_or_missing_config_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        for config in [
            Some("model_provider = \"mock\"\n[model_providers.mock\nenv_key = \"X_KEY\""),
            None,
        ] {
            let (settings, _) = host_with(dir.path(), &[("X_KEY", "x")], config);
            let names: Vec<String> = env_of(&settings, "codex")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(names, ["PATH", "CODEX_HOME"], "{config:?}");
        }
    }

    #[test]
    fn a_missing_variable_gets_a_hint_that_says_where_to_set_it() {
        let dir = tempfile::tempdir().unwrap();
        let message = "Missing environment variable: `X_KEY`.";
        let (settings, config) = host_with(dir.path(), &[], Some(CONFIG));
        let hint = settings.env_hint("codex", message).unwrap();
        let host_config = config.home.join("config.toml");
        for part in [
            "X_KEY (named by `env_key` of `[model_providers.mock]` in ".to_owned(),
            "was not in agent-host's environment".to_owned(),
            format!(
                "{}: [agents.codex] env = {{ X_KEY = \"…\" }}",
                host_config.display()
            ),
        ] {
            assert!(hint.contains(&part), "{part:?} not in {hint}");
        }
        // Blank in the host's environment (passed as it is; Codex calls it missing).
        let (settings, _) = host_with(dir.path(), &[("X_KEY", "  ")], Some(CONFIG));
        let hint = settings.env_hint("codex", message).unwrap();
        assert!(hint.contains("is empty"), "{hint}");
        // Passed with a value: nothing to add. No missing variable: no hint.
        let (settings, _) = host_with(dir.path(), &[("X_KEY", "x-secret")], Some(CONFIG));
        assert_eq!(settings.env_hint("codex", message), None);
        assert_eq!(settings.env_hint("codex", "unexpected status 500"), None);
        // The host has it, but Codex's config does not name it: scoped away.
        let (settings, _) = host_with(dir.path(), &[("Y_KEY", "y-secret")], Some(CONFIG));
        let hint = settings
            .env_hint("codex", "Missing environment variable: `Y_KEY`.")
            .unwrap();
        assert!(hint.contains("does not pass it to codex"), "{hint}");
        assert!(!hint.contains("y-secret"), "{hint}");
    }
}
