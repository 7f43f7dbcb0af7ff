//! Pairing rows (migration 13): `pairing_secrets`, the audit trail and single-use mark of every
//! pairing code, and `paired_bots`, every bot that paired. `crate::seal::pairs` is the only
//! caller; it keeps the secrets themselves in memory and hands the store their hashes. Scopes
//! are JSON text here, opaque to the store.

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreResult, sql};

/// A `pairing_secrets` row to write when a code is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairingSecretRow {
    pub secret_id: String,
    /// SHA-256 of the secret.
    pub secret_hash: [u8; 32],
    pub scope: String,
    pub name: Option<String>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
}

/// A `paired_bots` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairedBotRow {
    pub bot_id: String,
    pub public_key: Vec<u8>,
    pub name: String,
    pub scope: String,
    pub paired_at_ms: i64,
    pub last_seen_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
}

fn paired_bot_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PairedBotRow> {
    Ok(PairedBotRow {
        bot_id: r.get(0)?,
        public_key: r.get(1)?,
        name: r.get(2)?,
        scope: r.get(3)?,
        paired_at_ms: r.get(4)?,
        last_seen_at_ms: r.get(5)?,
        revoked_at_ms: r.get(6)?,
    })
}

impl Store {
    pub async fn insert_pairing_secret(&self, row: PairingSecretRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::INSERT_PAIRING_SECRET,
                params![
                    row.secret_id,
                    row.secret_hash.as_slice(),
                    row.scope,
                    row.name,
                    row.created_at_ms,
                    row.expires_at_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Use the secret `secret_id` (whose hash is `secret_hash`) at `at_ms` and store `bot`,
    /// in one transaction: `false`, and nothing changed, when the secret is unknown, used or
    /// expired — so of two pairings with one secret exactly one succeeds.
    pub async fn complete_pairing(
        &self,
        secret_id: String,
        secret_hash: [u8; 32],
        at_ms: i64,
        bot: PairedBotRow,
    ) -> StoreResult<bool> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let used = tx.execute(
                sql::USE_PAIRING_SECRET,
                params![secret_id, at_ms, secret_hash.as_slice()],
            )?;
            if used == 0 {
                return Ok(false);
            }
            tx.execute(
                sql::UPSERT_PAIRED_BOT,
                params![
                    bot.bot_id,
                    bot.public_key,
                    bot.name,
                    bot.scope,
                    bot.paired_at_ms
                ],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    pub async fn paired_bot(&self, bot_id: String) -> StoreResult<Option<PairedBotRow>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(sql::GET_PAIRED_BOT)?
                .query_row([&bot_id], paired_bot_from_row)
                .optional()?)
        })
        .await
    }

    /// Every paired bot, revoked ones too, in the order they paired.
    pub async fn paired_bots(&self) -> StoreResult<Vec<PairedBotRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql::LIST_PAIRED_BOTS)?;
            let rows = stmt
                .query_map([], paired_bot_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Revoke `bot_id` at `at_ms` (a bot revoked before keeps its first time): its row after,
    /// `None` when there is no such bot.
    pub async fn revoke_paired_bot(
        &self,
        bot_id: String,
        at_ms: i64,
    ) -> StoreResult<Option<PairedBotRow>> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            if tx.execute(sql::REVOKE_PAIRED_BOT, params![bot_id, at_ms])? == 0 {
                return Ok(None);
            }
            let row = tx
                .prepare_cached(sql::GET_PAIRED_BOT)?
                .query_row([&bot_id], paired_bot_from_row)
                .optional()?;
            tx.commit()?;
            Ok(row)
        })
        .await
    }

    /// Change a bot's stored scope: `change` gets the scope's text and gives the new text
    /// (`None`: leave it). Read and write are one transaction on the writer, so two changes at
    /// once both stay. `false` when there is no such bot.
    pub async fn update_paired_bot_scope<F>(&self, bot_id: String, change: F) -> StoreResult<bool>
    where
        F: FnOnce(&str) -> Option<String> + Send + 'static,
    {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let Some(row) = tx
                .prepare_cached(sql::GET_PAIRED_BOT)?
                .query_row([&bot_id], paired_bot_from_row)
                .optional()?
            else {
                return Ok(false);
            };
            if let Some(scope) = change(&row.scope) {
                tx.execute(sql::SET_PAIRED_BOT_SCOPE, params![bot_id, scope])?;
            }
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// `bot_id` was seen at `at_ms`; `false` when there is no such bot.
    pub async fn touch_paired_bot(&self, bot_id: String, at_ms: i64) -> StoreResult<bool> {
        self.write(move |conn| Ok(conn.execute(sql::TOUCH_PAIRED_BOT, params![bot_id, at_ms])? > 0))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bot(id: &str, name: &str) -> PairedBotRow {
        PairedBotRow {
            bot_id: id.into(),
            public_key: vec![1; 32],
            name: name.into(),
            scope: "{}".into(),
            paired_at_ms: 100,
            last_seen_at_ms: None,
            revoked_at_ms: None,
        }
    }

    #[tokio::test]
    async fn a_secret_is_used_once_and_never_after_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let secret = |id: &str| PairingSecretRow {
            secret_id: id.into(),
            secret_hash: [5; 32],
            scope: "{}".into(),
            name: Some("phone".into()),
            created_at_ms: 0,
            expires_at_ms: 1000,
        };
        store.insert_pairing_secret(secret("a")).await.unwrap();
        store.insert_pairing_secret(secret("b")).await.unwrap();
        // A wrong hash, then the right one, then a second use.
        assert!(
            !store
                .complete_pairing("a".into(), [6; 32], 10, bot("x", "n"))
                .await
                .unwrap()
        );
        assert!(
            store
                .complete_pairing("a".into(), [5; 32], 10, bot("x", "n"))
                .await
                .unwrap()
        );
        assert!(
            !store
                .complete_pairing("a".into(), [5; 32], 11, bot("y", "n"))
                .await
                .unwrap()
        );
        assert_eq!(store.paired_bot("y".into()).await.unwrap(), None);
        // Expired: refused, and no bot is stored.
        assert!(
            !store
                .complete_pairing("b".into(), [5; 32], 1000, bot("y", "n"))
                .await
                .unwrap()
        );
        assert!(
            !store
                .complete_pairing("zz".into(), [5; 32], 10, bot("y", "n"))
                .await
                .unwrap()
        );
        assert_eq!(store.paired_bots().await.unwrap(), vec![bot("x", "n")]);

        assert!(store.touch_paired_bot("x".into(), 50).await.unwrap());
        assert!(!store.touch_paired_bot("nobody".into(), 50).await.unwrap());
        let revoked = store
            .revoke_paired_bot("x".into(), 60)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(revoked.revoked_at_ms, Some(60));
        assert_eq!(revoked.last_seen_at_ms, Some(50));
        let again = store
            .revoke_paired_bot("x".into(), 70)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.revoked_at_ms, Some(60), "the first revocation stands");
        assert_eq!(
            store.revoke_paired_bot("nobody".into(), 70).await.unwrap(),
            None
        );

        // Paired again with a new secret: a new name, no longer revoked.
        store.insert_pairing_secret(secret("c")).await.unwrap();
        assert!(
            store
                .complete_pairing("c".into(), [5; 32], 20, bot("x", "renamed"))
                .await
                .unwrap()
        );
        let row = store.paired_bot("x".into()).await.unwrap().unwrap();
        assert_eq!((row.name.as_str(), row.revoked_at_ms), ("renamed", None));
        drop(store);
        threads.shutdown().await;
    }
}
