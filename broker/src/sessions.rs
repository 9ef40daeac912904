//! The approval page's login sessions as Redis keeps them: one key per session
//! issued (`keys::web_session`), holding who it was issued to and under which
//! password, expiring with the session.
//!
//! Invariants:
//! - A session is valid only while its key holds exactly the record the page
//!   issued: logout deletes the key, a changed password changes the record the
//!   page expects, so either ends every copy of the cookie.
//! - Only the page's Redis user reaches these keys (`acl::rules`); nothing
//!   else in the broker reads them.

use redis::AsyncCommands;

use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

impl Store {
    /// The record of session `nonce`, while it is neither expired nor ended.
    pub async fn session_record(&mut self, nonce: &str) -> Result<Option<String>> {
        // The key holds the nonce: it stays out of errors (and so of logs).
        self.conn
            .get(keys::web_session(nonce))
            .await
            .map_err(|e| Error::from_redis("GET web session", e))
    }

    /// Issues session `nonce` with `record` for `secs` seconds (at least one).
    pub async fn open_session(&mut self, nonce: &str, record: &str, secs: u64) -> Result<()> {
        self.conn
            .set_ex(keys::web_session(nonce), record, secs.max(1))
            .await
            .map_err(|e| Error::from_redis("SET web session", e))
    }

    /// Ends session `nonce` (logout): every copy of its cookie stops working.
    pub async fn end_session(&mut self, nonce: &str) -> Result<()> {
        self.conn
            .del(keys::web_session(nonce))
            .await
            .map_err(|e| Error::from_redis("DEL web session", e))
    }
}
