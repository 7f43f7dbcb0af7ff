//! Full-text search over what was said in sessions (`session.search`): the FTS5 table
//! `messages_fts` (migration 11), its rows written by the append path in the same transaction as
//! the events they index, and the ranked query.
//!
//! **What is indexed**, one row per bracket, under its `sequence_id`:
//! - `user.text` and `text.end`: the prompt's and the answer's `text` (what the issue asks);
//! - `tool.call.end`: the tool's name, then every string of its input (the shell command, the
//!   file path, the pattern): what a user remembers of a session ("the one that ran `cargo
//!   publish`"), and small.
//!
//! Not indexed: tool output (`tool.exec.end`, often whole files or build logs: it would
//! multiply the index and drown prompts and answers in the ranking), thinking (not shown by
//! default, and long), and every other kind (no prose). A client that wants only some kinds
//! reads each hit's `kind`.
//!
//! **Invariant**: a committed indexed bracket has its row, and a deleted session's rows are gone
//! ([`super::Store::delete_session`] deletes them in its transaction, before the messages).
//!
//! **Queries** are words by default ([`Syntax::Words`]): each whitespace-separated word is
//! quoted, so no input is ever FTS5 syntax (`"`, `*`, `NEAR(`, `OR` are searched as text, or
//! ignored when they hold no letter or digit); a trailing `*` keeps its meaning, a prefix. Every
//! word must match (AND). [`Syntax::Fts5`] passes the query to FTS5 as written (phrases, `OR`,
//! `NOT`, `NEAR`, prefixes); one FTS5 cannot parse is [`StoreError::BadQuery`], never an
//! internal error.

use std::borrow::Cow;

use rusqlite::{Transaction, params};
use serde::{Deserialize, Serialize};

use super::{NewEvent, Store, StoreError, StoreResult, sql};

/// Hits one search returns when the caller names no limit.
pub const DEFAULT_SEARCH_LIMIT: u32 = 20;
/// The most hits one search returns.
pub const MAX_SEARCH_LIMIT: u32 = 100;
/// The longest query accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 1024;
/// The most words a [`Syntax::Words`] query may have.
pub const MAX_QUERY_WORDS: usize = 32;
/// A snippet's length, in tokens (FTS5's `snippet()` takes at most 64).
const SNIPPET_TOKENS: i64 = 16;
/// What a snippet puts around each matched word: Markdown bold, which a terminal, a chat bot
/// and the web UI all show as it is meant (and which is never HTML).
pub const MATCH_OPEN: &str = "**";
pub const MATCH_CLOSE: &str = "**";

/// How a query is read: the command's own enum (`session.search` `syntax`).
pub use crate::protocol::envelope::SearchSyntax as Syntax;

/// One search.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    pub query: String,
    pub syntax: Syntax,
    /// `None`: every session; else only these (a scoped caller's, or the one it named).
    pub sessions: Option<Vec<String>>,
    pub limit: u32,
}

/// One match, as `session.search` returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchHit {
    pub session_id: String,
    pub sequence_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub kind: String,
    pub created_at_ms: i64,
    /// The matching passage, each matched word between [`MATCH_OPEN`] and [`MATCH_CLOSE`],
    /// `…` where text was cut.
    pub snippet: String,
    /// How well it matches (FTS5's bm25, negated: higher is better). Hits come best first.
    pub score: f64,
}

/// Whether brackets of `kind` are indexed.
pub(super) fn indexed(kind: &str) -> bool {
    matches!(kind, "user.text" | "text.end" | "tool.call.end")
}

/// The text a bracket is indexed under, `None` when it has none (or is not indexed). The same
/// text migration 11's backfill computes in SQL.
pub(super) fn searchable_text(kind: &str, payload: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Text<'a> {
        #[serde(borrow)]
        text: Cow<'a, str>,
    }
    #[derive(Deserialize)]
    struct Call {
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: serde_json::Value,
    }
    let text = match kind {
        "user.text" | "text.end" => serde_json::from_str::<Text<'_>>(payload)
            .ok()?
            .text
            .into_owned(),
        "tool.call.end" => {
            let call: Call = serde_json::from_str(payload).ok()?;
            let mut text = call.name;
            strings_of(&call.input, &mut text);
            text.trim().to_owned()
        }
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// Every string in `value`, depth first, appended to `out` after a space each.
fn strings_of(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::String(s) => {
            out.push(' ');
            out.push_str(s);
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings_of(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| strings_of(v, out)),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {}
    }
}

/// Index the searchable brackets of a group, in the group's transaction: `seqs[i]` is the
/// `sequence_id` just assigned to `events[i]`.
pub(super) fn index_group<'a>(
    tx: &Transaction<'_>,
    events: impl Iterator<Item = (&'a NewEvent, i64)>,
) -> rusqlite::Result<()> {
    let mut stmt = None;
    for (event, seq) in events {
        if !indexed(event.kind) {
            continue;
        }
        let Some(text) = searchable_text(event.kind, &event.payload) else {
            continue;
        };
        let stmt = match &mut stmt {
            Some(stmt) => stmt,
            None => stmt.insert(tx.prepare_cached(sql::INSERT_FTS)?),
        };
        stmt.execute(params![seq, text])?;
    }
    Ok(())
}

/// The FTS5 query for `query` read as `syntax`, or why there is none (an empty or oversized
/// query: the caller's fault).
pub fn fts_query(query: &str, syntax: Syntax) -> Result<String, String> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(format!(
            "the query is {} bytes, the most is {MAX_QUERY_BYTES}",
            query.len()
        ));
    }
    if query.trim().is_empty() {
        return Err("the query is empty".to_owned());
    }
    if syntax == Syntax::Fts5 {
        return Ok(query.to_owned());
    }
    let mut phrases = Vec::new();
    for word in query.split_whitespace() {
        let stem = word.trim_end_matches('*');
        // A word with no letter or digit has no token to match (the tokenizer drops the rest).
        if !stem.chars().any(char::is_alphanumeric) {
            continue;
        }
        let quoted = format!("\"{}\"", stem.replace('"', "\"\""));
        phrases.push(if stem.len() < word.len() {
            format!("{quoted}*")
        } else {
            quoted
        });
    }
    if phrases.is_empty() {
        return Err("the query has no word to search for (letters or digits)".to_owned());
    }
    if phrases.len() > MAX_QUERY_WORDS {
        return Err(format!(
            "the query has {} words, the most is {MAX_QUERY_WORDS}",
            phrases.len()
        ));
    }
    Ok(phrases.join(" "))
}

impl Store {
    /// The best matches of a query, best first, at most `limit` (clamped to
    /// 1..=[`MAX_SEARCH_LIMIT`]). A query that is not one is [`StoreError::BadQuery`].
    pub async fn search(&self, q: SearchQuery) -> StoreResult<Vec<SearchHit>> {
        let fts = fts_query(&q.query, q.syntax).map_err(StoreError::BadQuery)?;
        let limit = q.limit.clamp(1, MAX_SEARCH_LIMIT);
        let only = match &q.sessions {
            None => None,
            Some(ids) => {
                Some(serde_json::to_string(ids).map_err(|e| StoreError::BadQuery(e.to_string()))?)
            }
        };
        self.read(move |conn| {
            let row = |r: &rusqlite::Row<'_>| -> rusqlite::Result<SearchHit> {
                Ok(SearchHit {
                    session_id: r.get(0)?,
                    sequence_id: r.get(1)?,
                    run_id: r.get(2)?,
                    kind: r.get(3)?,
                    created_at_ms: r.get(4)?,
                    snippet: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                    score: -r.get::<_, f64>(6)?,
                })
            };
            let hits = match &only {
                None => conn
                    .prepare_cached(sql::SEARCH_ALL)?
                    .query_map(
                        params![fts, MATCH_OPEN, MATCH_CLOSE, SNIPPET_TOKENS, limit],
                        row,
                    )?
                    .collect::<Result<Vec<_>, _>>(),
                Some(only) => conn
                    .prepare_cached(sql::SEARCH_IN)?
                    .query_map(
                        params![fts, MATCH_OPEN, MATCH_CLOSE, SNIPPET_TOKENS, limit, only],
                        row,
                    )?
                    .collect::<Result<Vec<_>, _>>(),
            };
            hits.map_err(query_error)
        })
        .await
    }
}

/// A failure while running a search: FTS5 reports a query it cannot parse (a syntax error, an
/// unknown column filter) as a plain `SQLITE_ERROR`, which the fixed statement itself never
/// raises; that is the caller's query. Anything else (I/O, corruption, busy) is the store's.
fn query_error(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, message) if f.code == rusqlite::ErrorCode::Unknown => {
            StoreError::BadQuery(format!(
                "the search query cannot be read: {}",
                message.unwrap_or_else(|| f.to_string())
            ))
        }
        other => StoreError::Sqlite(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SessionRow, now_ms};

    fn ev(session: &str, n: usize, kind: &'static str, payload: serde_json::Value) -> NewEvent {
        NewEvent {
            message_id: format!("m{n}").into(),
            session_id: session.into(),
            run_id: Some("r1".into()),
            kind,
            payload: payload.to_string().into(),
            created_at: now_ms(),
        }
    }

    fn prompt(session: &str, n: usize, text: &str) -> NewEvent {
        ev(
            session,
            n,
            "user.text",
            serde_json::json!({"k": "user.text", "sessionId": session, "text": text}),
        )
    }

    fn answer(session: &str, n: usize, text: &str) -> NewEvent {
        ev(
            session,
            n,
            "text.end",
            serde_json::json!({"k": "text.end", "sessionId": session, "text": text}),
        )
    }

    fn session(id: &str) -> SessionRow {
        SessionRow {
            session_id: id.into(),
            agent_type: "claude".into(),
            native_session_id: None,
            cwd: "/".into(),
            parent_session_id: None,
            title: None,
            state: crate::protocol::states::SessionState::Idle,
            created_at_ms: 1,
            updated_at_ms: 1,
            fork_of: None,
            options: Default::default(),
            binding: None,
        }
    }

    fn words(query: &str) -> SearchQuery {
        SearchQuery {
            query: query.into(),
            syntax: Syntax::Words,
            sessions: None,
            limit: DEFAULT_SEARCH_LIMIT,
        }
    }

    async fn append(store: &Store, events: Vec<NewEvent>) -> Vec<i64> {
        store.append(events).await.unwrap().await.unwrap().unwrap()
    }

    async fn found(store: &Store, q: SearchQuery) -> Vec<(String, i64)> {
        store
            .search(q)
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.session_id, h.sequence_id))
            .collect()
    }

    #[test]
    fn searchable_text_of_each_kind() {
        let t = |kind, v: serde_json::Value| searchable_text(kind, &v.to_string());
        assert_eq!(
            t(
                "user.text",
                serde_json::json!({"text": "a \"quoted\" word"})
            )
            .as_deref(),
            Some("a \"quoted\" word")
        );
        assert_eq!(
            t("text.end", serde_json::json!({"text": ""})),
            None,
            "nothing to index"
        );
        assert_eq!(
            t(
                "tool.call.end",
                serde_json::json!({"name": "Bash", "input": {"command": "cargo publish", "timeout": 5, "env": ["A=b"]}})
            )
            .as_deref(),
            Some("Bash cargo publish A=b")
        );
        assert_eq!(t("tool.exec.end", serde_json::json!({"output": "x"})), None);
        assert_eq!(searchable_text("text.end", "not json"), None);
    }

    #[test]
    fn words_are_quoted_and_hostile_input_is_text() {
        assert_eq!(
            fts_query("hello world", Syntax::Words).unwrap(),
            r#""hello" "world""#
        );
        assert_eq!(fts_query("pre*", Syntax::Words).unwrap(), r#""pre"*"#);
        assert_eq!(
            fts_query(r#"say "hi NEAR( OR"#, Syntax::Words).unwrap(),
            r#""say" """hi" "NEAR(" "OR""#
        );
        for empty in ["", "   ", "\"", "*", "** ( ) \" -", "NEAR( ("] {
            let got = fts_query(empty, Syntax::Words);
            if empty.contains("NEAR") {
                assert_eq!(got.unwrap(), r#""NEAR(""#);
            } else {
                assert!(got.is_err(), "{empty:?}: {got:?}");
            }
        }
        assert!(fts_query(&"a ".repeat(MAX_QUERY_WORDS + 1), Syntax::Words).is_err());
        assert!(fts_query(&"a".repeat(MAX_QUERY_BYTES + 1), Syntax::Fts5).is_err());
        assert_eq!(fts_query("a OR b", Syntax::Fts5).unwrap(), "a OR b");
    }

    /// The index row commits with its event, in the same group; a hit names the bracket and
    /// carries a snippet with the match marked.
    #[tokio::test]
    async fn an_appended_prompt_and_answer_are_found_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let seqs = append(
            &store,
            vec![
                prompt("a", 1, "please refactor the Frobnicator"),
                ev("a", 2, "tool.exec.end", serde_json::json!({"output": "frobnicator"})),
                answer("a", 3, "I refactored the frobnicator module."),
                ev(
                    "a",
                    4,
                    "tool.call.end",
                    serde_json::json!({"callId": "c", "name": "Bash", "input": {"command": "cargo publish --dry-run"}}),
                ),
            ],
        )
        .await;
        let hits = store.search(words("frobnicator")).await.unwrap();
        let got: Vec<(i64, &str)> = hits
            .iter()
            .map(|h| (h.sequence_id, h.kind.as_str()))
            .collect();
        assert_eq!(got.len(), 2, "{hits:?}");
        assert!(got.contains(&(seqs[0], "user.text")) && got.contains(&(seqs[2], "text.end")));
        assert!(
            hits.iter()
                .all(|h| h.session_id == "a" && h.run_id.as_deref() == Some("r1"))
        );
        let prompt_hit = hits.iter().find(|h| h.kind == "user.text").unwrap();
        assert_eq!(prompt_hit.snippet, "please refactor the **Frobnicator**");
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        // The tool's command is indexed; its output is not.
        assert_eq!(
            found(&store, words("publish")).await,
            vec![("a".into(), seqs[3])]
        );
        assert_eq!(found(&store, words("frob*")).await.len(), 2);
        // Case and accents fold.
        append(&store, vec![answer("b", 5, "un Café crème")]).await;
        assert_eq!(found(&store, words("CAFE")).await.len(), 1);
        drop(store);
        threads.shutdown().await;
    }

    /// bm25 order: the bracket that says the word most (for its length) comes first, across
    /// sessions; a session filter keeps only its own; the limit keeps the best.
    #[tokio::test]
    async fn hits_come_in_rank_order_and_respect_the_filter_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let filler = "and some other words that say nothing in particular at all";
        let seqs = append(
            &store,
            vec![
                answer("a", 1, &format!("marmalade once {filler} {filler}")),
                prompt("b", 2, "marmalade marmalade marmalade"),
                answer("b", 3, &format!("marmalade marmalade {filler}")),
                prompt("c", 4, "nothing to see"),
            ],
        )
        .await;
        let all = found(&store, words("marmalade")).await;
        assert_eq!(
            all,
            vec![
                ("b".into(), seqs[1]),
                ("b".into(), seqs[2]),
                ("a".into(), seqs[0])
            ]
        );
        let only_a = SearchQuery {
            sessions: Some(vec!["a".into(), "c".into()]),
            ..words("marmalade")
        };
        assert_eq!(found(&store, only_a).await, vec![("a".into(), seqs[0])]);
        let none = SearchQuery {
            sessions: Some(vec![]),
            ..words("marmalade")
        };
        assert!(found(&store, none).await.is_empty());
        let one = SearchQuery {
            limit: 1,
            ..words("marmalade")
        };
        assert_eq!(found(&store, one).await, vec![("b".into(), seqs[1])]);
        // Limit 0 reads as 1; past the most, the most.
        let zero = SearchQuery {
            limit: 0,
            ..words("marmalade")
        };
        assert_eq!(found(&store, zero).await.len(), 1);
        // Every word must match.
        assert_eq!(
            found(&store, words("marmalade once")).await,
            vec![("a".into(), seqs[0])]
        );
        drop(store);
        threads.shutdown().await;
    }

    /// The index row is part of its event's commit: a group that fails to commit (a full
    /// disk) leaves no index row behind, and the store, once healthy again, finds only what
    /// was committed.
    #[tokio::test]
    async fn a_failed_commit_leaves_no_index_row() {
        use crate::store::{Job, WriteCmd};
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let kept = append(&store, vec![prompt("a", 1, "kept walrus")]).await;
        let mut health = store.watch_health();
        let cap = |limit: Option<i64>| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let job: Job = Box::new(move |conn| {
                let pages = limit.unwrap_or_else(|| {
                    conn.query_row("PRAGMA page_count", [], |r| r.get(0))
                        .unwrap()
                });
                conn.pragma_update(None, "max_page_count", pages).unwrap();
                tx.send(()).unwrap();
            });
            (job, rx)
        };
        let (job, done) = cap(None);
        store
            .writer
            .send(WriteCmd::Unchecked(job))
            .await
            .ok()
            .unwrap();
        done.await.unwrap();
        let big = format!("lost walrus {}", "word ".repeat(20_000));
        let failed = store
            .append(vec![answer("a", 2, &big), answer("a", 3, &big)])
            .await
            .unwrap();
        assert!(matches!(
            failed.await.unwrap(),
            Err(StoreError::CommitFailed(_))
        ));
        let (job, done) = cap(Some(1_000_000));
        store
            .writer
            .send(WriteCmd::Unchecked(job))
            .await
            .ok()
            .unwrap();
        done.await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while !health.borrow_and_update().is_ok() {
                health.changed().await.unwrap();
            }
        })
        .await
        .unwrap();
        assert_eq!(
            found(&store, words("walrus")).await,
            vec![("a".into(), kept[0])]
        );
        assert!(found(&store, words("lost")).await.is_empty());
        drop(store);
        threads.shutdown().await;
    }

    /// Deleting a session removes its index rows (and only its own).
    #[tokio::test]
    async fn deleting_a_session_removes_its_index_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        store.insert_session(session("a")).await.unwrap();
        store.insert_session(session("b")).await.unwrap();
        let seqs = append(
            &store,
            vec![prompt("a", 1, "walrus"), answer("b", 2, "walrus too")],
        )
        .await;
        assert!(store.delete_session("a".into()).await.unwrap());
        assert_eq!(
            found(&store, words("walrus")).await,
            vec![("b".into(), seqs[1])]
        );
        let rows = store
            .read(|conn| {
                Ok(
                    conn.query_row("SELECT count(*) FROM messages_fts", [], |r| {
                        r.get::<_, i64>(0)
                    })?,
                )
            })
            .await
            .unwrap();
        assert_eq!(rows, 1, "the deleted session's row is gone from the index");
        drop(store);
        threads.shutdown().await;
    }

    /// Hostile queries: as words they are text (or refused as empty); as FTS5 syntax a
    /// malformed one is `BadQuery`, never an internal error, and the store goes on serving.
    #[tokio::test]
    async fn hostile_queries_are_text_or_bad_query_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let seqs = append(
            &store,
            vec![prompt("a", 1, "what is NEAR or far, \"quoted\"")],
        )
        .await;
        for q in ["NEAR(", "OR", "\"quoted", "near( OR", "far,"] {
            assert_eq!(
                found(&store, words(q)).await,
                vec![("a".into(), seqs[0])],
                "{q:?}"
            );
        }
        for q in ["\"", "*", "", "( )", "\"\"\"\""] {
            assert!(
                matches!(store.search(words(q)).await, Err(StoreError::BadQuery(_))),
                "{q:?}"
            );
        }
        for q in [
            "\"",
            "NEAR(",
            "OR",
            "a OR",
            "*",
            "nope:word",
            "(a",
            "a AND",
            "NEAR(a b, x)",
        ] {
            let raw = SearchQuery {
                syntax: Syntax::Fts5,
                ..words(q)
            };
            match store.search(raw).await {
                Err(StoreError::BadQuery(m)) => assert!(!m.is_empty()),
                other => panic!("{q:?}: {other:?}"),
            }
        }
        // Deep nesting, as long as a query may be: an answer or a query error, never the
        // store's own failure.
        let deep = format!("{}what{}", "(".repeat(500), ")".repeat(500));
        let raw = SearchQuery {
            syntax: Syntax::Fts5,
            ..words(&deep)
        };
        match store.search(raw).await {
            Ok(_) | Err(StoreError::BadQuery(_)) => {}
            Err(e) => panic!("deep nesting: {e:?}"),
        }
        let raw = SearchQuery {
            syntax: Syntax::Fts5,
            ..words("NEAR(what far, 5) OR nothing")
        };
        assert_eq!(found(&store, raw).await, vec![("a".into(), seqs[0])]);
        drop(store);
        threads.shutdown().await;
    }
}
