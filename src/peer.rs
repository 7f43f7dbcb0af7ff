//! Which user is at the other end of an accepted Unix-socket connection (`SO_PEERCRED`), and
//! what a peer of another user is told. Both of the host's sockets (`host.sock`, `ws.sock`)
//! are 0600 in a 0700 home; this is the check behind those modes, for a home or a socket whose
//! mode was loosened. Each socket answers the refusal its own way (a `peer_refused` reply line,
//! a 403 whose reason starts `peer_refused:`).

use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// How long a peer of another user may take to send the request it is refused, so that it
/// cannot hold the connection slots the host's own clients need for a whole request's time.
pub const OTHER_USER_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerUser {
    Own,
    /// Another user (its uid), or `None`: credentials that could not be read.
    Other(Option<u32>),
}

impl PeerUser {
    /// The peer of `socket`. The uid is read directly: a peer in a PID namespace this host
    /// cannot see has pid 0 there (which `interprocess` takes for an error), and still a uid.
    pub fn of(socket: &impl AsFd) -> PeerUser {
        match getsockopt(socket, PeerCredentials) {
            Ok(cred) if cred.uid() == nix::unistd::geteuid().as_raw() => PeerUser::Own,
            Ok(cred) => PeerUser::Other(Some(cred.uid())),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read a Unix-socket peer's credentials");
                PeerUser::Other(None)
            }
        }
    }

    pub fn is_other(self) -> bool {
        matches!(self, PeerUser::Other(_))
    }

    /// Why another user's peer is refused (logged); `None` for the host's own user.
    pub fn refusal(self) -> Option<String> {
        let PeerUser::Other(uid) = self else {
            return None;
        };
        let own = nix::unistd::geteuid().as_raw();
        let who = uid.map_or_else(|| "unknown".to_owned(), |u| u.to_string());
        tracing::warn!(peer_uid = %who, "refused a Unix-socket peer of another user");
        Some(format!(
            "this host serves its own user (uid {own}) only; the peer's uid is {who}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_is_this_users_own() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(PeerUser::of(&a), PeerUser::Own);
        assert_eq!(PeerUser::Own.refusal(), None);
        let refusal = PeerUser::Other(Some(65534)).refusal().unwrap();
        assert!(refusal.ends_with("the peer's uid is 65534"), "{refusal}");
        assert!(
            PeerUser::Other(None)
                .refusal()
                .unwrap()
                .ends_with("is unknown")
        );
    }
}
