//! The web UI's files, embedded in the binary at build time from `web/app/`, and their ETags.
//!
//! The table is the whole list of what is served: a path not in it is a 404, whatever is on
//! disk. Adding a file is one `asset!` line. ETags are computed from the bytes once per
//! process, so a browser's `If-None-Match` costs a string comparison.

use std::fmt::Write as _;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// The URL path it is served at (`/vendor/marked.esm.js`).
    pub path: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

/// `asset!("vendor/x.js", JS)`: served at `/vendor/x.js`, read from `web/app/vendor/x.js`
/// (relative to this file: `src/web/` → the repository root is `../../`).
macro_rules! asset {
    ($file:literal, $content_type:expr) => {
        Asset {
            path: concat!("/", $file),
            content_type: $content_type,
            bytes: include_bytes!(concat!("../../web/app/", $file)),
        }
    };
}

/// Every file served. `/` is `/index.html` (see [`lookup`]).
pub const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("app.css", CSS),
    asset!("main.js", JS),
    asset!("wire.js", JS),
    asset!("transcript.js", JS),
    asset!("vendor/marked.esm.js", JS),
    asset!("vendor/purify.es.mjs", JS),
    asset!("vendor/diff.min.js", JS),
];

/// The path `/` is served as.
const INDEX: &str = "/index.html";

/// An asset found by its path, with its ETag.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    pub asset: &'static Asset,
    /// A strong ETag, quotes included: `"<sha-256 of the bytes, hex>"`.
    pub etag: &'static str,
}

/// The asset served at `path` (no query string), if any.
pub fn lookup(path: &str) -> Option<Found> {
    let path = if path == "/" { INDEX } else { path };
    let index = ASSETS.iter().position(|a| a.path == path)?;
    let asset = ASSETS.get(index)?;
    let etag = etags().get(index)?;
    Some(Found { asset, etag })
}

/// One ETag per row of [`ASSETS`], in the same order.
fn etags() -> &'static [String] {
    static ETAGS: OnceLock<Vec<String>> = OnceLock::new();
    ETAGS.get_or_init(|| ASSETS.iter().map(|a| etag_of(a.bytes)).collect())
}

fn etag_of(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut etag = String::with_capacity(2 + 2 * digest.len());
    etag.push('"');
    for byte in digest.iter() {
        // Writing to a String cannot fail.
        let _ = write!(etag, "{byte:02x}");
    }
    etag.push('"');
    etag
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_file_is_embedded_with_its_type() {
        let expected = [
            ("/", HTML),
            ("/index.html", HTML),
            ("/app.css", CSS),
            ("/main.js", JS),
            ("/wire.js", JS),
            ("/transcript.js", JS),
            ("/vendor/marked.esm.js", JS),
            ("/vendor/purify.es.mjs", JS),
            ("/vendor/diff.min.js", JS),
        ];
        for (path, content_type) in expected {
            let found = lookup(path).unwrap_or_else(|| panic!("{path} not served"));
            assert!(!found.asset.bytes.is_empty(), "{path} is empty");
            assert_eq!(found.asset.content_type, content_type, "{path}");
        }
        assert_eq!(ASSETS.len(), expected.len() - 1, "a row without a test");
        assert_eq!(
            lookup("/").unwrap().asset.bytes,
            include_bytes!("../../web/app/index.html")
        );
        for missing in [
            "",
            "/nope",
            "/index.html/",
            "/vendor",
            "/../Cargo.toml",
            "index.html",
        ] {
            assert!(lookup(missing).is_none(), "{missing:?}");
        }
    }

    #[test]
    fn etags_are_strong_stable_and_per_content() {
        let first = lookup("/main.js").unwrap().etag;
        assert_eq!(first, lookup("/main.js").unwrap().etag);
        assert_eq!(first, etag_of(include_bytes!("../../web/app/main.js")));
        assert_eq!(first.len(), 66);
        assert!(first.starts_with('"') && first.ends_with('"'));
        assert_eq!(
            lookup("/").unwrap().etag,
            lookup("/index.html").unwrap().etag
        );
        // SHA-256 of the empty string, so the encoding is pinned.
        assert_eq!(
            etag_of(b""),
            "\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\""
        );
    }
}
