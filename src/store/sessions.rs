//! The paged session list (`session.list`) and the two columns that make it cheap.
//!
//! A page is one keyset range of an index: newest activity first (`last_activity_at DESC`),
//! ties by session id (ascending), resuming strictly after the last row of the previous page.
//! The cursor is that row's `(last_activity_at, id)`, base64url, opaque to clients. Because a
//! page never counts rows (no OFFSET), each page costs the same however deep it is, and a
//! session created while a client pages has newer activity than every cursor handed out, so
//! it lands before the cursor: paging visits every other session exactly once and none twice.
//! A session whose activity moves while a client pages moves to the front too: that pass sees
//! it at most once (before the move, or not at all), and the next pass from the top sees it.
//!
//! `sessions.last_activity_at` and `sessions.preview` are kept by the append path
//! ([`touch_sessions`], in the group commit's own transaction), so the list never reads
//! `messages`. Every filter has an index that ends in the list's order (schema version 4);
//! `only` (a scoped client's sessions) is a primary-key lookup per id and a sort of those.
//! A test holds every query shape to an index with `EXPLAIN QUERY PLAN`.

use std::borrow::Cow;
use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rusqlite::types::Value;
use rusqlite::{Connection, Transaction, params, params_from_iter};

use super::{NewEvent, Store, StoreError, StoreResult, session_from_row, sql};

/// The page size when a client names none.
pub const DEFAULT_SESSION_PAGE: u32 = 50;
/// The largest page; a larger limit is clamped to this.
pub const MAX_SESSION_PAGE: u32 = 200;
/// A preview holds at most this many characters (Unicode scalar values, as SQLite's `substr`
/// counts them) of the newest message's text.
pub const PREVIEW_CHARS: usize = 160;
/// A cursor longer than this was not handed out by this store.
const MAX_CURSOR_LEN: usize = 1024;

/// One request for a page of sessions. Filters combine with AND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionQuery {
    /// Rows per page, clamped to `1..=`[`MAX_SESSION_PAGE`].
    pub limit: u32,
    /// The previous page's `next_cursor`; `None` for the first page.
    pub cursor: Option<String>,
    pub state: Option<String>,
    pub agent_type: Option<String>,
    pub cwd: Option<String>,
    /// Only these sessions (a scoped client's); `None` for all of them.
    pub only: Option<Vec<String>>,
}

impl Default for SessionQuery {
    fn default() -> Self {
        SessionQuery {
            limit: DEFAULT_SESSION_PAGE,
            cursor: None,
            state: None,
            agent_type: None,
            cwd: None,
            only: None,
        }
    }
}

/// A session as the list shows it, and one page of the list: the reply types clients read too.
pub use crate::protocol::replies::{SessionPage, SessionSummary as SessionListRow};

/// Where a page resumes: strictly after this row in list order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    last_activity_ms: i64,
    session_id: String,
}

impl Cursor {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}:{}", self.last_activity_ms, self.session_id))
    }

    fn decode(cursor: &str) -> StoreResult<Cursor> {
        let bad = |why: &str| StoreError::BadCursor(why.to_owned());
        if cursor.len() > MAX_CURSOR_LEN {
            return Err(bad("too long"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| bad("not base64url"))?;
        let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let (ms, id) = text.split_once(':').ok_or_else(|| bad("no separator"))?;
        let last_activity_ms = ms.parse().map_err(|_| bad("no activity time"))?;
        if id.is_empty() {
            return Err(bad("no session id"));
        }
        Ok(Cursor {
            last_activity_ms,
            session_id: id.to_owned(),
        })
    }
}

/// The SQL and parameters of one page: only the filters that are set appear, so SQLite plans
/// each shape against its own index. Asks for `limit + 1` rows (the extra one says whether a
/// next page exists).
fn page_sql(
    query: &SessionQuery,
    cursor: Option<&Cursor>,
    only: Option<String>,
    limit: u32,
) -> (String, Vec<Value>) {
    let mut sql = String::from(sql::LIST_SELECT);
    let mut args: Vec<Value> = Vec::new();
    let mut clauses: Vec<String> = Vec::new();
    let arg = |v: Value, args: &mut Vec<Value>| {
        args.push(v);
        format!("?{}", args.len())
    };
    // With `only`, the few named rows are looked up by primary key and sorted: a unary `+`
    // keeps SQLite from walking a filter's (or the activity) index instead, which would
    // visit every session in that range to find the named ones.
    let plus = if only.is_some() { "+" } else { "" };
    for (column, value) in [
        ("state", &query.state),
        ("agent_type", &query.agent_type),
        ("cwd", &query.cwd),
    ] {
        if let Some(value) = value {
            let n = arg(Value::Text(value.clone()), &mut args);
            clauses.push(format!("{plus}{column} = {n}"));
        }
    }
    if let Some(ids) = only {
        let n = arg(Value::Text(ids), &mut args);
        clauses.push(sql::LIST_ONLY_IN.replace("?N", &n));
    }
    if let Some(c) = cursor {
        // Row values cannot mix DESC and ASC; the first term is the index range, the second
        // the tie-break within the cursor's millisecond.
        let ms = arg(Value::Integer(c.last_activity_ms), &mut args);
        let id = arg(Value::Text(c.session_id.clone()), &mut args);
        clauses.push(format!(
            "{plus}last_activity_at <= {ms} AND ({plus}last_activity_at < {ms} OR id > {id})"
        ));
    }
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    let n = arg(Value::Integer(i64::from(limit) + 1), &mut args);
    sql.push_str(&format!(" ORDER BY last_activity_at DESC, id LIMIT {n}"));
    (sql, args)
}

/// Every shape [`page_sql`] composes (each filter on or off, `only` or not, a cursor or not),
/// with arguments, and whether it is the unfiltered first page: what the plan test walks.
#[cfg(test)]
pub(super) fn every_page_shape() -> Vec<(bool, String, Vec<Value>)> {
    let cursor = Cursor {
        last_activity_ms: 250,
        session_id: "s250".into(),
    };
    let set = |on: bool, v: &str| on.then(|| v.to_owned());
    let mut shapes = Vec::new();
    for mask in 0..16u32 {
        for with_cursor in [false, true] {
            let query = SessionQuery {
                state: set(mask & 1 != 0, "idle"),
                agent_type: set(mask & 2 != 0, "claude"),
                cwd: set(mask & 4 != 0, "/w"),
                ..Default::default()
            };
            let only = (mask & 8 != 0).then(|| r#"["s1","s2"]"#.to_owned());
            let (sql, args) = page_sql(&query, with_cursor.then_some(&cursor), only, 50);
            shapes.push((mask == 0 && !with_cursor, sql, args));
        }
    }
    shapes
}

/// Run one page query on `conn` (the reader's connection; the benchmark's raw one too).
fn read_page(conn: &Connection, query: &SessionQuery) -> StoreResult<SessionPage> {
    let cursor = query.cursor.as_deref().map(Cursor::decode).transpose()?;
    let limit = query.limit.clamp(1, MAX_SESSION_PAGE);
    let only = match &query.only {
        Some(ids) if ids.is_empty() => {
            return Ok(SessionPage {
                sessions: Vec::new(),
                next_cursor: None,
            });
        }
        Some(ids) => Some(serde_json::Value::from(ids.clone()).to_string()),
        None => None,
    };
    let (sql, args) = page_sql(query, cursor.as_ref(), only, limit);
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut sessions = stmt
        .query_map(params_from_iter(args), |r| {
            Ok(SessionListRow {
                session: session_from_row(r)?,
                last_activity_ms: r.get(10)?,
                preview: r.get(11)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let more = sessions.len() > limit as usize;
    sessions.truncate(limit as usize);
    let next_cursor = match sessions.last() {
        Some(last) if more => Some(
            Cursor {
                last_activity_ms: last.last_activity_ms,
                session_id: last.session.session_id.clone(),
            }
            .encode(),
        ),
        _ => None,
    };
    Ok(SessionPage {
        sessions,
        next_cursor,
    })
}

impl Store {
    /// One page of sessions matching `query`, newest activity first (see the module doc). A
    /// cursor this store did not hand out is [`StoreError::BadCursor`].
    pub async fn list_sessions_page(&self, query: SessionQuery) -> StoreResult<SessionPage> {
        self.read(move |conn| read_page(conn, &query)).await
    }
}

/// The start of a `user.text` / `text.end` payload's `text`, or `None` if it has none.
fn preview_of(payload: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Text<'a> {
        #[serde(borrow)]
        text: Cow<'a, str>,
    }
    let parsed: Text<'_> = serde_json::from_str(payload).ok()?;
    Some(cut_preview(&parsed.text))
}

/// At most [`PREVIEW_CHARS`] characters of `text`, cut at a character boundary.
fn cut_preview(text: &str) -> String {
    let end = text
        .char_indices()
        .nth(PREVIEW_CHARS)
        .map_or(text.len(), |(i, _)| i);
    text.get(..end).unwrap_or(text).to_owned()
}

/// Bring the list columns of every session in a committing group up to date: activity moves
/// to the group's newest event of the session (never back), and the preview to its newest
/// text. One UPDATE per session touched, however many events; only the newest text event of
/// each session is parsed. An event of a session without a row updates nothing.
pub(super) fn touch_sessions<'a>(
    tx: &Transaction<'_>,
    events: impl Iterator<Item = &'a NewEvent>,
) -> rusqlite::Result<()> {
    let mut touched: HashMap<&str, (i64, Option<&NewEvent>)> = HashMap::new();
    for e in events {
        let entry = touched.entry(&e.session_id).or_insert((e.created_at, None));
        entry.0 = entry.0.max(e.created_at);
        if matches!(e.kind, "user.text" | "text.end") {
            entry.1 = Some(e);
        }
    }
    let mut stmt = tx.prepare_cached(sql::TOUCH_SESSION)?;
    for (session_id, (at, text)) in touched {
        let preview = text.and_then(|e| preview_of(&e.payload));
        stmt.execute(params![session_id, at, preview])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    /// The first page of the list as (id, last activity, preview), newest first.
    async fn first_page_activity(store: &Store) -> Vec<(String, i64, Option<String>)> {
        let page = store
            .list_sessions_page(SessionQuery::default())
            .await
            .unwrap();
        page.sessions
            .into_iter()
            .map(|r| (r.session.session_id, r.last_activity_ms, r.preview))
            .collect()
    }
    use super::*;
    use crate::store::now_ms;
    use std::collections::HashSet;

    fn row(id: &str, at: i64) -> super::super::SessionRow {
        super::super::SessionRow {
            session_id: id.into(),
            agent_type: "claude".into(),
            native_session_id: None,
            cwd: "/w".into(),
            parent_session_id: None,
            title: None,
            state: crate::protocol::states::SessionState::Idle,
            created_at_ms: at,
            updated_at_ms: at,
            fork_of: None,
            options: Default::default(),
            binding: None,
        }
    }

    fn text_event(session: &str, n: usize, kind: &'static str, text: &str, at: i64) -> NewEvent {
        NewEvent {
            message_id: format!("m{n}").into(),
            session_id: session.into(),
            run_id: None,
            kind,
            payload: serde_json::json!({"k": kind, "sessionId": session, "text": text})
                .to_string()
                .into(),
            created_at: at,
        }
    }

    async fn open() -> (tempfile::TempDir, Store, super::super::StoreThreads) {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        (dir, store, threads)
    }

    /// Every page from the first, in order, with the query's filters.
    async fn all_pages(store: &Store, query: SessionQuery) -> Vec<Vec<SessionListRow>> {
        let mut pages = Vec::new();
        let mut query = SessionQuery {
            cursor: None,
            ..query
        };
        loop {
            let page = store.list_sessions_page(query.clone()).await.unwrap();
            assert!(page.sessions.len() <= query.limit.clamp(1, MAX_SESSION_PAGE) as usize);
            pages.push(page.sessions);
            match page.next_cursor {
                Some(c) => query.cursor = Some(c),
                None => return pages,
            }
            assert!(pages.len() < 10_000, "paging does not end");
        }
    }

    fn ids(rows: &[SessionListRow]) -> Vec<String> {
        rows.iter().map(|r| r.session.session_id.clone()).collect()
    }

    #[tokio::test]
    async fn paging_visits_every_session_once_in_activity_order() {
        let (_dir, store, threads) = open().await;
        // Many ties: 137 sessions over 20 distinct milliseconds.
        let mut expected = Vec::new();
        for i in 0..137 {
            let id = format!("s{:03}", (i * 37) % 137);
            let at = 1_000 + (i as i64 % 20);
            store.insert_session(row(&id, at)).await.unwrap();
            expected.push((at, id));
        }
        expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let expected: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();
        for limit in [1, 10, 50, 136, 137, 500] {
            let pages = all_pages(
                &store,
                SessionQuery {
                    limit,
                    ..Default::default()
                },
            )
            .await;
            let seen: Vec<String> = pages.iter().flat_map(|p| ids(p)).collect();
            assert_eq!(seen, expected, "limit {limit}");
            // The last page is the only short one, and no empty page follows a full one.
            let limit = limit.min(MAX_SESSION_PAGE) as usize;
            for page in &pages[..pages.len() - 1] {
                assert_eq!(page.len(), limit);
            }
            assert!(!pages[pages.len() - 1].is_empty());
        }
        // A limit of 0 is clamped to 1, and the default is 50.
        let one = store
            .list_sessions_page(SessionQuery {
                limit: 0,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(ids(&one.sessions), vec![expected[0].clone()]);
        let first = store
            .list_sessions_page(SessionQuery::default())
            .await
            .unwrap();
        assert_eq!(first.sessions.len(), 50);
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn sessions_created_while_paging_do_not_disturb_the_pass() {
        let (_dir, store, threads) = open().await;
        let base = now_ms() - 60_000;
        let mut before = HashSet::new();
        for i in 0..60 {
            let id = format!("old-{i:02}");
            // Ties in the same millisecond too.
            store.insert_session(row(&id, base + i / 3)).await.unwrap();
            before.insert(id);
        }
        // A task creating sessions the whole time, and more between pages.
        let creator = {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..200 {
                    store
                        .insert_session(row(&format!("bg-{i:03}"), now_ms()))
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut query = SessionQuery {
            limit: 7,
            ..Default::default()
        };
        let mut seen = Vec::new();
        let mut n = 0;
        loop {
            let page = store.list_sessions_page(query.clone()).await.unwrap();
            seen.extend(ids(&page.sessions));
            // Newer than every cursor, and one in the cursor's own millisecond sorting before
            // and after its id.
            store
                .insert_session(row(&format!("new-{n:02}"), now_ms()))
                .await
                .unwrap();
            if let Some(last) = page.sessions.last() {
                let at = last.last_activity_ms;
                for id in [format!("a{n}"), format!("zz{n}")] {
                    store.insert_session(row(&id, at)).await.unwrap();
                }
            }
            n += 1;
            match page.next_cursor {
                Some(c) => query.cursor = Some(c),
                None => break,
            }
        }
        creator.await.unwrap();
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "a session was listed twice");
        for id in &before {
            assert_eq!(
                seen.iter().filter(|s| *s == id).count(),
                1,
                "{id} was not listed exactly once"
            );
        }
        assert!(n >= 60 / 7, "{n} pages");
        drop(store);
        threads.shutdown().await;
    }

    /// Which rows a filter case should list.
    type Keep = Box<dyn Fn(&super::super::SessionRow) -> bool>;

    #[tokio::test]
    async fn filters_select_the_matching_sessions_in_order() {
        let (_dir, store, threads) = open().await;
        let agents = ["claude", "codex", "acp"];
        let states = ["idle", "running"];
        let cwds = ["/a", "/b", "/c", "/d"];
        let mut all = Vec::new();
        for i in 0..120usize {
            let r = super::super::SessionRow {
                agent_type: agents[i % 3].into(),
                state: crate::protocol::states::SessionState::parse(states[i % 2]).unwrap(),
                cwd: cwds[i % 4].into(),
                ..row(&format!("s{i:03}"), 1_000 + i as i64 / 2)
            };
            store.insert_session(r.clone()).await.unwrap();
            all.push(r);
        }
        // Newest first; ties by id.
        all.sort_by(|a, b| {
            b.created_at_ms
                .cmp(&a.created_at_ms)
                .then(a.session_id.cmp(&b.session_id))
        });
        let only: Vec<String> = ["s007", "s050", "s051", "s119", "nope", "s007"]
            .map(String::from)
            .to_vec();
        let cases: Vec<(SessionQuery, Keep)> = vec![
            (
                SessionQuery {
                    state: Some("running".into()),
                    ..Default::default()
                },
                Box::new(|r| r.state.as_str() == "running"),
            ),
            (
                SessionQuery {
                    agent_type: Some("codex".into()),
                    ..Default::default()
                },
                Box::new(|r| r.agent_type == "codex"),
            ),
            (
                SessionQuery {
                    cwd: Some("/c".into()),
                    ..Default::default()
                },
                Box::new(|r| r.cwd == "/c"),
            ),
            (
                SessionQuery {
                    only: Some(only.clone()),
                    ..Default::default()
                },
                Box::new(|r| ["s007", "s050", "s051", "s119"].contains(&&*r.session_id)),
            ),
            (
                SessionQuery {
                    state: Some("idle".into()),
                    agent_type: Some("acp".into()),
                    cwd: Some("/a".into()),
                    ..Default::default()
                },
                Box::new(|r| r.state.as_str() == "idle" && r.agent_type == "acp" && r.cwd == "/a"),
            ),
            (
                SessionQuery {
                    state: Some("running".into()),
                    only: Some(only.clone()),
                    ..Default::default()
                },
                Box::new(|r| {
                    r.state.as_str() == "running"
                        && ["s007", "s050", "s051", "s119"].contains(&&*r.session_id)
                }),
            ),
            (
                SessionQuery {
                    only: Some(Vec::new()),
                    ..Default::default()
                },
                Box::new(|_| false),
            ),
            (
                SessionQuery {
                    state: Some("no-such-state".into()),
                    ..Default::default()
                },
                Box::new(|_| false),
            ),
        ];
        for (query, keep) in cases {
            let expected: Vec<String> = all
                .iter()
                .filter(|r| keep(r))
                .map(|r| r.session_id.clone())
                .collect();
            for limit in [3, 200] {
                let pages = all_pages(
                    &store,
                    SessionQuery {
                        limit,
                        ..query.clone()
                    },
                )
                .await;
                let seen: Vec<String> = pages.iter().flat_map(|p| ids(p)).collect();
                assert_eq!(seen, expected, "{query:?} limit {limit}");
            }
        }
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_row_inserted_after_its_events_takes_their_activity_and_preview() {
        let (_dir, store, threads) = open().await;
        // An import publishes the agent's history before its row exists.
        store
            .append(vec![
                text_event("imp", 1, "user.text", "an earlier prompt", 4_000),
                text_event("imp", 2, "text.end", "the agent's earlier answer", 4_500),
            ])
            .await
            .unwrap()
            .await
            .unwrap()
            .unwrap();
        store.insert_session(row("imp", 1_000)).await.unwrap();
        store.insert_session(row("fresh", 2_000)).await.unwrap();
        let got = first_page_activity(&store).await;
        let got: Vec<_> = got
            .iter()
            .map(|(id, at, preview)| (id.as_str(), *at, preview.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("imp", 4_500, Some("the agent's earlier answer")),
                ("fresh", 2_000, None)
            ]
        );
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn appends_move_activity_and_preview() {
        let (_dir, store, threads) = open().await;
        store.insert_session(row("a", 1_000)).await.unwrap();
        store.insert_session(row("b", 2_000)).await.unwrap();
        let first = |store: Store| async move {
            let page = store
                .list_sessions_page(SessionQuery::default())
                .await
                .unwrap();
            page.sessions.into_iter().next().unwrap()
        };
        let top = first(store.clone()).await;
        assert_eq!(top.session.session_id, "b");
        assert_eq!((top.last_activity_ms, top.preview), (2_000, None));

        // A user message in "a" moves it to the top with its text as the preview.
        let commit = |events: Vec<NewEvent>| {
            let store = store.clone();
            async move { store.append(events).await.unwrap().await.unwrap().unwrap() }
        };
        commit(vec![text_event("a", 1, "user.text", "hello there", 5_000)]).await;
        let top = first(store.clone()).await;
        assert_eq!(top.session.session_id, "a");
        assert_eq!(top.last_activity_ms, 5_000);
        assert_eq!(top.preview.as_deref(), Some("hello there"));

        // Other events move the activity but keep the preview; an older event never moves
        // it back; in one group the newest text wins.
        let mut tool = text_event("a", 2, "tool.exec.end", "not a preview", 6_000);
        tool.payload = r#"{"k":"tool.exec.end","sessionId":"a","output":"x"}"#.into();
        commit(vec![
            tool,
            text_event("b", 3, "text.end", "older", 3_000),
            text_event("b", 4, "text.end", "newest in b", 3_500),
        ])
        .await;
        let got = first_page_activity(&store).await;
        let got: Vec<_> = got
            .iter()
            .map(|(id, at, preview)| (id.as_str(), *at, preview.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", 6_000, Some("hello there")),
                ("b", 3_500, Some("newest in b"))
            ]
        );
        commit(vec![text_event("b", 5, "thinking.end", "no", 100)]).await;
        let b = store
            .list_sessions_page(SessionQuery {
                only: Some(vec!["b".into()]),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(b.sessions[0].last_activity_ms, 3_500);
        assert_eq!(b.sessions[0].preview.as_deref(), Some("newest in b"));

        // A long multi-byte text is cut at a character boundary.
        let long = "é🙂x".repeat(100);
        commit(vec![text_event("b", 6, "text.end", &long, 9_000)]).await;
        let top = first(store.clone()).await;
        assert_eq!(top.session.session_id, "b");
        let preview = top.preview.unwrap();
        assert_eq!(preview.chars().count(), PREVIEW_CHARS);
        assert!(long.starts_with(&preview));
        // An event of a session without a row is stored and changes no row.
        commit(vec![text_event("ghost", 7, "user.text", "boo", 99_000)]).await;
        assert_eq!(first(store.clone()).await.session.session_id, "b");
        assert_eq!(store.count_sessions().await.unwrap(), 2);
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_malformed_cursor_is_refused() {
        let (_dir, store, threads) = open().await;
        for i in 0..3 {
            store
                .insert_session(row(&format!("s{i}"), 10 + i))
                .await
                .unwrap();
        }
        let page = store
            .list_sessions_page(SessionQuery {
                limit: 2,
                ..Default::default()
            })
            .await
            .unwrap();
        let cursor = page.next_cursor.unwrap();
        assert_eq!(
            Cursor::decode(&cursor).unwrap(),
            Cursor {
                last_activity_ms: 11,
                session_id: "s1".into()
            }
        );
        let garbage = [
            "not base64!".to_owned(),
            URL_SAFE_NO_PAD.encode("12"),
            URL_SAFE_NO_PAD.encode("12:"),
            URL_SAFE_NO_PAD.encode("twelve:s1"),
            URL_SAFE_NO_PAD.encode([0xff, 0xfe, b':', b'a']),
            "A".repeat(MAX_CURSOR_LEN + 1),
        ];
        for bad in garbage {
            let got = store
                .list_sessions_page(SessionQuery {
                    cursor: Some(bad.clone()),
                    ..Default::default()
                })
                .await;
            assert!(
                matches!(got, Err(StoreError::BadCursor(_))),
                "{bad:?}: {got:?}"
            );
        }
        drop(store);
        threads.shutdown().await;
    }

    /// The plan of `sql` (EXPLAIN QUERY PLAN's detail column, one step a line).
    fn plan_of(conn: &Connection, sql: &str, args: Vec<Value>) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let steps: Vec<String> = stmt
            .query_map(params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        steps.join("\n")
    }

    /// What is wrong with a page's plan, if anything: `messages` is never read; `sessions` is
    /// read through an index range (a SEARCH), except the unfiltered first page, which walks
    /// the activity index from its start and stops at the LIMIT; the index gives the order
    /// (no sort), except for `only`, whose rows are found by primary key and then sorted.
    fn plan_problem(plan: &str, first_unfiltered: bool, only: bool) -> Option<&'static str> {
        for step in plan.lines() {
            if step.contains("messages") {
                return Some("reads messages");
            }
            if step.contains("SCAN sessions")
                && !(first_unfiltered && step == "SCAN sessions USING INDEX sessions_activity")
            {
                return Some("scans sessions");
            }
        }
        if !plan.contains("SEARCH sessions USING INDEX") && !first_unfiltered {
            return Some("no index range on sessions");
        }
        match (only, plan.contains("TEMP B-TREE")) {
            (false, true) => Some("sorts"),
            (true, _) if !plan.contains("sqlite_autoindex_sessions_1 (id=?)") => {
                Some("only's ids are not looked up by key")
            }
            _ => None,
        }
    }

    /// Every shape of the page query reads an index range: no scan of `sessions` or
    /// `messages`, and no sort of the whole table (only `only`'s few rows are sorted).
    #[test]
    fn every_page_query_uses_an_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        // Enough rows that a scan would look like a choice to the planner.
        for i in 0..500 {
            conn.execute(
                "INSERT INTO sessions (id, agent_type, cwd, state, created_at, updated_at, \
                 last_activity_at) VALUES (?1, 'claude', '/w', 'idle', ?2, ?2, ?2)",
                params![format!("s{i}"), i],
            )
            .unwrap();
        }
        // The checker itself catches a scan and a sort.
        let bad = plan_of(
            &conn,
            "SELECT id FROM sessions WHERE title = ?1 ORDER BY created_at",
            vec![Value::Text("t".into())],
        );
        assert_eq!(
            plan_problem(&bad, false, false),
            Some("scans sessions"),
            "{bad}"
        );
        let sorted = plan_of(&conn, "SELECT id FROM sessions ORDER BY created_at", vec![]);
        assert!(plan_problem(&sorted, true, false).is_some(), "{sorted}");

        let cursor = Cursor {
            last_activity_ms: 250,
            session_id: "s250".into(),
        };
        let set = |on: bool, v: &str| on.then(|| v.to_owned());
        for mask in 0..16u32 {
            for with_cursor in [false, true] {
                let query = SessionQuery {
                    state: set(mask & 1 != 0, "idle"),
                    agent_type: set(mask & 2 != 0, "claude"),
                    cwd: set(mask & 4 != 0, "/w"),
                    ..Default::default()
                };
                let only = (mask & 8 != 0).then(|| r#"["s1","s2"]"#.to_owned());
                let (sql, args) = page_sql(&query, with_cursor.then_some(&cursor), only, 50);
                let plan = plan_of(&conn, &sql, args);
                let first_unfiltered = mask == 0 && !with_cursor;
                assert_eq!(
                    plan_problem(&plan, first_unfiltered, mask & 8 != 0),
                    None,
                    "{sql}\n{plan}"
                );
            }
        }
        // The append path's upkeep is one primary-key update per session.
        let touch = plan_of(
            &conn,
            sql::TOUCH_SESSION,
            vec![Value::Text("s1".into()), Value::Integer(1), Value::Null],
        );
        assert_eq!(
            touch,
            "SEARCH sessions USING INDEX sqlite_autoindex_sessions_1 (id=?)"
        );
    }

    #[test]
    fn previews_are_cut_at_a_character_boundary() {
        assert_eq!(cut_preview("short"), "short");
        let exact = "a".repeat(PREVIEW_CHARS);
        assert_eq!(cut_preview(&exact), exact);
        let long = format!("{exact}é");
        assert_eq!(cut_preview(&long), exact);
        let wide = "🙂".repeat(PREVIEW_CHARS + 1);
        assert_eq!(cut_preview(&wide).chars().count(), PREVIEW_CHARS);
        assert_eq!(
            preview_of(r#"{"k":"user.text","text":"a\"b"}"#).as_deref(),
            Some("a\"b")
        );
        assert_eq!(preview_of(r#"{"k":"user.text"}"#), None);
        assert_eq!(preview_of("not json"), None);
    }
}
