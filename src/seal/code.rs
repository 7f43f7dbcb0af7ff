//! The pairing code a person carries from the host to a bot (typed, pasted or scanned), and
//! its terminal QR.
//!
//! `ahpair1.` + base64url (no padding) of the compact JSON
//! `{"u":[relay urls],"h":host_id,"k":host public key b64url,"i":secret_id,"s":secret b64url,
//! "e":expires_at_ms}`. It holds the pairing secret: whoever has the code may pair once,
//! until it expires. [`PairingCode::decode`] checks that `h` is the id of `k`, so a code
//! whose key was swapped does not read. Pure: no I/O.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::SealError;
use super::keys::key_id;

/// What every pairing code starts with (its version is the digit).
pub const CODE_PREFIX: &str = "ahpair1.";
/// The longest code [`PairingCode::decode`] reads.
const MAX_CODE_BYTES: usize = 4096;

/// A decoded pairing code.
#[derive(Clone, PartialEq, Eq)]
pub struct PairingCode {
    /// Where the bot dials the relay (its `/bot` endpoint).
    pub relay_urls: Vec<String>,
    pub host_id: String,
    pub host_public: [u8; 32],
    /// Travels unsealed in the relay's `Open` frame, so the host finds the secret.
    pub secret_id: String,
    /// The pairing handshake's psk.
    pub secret: [u8; 32],
    pub expires_at_ms: i64,
}

#[derive(Serialize, Deserialize)]
struct Compact {
    u: Vec<String>,
    h: String,
    k: String,
    i: String,
    s: String,
    e: i64,
}

fn bad(why: impl Into<String>) -> SealError {
    SealError::BadCode(why.into())
}

fn key32(text: &str, what: &str) -> Result<[u8; 32], SealError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|e| bad(format!("{what}: {e}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| bad(format!("{what} is {} bytes, not 32", bytes.len())))
}

impl PairingCode {
    pub fn encode(&self) -> String {
        let compact = Compact {
            u: self.relay_urls.clone(),
            h: self.host_id.clone(),
            k: URL_SAFE_NO_PAD.encode(self.host_public),
            i: self.secret_id.clone(),
            s: URL_SAFE_NO_PAD.encode(self.secret),
            e: self.expires_at_ms,
        };
        // Strings and integers only: serializing cannot fail.
        let json = serde_json::to_vec(&compact).unwrap_or_default();
        format!("{CODE_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// Read a code (surrounding whitespace ignored).
    pub fn decode(text: &str) -> Result<PairingCode, SealError> {
        let text = text.trim();
        if text.len() > MAX_CODE_BYTES {
            return Err(bad(format!("over {MAX_CODE_BYTES} bytes")));
        }
        let body = text
            .strip_prefix(CODE_PREFIX)
            .ok_or_else(|| bad(format!("it does not start with {CODE_PREFIX}")))?;
        let json = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|e| bad(e.to_string()))?;
        let c: Compact = serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
        let host_public = key32(&c.k, "the host key")?;
        if key_id(&host_public) != c.h {
            return Err(bad("its host id is not its host key's"));
        }
        Ok(PairingCode {
            relay_urls: c.u,
            host_id: c.h,
            host_public,
            secret_id: c.i,
            secret: key32(&c.s, "the secret")?,
            expires_at_ms: c.e,
        })
    }

    /// The code as a terminal QR.
    pub fn qr(&self) -> Result<String, SealError> {
        render_qr(&self.encode())
    }
}

impl std::fmt::Debug for PairingCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairingCode")
            .field("relay_urls", &self.relay_urls)
            .field("host_id", &self.host_id)
            .field("secret_id", &self.secret_id)
            .field("secret", &"<redacted>")
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// `text` as a QR of Unicode half blocks (two modules a character), light modules drawn, so
/// it reads on a dark terminal, with its quiet zone.
pub fn render_qr(text: &str) -> Result<String, SealError> {
    use qrcode::render::unicode::Dense1x2;
    let code = qrcode::QrCode::new(text.as_bytes()).map_err(|e| bad(e.to_string()))?;
    Ok(code
        .render::<Dense1x2>()
        .dark_color(Dense1x2::Light)
        .light_color(Dense1x2::Dark)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PairingCode {
        let host_public = [3u8; 32];
        PairingCode {
            relay_urls: vec!["wss://relay.example.org/bot".into()],
            host_id: key_id(&host_public),
            host_public,
            secret_id: "0123456789abcdef".into(),
            secret: [9u8; 32],
            expires_at_ms: 1_800_000_000_000,
        }
    }

    #[test]
    fn a_code_round_trips_and_a_tampered_one_does_not_read() {
        let code = sample();
        let text = code.encode();
        assert!(text.starts_with("ahpair1."), "{text}");
        assert_eq!(PairingCode::decode(&format!(" {text}\n")).unwrap(), code);
        let json = URL_SAFE_NO_PAD
            .decode(text.strip_prefix(CODE_PREFIX).unwrap())
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            value.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["e", "h", "i", "k", "s", "u"]
        );
        let mut swapped = code.clone();
        swapped.host_public = [4u8; 32];
        assert!(PairingCode::decode(&swapped.encode()).is_err());
        for bad in ["", "ahpair2.xyz", "ahpair1.!!", "ahpair1.e30"] {
            assert!(PairingCode::decode(bad).is_err(), "{bad}");
        }
        assert!(!format!("{code:?}").contains("9, 9"));
    }

    #[test]
    fn the_qr_is_half_blocks() {
        let qr = sample().qr().unwrap();
        let lines: Vec<&str> = qr.lines().collect();
        assert!(lines.len() > 10, "{qr}");
        let width = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == width), "{qr}");
        assert!(
            qr.chars()
                .all(|c| " \u{2580}\u{2584}\u{2588}\n".contains(c))
        );
    }
}
