//! When each subscriber was last seen (migration 12's `subscribers.last_seen_at`): written
//! when it connects or asks for a fresh grant, read by `subscriber.list`, and the range the
//! pruning of subscribers that never come back reads (`crate::subscribers::prune`).

use std::collections::HashMap;

use rusqlite::params;

use super::{Store, StoreResult, sql};

impl Store {
    /// `id` was seen at `at_ms`; `false` when there is no such subscriber.
    pub async fn touch_subscriber(&self, id: String, at_ms: i64) -> StoreResult<bool> {
        self.write(move |conn| Ok(conn.execute(sql::TOUCH_SUBSCRIBER, params![id, at_ms])? > 0))
            .await
    }

    /// Every subscriber's last sighting by id (`None`: never seen since it was added).
    pub async fn subscribers_last_seen(&self) -> StoreResult<HashMap<String, Option<i64>>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql::LIST_SUBSCRIBERS_SEEN)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
                })?
                .collect::<Result<HashMap<_, _>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The subscribers last seen before `before_ms` (or never seen, and added before it).
    pub async fn stale_subscribers(&self, before_ms: i64) -> StoreResult<Vec<String>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::STALE_SUBSCRIBERS)?;
            let rows = stmt
                .query_map([before_ms], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
