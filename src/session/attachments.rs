//! A prompt's attachments (`session.send` `attachments`), checked and copied when the prompt is
//! taken, before its receipt: nothing unsafe is ever queued, and a queued prompt sends what was
//! attached even if the original changes or goes before it runs.
//!
//! ## The rules, in the order they are checked
//!
//! For the whole prompt: at most [`MAX_ATTACHMENTS`] attachments (`invalid_params`).
//!
//! For an attachment by `path`:
//! 1. a `..` component anywhere is refused (`parent_dir`), before anything touches the disk;
//! 2. a relative path is the session's cwd joined with it; the path is resolved
//!    (`canonicalize`: every symlink followed) and must then lie inside the session's cwd (as
//!    recorded: canonical when the session was created) or one of `config.toml`'s
//!    `attachment_dirs` (canonicalized when the config is read): else `outside_workspace` — a
//!    symlink inside the cwd that points out of it lands here. A directory that no longer
//!    resolves to itself (the cwd replaced by a symlink, moved, gone) is none of these: it is
//!    never re-rooted at where it points now. A path that does not resolve is `not_found` when
//!    the longest part of it that does resolves inside those directories and what comes next
//!    is not a symlink (dangling), else `outside_workspace` too: nothing is said about what
//!    exists outside them, through a symlinked directory or not;
//! 3. it must be a regular file (`not_regular_file`: a directory, a fifo, a device). Where it
//!    lies is checked before what it is, so `/dev/zero` is `outside_workspace`, and
//!    `not_regular_file` only for a device or fifo inside an allowed directory. The file is opened
//!    with `O_NOFOLLOW | O_NONBLOCK` and its `fstat` must be the regular file that was checked
//!    (same device and inode), and where the kernel says the open file is
//!    (`/proc/self/fd/N`) must still be inside: a file, or a directory on its way, swapped
//!    between the check and the open is refused (`changed`); one that cannot be opened is
//!    `unreadable`.
//!
//! Those are code 3010 `attachment_refused`, data `{path, reason}`.
//!
//! Sizes: each attachment at most `attachment_max_bytes` (default 10 MiB), all of a prompt's
//! together at most 4 times that: code 3011 `attachment_too_large`, data `{bytes?, limit}`. A
//! file is read up to the limit and one byte more, never further.
//!
//! An attachment by bytes (`data_base64`, `mime`, `name?`): standard base64 (padding optional),
//! else `invalid_params`; `mime` is required.
//!
//! The MIME type (`type/subtype`, no parameters, else `invalid_params`): the given one; for a
//! path without one, the contents for PNG, JPEG, GIF and WebP (their magic bytes), else the
//! extension for common text types, else `application/octet-stream`. The kind is `image` for
//! `image/png`, `image/jpeg`, `image/gif` and `image/webp`, else `file`.
//!
//! The family must take the kind ([`OptionCaps::images`], [`OptionCaps::files`]; a negotiated
//! one is resolved by [`Launcher::negotiate`]): else code 3008 `option_unsupported`, data
//! `{option: "attachments.image" | "attachments.file", agent_type}`.
//!
//! Each is then copied to `$AGENT_HOST_HOME/attachments/<session_id>/<sha256>[.ext]` (the
//! directories 0700 and never a symlink, the file 0600; `.ext` for a type agents recognise by
//! name, e.g. `.png`), written to a temporary name and renamed, so a copy is whole or absent.
//! A prompt the session then does not take (refused, or the session is being deleted) takes
//! back the copies it made. `session.delete` removes the session's directory. The driver gets [`Attachment`]s (`path` is the copy);
//! [`base64_of`] reads one for an agent that takes the bytes inline.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::SessionError;
use super::agent::{AdapterError, Launcher, OptionCaps, Support};
use crate::protocol::options::{Attachment, AttachmentKind, AttachmentParam};

/// The most attachments one prompt carries.
pub const MAX_ATTACHMENTS: usize = 8;
/// `attachment_max_bytes` when `config.toml` sets none: 10 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// The largest `attachment_max_bytes` accepted (64 MiB): a prompt's attachments are held in
/// memory while they are checked.
pub const MAX_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// A prompt's attachments together: at most this many times the per-attachment limit.
pub const TOTAL_FACTOR: u64 = 4;

/// Why an attachment was refused (`attachment_refused` `data.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The path has a `..` component.
    ParentDir,
    /// It resolves outside the session's cwd and every allowed directory.
    OutsideWorkspace,
    /// Not a regular file (a directory, a fifo, a device).
    NotRegularFile,
    /// Nothing there.
    NotFound,
    /// It changed between the check and the open.
    Changed,
    /// It could not be opened or read.
    Unreadable,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ParentDir => "parent_dir",
            Refusal::OutsideWorkspace => "outside_workspace",
            Refusal::NotRegularFile => "not_regular_file",
            Refusal::NotFound => "not_found",
            Refusal::Changed => "changed",
            Refusal::Unreadable => "unreadable",
        }
    }

    fn says(self) -> &'static str {
        match self {
            Refusal::ParentDir => "a path with a `..` component is not accepted",
            Refusal::OutsideWorkspace => {
                "it is not inside the session's cwd or an allowed directory (`attachment_dirs` \
                 in config.toml), after resolving symlinks"
            }
            Refusal::NotRegularFile => "it is not a regular file",
            Refusal::NotFound => "no such file",
            Refusal::Changed => "the file changed while it was being checked; send it again",
            Refusal::Unreadable => "the file cannot be read",
        }
    }
}

/// What the host does with attachments: where copies go and what paths it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentSettings {
    /// `$AGENT_HOST_HOME/attachments`; `None`: this host keeps no attachments (every prompt
    /// with one is refused).
    pub store_dir: Option<PathBuf>,
    /// `attachment_dirs` of `config.toml`, canonical: paths taken besides the session's cwd.
    pub allowed_dirs: Vec<PathBuf>,
    /// The most bytes one attachment may have.
    pub max_bytes: u64,
}

impl Default for AttachmentSettings {
    fn default() -> Self {
        AttachmentSettings {
            store_dir: None,
            allowed_dirs: Vec::new(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl AttachmentSettings {
    /// The settings of a host with `config`.
    pub fn from_config(config: &crate::config::Config) -> AttachmentSettings {
        AttachmentSettings {
            store_dir: Some(config.attachments_dir()),
            allowed_dirs: config.attachment_dirs.clone(),
            max_bytes: config.attachment_max_bytes,
        }
    }

    /// The most bytes a prompt's attachments may have together.
    pub fn total_limit(&self) -> u64 {
        self.max_bytes.saturating_mul(TOTAL_FACTOR)
    }

    /// Where one session's copies are.
    pub fn session_dir(&self, session_id: &str) -> Option<PathBuf> {
        self.store_dir.as_ref().map(|d| d.join(session_id))
    }
}

/// An attachment read and checked, not copied yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub name: String,
    pub mime: String,
    pub kind: AttachmentKind,
    pub data: Vec<u8>,
}

fn refused(path: &str, reason: Refusal) -> SessionError {
    SessionError::AttachmentRefused {
        path: path.to_owned(),
        reason: reason.as_str(),
        why: reason.says(),
    }
}

fn too_large(bytes: Option<u64>, limit: u64) -> SessionError {
    SessionError::AttachmentTooLarge { bytes, limit }
}

/// Whether `mime` is a plain `type/subtype` (RFC 6838 names, no parameters).
fn valid_mime(mime: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.len() <= 127
            && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
    };
    match mime.split_once('/') {
        Some((kind, sub)) => token(kind) && token(sub),
        None => false,
    }
}

fn checked_mime(mime: &str) -> Result<String, SessionError> {
    if valid_mime(mime) {
        Ok(mime.to_ascii_lowercase())
    } else {
        Err(SessionError::InvalidParams(format!(
            "attachment mime {mime:?} is not a MIME type `type/subtype` (e.g. image/png)"
        )))
    }
}

/// The kind an attachment of `mime` is.
pub fn kind_of(mime: &str) -> AttachmentKind {
    match mime {
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" => AttachmentKind::Image,
        _ => AttachmentKind::File,
    }
}

/// The image type of `data` by its magic bytes: PNG, JPEG, GIF or WebP.
pub fn sniff_image(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The type of a common text file by its extension.
fn mime_by_extension(name: &str) -> Option<&'static str> {
    let ext = Path::new(name).extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "txt" | "log" | "text" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "xml" => "application/xml",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "js" | "mjs" | "cjs" => "text/javascript",
        "ts" | "tsx" | "jsx" | "rs" | "py" | "go" | "c" | "h" | "cc" | "cpp" | "hpp" | "java"
        | "kt" | "rb" | "sh" | "sql" | "swift" | "php" | "lua" => "text/plain",
        "pdf" => "application/pdf",
        _ => return None,
    })
}

/// The extension a copy gets, for agents that tell a file's type by its name.
fn extension_of(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "text/csv" => "csv",
        "text/html" => "html",
        "application/json" => "json",
        "application/pdf" => "pdf",
        _ => return None,
    })
}

/// Whether a path the caller gave has a `..` component.
fn has_parent_dir(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

/// The directories paths may lie in, as recorded: the session's cwd (canonical when the
/// session was created) and `attachment_dirs` (canonical when the config was read). One that
/// no longer resolves to itself (replaced by a symlink, moved, gone) is none: the allow-list is
/// never re-rooted at wherever it points now.
fn live_roots(cwd: &Path, settings: &AttachmentSettings) -> Vec<PathBuf> {
    std::iter::once(cwd.to_path_buf())
        .chain(settings.allowed_dirs.iter().cloned())
        .filter(|root| root.canonicalize().is_ok_and(|real| real == *root))
        .collect()
}

/// For a path that does not resolve: whether the longest part of it that does resolves
/// inside (`inside`). A symlink right after that part (dangling, or into a place that does
/// not resolve) is never followed: not inside, wherever it points, so the answer says nothing
/// about what exists out there.
fn existing_part_inside(path: &Path, inside: &dyn Fn(&Path) -> bool) -> bool {
    let components: Vec<Component> = path.components().collect();
    for n in (1..=components.len()).rev() {
        let prefix: PathBuf = components[..n].iter().collect();
        let Ok(real) = prefix.canonicalize() else {
            continue;
        };
        if let Some(next) = components.get(n) {
            let next = real.join(next);
            if fs::symlink_metadata(&next).is_ok_and(|m| m.file_type().is_symlink()) {
                return false;
            }
        }
        return inside(&real);
    }
    false
}

/// Whether an open file is still inside (`inside`), by where the kernel says it is
/// (`/proc/self/fd/N`): else `changed` (it was inside when checked). Unknown: `unreadable`.
fn opened_inside(file: &fs::File, inside: &dyn Fn(&Path) -> bool) -> Result<(), Refusal> {
    use std::os::fd::AsRawFd as _;
    let real = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| Refusal::Unreadable)?;
    if inside(&real) {
        Ok(())
    } else {
        Err(Refusal::Changed)
    }
}

/// Read the file at `given` (relative: to `cwd`) as the rules say (module docs). `cwd` is the
/// session's canonical cwd. Blocking.
pub fn load_path(
    given: &str,
    mime: Option<&str>,
    cwd: &Path,
    settings: &AttachmentSettings,
) -> Result<Loaded, SessionError> {
    if given.is_empty() || given.contains('\0') {
        return Err(SessionError::InvalidParams(
            "an attachment path must be a non-empty path without NUL".to_owned(),
        ));
    }
    let path = Path::new(given);
    if has_parent_dir(path) {
        return Err(refused(given, Refusal::ParentDir));
    }
    let mime = mime.map(checked_mime).transpose()?;
    let joined = if path.is_absolute() {
        path.to_owned()
    } else {
        cwd.join(path)
    };
    let roots = live_roots(cwd, settings);
    let inside = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    let canonical = match joined.canonicalize() {
        Ok(canonical) => canonical,
        // Nothing is said about what does or does not exist outside the workspace: the part
        // of the path that exists must resolve inside, else it is outside whatever follows.
        Err(_) if !existing_part_inside(&joined, &inside) => {
            return Err(refused(given, Refusal::OutsideWorkspace));
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(refused(given, Refusal::Unreadable));
        }
        Err(_) => return Err(refused(given, Refusal::NotFound)),
    };
    if !inside(&canonical) {
        return Err(refused(given, Refusal::OutsideWorkspace));
    }
    let checked = fs::metadata(&canonical).map_err(|_| refused(given, Refusal::NotFound))?;
    if !checked.file_type().is_file() {
        return Err(refused(given, Refusal::NotRegularFile));
    }
    if checked.len() > settings.max_bytes {
        return Err(too_large(Some(checked.len()), settings.max_bytes));
    }
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(&canonical)
        .map_err(|e| match e.raw_os_error() {
            // The last component became a symlink after the check.
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => {
                refused(given, Refusal::Changed)
            }
            _ if e.kind() == io::ErrorKind::NotFound => refused(given, Refusal::Changed),
            _ => refused(given, Refusal::Unreadable),
        })?;
    let opened = file
        .metadata()
        .map_err(|_| refused(given, Refusal::Unreadable))?;
    if !opened.file_type().is_file() {
        return Err(refused(given, Refusal::NotRegularFile));
    }
    if (opened.dev(), opened.ino()) != (checked.dev(), checked.ino()) {
        return Err(refused(given, Refusal::Changed));
    }
    // A directory on the way swapped for a symlink between the check and the open: where the
    // open file really is must still be inside.
    opened_inside(&file, &inside).map_err(|reason| refused(given, reason))?;
    let mut data = Vec::with_capacity(usize::try_from(opened.len()).unwrap_or(0).min(1 << 20));
    file.take(settings.max_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|_| refused(given, Refusal::Unreadable))?;
    if data.len() as u64 > settings.max_bytes {
        return Err(too_large(None, settings.max_bytes));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("attachment")
        .to_owned();
    let mime = match mime {
        Some(mime) => mime,
        None => sniff_image(&data)
            .or_else(|| mime_by_extension(&name))
            .unwrap_or("application/octet-stream")
            .to_owned(),
    };
    Ok(Loaded {
        kind: kind_of(&mime),
        name,
        mime,
        data,
    })
}

/// Decode an attachment given as bytes.
pub fn load_data(
    data_base64: &str,
    mime: &str,
    name: Option<&str>,
    settings: &AttachmentSettings,
) -> Result<Loaded, SessionError> {
    let mime = checked_mime(mime)?;
    // Every 4 characters are at most 3 bytes: past this bound it is too large undecoded.
    let at_least = (data_base64.len() as u64 / 4)
        .saturating_mul(3)
        .saturating_sub(2);
    if at_least > settings.max_bytes {
        return Err(too_large(Some(at_least), settings.max_bytes));
    }
    let data = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(data_base64.trim())
        .map_err(|e| {
            SessionError::InvalidParams(format!("attachment data_base64 is not base64: {e}"))
        })?;
    if data.len() as u64 > settings.max_bytes {
        return Err(too_large(Some(data.len() as u64), settings.max_bytes));
    }
    let name = match name {
        Some(name) => {
            let plain = Path::new(name)
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| *n == name && !name.is_empty() && name.len() <= 255);
            plain
                .ok_or_else(|| {
                    SessionError::InvalidParams(format!(
                        "attachment name {name:?} must be a plain file name (no `/`), 1 to 255 \
                         bytes"
                    ))
                })?
                .to_owned()
        }
        None => match extension_of(&mime) {
            Some(ext) => format!("attachment.{ext}"),
            None => "attachment".to_owned(),
        },
    };
    Ok(Loaded {
        kind: kind_of(&mime),
        name,
        mime,
        data,
    })
}

/// Read and check every attachment of a prompt (module docs). Blocking.
pub fn load_all(
    params: &[AttachmentParam],
    cwd: &Path,
    settings: &AttachmentSettings,
) -> Result<Vec<Loaded>, SessionError> {
    if params.len() > MAX_ATTACHMENTS {
        return Err(SessionError::InvalidParams(format!(
            "a prompt takes at most {MAX_ATTACHMENTS} attachments, not {}",
            params.len()
        )));
    }
    let mut total = 0u64;
    let mut loaded = Vec::with_capacity(params.len());
    for param in params {
        let one = match param {
            AttachmentParam::Path { path, mime } => {
                load_path(path, mime.as_deref(), cwd, settings)?
            }
            AttachmentParam::Data {
                data_base64,
                mime,
                name,
            } => load_data(data_base64, mime, name.as_deref(), settings)?,
        };
        total += one.data.len() as u64;
        if total > settings.total_limit() {
            return Err(too_large(Some(total), settings.total_limit()));
        }
        loaded.push(one);
    }
    Ok(loaded)
}

/// Whether the family takes each kind: `caps` as declared (a negotiated kind resolved by
/// `launcher.negotiate`, asked at most once).
pub async fn check_family(
    loaded: &[Loaded],
    launcher: &dyn Launcher,
    agent_type: &str,
) -> Result<(), SessionError> {
    let mut caps: OptionCaps = launcher.capabilities(agent_type).options;
    let mut negotiated = false;
    for kind in [AttachmentKind::Image, AttachmentKind::File] {
        if !loaded.iter().any(|l| l.kind == kind) {
            continue;
        }
        let support = |caps: &OptionCaps| match kind {
            AttachmentKind::Image => caps.images,
            AttachmentKind::File => caps.files,
        };
        if support(&caps) == Support::Negotiated && !negotiated {
            caps = launcher
                .negotiate(agent_type)
                .await
                .map_err(|e: AdapterError| {
                    SessionError::AgentUnavailable(format!(
                        "{agent_type:?}: cannot ask the agent what it takes: {}",
                        e.message
                    ))
                })?;
            negotiated = true;
        }
        // A negotiation that still says `Negotiated` did not say yes.
        if support(&caps) != Support::Native {
            return Err(SessionError::AttachmentUnsupported {
                option: match kind {
                    AttachmentKind::Image => "attachments.image",
                    AttachmentKind::File => "attachments.file",
                },
                agent_type: agent_type.to_owned(),
            });
        }
    }
    Ok(())
}

/// Make `dir` (and its parents) if it is not there, then hold it to what the host's copies
/// need: a real directory (not a symlink to one), 0700.
fn private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is a symlink or not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// Write `data` to `temp` (0600, a new file), then rename it to `path`: whole or absent.
fn write_copy(temp: &Path, path: &Path, data: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp)?;
    file.write_all(data)?;
    file.sync_all()?;
    fs::rename(temp, path)
}

/// Checked attachments copied into the session's directory ([`store_all`]).
#[derive(Debug)]
pub struct Stored {
    /// What the driver gets.
    pub attachments: Vec<Attachment>,
    /// The copies this call made (not there before): what [`remove_copies`] takes back when
    /// the prompt is not taken after all. A copy already there (the same bytes attached
    /// before) is left alone.
    pub created: Vec<PathBuf>,
}

/// Copy checked attachments into the session's directory (module docs). Blocking. On an
/// error the copies made so far are removed.
pub fn store_all(
    loaded: Vec<Loaded>,
    session_id: &str,
    settings: &AttachmentSettings,
) -> Result<Stored, SessionError> {
    if loaded.is_empty() {
        return Ok(Stored {
            attachments: Vec::new(),
            created: Vec::new(),
        });
    }
    let (Some(root), Some(dir)) = (&settings.store_dir, settings.session_dir(session_id)) else {
        return Err(SessionError::InvalidParams(
            "this host keeps no attachments (it has no home directory for them)".to_owned(),
        ));
    };
    let failed = |e: io::Error| {
        tracing::error!(error = %e, "copying an attachment failed");
        SessionError::AgentUnavailable(format!("the host could not keep the attachment: {e}"))
    };
    private_dir(root).map_err(failed)?;
    private_dir(&dir).map_err(failed)?;
    let mut stored = Vec::with_capacity(loaded.len());
    let mut created = Vec::new();
    let undo = |created: &[PathBuf]| remove_copies(settings, session_id, created);
    for one in loaded {
        let sha256 = hex(&Sha256::digest(&one.data));
        let file_name = match extension_of(&one.mime) {
            Some(ext) => format!("{sha256}.{ext}"),
            None => sha256.clone(),
        };
        let path = dir.join(&file_name);
        if path.to_str().is_none() {
            undo(&created);
            return Err(failed(io::Error::other("the home's path is not UTF-8")));
        }
        let new = fs::symlink_metadata(&path).is_err();
        let temp = dir.join(format!(".{file_name}.{}", uuid::Uuid::new_v4().simple()));
        if let Err(e) = write_copy(&temp, &path, &one.data) {
            let _gone = fs::remove_file(&temp);
            undo(&created);
            return Err(failed(e));
        }
        if new && !created.contains(&path) {
            created.push(path.clone());
        }
        stored.push(Attachment {
            name: one.name,
            mime: one.mime,
            kind: one.kind,
            bytes: one.data.len() as u64,
            sha256,
            path,
        });
    }
    Ok(Stored {
        attachments: stored,
        created,
    })
}

/// Take back copies [`store_all`] made for a prompt that was not taken (the session refused
/// it, or is being deleted), and the session's directory if that leaves it empty. Blocking;
/// best effort (a copy already gone is fine). Two prompts racing with the same bytes, the
/// first refused: the second's copy may go with the first's (its run then fails "not sent").
pub fn remove_copies(settings: &AttachmentSettings, session_id: &str, created: &[PathBuf]) {
    for path in created {
        if let Err(e) = fs::remove_file(path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, path = %path.display(), "removing an attachment copy failed");
        }
    }
    if !created.is_empty()
        && let Some(dir) = settings.session_dir(session_id)
    {
        // Fails while other copies are there: kept.
        let _kept = fs::remove_dir(dir);
    }
}

/// Remove a session's copies (`session.delete`). Blocking; a directory that is not there is
/// fine.
pub fn remove_session(settings: &AttachmentSettings, session_id: &str) -> io::Result<()> {
    let Some(dir) = settings.session_dir(session_id) else {
        return Ok(());
    };
    match fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// An attachment's bytes as standard base64 (an agent that takes images inline: Claude's image
/// blocks, ACP image content), read from the host's copy. An error: the copy is gone or
/// unreadable (the prompt was not sent).
pub fn base64_of(attachment: &Attachment) -> Result<String, AdapterError> {
    let data = fs::read(&attachment.path).map_err(|e| {
        AdapterError::prompt_not_sent(format!(
            "the attachment {:?} cannot be read from {}: {e}",
            attachment.name,
            attachment.path.display()
        ))
    })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(data))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::protocol::options::SessionOptions;
    use crate::session::agent::{AgentSession, Capabilities, Native};

    /// The smallest PNG header a sniffer knows (the magic and the start of IHDR).
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

    fn settings(home: &Path) -> AttachmentSettings {
        AttachmentSettings {
            store_dir: Some(home.join("attachments")),
            allowed_dirs: Vec::new(),
            max_bytes: 64,
        }
    }

    /// A workspace (canonical, as a session's cwd is) and a home.
    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let cwd = root.join("ws");
        fs::create_dir(&cwd).unwrap();
        let home = root.join("home");
        fs::create_dir(&home).unwrap();
        (dir, cwd, home)
    }

    fn reason(result: Result<Loaded, SessionError>) -> String {
        match result {
            Err(SessionError::AttachmentRefused { reason, .. }) => reason.to_owned(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_parent_dir_component_is_refused_before_anything_else() {
        let (_dir, cwd, home) = dirs();
        let s = settings(&home);
        for path in [
            "../../etc/passwd",
            "sub/../../x",
            "/etc/../etc/passwd",
            "..",
        ] {
            assert_eq!(
                reason(load_path(path, None, &cwd, &s)),
                "parent_dir",
                "{path}"
            );
        }
        // Even one that would resolve inside.
        fs::write(cwd.join("a.txt"), "a").unwrap();
        fs::create_dir(cwd.join("sub")).unwrap();
        assert_eq!(
            reason(load_path("sub/../a.txt", None, &cwd, &s)),
            "parent_dir"
        );
    }

    #[test]
    fn a_symlink_out_of_the_cwd_is_outside_the_workspace() {
        let (dir, cwd, home) = dirs();
        let s = settings(&home);
        let secret = dir.path().join("secret.txt");
        fs::write(&secret, "secret").unwrap();
        symlink(&secret, cwd.join("link.txt")).unwrap();
        symlink(dir.path(), cwd.join("linkdir")).unwrap();
        assert_eq!(
            reason(load_path("link.txt", None, &cwd, &s)),
            "outside_workspace"
        );
        assert_eq!(
            reason(load_path("linkdir/secret.txt", None, &cwd, &s)),
            "outside_workspace"
        );
        // An absolute path elsewhere, existing or not: the same, nothing said about it.
        let abs = secret.display().to_string();
        assert_eq!(reason(load_path(&abs, None, &cwd, &s)), "outside_workspace");
        assert_eq!(
            reason(load_path("/nonexistent/x", None, &cwd, &s)),
            "outside_workspace"
        );
        assert_eq!(
            reason(load_path("/etc/passwd", None, &cwd, &s)),
            "outside_workspace"
        );
        // A symlink that stays inside is followed.
        fs::write(cwd.join("real.txt"), "real").unwrap();
        symlink(cwd.join("real.txt"), cwd.join("inside.txt")).unwrap();
        let got = load_path("inside.txt", None, &cwd, &s).unwrap();
        assert_eq!(
            (got.name.as_str(), got.data.as_slice()),
            ("inside.txt", &b"real"[..])
        );
    }

    /// Where a path lies is checked before what it is: `/dev/zero` is outside the workspace;
    /// a device in an allowed directory, a fifo or a directory in the cwd is not a regular
    /// file.
    #[test]
    fn dev_zero_and_other_non_files_are_refused() {
        let (_dir, cwd, home) = dirs();
        let mut s = settings(&home);
        assert_eq!(
            reason(load_path("/dev/zero", None, &cwd, &s)),
            "outside_workspace"
        );
        s.allowed_dirs = vec![PathBuf::from("/dev").canonicalize().unwrap()];
        assert_eq!(
            reason(load_path("/dev/zero", None, &cwd, &s)),
            "not_regular_file"
        );
        nix::unistd::mkfifo(&cwd.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(
            reason(load_path("fifo", None, &cwd, &s)),
            "not_regular_file"
        );
        fs::create_dir(cwd.join("d")).unwrap();
        assert_eq!(reason(load_path("d", None, &cwd, &s)), "not_regular_file");
        assert_eq!(reason(load_path(".", None, &cwd, &s)), "not_regular_file");
        assert_eq!(
            reason(load_path("missing.txt", None, &cwd, &s)),
            "not_found"
        );
    }

    #[test]
    fn a_file_in_an_allowed_dir_is_taken_and_typed() {
        let (dir, cwd, home) = dirs();
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::write(shared.join("shot"), PNG).unwrap();
        fs::write(shared.join("notes.MD"), "# hi").unwrap();
        fs::write(shared.join("blob.bin"), [0u8, 1, 2]).unwrap();
        let mut s = settings(&home);
        let abs = |name: &str| shared.join(name).display().to_string();
        assert_eq!(
            reason(load_path(&abs("shot"), None, &cwd, &s)),
            "outside_workspace"
        );
        s.allowed_dirs = vec![shared.canonicalize().unwrap()];
        let png = load_path(&abs("shot"), None, &cwd, &s).unwrap();
        assert_eq!(
            (png.name.as_str(), png.mime.as_str(), png.kind),
            ("shot", "image/png", AttachmentKind::Image)
        );
        let md = load_path(&abs("notes.MD"), None, &cwd, &s).unwrap();
        assert_eq!(
            (md.mime.as_str(), md.kind),
            ("text/markdown", AttachmentKind::File)
        );
        let bin = load_path(&abs("blob.bin"), None, &cwd, &s).unwrap();
        assert_eq!(bin.mime, "application/octet-stream");
        // A given type wins over the contents.
        let given = load_path(&abs("blob.bin"), Some("Image/GIF"), &cwd, &s).unwrap();
        assert_eq!(
            (given.mime.as_str(), given.kind),
            ("image/gif", AttachmentKind::Image)
        );
        // A relative path is the cwd's.
        fs::write(cwd.join("a.jpg"), [0xff, 0xd8, 0xff, 0xe0]).unwrap();
        assert_eq!(
            load_path("a.jpg", None, &cwd, &s).unwrap().mime,
            "image/jpeg"
        );
        assert_eq!(
            load_path(&cwd.join("a.jpg").display().to_string(), None, &cwd, &s)
                .unwrap()
                .mime,
            "image/jpeg"
        );
        assert_eq!(sniff_image(b"GIF89a...."), Some("image/gif"));
        assert_eq!(sniff_image(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff_image(b"RIFF\0\0\0\0WAVE"), None);
    }

    #[test]
    fn sizes_counts_and_shapes_are_held_to_their_limits() {
        let (_dir, cwd, home) = dirs();
        let s = settings(&home);
        fs::write(cwd.join("big.txt"), vec![b'x'; 65]).unwrap();
        fs::write(cwd.join("ok.txt"), vec![b'x'; 64]).unwrap();
        match load_path("big.txt", None, &cwd, &s) {
            Err(SessionError::AttachmentTooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (Some(65), 64));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load_path("ok.txt", None, &cwd, &s).unwrap().data.len(), 64);
        let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
        match load_data(&b64(65), "text/plain", None, &s) {
            Err(SessionError::AttachmentTooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (Some(65), 64));
            }
            other => panic!("{other:?}"),
        }
        // Far too large is refused before it is decoded.
        match load_data(&"A".repeat(4000), "text/plain", None, &s) {
            Err(SessionError::AttachmentTooLarge { limit: 64, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Together at most 4 times the limit.
        let path = |p: &str| AttachmentParam::Path {
            path: p.into(),
            mime: None,
        };
        let five = vec![path("ok.txt"); 5];
        match load_all(&five, &cwd, &s) {
            Err(SessionError::AttachmentTooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (Some(320), 256));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load_all(&five[..4], &cwd, &s).unwrap().len(), 4);
        // At most 8.
        fs::write(cwd.join("one.txt"), "1").unwrap();
        match load_all(&vec![path("one.txt"); 9], &cwd, &s) {
            Err(SessionError::InvalidParams(why)) => assert!(why.contains("at most 8"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            load_all(&vec![path("one.txt"); 8], &cwd, &s).unwrap().len(),
            8
        );
        // Bad base64, a bad type, a name with a slash: invalid params.
        for (data, mime, name) in [
            ("not base64!!", "text/plain", None),
            ("aGk=", "text", None),
            ("aGk=", "text/plain; charset=utf-8", None),
            ("aGk=", "", None),
            ("aGk=", "text/plain", Some("../x")),
            ("aGk=", "text/plain", Some("")),
        ] {
            match load_data(data, mime, name, &s) {
                Err(SessionError::InvalidParams(_)) => {}
                other => panic!("{data} {mime} {name:?}: {other:?}"),
            }
        }
        match load_path("ok.txt", Some("nope"), &cwd, &s) {
            Err(SessionError::InvalidParams(_)) => {}
            other => panic!("{other:?}"),
        }
        // Padding is optional; the name and type are kept.
        let hi = load_data("aGk", "text/plain", Some("hi.txt"), &s).unwrap();
        assert_eq!(
            (hi.name.as_str(), hi.data.as_slice()),
            ("hi.txt", &b"hi"[..])
        );
        let png = load_data(
            &base64::engine::general_purpose::STANDARD.encode(PNG),
            "image/png",
            None,
            &s,
        )
        .unwrap();
        assert_eq!(
            (png.name.as_str(), png.kind),
            ("attachment.png", AttachmentKind::Image)
        );
    }

    #[test]
    fn copies_are_private_content_addressed_and_go_with_the_session() {
        let (_dir, _cwd, home) = dirs();
        let s = settings(&home);
        let loaded = vec![
            load_data("aGk=", "text/plain", Some("hi.txt"), &s).unwrap(),
            load_data("AAEC", "application/x-thing", None, &s).unwrap(),
        ];
        let Stored {
            attachments: stored,
            created,
        } = store_all(loaded, "sess-1", &s).unwrap();
        let dir = home.join("attachments").join("sess-1");
        assert_eq!(created.len(), 2);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&home.join("attachments")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        // sha256("hi")
        let hi = "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4";
        assert_eq!(stored[0].sha256, hi);
        assert_eq!(stored[0].path, dir.join(format!("{hi}.txt")));
        assert_eq!(
            (stored[0].name.as_str(), stored[0].bytes, stored[0].kind),
            ("hi.txt", 2, AttachmentKind::File)
        );
        assert_eq!(fs::read(&stored[0].path).unwrap(), b"hi");
        assert_eq!(mode(&stored[0].path), 0o600);
        // No extension for a type agents do not know by name.
        assert_eq!(stored[1].path, dir.join(&stored[1].sha256));
        assert_eq!(fs::read(&stored[1].path).unwrap(), [0, 1, 2]);
        assert_eq!(base64_of(&stored[0]).unwrap(), "aGk=");
        // Nothing but the copies is left (no temporary file).
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
        // The same bytes again: the same copy.
        let again = store_all(
            vec![
                load_data("aGk=", "text/plain", None, &s).unwrap(),
                load_data("aGV5", "text/plain", None, &s).unwrap(),
            ],
            "sess-1",
            &s,
        )
        .unwrap();
        assert_eq!(again.attachments[0].path, stored[0].path);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 3);
        // A prompt not taken after all takes back only the copy it made.
        assert_eq!(again.created, vec![again.attachments[1].path.clone()]);
        remove_copies(&s, "sess-1", &again.created);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
        assert!(stored[0].path.exists());
        // The last copy taken back takes the session's directory with it.
        remove_copies(&s, "sess-1", &created);
        assert!(!dir.exists());
        store_all(
            vec![load_data("aGk=", "text/plain", None, &s).unwrap()],
            "sess-1",
            &s,
        )
        .unwrap();
        remove_session(&s, "sess-1").unwrap();
        assert!(!dir.exists());
        remove_session(&s, "sess-1").unwrap();
        assert!(base64_of(&stored[0]).is_err());
        // A session directory that is a symlink (to anywhere) is never written through.
        let elsewhere = home.join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, &dir).unwrap();
        let one = vec![load_data("aGk=", "text/plain", None, &s).unwrap()];
        assert!(matches!(
            store_all(one, "sess-1", &s),
            Err(SessionError::AgentUnavailable(_))
        ));
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
        // A directory left looser than 0700 is tightened.
        fs::remove_file(&dir).unwrap();
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let one = vec![load_data("aGk=", "text/plain", None, &s).unwrap()];
        store_all(one, "sess-1", &s).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // A host without a home for them takes none.
        let none = AttachmentSettings::default();
        let one = vec![load_data("aGk=", "text/plain", None, &none).unwrap()];
        assert!(matches!(
            store_all(one, "s", &none),
            Err(SessionError::InvalidParams(_))
        ));
    }

    /// A symlinked directory out of the cwd is outside whether or not the file exists out
    /// there, and a dangling symlink is outside wherever it points: no existence oracle.
    #[test]
    fn a_missing_file_through_a_symlink_out_is_outside_not_missing() {
        let (dir, cwd, home) = dirs();
        let s = settings(&home);
        let out = dir.path().canonicalize().unwrap().join("out");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("there.txt"), "x").unwrap();
        symlink(&out, cwd.join("linkdir")).unwrap();
        for path in [
            "linkdir/there.txt",
            "linkdir/missing.txt",
            "linkdir/missing/deeper.txt",
        ] {
            assert_eq!(
                reason(load_path(path, None, &cwd, &s)),
                "outside_workspace",
                "{path}"
            );
        }
        symlink(out.join("missing.txt"), cwd.join("dangling-out")).unwrap();
        symlink(cwd.join("missing.txt"), cwd.join("dangling-in")).unwrap();
        for path in ["dangling-out", "dangling-in", "dangling-out/x"] {
            assert_eq!(
                reason(load_path(path, None, &cwd, &s)),
                "outside_workspace",
                "{path}"
            );
        }
        // Missing inside the cwd, at any depth: not found.
        fs::create_dir(cwd.join("sub")).unwrap();
        for path in ["missing.txt", "sub/missing.txt", "nodir/missing.txt"] {
            assert_eq!(
                reason(load_path(path, None, &cwd, &s)),
                "not_found",
                "{path}"
            );
        }
    }

    /// The cwd replaced by a symlink after the session was created: its recorded place is
    /// no root any more, and the allow-list never follows it to the new target.
    #[test]
    fn a_cwd_replaced_by_a_symlink_is_no_root() {
        let (dir, cwd, home) = dirs();
        let s = settings(&home);
        fs::write(cwd.join("a.txt"), "a").unwrap();
        load_path("a.txt", None, &cwd, &s).unwrap();
        let other = dir.path().canonicalize().unwrap().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("a.txt"), "secret").unwrap();
        fs::rename(&cwd, dir.path().join("ws-moved")).unwrap();
        symlink(&other, &cwd).unwrap();
        for path in ["a.txt".to_owned(), cwd.join("a.txt").display().to_string()] {
            assert_eq!(
                reason(load_path(&path, None, &cwd, &s)),
                "outside_workspace",
                "{path}"
            );
        }
        // An allowed directory replaced the same way: no root either.
        let shared = dir.path().canonicalize().unwrap().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::write(shared.join("b.txt"), "b").unwrap();
        let mut s = s;
        s.allowed_dirs = vec![shared.clone()];
        let b = shared.join("b.txt").display().to_string();
        load_path(&b, None, &cwd, &s).unwrap();
        fs::rename(&shared, dir.path().join("shared-moved")).unwrap();
        symlink(&other, &shared).unwrap();
        fs::write(other.join("b.txt"), "secret").unwrap();
        assert_eq!(reason(load_path(&b, None, &cwd, &s)), "outside_workspace");
    }

    /// The re-check after the open: where the kernel says the open file is must be inside,
    /// so a directory on the way swapped for a symlink out between the check and the open
    /// is `changed` (the swap itself cannot be timed in a test; the check is tested here).
    #[test]
    fn an_open_file_outside_the_roots_is_changed() {
        let (dir, cwd, home) = dirs();
        let s = settings(&home);
        let roots = live_roots(&cwd, &s);
        let inside = |p: &Path| roots.iter().any(|root| p.starts_with(root));
        fs::create_dir(cwd.join("d")).unwrap();
        fs::write(cwd.join("d/f.txt"), "in").unwrap();
        let out = dir.path().canonicalize().unwrap().join("out");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("f.txt"), "out").unwrap();
        let file = fs::File::open(cwd.join("d/f.txt")).unwrap();
        assert_eq!(opened_inside(&file, &inside), Ok(()));
        // What an open through `d` swapped for a symlink to `out` would have opened.
        fs::rename(cwd.join("d"), cwd.join("d-old")).unwrap();
        symlink(&out, cwd.join("d")).unwrap();
        let swapped = fs::File::open(cwd.join("d/f.txt")).unwrap();
        assert_eq!(opened_inside(&swapped, &inside), Err(Refusal::Changed));
        // The file first opened moved with its directory, still inside: still fine.
        assert_eq!(opened_inside(&file, &inside), Ok(()));
    }

    /// An attachment is one shape or the other: fields of both, or of neither, are refused.
    #[test]
    fn an_attachment_of_both_shapes_or_neither_is_refused() {
        let parse = |v: serde_json::Value| {
            serde_json::from_value::<AttachmentParam>(v).map_err(|e| e.to_string())
        };
        assert_eq!(
            parse(serde_json::json!({"path": "a.png"})).unwrap(),
            AttachmentParam::Path {
                path: "a.png".into(),
                mime: None
            }
        );
        assert_eq!(
            parse(serde_json::json!({"path": "a", "mime": "image/png"})).unwrap(),
            AttachmentParam::Path {
                path: "a".into(),
                mime: Some("image/png".into())
            }
        );
        assert_eq!(
            parse(serde_json::json!({"data_base64": "aGk=", "mime": "text/plain", "name": "x"}))
                .unwrap(),
            AttachmentParam::Data {
                data_base64: "aGk=".into(),
                mime: "text/plain".into(),
                name: Some("x".into())
            }
        );
        for bad in [
            serde_json::json!({"path": "a", "data_base64": "aGk=", "mime": "text/plain"}),
            serde_json::json!({"path": "a", "name": "b"}),
            serde_json::json!({"path": "a", "size": 3}),
            serde_json::json!({"data_base64": "aGk="}),
            serde_json::json!({"data_base64": "aGk=", "mime": "text/plain", "path2": "x"}),
            serde_json::json!({"mime": "text/plain"}),
            serde_json::json!({}),
            serde_json::json!("a.png"),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
        let why = parse(serde_json::json!({"path": "a", "data_base64": "aGk=", "mime": "x/y"}))
            .unwrap_err();
        assert!(why.contains("not both"), "{why}");
    }

    struct Caps {
        options: OptionCaps,
        negotiated: OptionCaps,
        asked: AtomicUsize,
    }

    impl Launcher for Caps {
        fn runs_turns(&self, _agent_type: &str) -> bool {
            true
        }

        fn capabilities(&self, _agent_type: &str) -> Capabilities {
            Capabilities {
                options: self.options,
                ..Capabilities::NONE
            }
        }

        fn negotiate<'a>(
            &'a self,
            _agent_type: &'a str,
        ) -> futures_util::future::BoxFuture<'a, Result<OptionCaps, AdapterError>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let negotiated = self.negotiated;
            Box::pin(async move { Ok(negotiated) })
        }

        fn open(
            &self,
            _agent_type: &str,
            _cwd: &Path,
            _host_session_id: &str,
            _native: Native,
            _options: &SessionOptions,
        ) -> Result<AgentSession, AdapterError> {
            Err(AdapterError::new(
                crate::protocol::events::ErrorCategory::ProtocolIncompatible,
                "no agents here",
            ))
        }

        fn idle_timeout(&self) -> Option<Duration> {
            None
        }
    }

    fn loaded(kind: AttachmentKind) -> Loaded {
        Loaded {
            name: "x".into(),
            mime: match kind {
                AttachmentKind::Image => "image/png".into(),
                AttachmentKind::File => "text/plain".into(),
            },
            kind,
            data: vec![],
        }
    }

    #[tokio::test]
    async fn a_kind_the_family_does_not_take_is_option_unsupported() {
        let launcher = |options, negotiated| Caps {
            options,
            negotiated,
            asked: AtomicUsize::new(0),
        };
        let none = launcher(OptionCaps::NONE, OptionCaps::NONE);
        let image = [loaded(AttachmentKind::Image)];
        let file = [loaded(AttachmentKind::File)];
        for (what, option) in [(&image, "attachments.image"), (&file, "attachments.file")] {
            match check_family(what, &none, "fake").await {
                Err(SessionError::AttachmentUnsupported {
                    option: named,
                    agent_type,
                }) => assert_eq!((named, agent_type.as_str()), (option, "fake")),
                other => panic!("{other:?}"),
            }
        }
        check_family(&[], &none, "fake").await.unwrap();
        let images = launcher(
            OptionCaps {
                images: Support::Native,
                ..OptionCaps::NONE
            },
            OptionCaps::NONE,
        );
        check_family(&image, &images, "fake").await.unwrap();
        assert!(check_family(&file, &images, "fake").await.is_err());
        // Negotiated: the agent is asked once, and its answer decides.
        let yes = launcher(
            OptionCaps {
                images: Support::Negotiated,
                files: Support::Negotiated,
                ..OptionCaps::NONE
            },
            OptionCaps {
                images: Support::Native,
                files: Support::Native,
                ..OptionCaps::NONE
            },
        );
        let both = [loaded(AttachmentKind::Image), loaded(AttachmentKind::File)];
        check_family(&both, &yes, "fake").await.unwrap();
        assert_eq!(yes.asked.load(Ordering::SeqCst), 1);
        let no = launcher(
            OptionCaps {
                images: Support::Negotiated,
                ..OptionCaps::NONE
            },
            OptionCaps::NONE,
        );
        assert!(matches!(
            check_family(&image, &no, "fake").await,
            Err(SessionError::AttachmentUnsupported { .. })
        ));
    }
}
