//! What a session's native id is bound under ([`BindingRecord`]): derived at `session.create`
//! (and `session.import`, `session.fork`) and again before every prompt, then compared with the
//! record on the session's row (`docs/architecture.md`, "Binding"):
//!
//! - the workspace: the git top-level of the cwd and its `origin` remote (credentials
//!   stripped), read with `git` itself (`git -C <cwd> rev-parse --show-toplevel`, `git -C <cwd>
//!   config --get remote.origin.url`); git's "not a git repository": none; any other failure
//!   (no git, a repository git refuses to read, a broken `.git`): unknown, not compared;
//!   remotes are compared in one `host/path` form ([`remote_key`]);
//! - the provider: the host of the base URL the agent talks to and a hash of its key (the first
//!   16 hex digits of its SHA-256: never the key), as its family reads them from the agent's
//!   variables and files (`AgentFamily::provider`);
//! - the model in effect (the session's `model`, else the family's configured default), a hash
//!   of the standing prompt, and a hash of the runtime options (MCP servers, permission mode).
//!
//! Pure but for the `git` calls: the actor decides what a difference means
//! (`actor::binding`).

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::agent::Launcher;
use crate::protocol::options::{
    BindingRecord, ProviderIdentity, SessionOptions, WorkspaceIdentity,
};
use crate::store::now_ms;

/// How long one `git` call may take before the workspace is taken as unknown.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(3);

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(2 * digest.len());
    for byte in digest.iter() {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

/// How a key or token is recorded: the first 16 hex digits of its SHA-256, enough to tell two
/// accounts apart, never enough to be the key.
pub fn key_hash(key: &str) -> String {
    let mut hex = sha256_hex(key.as_bytes());
    hex.truncate(16);
    hex
}

/// The provider identity of an API at `base_url` (else `default_url`) with `key`: the URL's
/// host, with its port when it is not the scheme's default. `None` when neither URL has a host.
pub fn provider_identity(
    base_url: Option<&str>,
    default_url: &str,
    key: Option<&str>,
) -> Option<ProviderIdentity> {
    let host = base_url
        .and_then(url_host)
        .or_else(|| url_host(default_url))?;
    Some(ProviderIdentity {
        host,
        key_sha256: key.filter(|k| !k.is_empty()).map(key_hash),
    })
}

/// The `host[:port]` of a URL (lowercased; the port left out when it is the scheme's default).
pub fn url_host(url: &str) -> Option<String> {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => (String::new(), url),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Credentials in the URL are never part of the identity.
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let hostport = hostport.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" | "wss" => Some("443"),
        "http" | "ws" => Some("80"),
        _ => None,
    };
    let hostport = match (hostport.rsplit_once(':'), default_port) {
        // `[::1]:443` and `host:443` lose a default port; an IPv6 literal alone keeps its colons.
        (Some((host, port)), Some(default)) if port == default && !host.ends_with(':') => {
            host.to_owned()
        }
        _ => hostport,
    };
    (!hostport.is_empty()).then_some(hostport)
}

/// A git remote URL without credentials: a URL's `user:password@` (and for http(s), where a
/// token goes in the user part, any `user@`) is dropped; scp-like `git@host:path` is kept (its
/// user is no secret).
pub fn strip_credentials(url: &str) -> String {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let http = matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https");
    if http || userinfo.contains(':') {
        format!("{scheme}://{host}{path}")
    } else {
        url.to_owned()
    }
}

/// A remote as it is compared: `host/path`, whatever the form git was given it in —
/// `https://host/path`, `ssh://[user@]host[:port]/path`, scp-like `[user@]host:path` — the
/// host lowercased, its port and any user left out, the path without a trailing `/` or `.git`.
/// A local path (or `file://`) is its path so trimmed. The record keeps the URL as git has it
/// (credentials stripped) for messages; only this form is compared.
pub fn remote_key(url: &str) -> String {
    let url = url.trim();
    let (host, path) = if let Some((scheme, rest)) = url.split_once("://") {
        if scheme.eq_ignore_ascii_case("file") {
            (String::new(), rest)
        } else {
            let end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(end);
            (host_without_port(authority), path)
        }
    } else {
        match url.split_once(':') {
            // scp-like: a `:` before any `/`.
            Some((authority, path)) if !authority.is_empty() && !authority.contains('/') => {
                let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                (host.to_ascii_lowercase(), path)
            }
            _ => (String::new(), url),
        }
    };
    let path = path.trim_end_matches('/');
    let path = path
        .strip_suffix(".git")
        .unwrap_or(path)
        .trim_end_matches('/');
    if host.is_empty() {
        path.to_owned()
    } else {
        format!("{host}/{}", path.trim_start_matches('/'))
    }
}

/// The lowercased host of a URL's authority, without user or port.
fn host_without_port(authority: &str) -> String {
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        // `[::1]:22`: the literal with its brackets.
        v6.split_once(']')
            .map_or(hostport.to_owned(), |(ip, _)| format!("[{ip}]"))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host.to_owned(),
            _ => hostport.to_owned(),
        }
    };
    host.to_ascii_lowercase()
}

/// What git says of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workspace {
    /// It is (`Some`) or is not (`None`) in a repository.
    Known(Option<WorkspaceIdentity>),
    /// Git could not say (not installed, timed out, a repository it refuses to read or cannot
    /// open): nothing is compared.
    Unknown(String),
}

impl Workspace {
    /// As a record holds it: an unknown workspace is none.
    pub fn identity(&self) -> Option<WorkspaceIdentity> {
        match self {
            Workspace::Known(w) => w.clone(),
            Workspace::Unknown(_) => None,
        }
    }
}

/// What one `git` call answered.
#[derive(Debug)]
enum GitSaid {
    /// It succeeded: its trimmed stdout (`None` when empty).
    Out(Option<String>),
    /// It failed: its exit code and the first line of its stderr.
    Failed { code: Option<i32>, stderr: String },
}

/// Whether git's `stderr` is its answer that the directory is in no repository (and not a
/// repository it refuses to read, such as one of another owner, or one it cannot open). Read
/// from git run under `LC_ALL=C`.
fn not_a_repository(stderr: &str) -> bool {
    // "fatal: not a git repository (or any of the parent directories): .git", or "(or any
    // parent up to mount point /x)". A `.git` naming a missing directory says "not a git
    // repository: /x" instead: a broken repository, not none.
    stderr.contains("not a git repository (or any")
}

/// One `git -C <cwd> <args>`; `Err` when it could not be run or did not answer in time.
async fn git(cwd: &Path, args: &[&str]) -> Result<GitSaid, String> {
    let mut command = tokio::process::Command::new("git");
    command
        .arg("-C")
        .arg(cwd)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its messages in English: `not_a_repository` reads them.
        .env("LC_ALL", "C")
        .env_remove("LANGUAGE")
        .kill_on_drop(true);
    // The host's own git context must not decide what the session's cwd is.
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_COMMON_DIR",
        "GIT_INDEX_FILE",
        "GIT_CEILING_DIRECTORIES",
        "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    ] {
        command.env_remove(var);
    }
    // Registered while it runs: a binary host reaps the zombies of children it does not own,
    // and would otherwise take git's exit status before this wait (`ECHILD`).
    let child = crate::adapter::reap::spawn_registered(&mut command)
        .map_err(|e| format!("git could not be run: {e}"))?;
    let pid = child.id();
    let waited = tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output()).await;
    if let Some(pid) = pid {
        crate::adapter::reap::unregister(pid);
    }
    let output = match waited {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(format!("git could not be run: {e}")),
        Err(_) => {
            return Err(format!(
                "git did not answer within {} s",
                GIT_TIMEOUT.as_secs()
            ));
        }
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Ok(GitSaid::Failed {
            code: output.status.code(),
            stderr: stderr.lines().next().unwrap_or_default().trim().to_owned(),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok(GitSaid::Out((!text.is_empty()).then_some(text)))
}

/// The workspace of `cwd` as git knows it: its top-level and `origin` remote (credentials
/// stripped). Only git's own "not a git repository" is no repository; any other failure (a
/// repository of another owner git refuses, a broken `.git`, a cwd gone) is unknown, and
/// nothing is compared.
pub async fn workspace(cwd: &Path) -> Workspace {
    let root = match git(cwd, &["rev-parse", "--show-toplevel"]).await {
        Ok(GitSaid::Out(Some(root))) => root,
        // Success without a top-level: a bare repository, no work tree.
        Ok(GitSaid::Out(None)) => return Workspace::Known(None),
        Ok(GitSaid::Failed { stderr, .. }) if not_a_repository(&stderr) => {
            return Workspace::Known(None);
        }
        Ok(GitSaid::Failed { code, stderr }) => {
            return Workspace::Unknown(format!("git rev-parse failed ({code:?}): {stderr}"));
        }
        Err(why) => return Workspace::Unknown(why),
    };
    let remote = match git(cwd, &["config", "--get", "remote.origin.url"]).await {
        Ok(GitSaid::Out(remote)) => remote.map(|r| strip_credentials(&r)),
        // `git config --get` exits 1 for a key that is not set.
        Ok(GitSaid::Failed { code: Some(1), .. }) => None,
        Ok(GitSaid::Failed { code, stderr }) => {
            return Workspace::Unknown(format!("git config failed ({code:?}): {stderr}"));
        }
        Err(why) => return Workspace::Unknown(why),
    };
    Workspace::Known(Some(WorkspaceIdentity { root, remote }))
}

/// Hex SHA-256 of the runtime options that change what the agent can do (MCP servers and
/// permission mode, as stored); `None` when neither is set.
pub fn options_sha256(options: &SessionOptions) -> Option<String> {
    if options.mcp_servers.is_empty() && options.permission_mode.is_none() {
        return None;
    }
    let runtime = json!({
        "mcp_servers": options.mcp_servers,
        "permission_mode": options.permission_mode,
    });
    Some(sha256_hex(runtime.to_string().as_bytes()))
}

/// The binding of a session of `agent_type` in `cwd` with `options`, given its workspace.
pub fn record(
    launcher: &dyn Launcher,
    agent_type: &str,
    workspace: &Workspace,
    options: &SessionOptions,
) -> BindingRecord {
    BindingRecord {
        workspace: workspace.identity(),
        provider: launcher.provider(agent_type),
        model: options
            .model
            .clone()
            .or_else(|| launcher.default_model(agent_type)),
        system_prompt_sha256: options
            .system_prompt
            .as_deref()
            .map(|p| sha256_hex(p.as_bytes())),
        options_sha256: options_sha256(options),
        recorded_at_ms: now_ms(),
    }
}

/// [`record`], reading the workspace (git) and the family's files (off the runtime).
pub async fn derive(
    launcher: std::sync::Arc<dyn Launcher>,
    agent_type: &str,
    cwd: &Path,
    options: &SessionOptions,
) -> (Workspace, BindingRecord) {
    let workspace = workspace(cwd).await;
    let (ws, agent_type, options) = (workspace.clone(), agent_type.to_owned(), options.clone());
    let record =
        tokio::task::spawn_blocking(move || record(launcher.as_ref(), &agent_type, &ws, &options))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "deriving the binding failed");
                BindingRecord {
                    workspace: workspace.identity(),
                    recorded_at_ms: now_ms(),
                    ..BindingRecord::default()
                }
            });
    (workspace, record)
}

/// A workspace as a message names it.
pub fn describe_workspace(w: Option<&WorkspaceIdentity>) -> String {
    match w {
        None => "no git repository".to_owned(),
        Some(WorkspaceIdentity { root, remote: None }) => format!("{root} (no origin remote)"),
        Some(WorkspaceIdentity {
            root,
            remote: Some(remote),
        }) => format!("{root} (origin {remote})"),
    }
}

/// A provider as a message names it (the key by its hash only).
pub fn describe_provider(p: Option<&ProviderIdentity>) -> String {
    match p {
        None => "none known".to_owned(),
        Some(ProviderIdentity {
            host,
            key_sha256: None,
        }) => format!("{host} (no key)"),
        Some(ProviderIdentity {
            host,
            key_sha256: Some(key),
        }) => format!("{host} (key sha256 {key}…)"),
    }
}

/// Whether the workspace `now` is another than the one `recorded`: the recorded root or remote
/// differs (remotes compared as [`remote_key`] gives them), or the cwd left its repository. A workspace where none was recorded (the cwd became
/// a repository), or a remote where none was, contradicts nothing: it is recorded.
pub fn workspace_moved(
    recorded: Option<&WorkspaceIdentity>,
    now: Option<&WorkspaceIdentity>,
) -> bool {
    match (recorded, now) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(old), Some(new)) => {
            old.root != new.root
                || (old.remote.is_some()
                    && old.remote.as_deref().map(remote_key)
                        != new.remote.as_deref().map(remote_key))
        }
    }
}

/// Whether the provider account `now` is another than the one `recorded` (host or key hash
/// differ). None recorded, or none known now: nothing to compare.
pub fn provider_moved(recorded: Option<&ProviderIdentity>, now: Option<&ProviderIdentity>) -> bool {
    matches!((recorded, now), (Some(old), Some(new)) if old != new)
}

/// Which of the configuration's parts differ (`model`, `system_prompt`, `options`).
pub fn reconfigured(recorded: &BindingRecord, now: &BindingRecord) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if recorded.model != now.model {
        changed.push("model");
    }
    if recorded.system_prompt_sha256 != now.system_prompt_sha256 {
        changed.push("system_prompt");
    }
    if recorded.options_sha256 != now.options_sha256 {
        changed.push("options");
    }
    changed
}

/// The two records say the same (when each was recorded aside).
pub fn same(a: &BindingRecord, b: &BindingRecord) -> bool {
    BindingRecord {
        recorded_at_ms: 0,
        ..a.clone()
    } == BindingRecord {
        recorded_at_ms: 0,
        ..b.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::options::{McpServer, PermissionMode};

    fn git_here(dir: &Path, args: &[&str]) {
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("git is needed by this test (it is wherever the repository was cloned)");
        assert!(status.success(), "git {args:?}");
    }

    fn have_git() {
        assert!(
            which::which("git").is_ok(),
            "git is needed by this test (it is wherever the repository was cloned)"
        );
    }

    #[tokio::test]
    async fn the_workspace_is_the_repository_root_and_its_remote_without_credentials() {
        have_git();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        // Not a repository: no workspace (tempdirs are not inside one).
        assert_eq!(workspace(&root).await, Workspace::Known(None));
        git_here(&root, &["init", "-q"]);
        let sub = root.join("src/deep");
        std::fs::create_dir_all(&sub).unwrap();
        let root_text = root.display().to_string();
        assert_eq!(
            workspace(&sub).await,
            Workspace::Known(Some(WorkspaceIdentity {
                root: root_text.clone(),
                remote: None
            }))
        );
        git_here(
            &root,
            &[
                "remote",
                "add",
                "origin",
                "https://alice:s3cret@example.com/team/a.git",
            ],
        );
        let a = workspace(&sub).await.identity().unwrap();
        assert_eq!(a.root, root_text);
        assert_eq!(a.remote.as_deref(), Some("https://example.com/team/a.git"));
        let recorded = serde_json::to_string(&a).unwrap();
        assert!(!recorded.contains("s3cret") && !recorded.contains("alice"));
        // The same remote with another token: the same workspace.
        git_here(
            &root,
            &[
                "remote",
                "set-url",
                "origin",
                "https://ghp_token@example.com/team/a.git",
            ],
        );
        let same_again = workspace(&sub).await.identity().unwrap();
        assert!(!workspace_moved(Some(&a), Some(&same_again)));
        // Another remote: moved.
        git_here(
            &root,
            &["remote", "set-url", "origin", "git@example.com:team/b.git"],
        );
        let b = workspace(&sub).await.identity().unwrap();
        assert_eq!(b.remote.as_deref(), Some("git@example.com:team/b.git"));
        assert!(workspace_moved(Some(&a), Some(&b)));
        // The remote removed, the repository gone: moved too.
        git_here(&root, &["remote", "remove", "origin"]);
        let none = workspace(&sub).await.identity().unwrap();
        assert!(workspace_moved(Some(&a), Some(&none)));
        std::fs::remove_dir_all(root.join(".git")).unwrap();
        assert_eq!(workspace(&sub).await, Workspace::Known(None));
        assert!(workspace_moved(Some(&a), None));
        // Where nothing was recorded, a repository or a remote contradicts nothing.
        assert!(!workspace_moved(None, Some(&a)));
        assert!(!workspace_moved(Some(&none), Some(&a)));
    }

    #[test]
    fn credentials_are_stripped_from_remotes() {
        for (url, stripped) in [
            (
                "https://user:pass@github.com/o/r.git",
                "https://github.com/o/r.git",
            ),
            ("https://tok@github.com/o/r", "https://github.com/o/r"),
            ("ssh://git:pw@host:22/o/r", "ssh://host:22/o/r"),
            ("ssh://git@host/o/r", "ssh://git@host/o/r"),
            ("git@github.com:o/r.git", "git@github.com:o/r.git"),
            ("/srv/repos/r.git", "/srv/repos/r.git"),
            ("https://github.com/o/r@v1", "https://github.com/o/r@v1"),
        ] {
            assert_eq!(strip_credentials(url), stripped, "{url}");
        }
    }

    #[test]
    fn a_provider_is_its_host_and_a_hash_of_its_key_never_the_key() {
        let p = provider_identity(
            Some("http://127.0.0.1:4010/v1"),
            "https://api.anthropic.com",
            Some("sk-ant-very-secret"),
        )
        .unwrap();
        assert_eq!(p.host, "127.0.0.1:4010");
        let key = p.key_sha256.clone().unwrap();
        assert_eq!(key.len(), 16);
        assert_eq!(key, sha256_hex(b"sk-ant-very-secret")[..16]);
        let stored = serde_json::to_string(&BindingRecord {
            provider: Some(p.clone()),
            ..BindingRecord::default()
        })
        .unwrap();
        assert!(!stored.contains("secret"), "{stored}");
        // The default, its port left out; no key.
        let d = provider_identity(None, "https://api.anthropic.com", None).unwrap();
        assert_eq!(d.host, "api.anthropic.com");
        assert_eq!(d.key_sha256, None);
        assert_eq!(
            url_host("https://User:pw@API.Example.com:443/x"),
            Some("api.example.com".into())
        );
        assert_eq!(url_host("http://[::1]:8080"), Some("[::1]:8080".into()));
        // Another key is another account; another host another provider.
        let other = provider_identity(
            Some("http://127.0.0.1:4010"),
            "https://api.anthropic.com",
            Some("another"),
        );
        assert!(provider_moved(Some(&p), other.as_ref()));
        assert!(!provider_moved(Some(&p), Some(&p)));
        assert!(!provider_moved(None, Some(&p)));
    }

    #[test]
    fn claude_reads_its_base_url_and_key_and_default_model() {
        use crate::adapter::family::{AgentFamily, Vars};
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let claude = &crate::adapter::families::claude::Claude;
        let none = env(&[]);
        let p = claude.provider(&Vars::new(&none)).unwrap();
        assert_eq!((p.host.as_str(), p.key_sha256), ("api.anthropic.com", None));
        let mock = env(&[
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:4010"),
            ("ANTHROPIC_AUTH_TOKEN", "tok"),
            ("ANTHROPIC_MODEL", "claude-mock"),
        ]);
        let vars = Vars::new(&mock);
        let p = claude.provider(&vars).unwrap();
        assert_eq!(p.host, "127.0.0.1:4010");
        assert_eq!(p.key_sha256, Some(key_hash("tok")));
        assert_eq!(claude.default_model(&vars).as_deref(), Some("claude-mock"));
        // The `acp` family runs Claude: the same provider.
        let acp = &crate::adapter::families::acp::Acp;
        assert_eq!(acp.provider(&vars), Some(p));
    }

    #[test]
    fn the_configuration_parts_are_compared_by_hash() {
        let plain = SessionOptions::default();
        assert_eq!(options_sha256(&plain), None);
        let with = SessionOptions {
            model: Some("m".into()),
            system_prompt: Some("be terse".into()),
            mcp_servers: vec![McpServer::Stdio {
                name: "probe".into(),
                command: "node".into(),
                args: vec![],
                env: vec![],
            }],
            permission_mode: Some(PermissionMode::AcceptEdits),
        };
        let a = BindingRecord {
            model: with.model.clone(),
            system_prompt_sha256: with
                .system_prompt
                .as_deref()
                .map(|p| sha256_hex(p.as_bytes())),
            options_sha256: options_sha256(&with),
            recorded_at_ms: 1,
            ..BindingRecord::default()
        };
        let b = BindingRecord {
            recorded_at_ms: 2,
            ..a.clone()
        };
        assert!(same(&a, &b));
        assert!(reconfigured(&a, &b).is_empty());
        let c = BindingRecord {
            model: Some("n".into()),
            options_sha256: None,
            ..a.clone()
        };
        assert_eq!(reconfigured(&a, &c), ["model", "options"]);
        assert!(!same(&a, &c));
    }

    #[test]
    fn only_gits_not_a_repository_is_no_repository() {
        assert!(not_a_repository(
            "fatal: not a git repository (or any of the parent directories): .git"
        ));
        assert!(not_a_repository(
            "fatal: not a git repository (or any parent up to mount point /tmp)"
        ));
        for other in [
            "fatal: detected dubious ownership in repository at '/srv/r'",
            "fatal: not a git repository: /nowhere",
            "fatal: cannot change to '/gone': No such file or directory",
            "error: could not lock config file .git/config",
            "",
        ] {
            assert!(!not_a_repository(other), "{other}");
        }
    }

    #[tokio::test]
    async fn a_repository_git_cannot_read_is_unknown_not_none() {
        have_git();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        // A `.git` file naming a directory that is not there: a broken repository.
        let broken = root.join("broken");
        std::fs::create_dir(&broken).unwrap();
        std::fs::write(broken.join(".git"), "gitdir: /nowhere/at/all\n").unwrap();
        let w = workspace(&broken).await;
        assert!(matches!(w, Workspace::Unknown(_)), "{w:?}");
        // A cwd that is gone: unknown too (its agent says what is wrong).
        let w = workspace(&root.join("gone")).await;
        assert!(matches!(w, Workspace::Unknown(_)), "{w:?}");
        // A repository of another owner (git refuses it: dubious ownership) is never "no
        // repository"; only root can make one here.
        let theirs = root.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        git_here(&theirs, &["init", "-q"]);
        let chown = |p: &Path| std::os::unix::fs::chown(p, Some(54_321), Some(54_321)).is_ok();
        if chown(&theirs.join(".git")) && chown(&theirs) {
            let w = workspace(&theirs).await;
            assert_ne!(w, Workspace::Known(None));
        }
    }

    #[test]
    fn remotes_are_compared_as_host_and_path_whatever_their_form() {
        let forms = [
            "https://github.com/team/a.git",
            "https://GitHub.com/team/a",
            "https://github.com/team/a/",
            "https://github.com:443/team/a.git/",
            "http://github.com/team/a",
            "ssh://git@github.com/team/a.git",
            "ssh://git@github.com:22/team/a",
            "git+ssh://github.com/team/a.git",
            "git@github.com:team/a.git",
            "git@GITHUB.COM:/team/a",
            "github.com:team/a",
        ];
        for form in forms {
            assert_eq!(remote_key(form), "github.com/team/a", "{form}");
        }
        for other in [
            "https://github.com/team/b.git",
            "git@github.com:team/b.git",
            "https://gitlab.com/team/a.git",
            "git@github.com:other/a.git",
            "/srv/repos/a.git",
        ] {
            assert_ne!(remote_key(other), "github.com/team/a", "{other}");
        }
        assert_eq!(remote_key("/srv/repos/a.git"), "/srv/repos/a");
        assert_eq!(remote_key("file:///srv/repos/a.git/"), "/srv/repos/a");
        assert_eq!(remote_key("ssh://git@[::1]:2222/a.git"), "[::1]/a");
        // As the binding compares them: one repository in another form is not a move.
        let recorded = WorkspaceIdentity {
            root: "/w".into(),
            remote: Some("https://github.com/team/a.git".into()),
        };
        let ssh = WorkspaceIdentity {
            remote: Some("git@github.com:team/a.git".into()),
            ..recorded.clone()
        };
        let other = WorkspaceIdentity {
            remote: Some("git@github.com:team/b.git".into()),
            ..recorded.clone()
        };
        assert!(!workspace_moved(Some(&recorded), Some(&ssh)));
        assert!(workspace_moved(Some(&recorded), Some(&other)));
    }
}
