//! The open blocks of every session, kept by the hub so that a subscriber joining (or
//! rejoining) live while a block streams is first sent what the block holds so far.
//!
//! A block is opened by its start bracket (`text.start`, `thinking.start`, `tool.call.start`,
//! `tool.exec.start`), grows by its deltas (`text.delta`, `thinking.delta`, `tool.call.delta`,
//! `tool.exec.update`), and is forgotten at its end bracket, at its session's `run.end`, or when
//! its session goes `idle` (a stop), or when its session is deleted ([`BlockOp::Forget`]: a
//! session stopped quietly never closes its blocks). Nothing here is persisted: it is memory of
//! the live stream.
//!
//! Bounds: a block keeps at most [`MAX_BLOCK_BYTES`] of content, all blocks together at most
//! [`MAX_TOTAL_BYTES`] (past it the oldest blocks lose their content first, so that stale blocks
//! cannot turn the feature off for live ones), and at most [`MAX_OPEN_BLOCKS`] are tracked (the
//! oldest is forgotten first). Past its bound a block keeps only
//! its length: subscribers that have everything so far keep getting its live deltas, one that
//! is behind on it gets none of it any more and relies on its end bracket, which carries the
//! whole text.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use super::{Delivery, MAX_EVENT_BYTES};
use crate::protocol::events::{Event, EventBody, TextDelta, ToolCallDelta, ToolExecUpdate};
use crate::protocol::states::SessionState;

/// The most content one open block keeps for late joiners (UTF-8 bytes of its deltas).
pub const MAX_BLOCK_BYTES: usize = 1024 * 1024;
/// The most content all open blocks keep together.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024 * 1024;
/// The most open blocks tracked at once.
pub const MAX_OPEN_BLOCKS: usize = 1024;

/// The kinds of block whose deltas are coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Family {
    Text,
    Thinking,
    ToolCall,
    ToolExec,
}

/// What one event does to the open blocks, decided in `publish` from the typed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BlockOp {
    Open(Family, String),
    Append(Family, String, String),
    Close(Family, String),
    /// The session has no running turn any more (`run.end`, `session.state` idle).
    ClearSession,
    /// The session was deleted: forget its blocks. Not an event: never delivered.
    Forget,
}

impl BlockOp {
    pub(super) fn of(body: &EventBody) -> Option<BlockOp> {
        let id = |id: &Option<String>| id.clone().unwrap_or_default();
        Some(match body {
            EventBody::TextStart(b) => BlockOp::Open(Family::Text, id(&b.item_id)),
            EventBody::TextDelta(d) => {
                BlockOp::Append(Family::Text, id(&d.item_id), d.text.clone())
            }
            EventBody::TextEnd(b) => BlockOp::Close(Family::Text, id(&b.item_id)),
            EventBody::ThinkingStart(b) => BlockOp::Open(Family::Thinking, id(&b.item_id)),
            EventBody::ThinkingDelta(d) => {
                BlockOp::Append(Family::Thinking, id(&d.item_id), d.text.clone())
            }
            EventBody::ThinkingEnd(b) => BlockOp::Close(Family::Thinking, id(&b.item_id)),
            EventBody::ToolCallStart(t) => BlockOp::Open(Family::ToolCall, t.call_id.clone()),
            EventBody::ToolCallDelta(t) => {
                BlockOp::Append(Family::ToolCall, t.call_id.clone(), t.delta.clone())
            }
            EventBody::ToolCallEnd(t) => BlockOp::Close(Family::ToolCall, t.call_id.clone()),
            EventBody::ToolExecStart(t) => BlockOp::Open(Family::ToolExec, t.call_id.clone()),
            EventBody::ToolExecUpdate(t) => {
                BlockOp::Append(Family::ToolExec, t.call_id.clone(), t.output.clone())
            }
            EventBody::ToolExecEnd(t) => BlockOp::Close(Family::ToolExec, t.call_id.clone()),
            EventBody::RunEnd(_) => BlockOp::ClearSession,
            EventBody::SessionState(s) if s.state == SessionState::Idle => BlockOp::ClearSession,
            _ => return None,
        })
    }
}

/// A tracked block's identity, unique for the hub's lifetime.
pub(super) type BlockUid = u64;

/// How much of a block a subscriber has been queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Progress {
    /// This many bytes of its content, from the start.
    Sent(usize),
    /// It is behind on a block past its bound: it gets no more of it (the end bracket has it).
    Muted,
}

struct Block {
    session_id: Arc<str>,
    run_id: Option<Arc<str>>,
    family: Family,
    id: String,
    /// The content so far; `None` once past the bound.
    text: Option<String>,
    /// Bytes of content so far (counted past the bound too).
    len: usize,
    /// The coalesced delta of the whole content, built for the first joiner at this length
    /// and `sequence_id` and shared by the others.
    whole: Option<Arc<Delivery>>,
}

/// A delta of a tracked block, as fan-out needs it: which block, and its length before and
/// after this delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Appended {
    pub uid: BlockUid,
    pub before: usize,
    pub after: usize,
}

/// What applying one event did.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// Set for a delta of a tracked block.
    pub appended: Option<Appended>,
    /// Blocks no longer tracked: subscribers forget their progress on them.
    pub forgotten: Vec<BlockUid>,
}

#[derive(Default)]
pub(super) struct Blocks {
    by_key: HashMap<(Arc<str>, Family, String), BlockUid>,
    /// In the order they opened.
    open: BTreeMap<BlockUid, Block>,
    next_uid: BlockUid,
    bytes: usize,
    /// Coalesced deltas built (not shared), for tests of what fan-out costs.
    #[cfg(test)]
    builds: usize,
}

impl Blocks {
    /// Apply one event (`item` already has its `sequence_id`).
    pub(super) fn apply(&mut self, op: Option<BlockOp>, item: &Delivery) -> Applied {
        let mut applied = Applied::default();
        let Some(op) = op else {
            return applied;
        };
        match op {
            BlockOp::Open(family, id) => {
                let key = (item.session_id.clone(), family, id.clone());
                if let Some(old) = self.by_key.remove(&key) {
                    self.remove(old);
                    applied.forgotten.push(old);
                }
                while self.open.len() >= MAX_OPEN_BLOCKS {
                    let Some((&oldest, _)) = self.open.first_key_value() else {
                        break;
                    };
                    self.forget(oldest);
                    applied.forgotten.push(oldest);
                }
                let uid = self.next_uid;
                self.next_uid += 1;
                self.by_key.insert(key, uid);
                self.open.insert(
                    uid,
                    Block {
                        session_id: item.session_id.clone(),
                        run_id: item.run_id.clone(),
                        family,
                        id,
                        text: Some(String::new()),
                        len: 0,
                        whole: None,
                    },
                );
            }
            BlockOp::Append(family, id, text) => {
                let key = (item.session_id.clone(), family, id);
                // A delta of no open block (its start predates this hub, or it was forgotten)
                // is passed on as it is.
                let Some(&uid) = self.by_key.get(&key) else {
                    return applied;
                };
                let Some(block) = self.open.get_mut(&uid) else {
                    return applied;
                };
                let before = block.len;
                block.len += text.len();
                block.whole = None;
                let after = block.len;
                let keep = match block.text.as_mut() {
                    Some(kept) if kept.len() + text.len() > MAX_BLOCK_BYTES => {
                        self.bytes -= kept.len();
                        block.text = None;
                        false
                    }
                    Some(_) => true,
                    None => false,
                };
                if keep {
                    // Room is made by the oldest blocks' content, never refused to this one.
                    self.make_room(text.len(), uid);
                    if let Some(kept) = self.open.get_mut(&uid).and_then(|b| b.text.as_mut()) {
                        kept.push_str(&text);
                        self.bytes += text.len();
                    }
                }
                applied.appended = Some(Appended { uid, before, after });
            }
            BlockOp::Close(family, id) => {
                if let Some(uid) = self.by_key.remove(&(item.session_id.clone(), family, id)) {
                    self.remove(uid);
                    applied.forgotten.push(uid);
                }
            }
            BlockOp::ClearSession | BlockOp::Forget => {
                let uids: Vec<BlockUid> = self
                    .open
                    .iter()
                    .filter(|(_, b)| b.session_id == item.session_id)
                    .map(|(uid, _)| *uid)
                    .collect();
                for uid in uids {
                    self.forget(uid);
                    applied.forgotten.push(uid);
                }
            }
        }
        applied
    }

    /// Drop the content of the oldest blocks (not `keep`) until `more` bytes fit the total.
    fn make_room(&mut self, more: usize, keep: BlockUid) {
        if self.bytes + more <= MAX_TOTAL_BYTES {
            return;
        }
        for (uid, block) in self.open.iter_mut() {
            if *uid == keep {
                continue;
            }
            if let Some(text) = block.text.take() {
                self.bytes -= text.len();
                block.whole = None;
                if self.bytes + more <= MAX_TOTAL_BYTES {
                    return;
                }
            }
        }
    }

    fn forget(&mut self, uid: BlockUid) {
        if let Some(block) = self.remove(uid) {
            self.by_key
                .remove(&(block.session_id.clone(), block.family, block.id.clone()));
        }
    }

    fn remove(&mut self, uid: BlockUid) -> Option<Block> {
        let block = self.open.remove(&uid)?;
        self.bytes -= block.text.as_ref().map_or(0, String::len);
        Some(block)
    }

    /// The open blocks, oldest first: (uid, session, bytes so far).
    pub(super) fn open(&self) -> impl Iterator<Item = (BlockUid, &Arc<str>, usize)> {
        self.open
            .iter()
            .map(|(uid, b)| (*uid, &b.session_id, b.len))
    }

    /// One delta of the block's kind and id carrying its content from byte `from` to now, with
    /// `sequence_id`; `None` when the block is past its bound (or unknown).
    pub(super) fn coalesced(
        &mut self,
        uid: BlockUid,
        from: usize,
        sequence_id: i64,
    ) -> Option<Arc<Delivery>> {
        let block = self.open.get_mut(&uid)?;
        let text = block.text.as_deref()?.get(from..)?;
        if from == 0
            && let Some(whole) = &block.whole
            && whole.sequence_id == sequence_id
        {
            return Some(whole.clone());
        }
        #[cfg(test)]
        {
            self.builds += 1;
        }
        let id = block.id.clone();
        let item_id = (!id.is_empty()).then(|| id.clone());
        let (kind, body) = match block.family {
            Family::Text => (
                "text.delta",
                EventBody::TextDelta(TextDelta {
                    item_id,
                    text: text.to_owned(),
                }),
            ),
            Family::Thinking => (
                "thinking.delta",
                EventBody::ThinkingDelta(TextDelta {
                    item_id,
                    text: text.to_owned(),
                }),
            ),
            Family::ToolCall => (
                "tool.call.delta",
                EventBody::ToolCallDelta(ToolCallDelta {
                    call_id: id,
                    delta: text.to_owned(),
                }),
            ),
            Family::ToolExec => (
                "tool.exec.update",
                EventBody::ToolExecUpdate(ToolExecUpdate {
                    call_id: id,
                    output: text.to_owned(),
                }),
            ),
        };
        let event = Event::new(
            block.session_id.to_string(),
            block.run_id.as_deref().map(str::to_owned),
            body,
        );
        let json = serde_json::to_string(&event).ok()?;
        if json.len() > MAX_EVENT_BYTES {
            return None;
        }
        let delivery = Arc::new(Delivery {
            sequence_id,
            message_id: super::message_id().to_string().into(),
            session_id: block.session_id.clone(),
            run_id: block.run_id.clone(),
            kind: kind.into(),
            is_delta: true,
            json: json.into(),
            frame: OnceLock::new(),
            json_frame: OnceLock::new(),
        });
        if from == 0 {
            block.whole = Some(delivery.clone());
        }
        Some(delivery)
    }

    /// Content bytes kept, over all blocks.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Coalesced deltas built so far.
    #[cfg(test)]
    pub(super) fn builds(&self) -> usize {
        self.builds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::events::{BlockEnd, BlockStart, RunEnd, RunState};

    fn delivery(session: &str, seq: i64) -> Delivery {
        Delivery {
            sequence_id: seq,
            message_id: "m".into(),
            session_id: session.into(),
            run_id: Some("r".into()),
            kind: "x".into(),
            is_delta: false,
            json: "{}".into(),
            frame: OnceLock::new(),
            json_frame: OnceLock::new(),
        }
    }

    fn text_of(d: &Delivery) -> String {
        let v: serde_json::Value = serde_json::from_str(&d.json).unwrap();
        v["text"].as_str().unwrap().to_owned()
    }

    #[test]
    fn ops_follow_the_typed_event() {
        let start = EventBody::TextStart(BlockStart {
            item_id: Some("i".into()),
        });
        assert_eq!(
            BlockOp::of(&start),
            Some(BlockOp::Open(Family::Text, "i".into()))
        );
        let end = EventBody::TextEnd(BlockEnd {
            item_id: Some("i".into()),
            text: "x".into(),
            truncated: None,
            imported: false,
        });
        assert_eq!(
            BlockOp::of(&end),
            Some(BlockOp::Close(Family::Text, "i".into()))
        );
        let run_end = EventBody::RunEnd(RunEnd {
            state: RunState::Completed,
            category: None,
            message: None,
        });
        assert_eq!(BlockOp::of(&run_end), Some(BlockOp::ClearSession));
    }

    #[test]
    fn a_block_keeps_its_content_until_its_end_and_is_bounded() {
        let mut blocks = Blocks::default();
        let s = delivery("s", 1);
        blocks.apply(Some(BlockOp::Open(Family::Text, "i".into())), &s);
        blocks.apply(Some(BlockOp::Open(Family::ToolExec, "c".into())), &s);
        let a = blocks
            .apply(
                Some(BlockOp::Append(Family::Text, "i".into(), "héllo ".into())),
                &s,
            )
            .appended
            .unwrap();
        assert_eq!((a.before, a.after), (0, 7));
        blocks.apply(
            Some(BlockOp::Append(Family::Text, "i".into(), "world".into())),
            &s,
        );
        let whole = blocks.coalesced(a.uid, 0, 1).unwrap();
        assert_eq!(text_of(&whole), "héllo world");
        assert_eq!(&*whole.kind, "text.delta");
        assert!(whole.is_delta && whole.json.contains("\"itemId\":\"i\""));
        // Shared while nothing changed; a remainder from an offset.
        assert!(Arc::ptr_eq(&whole, &blocks.coalesced(a.uid, 0, 1).unwrap()));
        assert_eq!(text_of(&blocks.coalesced(a.uid, 7, 1).unwrap()), "world");
        assert_eq!(blocks.bytes(), 12);
        // Its end forgets it; the other block stays.
        let closed = blocks.apply(Some(BlockOp::Close(Family::Text, "i".into())), &s);
        assert_eq!(closed.forgotten, vec![a.uid]);
        assert!(blocks.coalesced(a.uid, 0, 1).is_none());
        assert_eq!(blocks.open().count(), 1);
        // Past the bound: the length still counts, the content is gone.
        let big = "x".repeat(MAX_BLOCK_BYTES);
        let one = blocks
            .apply(Some(BlockOp::Append(Family::ToolExec, "c".into(), big)), &s)
            .appended
            .unwrap();
        assert_eq!(
            text_of_output(&blocks.coalesced(one.uid, 0, 1).unwrap()).len(),
            MAX_BLOCK_BYTES
        );
        let two = blocks
            .apply(
                Some(BlockOp::Append(Family::ToolExec, "c".into(), "y".into())),
                &s,
            )
            .appended
            .unwrap();
        assert_eq!(two.after, MAX_BLOCK_BYTES + 1);
        assert!(blocks.coalesced(one.uid, 0, 1).is_none());
        assert_eq!(blocks.bytes(), 0);
        // run.end clears the session.
        let cleared = blocks.apply(Some(BlockOp::ClearSession), &s);
        assert_eq!(cleared.forgotten, vec![one.uid]);
        assert_eq!(blocks.open().count(), 0);
    }

    fn text_of_output(d: &Delivery) -> String {
        let v: serde_json::Value = serde_json::from_str(&d.json).unwrap();
        v["output"].as_str().unwrap().to_owned()
    }

    /// The total limit takes the oldest blocks' content first: the newest block (the live
    /// one) keeps its own; the evicted block keeps its length, only its content is gone.
    #[test]
    fn the_total_limit_evicts_the_oldest_blocks_content_first() {
        let mut blocks = Blocks::default();
        let s = delivery("s", 1);
        let full = "x".repeat(MAX_BLOCK_BYTES);
        let mut uids = Vec::new();
        for i in 0..MAX_TOTAL_BYTES / MAX_BLOCK_BYTES {
            let id = i.to_string();
            blocks.apply(Some(BlockOp::Open(Family::Text, id.clone())), &s);
            let a = blocks
                .apply(Some(BlockOp::Append(Family::Text, id, full.clone())), &s)
                .appended
                .unwrap();
            uids.push(a.uid);
        }
        assert_eq!(blocks.bytes(), MAX_TOTAL_BYTES);
        blocks.apply(Some(BlockOp::Open(Family::Text, "new".into())), &s);
        let new = blocks
            .apply(
                Some(BlockOp::Append(Family::Text, "new".into(), "fresh".into())),
                &s,
            )
            .appended
            .unwrap();
        assert_eq!(text_of(&blocks.coalesced(new.uid, 0, 1).unwrap()), "fresh");
        assert!(blocks.coalesced(uids[0], 0, 1).is_none(), "oldest evicted");
        assert!(
            blocks.coalesced(uids[1], 0, 1).is_some(),
            "only as much as needed"
        );
        assert_eq!(blocks.bytes(), MAX_TOTAL_BYTES - MAX_BLOCK_BYTES + 5);
        // The evicted block's later deltas are still counted, not kept.
        let more = blocks
            .apply(
                Some(BlockOp::Append(Family::Text, "0".into(), "y".into())),
                &s,
            )
            .appended
            .unwrap();
        assert_eq!((more.uid, more.after), (uids[0], MAX_BLOCK_BYTES + 1));
        assert_eq!(blocks.bytes(), MAX_TOTAL_BYTES - MAX_BLOCK_BYTES + 5);
    }

    /// A deleted session's blocks are forgotten; another session's stay.
    #[test]
    fn forget_drops_only_that_sessions_blocks() {
        let mut blocks = Blocks::default();
        let a = delivery("a", 1);
        let b = delivery("b", 1);
        blocks.apply(Some(BlockOp::Open(Family::Text, "i".into())), &a);
        blocks.apply(Some(BlockOp::Open(Family::ToolExec, "c".into())), &a);
        blocks.apply(Some(BlockOp::Open(Family::Text, "i".into())), &b);
        blocks.apply(
            Some(BlockOp::Append(Family::Text, "i".into(), "aa".into())),
            &a,
        );
        blocks.apply(
            Some(BlockOp::Append(Family::Text, "i".into(), "b".into())),
            &b,
        );
        let forgotten = blocks.apply(Some(BlockOp::Forget), &a).forgotten;
        assert_eq!(forgotten.len(), 2);
        assert_eq!(blocks.bytes(), 1);
        let left: Vec<_> = blocks.open().map(|(_, s, _)| s.to_string()).collect();
        assert_eq!(left, vec!["b".to_owned()]);
        // Its stray deltas are no longer tracked.
        let stray = blocks.apply(
            Some(BlockOp::Append(Family::Text, "i".into(), "x".into())),
            &a,
        );
        assert!(stray.appended.is_none());
    }

    #[test]
    fn the_oldest_block_goes_when_too_many_are_open() {
        let mut blocks = Blocks::default();
        let s = delivery("s", 1);
        let mut forgotten = Vec::new();
        for i in 0..=MAX_OPEN_BLOCKS {
            forgotten.extend(
                blocks
                    .apply(Some(BlockOp::Open(Family::Text, i.to_string())), &s)
                    .forgotten,
            );
        }
        assert_eq!(forgotten, vec![0]);
        assert_eq!(blocks.open().count(), MAX_OPEN_BLOCKS);
        // Its deltas pass untracked.
        let untracked = blocks.apply(
            Some(BlockOp::Append(Family::Text, "0".into(), "x".into())),
            &s,
        );
        assert!(untracked.appended.is_none());
    }
}
