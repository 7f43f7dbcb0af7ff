//! Debian packages the tests need (Chromium, `systemd-analyze`, zsh, fish), installed with apt
//! when the program does not run: as root only (else the test fails, saying how to install
//! it), `apt-get update` then `apt-get install -y`, under one global lock so tests installing
//! at once do not collide, and checked again after the lock (another test may have installed
//! it meanwhile). Included by `tests/common` and, by path, by test files that need only it.

use std::fs::File;

/// The one lock around apt for every test binary.
pub const APT_LOCK: &str = "/tmp/agent-host-apt.lock";

/// Make `runs()` true by installing Debian's `package` when it is false.
pub fn ensure_package(package: &str, what: &str, runs: impl Fn() -> bool) {
    if runs() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "{what} is missing and this test is not root, so it cannot install it; install it with \
         `sudo apt-get install {package}` (Debian's package) and run the test again"
    );
    let lock = File::create(APT_LOCK).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
    if !runs() {
        let update = std::process::Command::new("apt-get")
            .arg("update")
            .status()
            .expect("apt-get runs");
        assert!(update.success(), "apt-get update failed");
        let install = std::process::Command::new("apt-get")
            .args(["install", "-y", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get runs");
        assert!(install.success(), "apt-get install {package} failed");
    }
    assert!(
        runs(),
        "{what} does not run after apt-get install {package}"
    );
}

/// Whether `program --version` runs.
pub fn version_runs(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
