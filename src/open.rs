//! `agent-host open [session_id] [--print]`: the way into the host's web UI.
//!
//! It owns three steps and nothing else: mint a WebSocket grant over IPC (`subscriber.add`,
//! with deltas and no replay — the page reads history itself), build the URL of the page the
//! host serves on its loopback port, and hand it to the desktop's browser — as a private file
//! (`open.html` in the home, 0600) that forwards to the URL, never as a command-line argument
//! every local user could read. The grant is always full-scope: a session id only says which
//! session the page opens on.
//!
//! The token travels in the URL's fragment (`#token=…`), which a browser never sends to a
//! server, so it reaches no request line, log or `Referer`. It lives for the grant's TTL; once
//! connected the page renews its own grant (`subscriber.grant` over the wire).
//!
//! Output: exactly one line on the first writer (stdout), the URL; a status line on the
//! second (stderr). A browser that cannot be opened is not a failure — the URL is printed
//! either way. It must not wait on the browser beyond its spawn, and it never prints the
//! token anywhere but in that one URL line.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Config;
use crate::ipc;
use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::replies::Grant;

const IPC_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The session the page opens on (none: the session list).
    pub session_id: Option<String>,
    /// Print the URL only; do not start a browser.
    pub print_only: bool,
}

/// Mint a grant, print the page's URL, and (unless `print_only`) open it in the browser.
/// Returns the reply to report: ok once the URL is printed; otherwise the reason, and nothing
/// was printed on `out`.
pub async fn run(
    config: &Config,
    options: OpenOptions,
    out: &mut (dyn Write + Send),
    status: &mut (dyn Write + Send),
) -> Reply {
    let params = json!({
        "type": "local",
        "forward_deltas": true,
        "replay_mode": "none",
        "client": "web",
    });
    let added = ipc_call(config, "subscriber.add", params).await;
    if !added.is_ok() {
        return added;
    }
    let grant: Grant = match added.data_as() {
        Ok(grant) => grant,
        Err(e) => {
            return Reply::error(
                ErrorCode::Internal,
                format!("subscriber.add answered no grant: {e}"),
                Value::Null,
            );
        }
    };
    let Some(port) = endpoint_port(&grant.ws_endpoint) else {
        // Leave no subscriber row behind for a grant nobody can use. Best effort.
        let _removed = ipc_call(
            config,
            "subscriber.remove",
            json!({"subscriber_id": grant.subscriber_id}),
        )
        .await;
        return Reply::error(
            ErrorCode::Internal,
            format!(
                "subscriber.add answered an endpoint without a loopback port: {:?}",
                grant.ws_endpoint
            ),
            Value::Null,
        );
    };
    let session_id = options.session_id.as_deref().filter(|id| !id.is_empty());
    let url = web_url(port, &grant.ws_token, session_id);
    if writeln!(out, "{url}").and_then(|()| out.flush()).is_err() {
        return Reply::error(
            ErrorCode::Internal,
            "could not write the URL to standard output",
            Value::Null,
        );
    }
    // Status lines are best effort: a closed stderr must not undo a printed URL.
    let _said = writeln!(
        status,
        "agent-host open: this link works for {} s; once connected, the page renews its own grant",
        grant.token_ttl_s
    );
    if !options.print_only {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        // The browser gets a private file that forwards to the URL, not the URL: a command
        // line is readable by every local user (`/proc/*/cmdline`), and a browser started by
        // it keeps it for its whole life.
        let opened = browser(std::env::consts::OS, env).and_then(|program| {
            let page = write_redirect(&config.home.join("open.html"), &url)?;
            launch(program, &page)
        });
        if let Err(why) = opened {
            let _said = writeln!(
                status,
                "agent-host open: could not open a browser: {why}; open the URL above"
            );
        }
    }
    Reply::ok(json!({"subscriber_id": grant.subscriber_id, "port": port}))
}

/// A page that forwards to `url` at once (and links to it, should refresh be off).
pub fn redirect_page(url: &str) -> String {
    let attr = url
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<meta name=\"referrer\" content=\"no-referrer\">\n\
         <meta http-equiv=\"refresh\" content=\"0;url={attr}\">\n<title>agent-host</title>\n\
         <p><a href=\"{attr}\">Open agent-host</a></p>\n"
    )
}

/// Write the forwarding page for `url` at `path`, readable by this user only (0600, even when
/// the file was there before); its path.
fn write_redirect(path: &std::path::Path, url: &str) -> Result<String, String> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(redirect_page(url).as_bytes()))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// The page's URL: the loopback origin of the host's port, the token (and the session the
/// page opens on) in the fragment. Values are percent-encoded as URL components.
pub fn web_url(port: u16, token: &str, session_id: Option<&str>) -> String {
    let mut url = format!("http://127.0.0.1:{port}/#token={}", encode_component(token));
    if let Some(id) = session_id {
        url.push_str("&session=");
        url.push_str(&encode_component(id));
    }
    url
}

/// The port of a grant's `ws://127.0.0.1:PORT/…` endpoint.
pub fn endpoint_port(ws_endpoint: &str) -> Option<u16> {
    let rest = ws_endpoint.strip_prefix("ws://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    if host != "127.0.0.1" && !host.eq_ignore_ascii_case("localhost") {
        return None;
    }
    port.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Percent-encode everything but RFC 3986's unreserved characters, so that no `&`, `=` or
/// `#` in a value can change the fragment's meaning.
fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The program that opens a URL in the user's browser on `os`, given the environment: on
/// Linux only inside a graphical session (`DISPLAY` or `WAYLAND_DISPLAY` set), where
/// `xdg-open` can reach a browser; elsewhere the reason there is none.
fn browser(
    os: &str,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<&'static str, String> {
    match os {
        "macos" => Ok("open"),
        "linux" if env("DISPLAY").is_some() || env("WAYLAND_DISPLAY").is_some() => Ok("xdg-open"),
        "linux" => Err("no graphical session (DISPLAY and WAYLAND_DISPLAY are unset)".to_owned()),
        other => Err(format!("no known way to open one on {other}")),
    }
}

/// Start `program URL` detached: no stdio (the URL line stays the only output), its own
/// process group (a Ctrl-C in this terminal does not reach the browser), not waited for.
/// The opener exits by itself once it has handed the URL on; this process exits right after,
/// and the child is reaped by whoever inherits it.
fn launch(program: &str, target: &str) -> Result<(), String> {
    use std::os::unix::process::CommandExt as _;
    Command::new(program)
        .arg(target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map(drop)
        .map_err(|e| format!("{program}: {e}"))
}

async fn ipc_call(config: &Config, command: &str, params: Value) -> Reply {
    let path = config.ipc_path();
    match ipc::request(
        &path,
        &json!({"command": command, "params": params}),
        IPC_TIMEOUT,
    )
    .await
    {
        Ok(reply) => reply,
        Err(e) => crate::request::errors::ipc_failure(e, &path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_browser_gets_a_private_page_that_forwards_to_the_url() {
        let url = web_url(4317, "AbC-_09", Some("s&1"));
        let page = redirect_page(&url);
        assert!(
            page.contains(
                "content=\"0;url=http://127.0.0.1:4317/#token=AbC-_09&amp;session=s%261\""
            ),
            "{page}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("open.html");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert_eq!(
            write_redirect(&path, &url).unwrap(),
            path.display().to_string()
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), page);
    }

    #[test]
    fn the_url_carries_token_and_session_in_the_fragment() {
        assert_eq!(
            web_url(4317, "AbC-_09", None),
            "http://127.0.0.1:4317/#token=AbC-_09"
        );
        assert_eq!(
            web_url(4317, "AbC-_09", Some("0190-ab.cd~x")),
            "http://127.0.0.1:4317/#token=AbC-_09&session=0190-ab.cd~x"
        );
        // Nothing in a value can add a parameter or end the fragment.
        assert_eq!(
            web_url(1, "t", Some("a&token=evil#x y/é")),
            "http://127.0.0.1:1/#token=t&session=a%26token%3Devil%23x%20y%2F%C3%A9"
        );
        assert_eq!(
            web_url(1, "a=b+c", None),
            "http://127.0.0.1:1/#token=a%3Db%2Bc"
        );
    }

    #[test]
    fn the_port_is_read_from_a_loopback_endpoint_only() {
        assert_eq!(endpoint_port("ws://127.0.0.1:4317/subscribe"), Some(4317));
        assert_eq!(endpoint_port("ws://localhost:80/subscribe"), Some(80));
        assert_eq!(endpoint_port("ws://127.0.0.1:65535"), Some(65535));
        for bad in [
            "",
            "ws://127.0.0.1/subscribe",
            "ws://127.0.0.1:0/subscribe",
            "ws://127.0.0.1:70000/subscribe",
            "ws://127.0.0.1:x/subscribe",
            "ws://example.com:4317/subscribe",
            "http://127.0.0.1:4317/subscribe",
            "wss://127.0.0.1:4317/subscribe",
        ] {
            assert_eq!(endpoint_port(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_browser_is_opened_only_where_one_can_be() {
        use std::ffi::OsString;
        let none = |_: &str| None;
        let x11 = |name: &str| (name == "DISPLAY").then(|| OsString::from(":0"));
        let wayland = |name: &str| (name == "WAYLAND_DISPLAY").then(|| OsString::from("wayland-0"));
        assert_eq!(browser("macos", none), Ok("open"));
        assert_eq!(browser("linux", x11), Ok("xdg-open"));
        assert_eq!(browser("linux", wayland), Ok("xdg-open"));
        assert!(browser("linux", none).unwrap_err().contains("DISPLAY"));
        assert!(browser("freebsd", x11).is_err());
    }

    #[test]
    fn a_missing_opener_is_an_error_not_a_panic() {
        let err = launch(
            "/nonexistent/agent-host-no-such-opener",
            "http://127.0.0.1:1/",
        )
        .unwrap_err();
        assert!(err.contains("no-such-opener"), "{err}");
    }
}
