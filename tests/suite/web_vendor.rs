//! The web UI's third-party code: the files vendored in `web/app/vendor` are byte for byte the
//! builds of the versions `web/package.json` pins (exactly, and the same in the lock file and
//! in `node_modules`), and nothing under `web/app` loads anything from another origin.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};

use common::browser::{ensure_web, installed_version, web_pins};

/// Each vendored file (under `web/app/vendor`) and the built file of `web/node_modules` it is
/// a copy of.
const VENDORED: &[(&str, &str)] = &[
    ("marked.esm.js", "marked/lib/marked.esm.js"),
    ("purify.es.mjs", "dompurify/dist/purify.es.mjs"),
    ("diff.min.js", "diff/dist/diff.min.js"),
];

#[test]
fn vendored_libraries_match_their_pinned_builds() {
    let web = ensure_web();
    let mut problems = Vec::new();
    for (vendored, built) in VENDORED {
        let vendored_path = web.join("app/vendor").join(vendored);
        let built_path = web.join("node_modules").join(built);
        let ours = std::fs::read(&vendored_path)
            .unwrap_or_else(|e| panic!("{}: {e}", vendored_path.display()));
        let theirs =
            std::fs::read(&built_path).unwrap_or_else(|e| panic!("{}: {e}", built_path.display()));
        if ours != theirs {
            problems.push(format!(
                "web/app/vendor/{vendored} differs from web/node_modules/{built} (the pinned \
                 build); refresh it: cp web/node_modules/{built} web/app/vendor/{vendored}"
            ));
        }
    }

    let lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(web.join("package-lock.json")).unwrap())
            .unwrap();
    let pins = web_pins(&web);
    let exact = regex::Regex::new(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?$").unwrap();
    for name in ["marked", "dompurify", "diff", "playwright-core"] {
        assert!(
            pins.iter().any(|(n, _)| n == name),
            "web/package.json does not pin {name}"
        );
    }
    for (name, pin) in &pins {
        if !exact.is_match(pin) {
            problems.push(format!(
                "web/package.json: {name} is {pin:?}, not an exact version (no ^, ~ or range)"
            ));
        }
        let root = &lock["packages"][""];
        let declared = root["dependencies"][name]
            .as_str()
            .or_else(|| root["devDependencies"][name].as_str());
        if declared != Some(pin.as_str()) {
            problems.push(format!(
                "web/package-lock.json declares {name} as {declared:?}, package.json pins \
                 {pin}; run npm install in web/ to update the lock"
            ));
        }
        let locked = lock["packages"][format!("node_modules/{name}")]["version"].as_str();
        if locked != Some(pin.as_str()) {
            problems.push(format!(
                "web/package-lock.json locks {name} at {locked:?}, package.json pins {pin}"
            ));
        }
        let installed = installed_version(&web, name);
        if installed.as_deref() != Some(pin.as_str()) {
            problems.push(format!(
                "web/node_modules/{name} is {installed:?}, package.json pins {pin}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every file under `dir`, recursively, except what is under `skip`.
fn files_under(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            files_under(&path, skip, out);
        } else {
            out.push(path);
        }
    }
}

/// The URL-ish strings of `text` that point to another origin: any `http://` or `https://`
/// not to 127.0.0.1 or localhost, and any protocol-relative `//cdn…`. Each with its line.
fn foreign_urls(text: &str) -> Vec<(usize, String)> {
    const LOCAL: &[&str] = &["http://127.0.0.1", "http://localhost"];
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let mut at = 0;
        while let Some(i) = ["http://", "https://", "//cdn"]
            .iter()
            .filter_map(|p| lower[at..].find(p).map(|i| at + i))
            .min()
        {
            let rest = &lower[i..];
            let end = rest
                .find(|c: char| c.is_whitespace() || "\"'`()<>".contains(c))
                .unwrap_or(rest.len());
            let url = &line[i..i + end];
            let local = LOCAL.iter().any(|l| {
                rest.starts_with(l)
                    && rest[l.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| c == ':' || c == '/')
            });
            if !local {
                found.push((n + 1, url.to_owned()));
            }
            // Past the scheme (or `//cdn`), so a match found inside this URL is not reported
            // again as a `//cdn` of its own.
            at = i + rest.find("//").map_or(1, |s| s + 2);
        }
    }
    found
}

#[test]
fn web_app_loads_nothing_from_another_origin() {
    let app = common::browser::web_root().join("app");
    let mut files = Vec::new();
    files_under(&app, &app.join("vendor"), &mut files);
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let ext = file
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default();
        if !["html", "htm", "js", "mjs", "css"].contains(&ext) {
            continue;
        }
        checked += 1;
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap()).into_owned();
        for (line, url) in foreign_urls(&text) {
            problems.push(format!(
                "{}:{line}: {url} (web/app may load only from its own origin; vendor the file \
                 under web/app/vendor)",
                file.strip_prefix(&app).unwrap_or(file).display()
            ));
        }
    }
    assert!(
        checked > 0,
        "no html, js or css file under {}",
        app.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn foreign_url_check_tells_local_from_foreign() {
    assert!(foreign_urls("fetch('/api'); ws://127.0.0.1:9/x").is_empty());
    assert!(foreign_urls("const u = 'http://127.0.0.1:8080/';").is_empty());
    assert!(foreign_urls("<a href=\"http://localhost/\">").is_empty());
    assert_eq!(
        foreign_urls("x\n<script src=\"https://cdn.jsdelivr.net/npm/marked\"></script>"),
        [(2, "https://cdn.jsdelivr.net/npm/marked".to_owned())]
    );
    assert_eq!(
        foreign_urls("@import url(//cdnjs.example/x.css);"),
        [(1, "//cdnjs.example/x.css".to_owned())]
    );
    assert_eq!(
        foreign_urls("http://localhost.evil.example/"),
        [(1, "http://localhost.evil.example/".to_owned())]
    );
    assert_eq!(foreign_urls("HTTP://Example.com").len(), 1);
}
