//! Static X25519 keys: the host's (`$AGENT_HOST_HOME/relay.key`) and a bot's (a path of the
//! bot's choosing), and the ids named after them ([`key_id`]).
//!
//! A key file is 64 bytes, private ‖ public, created with mode 0600 from its first byte and
//! never wider: a file of another size, a mode that lets anyone else read it, or a public half
//! that is not the private half's is refused ([`SealError::BadKeyFile`]), never replaced — a
//! new key would silently unpair every bot. Creating writes a temporary file and links it into
//! place, so a half-written key is never found and an existing one never overwritten. The
//! private half is never logged ([`std::fmt::Debug`] shows the id only).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::SealError;

/// The host key's file name in the home.
pub const KEY_FILE: &str = "relay.key";
/// Bytes of a key file: the private half, then the public half.
const FILE_BYTES: usize = 64;
/// The Noise DH both handshakes use.
const DH_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";

/// The id of a static public key: the lowercase hex of the first 12 bytes of its SHA-256 (24
/// characters). `host_id` and `bot_id` both.
pub fn key_id(public: &[u8; 32]) -> String {
    let digest = Sha256::digest(public);
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// A static key pair of either side.
#[derive(Clone)]
struct StaticKey {
    private: [u8; 32],
    public: [u8; 32],
}

impl Drop for StaticKey {
    fn drop(&mut self) {
        // Best effort: the private half does not linger in freed memory.
        self.private.fill(0);
    }
}

impl StaticKey {
    fn generate() -> Result<StaticKey, SealError> {
        let params = DH_PARAMS
            .parse()
            .map_err(|e: snow::Error| SealError::Seal(e.to_string()))?;
        let pair = snow::Builder::new(params)
            .generate_keypair()
            .map_err(|e| SealError::Seal(e.to_string()))?;
        let (Ok(private), Ok(public)) = (
            <[u8; 32]>::try_from(pair.private.as_slice()),
            <[u8; 32]>::try_from(pair.public.as_slice()),
        ) else {
            return Err(SealError::Seal("X25519 keys are not 32 bytes".to_owned()));
        };
        Ok(StaticKey { private, public })
    }

    /// The public half of `private`, as X25519 computes it.
    fn public_of(private: &[u8; 32]) -> Result<[u8; 32], SealError> {
        use snow::resolvers::{CryptoResolver, DefaultResolver};
        let mut dh = DefaultResolver
            .resolve_dh(&snow::params::DHChoice::Curve25519)
            .ok_or_else(|| SealError::Seal("no X25519 implementation".to_owned()))?;
        dh.set(private);
        <[u8; 32]>::try_from(dh.pubkey())
            .map_err(|_| SealError::Seal("X25519 keys are not 32 bytes".to_owned()))
    }

    fn load_or_create(path: &Path) -> Result<StaticKey, SealError> {
        match Self::load(path) {
            Err(SealError::KeyIo { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Self::create(path)
            }
            other => other,
        }
    }

    fn load(path: &Path) -> Result<StaticKey, SealError> {
        let io = |source| SealError::KeyIo {
            path: path.to_owned(),
            source,
        };
        let bad = |reason: String| SealError::BadKeyFile {
            path: path.to_owned(),
            reason,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "mode {mode:04o} lets others read the private key; it must be 0600 \
                 (`chmod 600`, if nobody else could have read it — else move it aside)"
            )));
        }
        if !meta.is_file() || meta.len() != FILE_BYTES as u64 {
            return Err(bad(format!(
                "{} bytes where a key file has {FILE_BYTES}",
                meta.len()
            )));
        }
        let mut bytes = [0u8; FILE_BYTES];
        file.read_exact(&mut bytes).map_err(io)?;
        let mut key = StaticKey {
            private: [0; 32],
            public: [0; 32],
        };
        key.private.copy_from_slice(&bytes[..32]);
        key.public.copy_from_slice(&bytes[32..]);
        bytes.fill(0);
        if Self::public_of(&key.private)? != key.public {
            return Err(bad(
                "its public half is not its private half's: the file is damaged".to_owned(),
            ));
        }
        Ok(key)
    }

    /// A new key in a temporary file beside `path`, then linked to `path`: whoever created
    /// it first wins, and the loser loads the winner's.
    fn create(path: &Path) -> Result<StaticKey, SealError> {
        let io = |source| SealError::KeyIo {
            path: path.to_owned(),
            source,
        };
        let key = Self::generate()?;
        let temp = temp_path(path);
        let written = (|| -> std::io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            let mut bytes = [0u8; FILE_BYTES];
            bytes[..32].copy_from_slice(&key.private);
            bytes[32..].copy_from_slice(&key.public);
            let result = file.write_all(&bytes).and_then(|()| file.sync_all());
            bytes.fill(0);
            result
        })();
        let linked = written.and_then(|()| std::fs::hard_link(&temp, path));
        if let Err(e) = std::fs::remove_file(&temp)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %temp.display(), error = %e, "a temporary key file was left");
        }
        match linked {
            Ok(()) => {
                tracing::info!(path = %path.display(), id = %key_id(&key.public), "created a static key");
                Ok(key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(e) => Err(io(e)),
        }
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(format!(".tmp-{}-{}", std::process::id(), unique()));
    path.with_file_name(name)
}

/// A number no other call in this process returns.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The host's static key: who the host is to every bot (`host_id`).
#[derive(Clone)]
pub struct HostKey {
    key: StaticKey,
}

impl HostKey {
    /// `home/relay.key`: loaded, or created (0600) when there is none.
    pub fn load_or_create(home: &Path) -> Result<HostKey, SealError> {
        StaticKey::load_or_create(&home.join(KEY_FILE)).map(|key| HostKey { key })
    }

    /// A key in memory only (tests, and hosts that never dial a relay).
    pub fn generate() -> Result<HostKey, SealError> {
        StaticKey::generate().map(|key| HostKey { key })
    }

    pub fn public(&self) -> [u8; 32] {
        self.key.public
    }

    /// [`key_id`] of the public key.
    pub fn host_id(&self) -> String {
        key_id(&self.key.public)
    }

    pub(super) fn private(&self) -> &[u8; 32] {
        &self.key.private
    }
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKey")
            .field("host_id", &self.host_id())
            .finish_non_exhaustive()
    }
}

/// A bot's static key: who the bot is to the host (`bot_id`), kept by the bot.
#[derive(Clone)]
pub struct BotKey {
    key: StaticKey,
}

impl BotKey {
    /// The key file at `path`: loaded, or created (0600) when there is none. The directory
    /// must exist.
    pub fn load_or_create(path: &Path) -> Result<BotKey, SealError> {
        StaticKey::load_or_create(path).map(|key| BotKey { key })
    }

    /// A key in memory only.
    pub fn generate() -> Result<BotKey, SealError> {
        StaticKey::generate().map(|key| BotKey { key })
    }

    pub fn public(&self) -> [u8; 32] {
        self.key.public
    }

    /// [`key_id`] of the public key.
    pub fn bot_id(&self) -> String {
        key_id(&self.key.public)
    }

    pub(super) fn private(&self) -> &[u8; 32] {
        &self.key.private
    }
}

impl std::fmt::Debug for BotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotKey")
            .field("bot_id", &self.bot_id())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_24_hex_of_the_keys_hash() {
        let key = HostKey::generate().unwrap();
        let id = key.host_id();
        assert_eq!(id.len(), 24);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(id, key_id(&key.public()));
        assert_ne!(id, HostKey::generate().unwrap().host_id());
        // The first 12 bytes of SHA-256 of 32 zero bytes.
        assert_eq!(key_id(&[0; 32]), "66687aadf862bd776c8fc18b");
    }

    #[test]
    fn the_key_file_is_created_0600_and_loaded_after() {
        let dir = tempfile::tempdir().unwrap();
        let first = HostKey::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 64);
        let again = HostKey::load_or_create(dir.path()).unwrap();
        assert_eq!(again.public(), first.public());
        assert_eq!(again.private(), first.private());
        // Only the key is left in the directory (no temporary file).
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(KEY_FILE)]);
        assert!(!format!("{first:?}").contains(&format!("{:?}", first.private())));
    }

    #[test]
    fn a_wider_mode_a_wrong_size_or_a_damaged_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let key = BotKey::load_or_create(&dir.path().join("bot.key")).unwrap();
        let path = dir.path().join("bot.key");
        let original = std::fs::read(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = BotKey::load_or_create(&path).unwrap_err();
        assert!(matches!(err, SealError::BadKeyFile { .. }), "{err}");
        assert!(err.to_string().contains("0640"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), original, "never replaced");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            BotKey::load_or_create(&path).unwrap().public(),
            key.public()
        );
        std::fs::write(&path, &original[..63]).unwrap();
        assert!(matches!(
            BotKey::load_or_create(&path),
            Err(SealError::BadKeyFile { .. })
        ));
        let mut damaged = original.clone();
        damaged[40] ^= 1;
        std::fs::write(&path, &damaged).unwrap();
        let err = BotKey::load_or_create(&path).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), damaged);
    }
}
