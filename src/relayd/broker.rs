//! The relay's one NATS connection and everything it keeps there: the two JetStream streams
//! frames rest in, the durable consumers endpoints read through, and the presence bucket.
//! Only NATS Server 2.9 features are used (Debian ships 2.9.10): the consumer create API with
//! the name in the subject, durable `inactive_threshold`, KV with direct get, and
//! `Nats-Expected-Last-Subject-Sequence` for compare-and-set.
//!
//! - Streams [`HOSTS_STREAM`] (`ah.h.>`, to hosts) and [`BOTS_STREAM`] (`ah.b.>`, to bot
//!   channels): file storage, 30 s `max_age`, 4096 messages per subject, 256 MiB, discard old.
//!   They hold the encoded frames exactly as an endpoint sent them, sealed by the endpoints;
//!   nothing else of a frame is stored anywhere.
//! - Durable pull consumers `h-<host_id>` and `b-<channel>`: explicit ack (the caller acks
//!   after the WebSocket write), 5 s `ack_wait`, 60 s `inactive_threshold`, at most
//!   [`MAX_ACK_PENDING`] unacked at once. [`Broker::inbox`] attaches one. When the durable
//!   exists already (the endpoint was connected before, maybe through an instance that died),
//!   it is deleted and created again from its ack floor, under the same name: the frames the
//!   earlier reader never acked come at once and in order (rather than after `ack_wait`, behind
//!   newer ones), and an earlier reader still pulling — a stale connection on an instance that
//!   has not noticed the endpoint left — gets "consumer deleted" and ends (`superseded`):
//!   newest wins. (A consumer that handed frames out but never had one acked restarts from
//!   the oldest its subject holds: for a bot channel that can replay frames of an earlier
//!   channel under the same id, which the endpoint cannot open and re-handshakes — rather
//!   than lose the un-acked ones.)
//!   A new host consumer starts with everything the stream holds for the host (a bot may have
//!   opened a channel before the host connected); a new bot consumer starts with what comes
//!   next (it is created before the bot's first frame on the channel is published, so no
//!   answer can precede it, and an older channel's frames under a reused id are not replayed).
//! - KV bucket [`PRESENCE_BUCKET`] (history 1, 15 s `max_age`): key `<host_id>` = the id of
//!   the instance holding the host, put at connect and refreshed every [`PRESENCE_INTERVAL`]
//!   by compare-and-set on the revision this connection wrote last. A failed compare means a
//!   newer connection claimed the key: [`Refresh::Superseded`].
//!
//! Must not touch: frame content (payloads are passed through as opaque bytes).

use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
use bytes::Bytes;

use super::error::BrokerError;

/// The stream of frames to hosts.
pub const HOSTS_STREAM: &str = "AH_HOSTS";
/// The stream of frames to bot channels.
pub const BOTS_STREAM: &str = "AH_BOTS";
/// The KV bucket of which instance holds which host.
pub const PRESENCE_BUCKET: &str = "ah_presence";
/// How often a connected host's presence key is refreshed.
pub const PRESENCE_INTERVAL: Duration = Duration::from_secs(5);

const STREAM_MAX_AGE: Duration = Duration::from_secs(30);
const STREAM_MAX_MSGS_PER_SUBJECT: i64 = 4096;
const STREAM_MAX_BYTES: i64 = 256 * 1024 * 1024;
const PRESENCE_MAX_AGE: Duration = Duration::from_secs(15);
const ACK_WAIT: Duration = Duration::from_secs(5);
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(60);
/// Frames a consumer hands out before one is acked: with the writer's queue, what one
/// endpoint connection may hold in memory.
pub const MAX_ACK_PENDING: i64 = 64;
/// Frames asked for per pull request.
const PULL_BATCH: usize = 32;
/// The server's idle heartbeat on a pull: a reader whose consumer vanished without a word
/// notices within two of these.
const PULL_HEARTBEAT: Duration = Duration::from_secs(5);
const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// Every JetStream API call and publish ack is bounded by this.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// The first connection to NATS must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The subject of frames to a host.
pub fn host_subject(host_id: &str) -> String {
    format!("ah.h.{host_id}")
}

/// The subject of frames to a bot channel.
pub fn channel_subject(channel: &str) -> String {
    format!("ah.b.{channel}")
}

/// Frames for one endpoint, as they come from its durable consumer.
pub type Inbox = consumer::pull::Stream;

/// The outcome of a presence refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Still ours, now at this revision.
    Held(u64),
    /// A newer connection claimed the host.
    Superseded,
}

/// A cloneable handle on the NATS connection and the relay's streams and bucket.
#[derive(Clone)]
pub struct Broker {
    client: async_nats::Client,
    js: jetstream::Context,
    hosts: stream::Stream,
    bots: stream::Stream,
    presence: kv::Store,
}

impl Broker {
    /// Connect to `url` and make sure the streams and the bucket exist with the relay's
    /// bounds (created, or updated to them).
    pub async fn connect(url: &str, instance: &str) -> Result<Broker, BrokerError> {
        let options = async_nats::ConnectOptions::new()
            .name(format!("agent-host-relay {instance}"))
            .connection_timeout(CONNECT_TIMEOUT)
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("NATS connected"),
                    async_nats::Event::Disconnected => tracing::warn!("NATS disconnected"),
                    other => tracing::info!(event = %other, "NATS event"),
                }
            });
        let client = tokio::time::timeout(CONNECT_TIMEOUT, options.connect(url))
            .await
            .map_err(|_| BrokerError::new("connecting to NATS", "timed out"))?
            .map_err(|e| BrokerError::new("connecting to NATS", e))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(API_TIMEOUT)
            .build(client.clone());
        let hosts = ensure_stream(&js, HOSTS_STREAM, "ah.h.>").await?;
        let bots = ensure_stream(&js, BOTS_STREAM, "ah.b.>").await?;
        let presence = ensure_bucket(&js).await?;
        Ok(Broker {
            client,
            js,
            hosts,
            bots,
            presence,
        })
    }

    /// Whether the NATS connection is up now (`/healthz`).
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Attach the durable consumer of `host_id` and start pulling from it.
    pub async fn host_inbox(&self, host_id: &str) -> Result<Inbox, BrokerError> {
        inbox(
            &self.hosts,
            &format!("h-{host_id}"),
            host_subject(host_id),
            consumer::DeliverPolicy::All,
        )
        .await
    }

    /// Attach the durable consumer of a bot `channel` and start pulling from it.
    pub async fn channel_inbox(&self, channel: &str) -> Result<Inbox, BrokerError> {
        inbox(
            &self.bots,
            &format!("b-{channel}"),
            channel_subject(channel),
            consumer::DeliverPolicy::New,
        )
        .await
    }

    /// Forget a channel the bot closed: its consumer goes now rather than after the
    /// inactivity threshold, so a later `Open` under the same id starts clean.
    pub async fn drop_channel(&self, channel: &str) -> Result<(), BrokerError> {
        match self.bots.delete_consumer(&format!("b-{channel}")).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(BrokerError::new("deleting a channel's consumer", e)),
        }
    }

    /// Publish a frame to a host; the returned future is its JetStream ack.
    pub async fn to_host(
        &self,
        host_id: &str,
        frame: Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, BrokerError> {
        self.js
            .publish(host_subject(host_id), frame)
            .await
            .map_err(|e| BrokerError::new("publishing to a host", e))
    }

    /// Publish a frame to a bot channel; the returned future is its JetStream ack.
    pub async fn to_channel(
        &self,
        channel: &str,
        frame: Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, BrokerError> {
        self.js
            .publish(channel_subject(channel), frame)
            .await
            .map_err(|e| BrokerError::new("publishing to a channel", e))
    }

    /// Claim `host_id` for `instance` (a new connection always wins): the revision written.
    pub async fn claim(&self, host_id: &str, instance: &str) -> Result<u64, BrokerError> {
        self.presence
            .put(host_id, Bytes::from(instance.to_owned()))
            .await
            .map_err(|e| BrokerError::new("claiming presence", e))
    }

    /// Refresh the claim written at `revision`, unless a newer connection claimed it since.
    pub async fn refresh(
        &self,
        host_id: &str,
        instance: &str,
        revision: u64,
    ) -> Result<Refresh, BrokerError> {
        match self
            .presence
            .update(host_id, Bytes::from(instance.to_owned()), revision)
            .await
        {
            Ok(revision) => Ok(Refresh::Held(revision)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(Refresh::Superseded),
            Err(e) => Err(BrokerError::new("refreshing presence", e)),
        }
    }

    /// Remove the claim written at `revision`; a newer claim is left alone.
    pub async fn release(&self, host_id: &str, revision: u64) -> Result<(), BrokerError> {
        self.presence
            .delete_expect_revision(host_id, Some(revision))
            .await
            .map_err(|e| BrokerError::new("releasing presence", e))
    }

    /// Whether some instance holds `host_id` now.
    pub async fn host_online(&self, host_id: &str) -> Result<bool, BrokerError> {
        let value = self
            .presence
            .get(host_id)
            .await
            .map_err(|e| BrokerError::new("reading presence", e))?;
        Ok(value.is_some_and(|v| !v.is_empty()))
    }

    /// Send whatever is buffered (acks, presence deletes) before the process exits.
    pub async fn flush(&self) {
        if let Err(e) = self.client.flush().await {
            tracing::warn!(error = %e, "NATS flush at shutdown failed");
        }
    }
}

async fn ensure_stream(
    js: &jetstream::Context,
    name: &str,
    subject: &str,
) -> Result<stream::Stream, BrokerError> {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        storage: stream::StorageType::File,
        max_age: STREAM_MAX_AGE,
        max_messages_per_subject: STREAM_MAX_MSGS_PER_SUBJECT,
        max_bytes: STREAM_MAX_BYTES,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    };
    js.create_or_update_stream(config)
        .await
        .map_err(|e| BrokerError::new("creating a stream", e))?;
    js.get_stream(name)
        .await
        .map_err(|e| BrokerError::new("opening a stream", e))
}

/// The presence bucket. Its stream is made here, laid out as the client's own bucket
/// creation would (`KV_<bucket>`, `$KV.<bucket>.>`, rollups, direct get, discard new): that
/// call first asks for the account's info, whose 2.9 reply this client does not parse.
async fn ensure_bucket(js: &jetstream::Context) -> Result<kv::Store, BrokerError> {
    let config = stream::Config {
        name: format!("KV_{PRESENCE_BUCKET}"),
        description: Some("agent-host relay: which instance holds which host".to_owned()),
        subjects: vec![format!("$KV.{PRESENCE_BUCKET}.>")],
        storage: stream::StorageType::File,
        max_messages_per_subject: 1,
        max_age: PRESENCE_MAX_AGE,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: 1,
        ..Default::default()
    };
    js.create_or_update_stream(config)
        .await
        .map_err(|e| BrokerError::new("creating the presence bucket", e))?;
    js.get_key_value(PRESENCE_BUCKET)
        .await
        .map_err(|e| BrokerError::new("opening the presence bucket", e))
}

fn is_not_found(e: &stream::ConsumerError) -> bool {
    matches!(
        e.kind(),
        stream::ConsumerErrorKind::JetStream(js)
            if js.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND
    )
}

/// Attach durable `name` (filter `subject`) on `stream` and start pulling: created with
/// `fresh` when absent, else created again from its ack floor (the module comment says why).
async fn inbox(
    stream: &stream::Stream,
    name: &str,
    subject: String,
    fresh: consumer::DeliverPolicy,
) -> Result<Inbox, BrokerError> {
    let deliver_policy = match stream.consumer_info(name).await {
        Ok(info) => {
            // Nothing handed out yet: it stands where it was made (a fresh consumer reports
            // an ack floor of 0 whatever its start). Else: after the last frame acked.
            let after = if info.delivered.consumer_sequence == 0 {
                info.delivered.stream_sequence
            } else {
                info.ack_floor.stream_sequence
            };
            tracing::debug!(
                name,
                after,
                unacked = info.num_ack_pending,
                "consumer attached again from its ack floor"
            );
            match stream.delete_consumer(name).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(BrokerError::new("resetting a consumer", e)),
            }
            consumer::DeliverPolicy::ByStartSequence {
                start_sequence: after.saturating_add(1),
            }
        }
        Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => fresh,
        Err(e) => return Err(BrokerError::new("looking up a consumer", e)),
    };
    let config = consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        deliver_policy,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        filter_subject: subject,
        max_ack_pending: MAX_ACK_PENDING,
        inactive_threshold: INACTIVE_THRESHOLD,
        ..Default::default()
    };
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(|e| BrokerError::new("creating a consumer", e))?;
    consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .heartbeat(PULL_HEARTBEAT)
        .expires(PULL_EXPIRES)
        .messages()
        .await
        .map_err(|e| BrokerError::new("pulling from a consumer", e))
}
