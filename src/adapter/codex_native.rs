//! The native Codex binary behind an npm-installed `codex`: [`native_of`] finds it the way
//! the package's own launcher (`@openai/codex/bin/codex.js`) does, so the host can start it
//! directly instead of a node process per session that only passes stdio through.
//!
//! What the launcher (0.171.0) does, and this module repeats:
//! - the target triple from the platform (Linux: the musl build), and its platform package
//!   (`@openai/codex-linux-x64`, …), resolved as node resolves `require.resolve(<package>/
//!   package.json)` from the launcher's real directory (every ancestor's `node_modules`),
//!   else `<package root>/vendor`;
//! - the binary `<vendor>/<triple>/bin/codex`; none there: the launcher fails, and the host
//!   starts the launcher (which then says so itself);
//! - the environment: its own, plus `CODEX_MANAGED_PACKAGE_ROOT=<real package root>`, with
//!   every `CODEX_MANAGED_BY_*` removed and the one of the package manager it detects set
//!   to `1` (pnpm, Vite+ and bun by their layouts; npm otherwise). It adds nothing to `PATH`:
//!   the native binary finds its bundled `rg` and `bwrap` next to itself.
//!
//! Anything that is not the launcher (a native binary configured directly, a wrapper script)
//! is started as it is. Pure file-system look-ups; no process is started here.

use std::path::{Path, PathBuf};

/// The npm package the launcher belongs to.
const PACKAGE: &str = "@openai/codex";
/// The variable the launcher sets to the package's real root.
pub const PACKAGE_ROOT_VAR: &str = "CODEX_MANAGED_PACKAGE_ROOT";
/// The variables naming the package manager; the launcher sets exactly one.
const MANAGED_BY: &[&str] = &[
    "CODEX_MANAGED_BY_NPM",
    "CODEX_MANAGED_BY_BUN",
    "CODEX_MANAGED_BY_PNPM",
    "CODEX_MANAGED_BY_VITE_PLUS",
];

/// The native binary an npm launcher starts, and the variables it sets for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeCodex {
    pub binary: PathBuf,
    /// `CODEX_MANAGED_PACKAGE_ROOT` and the package manager's `CODEX_MANAGED_BY_*`.
    pub env: Vec<(String, String)>,
}

impl NativeCodex {
    /// `env` as the launcher passes it on: less every `CODEX_MANAGED_BY_*` and the package
    /// root, which `self.env` sets.
    pub fn scrub(&self, env: &mut Vec<(String, String)>) {
        env.retain(|(k, _)| k != PACKAGE_ROOT_VAR && !MANAGED_BY.contains(&k.as_str()));
    }
}

/// The target triple and platform package the launcher picks for this build's platform.
fn target() -> Option<(&'static str, &'static str)> {
    Some(match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux" | "android", "x86_64") => ("x86_64-unknown-linux-musl", "@openai/codex-linux-x64"),
        ("linux" | "android", "aarch64") => {
            ("aarch64-unknown-linux-musl", "@openai/codex-linux-arm64")
        }
        ("macos", "x86_64") => ("x86_64-apple-darwin", "@openai/codex-darwin-x64"),
        ("macos", "aarch64") => ("aarch64-apple-darwin", "@openai/codex-darwin-arm64"),
        _ => return None,
    })
}

/// The native binary behind `program` if `program` is the `@openai/codex` npm launcher and
/// the binary is there; `None`: start `program` itself. `env` is the environment the launcher
/// would run with (its package-manager detection reads `npm_config_user_agent` and
/// `npm_execpath`).
pub fn native_of(program: &Path, env: &[(String, String)]) -> Option<NativeCodex> {
    let script = std::fs::canonicalize(program).ok()?;
    if script.file_name()? != "codex.js" {
        return None;
    }
    let bin_dir = script.parent()?;
    if bin_dir.file_name()? != "bin" {
        return None;
    }
    let root = std::fs::canonicalize(bin_dir.parent()?).ok()?;
    if package_name(&root.join("package.json")).as_deref() != Some(PACKAGE) {
        return None;
    }
    let (triple, platform_package) = target()?;
    let vendor = resolve_package_json(bin_dir, platform_package)
        .and_then(|p| p.parent().map(|d| d.join("vendor")))
        .unwrap_or_else(|| root.join("vendor"));
    let binary = vendor.join(triple).join("bin").join("codex");
    if !is_executable(&binary) {
        return None;
    }
    // The launcher's `process.argv[1]` is the path it was started by, not its real path.
    let entry_dir = program.parent().unwrap_or(bin_dir);
    let manager = detect_manager(&root, entry_dir, bin_dir, env);
    Some(NativeCodex {
        binary,
        env: vec![
            (PACKAGE_ROOT_VAR.to_owned(), root.display().to_string()),
            (manager.to_owned(), "1".to_owned()),
        ],
    })
}

fn package_name(package_json: &Path) -> Option<String> {
    let text = std::fs::read_to_string(package_json).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value.get("name")?.as_str().map(str::to_owned)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// node's `require.resolve("<package>/package.json")` from a module in `from`: the first
/// `<ancestor>/node_modules/<package>/package.json`, skipping ancestors that are themselves
/// `node_modules`, as its real path.
fn resolve_package_json(from: &Path, package: &str) -> Option<PathBuf> {
    from.ancestors()
        .filter(|dir| dir.file_name().is_none_or(|n| n != "node_modules"))
        .map(|dir| dir.join("node_modules").join(package).join("package.json"))
        .find(|candidate| candidate.is_file())
        .and_then(|found| std::fs::canonicalize(found).ok())
}

/// The launcher's `detectPackageManager`, as the variable it sets.
fn detect_manager(
    root: &Path,
    entry_dir: &Path,
    script_dir: &Path,
    env: &[(String, String)],
) -> &'static str {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    };
    let entry_dir = std::path::absolute(entry_dir).unwrap_or_else(|_| entry_dir.to_owned());
    let starts = if entry_dir == root {
        vec![root.to_owned()]
    } else {
        vec![root.to_owned(), entry_dir]
    };
    for start in &starts {
        // Up to the file-system root, which is looked at last and for pnpm only.
        for dir in start.ancestors().filter(|d| d.parent().is_some()) {
            if vite_plus_owns(dir, root) {
                return "CODEX_MANAGED_BY_VITE_PLUS";
            }
            if pnpm_owns(&dir.join("node_modules"), root) {
                return "CODEX_MANAGED_BY_PNPM";
            }
        }
        if let Some(fs_root) = start.ancestors().last()
            && pnpm_owns(&fs_root.join("node_modules"), root)
        {
            return "CODEX_MANAGED_BY_PNPM";
        }
    }
    let script_dir = script_dir.display().to_string();
    if var("npm_config_user_agent").contains("bun/")
        || var("npm_execpath").contains("bun")
        || script_dir.contains(".bun/install/global")
    {
        return "CODEX_MANAGED_BY_BUN";
    }
    // npm, or nothing detected: the launcher names npm for both.
    "CODEX_MANAGED_BY_NPM"
}

fn same_real(path: &Path, root: &Path) -> bool {
    std::fs::canonicalize(path).is_ok_and(|p| p == root)
}

/// pnpm's `node_modules/.modules.yaml` beside this very package.
fn pnpm_owns(node_modules: &Path, root: &Path) -> bool {
    node_modules.join(".modules.yaml").exists()
        && same_real(&node_modules.join("@openai").join("codex"), root)
}

/// Vite+'s `packages/@openai/codex.json` naming the installation this package is.
fn vite_plus_owns(packages: &Path, root: &Path) -> bool {
    if packages.file_name().is_none_or(|n| n != "packages") {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(packages.join("@openai").join("codex.json")) else {
        return false;
    };
    let Ok(meta) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    if meta.get("name").and_then(|n| n.as_str()) != Some(PACKAGE) {
        return false;
    }
    let id = meta
        .get("installId")
        .and_then(|i| i.as_str())
        .unwrap_or_default();
    let install = if id.starts_with('#') {
        packages.join(format!("@openai/codex{id}"))
    } else {
        packages.join("@openai/codex").join(id)
    };
    [
        install.join("lib").join("node_modules"),
        install.join("node_modules"),
    ]
    .iter()
    .any(|nm| same_real(&nm.join("@openai").join("codex"), root))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An npm install of the launcher and (optionally) its platform package under `dir`, with
    /// `node_modules/.bin/codex` linking to the launcher; returns that link.
    fn install(dir: &Path, platform_package: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let nm = dir.join("node_modules");
        let pkg = nm.join("@openai/codex");
        std::fs::create_dir_all(pkg.join("bin")).unwrap();
        std::fs::write(pkg.join("package.json"), r#"{"name":"@openai/codex"}"#).unwrap();
        std::fs::write(pkg.join("bin/codex.js"), "#!/usr/bin/env node\n").unwrap();
        if platform_package && let Some((triple, platform)) = target() {
            let p = nm.join(platform);
            let bin = p.join("vendor").join(triple).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(p.join("package.json"), r#"{"name":"@openai/codex"}"#).unwrap();
            std::fs::write(bin.join("codex"), "").unwrap();
            std::fs::set_permissions(bin.join("codex"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        std::fs::create_dir_all(nm.join(".bin")).unwrap();
        let link = nm.join(".bin/codex");
        std::os::unix::fs::symlink("../@openai/codex/bin/codex.js", &link).unwrap();
        link
    }

    #[test]
    fn the_launcher_leads_to_the_platform_packages_binary_and_its_variables() {
        let dir = tempfile::tempdir().unwrap();
        let link = install(dir.path(), true);
        let Some((triple, platform)) = target() else {
            return;
        };
        let native = native_of(&link, &[]).unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(
            native.binary,
            real.join("node_modules")
                .join(platform)
                .join("vendor")
                .join(triple)
                .join("bin/codex")
        );
        let root = real
            .join("node_modules/@openai/codex")
            .display()
            .to_string();
        assert_eq!(
            native.env,
            [
                (PACKAGE_ROOT_VAR.to_owned(), root),
                ("CODEX_MANAGED_BY_NPM".to_owned(), "1".to_owned())
            ]
        );
        let mut env = vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("CODEX_MANAGED_BY_PNPM".to_owned(), "1".to_owned()),
            (PACKAGE_ROOT_VAR.to_owned(), "/elsewhere".to_owned()),
        ];
        native.scrub(&mut env);
        assert_eq!(env, [("PATH".to_owned(), "/bin".to_owned())]);
    }

    #[test]
    fn no_platform_binary_or_no_launcher_starts_the_program_itself() {
        let dir = tempfile::tempdir().unwrap();
        let link = install(dir.path(), false);
        assert_eq!(native_of(&link, &[]), None);
        assert_eq!(native_of(Path::new("/bin/sh"), &[]), None);
        assert_eq!(native_of(&dir.path().join("missing"), &[]), None);
    }

    #[test]
    fn a_pnpm_layout_and_bun_are_told_as_the_launcher_tells_them() {
        let dir = tempfile::tempdir().unwrap();
        let link = install(dir.path(), true);
        if target().is_none() {
            return;
        }
        let bun = [("npm_config_user_agent".to_owned(), "bun/1.2".to_owned())];
        let native = native_of(&link, &bun).unwrap();
        assert_eq!(native.env[1].0, "CODEX_MANAGED_BY_BUN");
        std::fs::write(dir.path().join("node_modules/.modules.yaml"), "").unwrap();
        let native = native_of(&link, &bun).unwrap();
        assert_eq!(native.env[1].0, "CODEX_MANAGED_BY_PNPM");
    }
}
