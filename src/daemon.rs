//! Wiring only: builds every part of the host, reports readiness, and tears it down in order.
//!
//! Start: home → instance lock → end what a dead host of this home left running → store → bus
//! → hooks (if configured) → sessions → WebSocket listener (port into the lock file) → the pairing registry → IPC socket → relay
//! and the fleet client
//! → the reload task (`config.toml` watched) and the pruning of subscribers that never come back → `ready`. Shutdown (on the caller's `shutdown` future or `host.shutdown`) is a tree, leaves
//! first: stop accepting IPC and finish in-flight requests → stop reloading (the hooks running now come back) → session actors and their agents → drain the bus
//! (queued brackets are committed and fanned out) → hooks finish within a short grace (or are killed) → flush and join the store threads →
//! release the lock. The socket file goes with the listener, the lock with the last line.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::adapter::AgentSettings;
use crate::adapter::reap;
use crate::bus::{Bus, BusError};
use crate::config::{Config, ConfigError};
use crate::hooks::Hooks;
use crate::instance::{InstanceError, InstanceLock, LockInfo};
use crate::ipc::{self, IpcError};
use crate::link::Link;
use crate::relay;
use crate::request::Handler;
use crate::session::SessionManager;
use crate::store::{Store, StoreError};
use crate::subscribers::{GrantStore, Subscribers};
use crate::ws;
use crate::ws::server::WsContext;

/// What a started host reports to whoever started it.
#[derive(Clone)]
pub struct Ready {
    pub info: LockInfo,
    pub ipc_path: PathBuf,
    /// The host's bus, for code embedding the host in its own process (tests, benchmarks).
    pub bus: Bus,
    /// The relay client's handle (its status can be watched).
    pub relay: relay::RelayHandle,
    /// The fleet client's handle (its status can be watched).
    pub fleet: relay::fleet::FleetHandle,
    /// The host's pairings (the same handle `pair.*` and the relay client use).
    pub pairs: crate::seal::pairs::PairRegistry,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Instance(#[from] InstanceError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("bus: {0}")]
    Bus(#[from] BusError),
    #[error(transparent)]
    Ipc(#[from] IpcError),
    #[error("lock file: {0}")]
    Lock(std::io::Error),
    #[error("WebSocket listener: {0}")]
    Ws(std::io::Error),
}

/// How long in-flight IPC requests get to finish at shutdown.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// The loopback listener: the configured port; else the port this home's last host had, when
/// it is free (the web UI's origin — and so a page's storage and a bookmark — survives a
/// restart); else any free port.
async fn bind_ws(config: &Config) -> std::io::Result<tokio::net::TcpListener> {
    if config.ws_port != 0 {
        return ws::server::bind(config.ws_port).await;
    }
    let last = std::fs::read_to_string(config.ws_port_path())
        .ok()
        .and_then(|text| text.trim().parse::<u16>().ok())
        .filter(|port| *port != 0);
    if let Some(port) = last {
        match ws::server::bind(port).await {
            Ok(listener) => return Ok(listener),
            Err(e) => {
                tracing::info!(port, error = %e, "the last host's WebSocket port is taken; using another")
            }
        }
    }
    ws::server::bind(0).await
}

/// Best effort: a home that cannot keep the file just gets a new port next time.
fn remember_ws_port(config: &Config, port: u16) {
    if config.ws_port != 0 {
        return;
    }
    if let Err(e) = std::fs::write(config.ws_port_path(), format!("{port}\n")) {
        tracing::debug!(error = %e, "could not remember the WebSocket port");
    }
}

/// Run the host until `shutdown` resolves or a client sends `host.shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
    ready: oneshot::Sender<Ready>,
) -> Result<(), DaemonError> {
    config.ensure_home()?;
    let ipc_path = config.ipc_path();
    let info = LockInfo {
        pid: std::process::id(),
        version: crate::VERSION.to_owned(),
        ipc_path: ipc_path.display().to_string(),
        ws_port: None,
        started_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
    };
    let lock_path = config.lock_path();
    // Acquiring may wait briefly for a racing host to write its pid: not on a tokio worker.
    let lock = tokio::task::spawn_blocking(move || InstanceLock::acquire(&lock_path, info))
        .await
        .map_err(|e| DaemonError::Lock(std::io::Error::other(e)))??;
    let span = tracing::info_span!("host", pid = lock.info().pid);
    serve(config, lock, shutdown, ready).instrument(span).await
}

async fn serve(
    config: Config,
    mut lock: InstanceLock,
    shutdown: impl Future<Output = ()>,
    ready: oneshot::Sender<Ready>,
) -> Result<(), DaemonError> {
    let ipc_path = config.ipc_path();
    tracing::info!(home = %config.home.display(), version = crate::VERSION, "host starting");
    // Each subscriber's connection is a descriptor: 10,000 of them need more than the 1024
    // many desktops give a process.
    crate::limits::raise_open_files_logged();
    // We hold the lock: whatever carries this home's marker was left by a dead host.
    let leftovers = reap::end_leftovers(&reap::HomeMarker::of(&config.home));
    if !leftovers.is_empty() {
        tracing::warn!(
            count = leftovers.len(),
            "ended processes a previous host of this home left running"
        );
    }

    let db_path = config.db_path();
    let (store, store_threads) = tokio::task::spawn_blocking(move || Store::open(&db_path))
        .await
        .map_err(|e| DaemonError::Lock(std::io::Error::other(e)))??;
    let (bus, bus_tasks) = Bus::start(store.clone()).await?;
    // `[hooks]` follow every bracket from here on (recovery's included), never the history.
    let hooks = Hooks::start(&config, &bus, store.clone())
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "hooks cannot run");
            None
        });
    // Agent definitions a reload can replace (`reload::LiveLauncher`).
    let (launcher, agent_defs) =
        crate::reload::LiveLauncher::new(AgentSettings::from_config(&config));
    let sessions = SessionManager::new(store.clone(), bus.clone(), Arc::new(launcher))
        .with_queue_capacity(config.queue_capacity)
        .with_attachments(crate::session::attachments::AttachmentSettings::from_config(&config))
        .with_allow_bypass(config.allow_bypass);
    // What a stopped host left open is closed (and published) before anyone can connect.
    if let Err(e) = sessions.recover().await {
        tracing::error!(error = %e, "closing the runs the last host left open failed");
    }

    let root = CancellationToken::new();
    let tracker = TaskTracker::new();
    // Its agents' orphans come to this process, which reaps them (binary host only).
    let orphans = CancellationToken::new();
    if config.adopt_orphans {
        match reap::adopt_orphans(orphans.clone()) {
            Ok(_task) => tracing::debug!("adopting the orphans of agents"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot become a subreaper; orphans of agents go to init")
            }
        }
    }

    // The loopback WebSocket server; its port goes into the lock file before anyone is told.
    let ws_listener = bind_ws(&config).await.map_err(DaemonError::Ws)?;
    let ws_port = ws_listener.local_addr().map_err(DaemonError::Ws)?.port();
    remember_ws_port(&config, ws_port);
    let mut info = lock.info().clone();
    info.ws_port = Some(ws_port);
    lock.update(info).map_err(DaemonError::Lock)?;
    let grants = Arc::new(GrantStore::new(config.clock.clone()));
    // The same protocol on a Unix socket beside `host.sock` (we hold the lock: a leftover
    // file is a dead host's). Without it clients still have TCP, so a failure is not fatal.
    let ws_socket_path = config.ws_socket_path();
    let ws_socket = match ws::server::bind_unix(&ws_socket_path) {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!(path = %ws_socket_path.display(), error = %e, "no WebSocket Unix socket");
            None
        }
    };
    let mut subscribers = Subscribers::new(
        store.clone(),
        bus.clone(),
        sessions.clone(),
        grants,
        ws_port,
    );
    if ws_socket.is_some() {
        subscribers = subscribers.with_socket(&ws_socket_path);
    }
    // Subscribers that never come back: now, hourly, and when a reload changes the limit.
    let (max_idle, max_idle_rx) = tokio::sync::watch::channel(config.subscriber_max_idle);
    tracker.spawn(crate::subscribers::prune_task(
        subscribers.clone(),
        max_idle_rx,
        root.child_token(),
    ));
    // The one request layer every transport serves.
    let handler = Handler::new(
        sessions.clone(),
        subscribers,
        lock.info().clone(),
        Arc::new(config.clone()),
        root.clone(),
    );
    // Pending pairings and paired bots: `pair.*`, and the relay client's handshakes through
    // `Handler::pairs`. Its task ends with the root token.
    let pairs = crate::seal::pairs::PairRegistry::spawn(
        store.clone(),
        config.home.clone(),
        config.clock.clone(),
        root.child_token(),
    );
    handler.set_pairs(pairs.clone());
    let link = Link {
        handler: handler.clone(),
    };
    let ws_ctx = Arc::new(WsContext {
        link: link.clone(),
        port: ws_port,
        allowed_origins: config.ws_allowed_origins.clone(),
        keepalive: ws::server::KEEPALIVE,
    });
    let ws_task = tokio::spawn(ws::server::serve(
        ws_listener,
        ws_ctx.clone(),
        root.child_token(),
        tracker.clone(),
    ));
    let ws_unix_task = tokio::spawn({
        let cancel = root.child_token();
        let tracker = tracker.clone();
        async move {
            if let Some(socket) = ws_socket {
                ws::server::serve_unix(socket, ws_ctx, cancel, tracker).await;
            }
        }
    });

    let listener = ipc::bind(&ipc_path)?;
    // The relay client dials out (if configured); its connection is a transport like the
    // others and closes with them.
    let relay = relay::client::spawn(
        link.clone(),
        config.relay.clone(),
        root.child_token(),
        &tracker,
    );
    let relay_control: Arc<dyn crate::request::RelayControl> = Arc::new(relay.clone());
    handler.set_relay(relay_control.clone());
    // The sealed fleet (if configured): its bots' channels are transports like the others.
    let fleet = relay::fleet::spawn(
        link,
        pairs.clone(),
        config.fleet.clone(),
        root.child_token(),
        &tracker,
    );
    let fleet_control: Arc<dyn crate::request::FleetControl> = Arc::new(fleet.clone());
    handler.set_fleet(fleet_control.clone());
    // `config.toml` watched and `host.reload`: it owns the hooks from here on.
    let reloader = crate::reload::Reloader::spawn(crate::reload::Parts {
        config: Arc::new(config.clone()),
        agents: agent_defs,
        subscriber_max_idle: max_idle,
        hooks,
        bus: bus.clone(),
        store: store.clone(),
        relay: relay_control,
        fleet: fleet_control,
    });
    handler.set_reloader(reloader.clone());
    let ipc_task = tokio::spawn(ipc::serve(
        listener,
        handler,
        ipc::Limits {
            read_timeout: config.ipc_read_timeout,
            ..ipc::Limits::default()
        },
        root.child_token(),
        tracker.clone(),
    ));

    let _receiver_gone = ready.send(Ready {
        info: lock.info().clone(),
        ipc_path: ipc_path.clone(),
        bus: bus.clone(),
        relay,
        fleet,
        pairs,
    });
    tracing::info!(ipc = %ipc_path.display(), ws_port, "host ready");

    tokio::select! {
        () = shutdown => tracing::info!("shutdown signal received"),
        () = root.cancelled() => {}
    }
    root.cancel();

    // 1. Transports: stop accepting, let in-flight requests answer, close WebSockets.
    for (name, task) in [
        ("IPC", ipc_task),
        ("WebSocket", ws_task),
        ("WebSocket (Unix)", ws_unix_task),
    ] {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "{name} listener task failed");
        }
    }
    tracker.close();
    if tokio::time::timeout(DRAIN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("IPC requests still running after the grace period; abandoning them");
    }
    // No reload from here on; the hooks running now are ended after the bus drains.
    let hooks = reloader.stop().await;
    // 2. Sessions: running turns interrupted, agents closed (queued prompts stay queued for
    //    the next start); their last events go onto the bus.
    sessions.shutdown().await;
    if config.adopt_orphans {
        reap::end_adopted();
    }
    orphans.cancel();
    // 3. Bus: everything queued is committed and fanned out.
    drop(bus);
    bus_tasks.shutdown().await;
    // Hooks of those last brackets get a short grace (`hooks::SHUTDOWN_GRACE`, 2 s, or their
    // time limit if shorter), then are killed: they add at most that (plus the kill) to a
    // shutdown whose sessions take up to 10 s of the 15 s `host.shutdown` waits for the lock.
    if let Some(hooks) = hooks {
        hooks.shutdown().await;
    }
    // 4. Store: the writer drains and commits, then both threads exit.
    drop(store);
    store_threads.shutdown().await;
    tracing::info!("host stopped");
    // 5. The lock goes last: a new host can start only once this one has fully let go.
    drop(lock);
    Ok(())
}
