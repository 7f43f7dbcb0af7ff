//! OpenCode (`opencode acp`): an ACP agent of any provider its own `opencode.json` names, so it
//! is given every provider's variables. It keeps its sessions in its own SQLite database
//! (`$XDG_DATA_HOME/opencode/opencode.db`), not in a file per session: the host relies on the
//! agent's own refusal of `session/load` / `session/resume` (a visible `resume_rejected`).
//! The variables its user-level configuration names with `{env:NAME}` (a provider's
//! `options.apiKey: "{env:MY_KEY}"`, say) are passed to it ([`named_vars`]).

use futures_util::future::BoxFuture;

use super::acp::{ACP_CAPABILITIES, probe_acp};
use crate::adapter::family::{AgentFamily, NamedVar, ProbeSpec, Probed, Vars};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, OpenSpec, OptionCaps, acp_process,
};

pub struct OpenCode;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "opencode",
    protocol: "Agent Client Protocol v1",
    default_binary: "opencode",
    binary_env: "AGENT_HOST_OPENCODE_BIN",
    version_args: &[],
    // No session option is shown with the real CLI here: none is declared.
    capabilities: Capabilities {
        options: OptionCaps::NONE,
        ..ACP_CAPABILITIES
    },
    turns: true,
    permission_policy: None,
};

impl AgentFamily for OpenCode {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn default_args(&self) -> &'static [&'static str] {
        &["acp"]
    }

    /// OpenCode's own settings (`OPENCODE_CONFIG`, `OPENCODE_CONFIG_DIR`, …).
    fn own_env(&self) -> &'static [&'static str] {
        &["OPENCODE_"]
    }

    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        acp_process::open(spec)
    }

    /// Every `{env:NAME}` of its user-level configuration: `$OPENCODE_CONFIG`, and
    /// `opencode.json`, `opencode.jsonc` and `config.json` in `$XDG_CONFIG_HOME/opencode`
    /// (else `~/.config/opencode`). Not a workspace's `opencode.json`: a repository must not
    /// be able to name the host's variables.
    fn config_env(&self, vars: &Vars<'_>) -> Vec<NamedVar> {
        let mut files: Vec<std::path::PathBuf> = vars
            .get("OPENCODE_CONFIG")
            .map(std::path::PathBuf::from)
            .into_iter()
            .collect();
        if let Some(dir) = vars.dir_or_home("XDG_CONFIG_HOME", ".config") {
            let dir = dir.join("opencode");
            files.extend(["opencode.json", "opencode.jsonc", "config.json"].map(|f| dir.join(f)));
        }
        let mut out: Vec<NamedVar> = Vec::new();
        for file in files {
            // A user's config is small; one much larger is not read.
            let Ok(meta) = std::fs::metadata(&file) else {
                continue;
            };
            if meta.len() > 1024 * 1024 {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for name in named_vars(&text) {
                if !out.iter().any(|n| n.name == name) {
                    out.push(NamedVar {
                        name: name.to_owned(),
                        named_by: format!("`{{env:{name}}}` in {}", file.display()),
                    });
                }
            }
        }
        out
    }

    fn probe<'a>(
        &'a self,
        spec: ProbeSpec<'a>,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Probed, AdapterError>> {
        probe_acp(spec, timeout)
    }
}

/// The names of every `{env:NAME}` in an OpenCode configuration's text, in order: OpenCode
/// substitutes them into the text before it parses it, so they count wherever they stand.
pub fn named_vars(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("{env:") {
        rest = &rest[at + "{env:".len()..];
        let Some(end) = rest.find('}') else {
            break;
        };
        let name = rest[..end].trim();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
        rest = &rest[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_of_its_user_config_are_named() {
        assert_eq!(
            named_vars(
                r#"{"provider": {"mine": {"options": {"apiKey": "{env:MY_KEY}",
                   "headers": {"X-Org": "{env: MY_ORG }"}}}},
                   "other": "{env:MY_KEY}", "broken": "{env:"#
            ),
            ["MY_KEY", "MY_ORG"]
        );
        assert!(named_vars("{\"no\": \"env\"}").is_empty());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("opencode");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(
            config.join("opencode.json"),
            r#"{"provider": {"m": {"options": {"apiKey": "{env:MY_KEY}"}}}}"#,
        )
        .unwrap();
        let home = dir.path().display().to_string();
        let lookup = move |name: &str| (name == "XDG_CONFIG_HOME").then(|| home.clone());
        let named = OpenCode.config_env(&Vars::new(&lookup));
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].name, "MY_KEY");
        assert!(named[0].named_by.contains("opencode.json"), "{named:?}");
    }
}
