//! The browser side of the web UI tests: `web/` installed from its lock file (the libraries
//! vendored in `web/app/vendor` and `playwright-core`, which drives the browser), and a
//! Chromium to drive: Debian's `/usr/bin/chromium`, installed with apt when missing and root.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Chromium the browser tests run.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// The flags Chromium runs with in the tests (`AH_CHROMIUM_ARGS`, space-separated): headless,
/// no sandbox (root in a network namespace), and every background connection off. The
/// machine's network is closed; without the background-networking switches Chromium keeps
/// trying to reach Google's services and floods the log with refused connections.
pub const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// `web/` of this checkout.
pub fn web_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("web")
}

fn json(file: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

/// Every package `web/package.json` pins (dependencies and devDependencies), with its pin.
pub fn web_pins(root: &Path) -> Vec<(String, String)> {
    let manifest = json(&root.join("package.json")).unwrap_or_else(|| {
        panic!(
            "{} is missing or not JSON",
            root.join("package.json").display()
        )
    });
    ["dependencies", "devDependencies"]
        .iter()
        .filter_map(|section| manifest[*section].as_object())
        .flat_map(|deps| deps.iter())
        .map(|(name, pin)| (name.clone(), pin.as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// The version of `package` installed in `root/node_modules`, if any.
pub fn installed_version(root: &Path, package: &str) -> Option<String> {
    json(&root.join("node_modules").join(package).join("package.json"))
        .and_then(|v| v["version"].as_str().map(str::to_owned))
}

/// `web/`, with `web/node_modules` installed from the lock (`npm ci`) when it is missing or a
/// package there is not the version `package.json` pins (under the install lock, so parallel
/// tests do not install twice).
pub fn ensure_web() -> PathBuf {
    let root = web_root();
    let lock = File::create(root.join(".install.lock")).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let pins = web_pins(&root);
    let current = root.join("node_modules").is_dir()
        && pins
            .iter()
            .all(|(name, pin)| installed_version(&root, name).as_deref() == Some(pin.as_str()));
    if !current {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&root)
            .status()
            .expect("npm is needed to install web/ (the vendored libraries and playwright-core)");
        assert!(status.success(), "npm ci in web/ failed");
    }
    for (name, pin) in &pins {
        assert_eq!(
            installed_version(&root, name).as_deref(),
            Some(pin.as_str()),
            "web/node_modules/{name} is not the pinned version after npm ci"
        );
    }
    root
}

/// Whether `chromium --version` runs.
fn chromium_runs(path: &Path) -> bool {
    Command::new(path)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Debian's Chromium, installed with apt (as root, under a global lock) when it does not run.
pub fn ensure_chromium() -> PathBuf {
    let path = PathBuf::from(CHROMIUM);
    super::apt::ensure_package("chromium", CHROMIUM, || chromium_runs(&path));
    path
}
