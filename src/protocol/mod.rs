//! Pure contracts shared by every layer: the command envelope with its error codes, and the
//! canonical events. No I/O and no tokio here; `protocol` depends on nothing else in the crate.

pub mod envelope;
pub mod event_reference;
pub mod events;
pub mod options;
pub mod relay_wire;
pub mod replies;
pub mod scope;
pub mod states;
pub mod strict_json;
pub mod wire;

pub use envelope::{Command, ErrorCode, Reply, RequestError, Route};
pub use events::{AnyEvent, Event, EventBody, EventClass};
