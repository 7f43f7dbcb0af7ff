//! The real agent CLIs the tests drive: installed from `agents/package.json` (pinned) into
//! `agents/node_modules` from the lock file, once per checkout, and run offline.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned claude CLI, installed if missing (a lock keeps parallel tests from installing
/// twice).
pub fn ensure_claude() -> PathBuf {
    ensure_npm_agent("claude", "@anthropic-ai/claude-code")
}

/// The pinned `claude-agent-acp` (an ACP agent over Claude Code), installed if missing.
pub fn ensure_claude_acp() -> PathBuf {
    ensure_claude();
    ensure_npm_agent("claude-agent-acp", "@agentclientprotocol/claude-agent-acp")
}

/// The pinned Qwen Code (`qwen --acp`), installed if missing.
pub fn ensure_qwen() -> PathBuf {
    ensure_npm_agent("qwen", "@qwen-code/qwen-code")
}

/// Install `agents/` from its lock file. `npm install` rather than `npm ci`: Qwen Code's
/// optional clipboard packages for other platforms are never written to a lock file by npm,
/// and `npm ci` refuses such a lock; `npm install` installs exactly what it pins and leaves it
/// unchanged.
fn npm_install(root: &Path) {
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(root)
        .status()
        .expect("npm is needed to install the agent CLIs the tests drive");
    assert!(status.success(), "npm install in agents/ failed");
}

/// The harness's own name of the running test, as `--exact` matches it: its path within the
/// test binary (`module::test_name` in the suite). The harness names each test's thread so; a
/// test that re-runs itself in a child process (e.g. in a namespace) passes this name.
pub fn full_test_name(test_name: &str) -> String {
    std::thread::current()
        .name()
        .filter(|name| *name == test_name || name.ends_with(&format!("::{test_name}")))
        .unwrap_or(test_name)
        .to_owned()
}

/// Set in a test process that runs inside its own network namespace.
pub const NETNS_MARKER: &str = "AGENT_HOST_TEST_NETNS";

/// Run the named test of this test binary again inside a new network namespace that has only
/// loopback (`unshare -n`, root; `unshare -rn` otherwise), so a real agent CLI can reach the
/// mock model on 127.0.0.1 and nothing else. Returns `true` in the child (go on with the test),
/// and `false` in the parent once the child passed.
pub fn in_loopback_only_netns(test_name: &str) -> bool {
    if std::env::var_os(NETNS_MARKER).is_some() {
        // Inside: the only network interface is loopback (/proc/self/net is this namespace's
        // view; /sys/class/net would still show the mount's).
        let interfaces: Vec<String> = std::fs::read_to_string("/proc/self/net/dev")
            .unwrap()
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next().map(|n| n.trim().to_owned()))
            .collect();
        assert_eq!(interfaces, ["lo"], "not isolated");
        return true;
    }
    let test_name = full_test_name(test_name);
    let exe = std::env::current_exe().unwrap();
    let root = nix::unistd::geteuid().is_root();
    let unshare_flags = if root { "-n" } else { "-rn" };
    let status = Command::new("unshare")
        .args([
            unshare_flags,
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\" \"$@\"",
        ])
        .arg(&exe)
        .args([&test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(NETNS_MARKER, "1")
        .status()
        .expect("unshare (util-linux) runs the real CLIs in a loopback-only namespace");
    assert!(
        status.success(),
        "{test_name} failed inside its network namespace"
    );
    false
}

/// What a real CLI needs to run offline against the mock: a private HOME, the mock's URL, a
/// key it never checks, and every telemetry and retry switch off.
pub fn agent_env(home: &Path, mock: &super::mock_model::MockModel) -> Vec<(String, String)> {
    [
        ("HOME", home.to_str().unwrap().to_owned()),
        ("PATH", "/usr/bin:/bin".to_owned()),
        ("ANTHROPIC_BASE_URL", mock.base_url()),
        ("ANTHROPIC_API_KEY", "mock-key".to_owned()),
        ("DISABLE_TELEMETRY", "1".to_owned()),
        ("DISABLE_ERROR_REPORTING", "1".to_owned()),
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// Whether any live (non-zombie) process is in group `pgid`.
pub fn group_alive(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
            && fields.first() != Some(&"Z")
    })
}

/// The pinned codex CLI, installed if missing (the same install and lock as `ensure_claude`).
pub fn ensure_codex() -> PathBuf {
    ensure_npm_agent("codex", "@openai/codex")
}

/// `agents/node_modules/.bin/<bin>` of npm package `package`, installed from the lock when it is
/// missing, not the pinned version, or does not run `--version` (under the install lock).
///
/// A CLI that ran `--version` at its pinned version leaves a stamp (`node_modules/.verified/
/// <bin>`: the version and its installed `package.json`'s mtime), so later calls — many tests
/// call this, and a test re-run in a namespace calls it again — skip the run: `gemini
/// --version` alone takes ~3 s. A reinstall rewrites that `package.json` and so voids the stamp.
fn ensure_npm_agent(bin: &str, package: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
    let path = root.join("node_modules/.bin").join(bin);
    let lock = File::create(root.join(".install.lock")).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let json = |file: PathBuf| {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    };
    let manifest = root.join("node_modules").join(package).join("package.json");
    let pinned = json(root.join("package.json"))
        .and_then(|v| v["dependencies"][package].as_str().map(str::to_owned));
    let stamp_path = root.join("node_modules/.verified").join(bin);
    let stamp = || {
        let modified = std::fs::metadata(&manifest)
            .and_then(|m| m.modified())
            .ok()?;
        let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
        let installed = json(manifest.clone())?["version"].as_str()?.to_owned();
        (Some(&installed) == pinned.as_ref()).then(|| format!("{installed} {}", since.as_nanos()))
    };
    if path.exists()
        && stamp().is_some_and(|s| std::fs::read_to_string(&stamp_path).ok() == Some(s))
    {
        return path;
    }
    let works = |path: &Path| {
        Command::new(path)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !path.exists() || stamp().is_none() || !works(&path) {
        npm_install(&root);
        assert!(
            works(&path),
            "{} does not run after npm install",
            path.display()
        );
    }
    let verified = stamp().unwrap_or_else(|| {
        panic!("{package} in agents/node_modules is not the pinned {pinned:?} after npm install")
    });
    std::fs::create_dir_all(stamp_path.parent().unwrap()).unwrap();
    std::fs::write(&stamp_path, verified).unwrap();
    path
}

/// What `codex` needs to run offline against the mock: a private HOME, CODEX_HOME inside it
/// (`home/.codex`, where `write_codex_config` puts the config naming the mock), and the key
/// the config's provider reads (never checked).
pub fn codex_env(home: &Path, _mock: &super::mock_model::MockModel) -> Vec<(String, String)> {
    let codex_home = home.join(".codex");
    [
        ("HOME", home.to_str().unwrap().to_owned()),
        ("PATH", "/usr/bin:/bin".to_owned()),
        ("CODEX_HOME", codex_home.to_str().unwrap().to_owned()),
        ("MOCK_API_KEY", "mock-key".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// Write `codex_home/config.toml`: the mock as the model provider over the Responses API, a
/// pinned model (fallback metadata keeps the classic `exec_command` tool; Codex's default model
/// would use "code mode", which the mock does not script), no retries (an HTTP 500 fails the
/// turn at once), and analytics, feedback, OpenTelemetry and update checks off.
pub fn write_codex_config(codex_home: &Path, mock: &super::mock_model::MockModel) {
    std::fs::create_dir_all(codex_home).unwrap();
    let config = format!(
        r#"model = "mock-model"
model_provider = "mock"
approval_policy = "on-request"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[model_providers.mock]
name = "Mock LLM"
base_url = "{}/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"#,
        mock.base_url()
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
}

/// The pinned Gemini CLI (`gemini`), installed if missing.
pub fn ensure_gemini() -> PathBuf {
    ensure_npm_agent("gemini", "@google/gemini-cli")
}

/// The pinned OpenCode (`opencode acp`), installed if missing.
pub fn ensure_opencode() -> PathBuf {
    ensure_npm_agent("opencode", "opencode-ai")
}

/// What OpenCode needs to run offline against the mock's Chat Completions API, written under
/// `home` (its HOME and XDG dirs): `opencode.json` naming the mock as its only provider, bash
/// and edits asked about, and a stub of the plugin package in its config folder (without it
/// OpenCode starts an npm install of `@opencode-ai/plugin` at every start, which fails
/// offline). Returns the variables to run it with; the key in the config is `api_key`.
pub fn opencode_setup(
    home: &Path,
    mock: &super::mock_model::MockModel,
    api_key: &str,
) -> Vec<(String, String)> {
    let version =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/package.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["dependencies"]["opencode-ai"].as_str().map(str::to_owned))
            .unwrap();
    let config = home.join(".config");
    let dir = config.join("opencode");
    std::fs::create_dir_all(dir.join("node_modules")).unwrap();
    let plugin = serde_json::json!({"dependencies": {"@opencode-ai/plugin": version}});
    std::fs::write(dir.join("package.json"), plugin.to_string()).unwrap();
    let lock = serde_json::json!({"lockfileVersion": 3, "packages": {"": plugin}});
    std::fs::write(dir.join("package-lock.json"), lock.to_string()).unwrap();
    let settings = serde_json::json!({
        "model": "mock/mock-model",
        "small_model": "mock/mock-model",
        "enabled_providers": ["mock"],
        "autoupdate": false,
        "share": "disabled",
        "permission": {"bash": "ask", "edit": "ask"},
        "provider": {"mock": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Mock LLM",
            "options": {"baseURL": format!("{}/v1", mock.base_url()), "apiKey": api_key},
            "models": {"mock-model": {"name": "Mock Model", "tool_call": true,
                                       "limit": {"context": 128000, "output": 8192}}}
        }}
    });
    std::fs::write(dir.join("opencode.json"), settings.to_string()).unwrap();
    let at = |p: &str| home.join(p).to_str().unwrap().to_owned();
    [
        ("XDG_CONFIG_HOME", at(".config")),
        ("XDG_DATA_HOME", at(".local/share")),
        ("XDG_CACHE_HOME", at(".cache")),
        ("XDG_STATE_HOME", at(".local/state")),
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".to_owned()),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".to_owned()),
        ("OPENCODE_DISABLE_SHARE", "1".to_owned()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".to_owned()),
        ("OPENCODE_DISABLE_CLAUDE_CODE", "1".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// What `gemini` needs to run offline against the mock: a private HOME (where
/// `write_gemini_settings` puts `.gemini/settings.json`), the mock as the Gemini API's base URL
/// (allowed over plain HTTP because it is 127.0.0.1), a key it never checks, no relaunch (by
/// default the CLI re-spawns itself as a child node process with a bigger heap, which doubles
/// the start-up and puts a parent that ignores SIGINT and SIGTERM between the caller and the
/// agent), and TMPDIR inside HOME (the CLI writes an error report there, `/tmp` otherwise).
pub fn gemini_env(home: &Path, mock: &super::mock_model::MockModel) -> Vec<(String, String)> {
    let home = home.to_str().unwrap().to_owned();
    [
        ("HOME", home.clone()),
        ("PATH", "/usr/bin:/bin".to_owned()),
        ("TMPDIR", home),
        ("GEMINI_API_KEY", "mock-key".to_owned()),
        ("GOOGLE_GEMINI_BASE_URL", mock.base_url()),
        ("GEMINI_CLI_NO_RELAUNCH", "1".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// Write `home/.gemini/settings.json`: API-key auth (without it the CLI exits 41, "Invalid auth
/// method selected"), no session clean-up (with it, a new process was seen deleting the
/// sessions of earlier ones), one attempt per model call (the CLI retries 429s and 5xx up to
/// 10 times with 5-30 s back-off otherwise), and usage statistics, telemetry, update checks,
/// the IDE integration, ripgrep (not bundled: it would look for one) and the terminal warnings
/// off. The workspace is trusted per run, with `--skip-trust`.
pub fn write_gemini_settings(home: &Path) {
    let dir = home.join(".gemini");
    std::fs::create_dir_all(&dir).unwrap();
    let settings = serde_json::json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {
            "sessionRetention": {"enabled": false},
            "maxAttempts": 1,
            "enableAutoUpdate": false,
            "enableAutoUpdateNotification": false
        },
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "ide": {"enabled": false},
        "tools": {"useRipgrep": false},
        "ui": {"showCompatibilityWarnings": false}
    });
    std::fs::write(
        dir.join("settings.json"),
        serde_json::to_string_pretty(&settings).unwrap(),
    )
    .unwrap();
}
