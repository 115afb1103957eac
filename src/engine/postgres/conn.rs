//! One connection to the PostgreSQL store, used from a thread that may
//! block (serve's writer, the leadership thread, the blocking pool): every
//! call runs to completion on the store's tokio runtime
//! (`Handle::block_on`) within a deadline, and a connection that failed or
//! timed out is dropped and made again on the next call (after a Patroni
//! switchover it then reaches the new primary, see `connect.rs`).
//!
//! Statements are prepared once per connection and kept, so each call is
//! one round trip (or less: a transaction's writes are pipelined).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_postgres::{Client, Statement};

use super::connect::PgConfig;
use crate::engine::error::StoreError;

/// The longest any one call may take (a statement, a commit, a connect).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The session's settings, sent once per connection: commits are durable
/// (flushed, and on the synchronous standby where there is one) whatever
/// the server's default; no statement or lock wait runs unbounded; a
/// transaction left open by a replica that stopped (SIGSTOP, a pause)
/// ends after `idle_tx_ms` (serve: half the leader ttl), so the share lock
/// its fence holds on the leadership row (`mod.rs`) does not hold up a
/// takeover for longer; the server notices a client gone within a second
/// even while the statement waits for a lock.
fn session(cfg: &PgConfig) -> String {
    format!(
        "SET synchronous_commit TO on; SET statement_timeout TO '10s'; \
         SET lock_timeout TO '10s'; SET idle_in_transaction_session_timeout TO {}; \
         SET client_connection_check_interval TO 1000",
        cfg.idle_tx_ms.max(100)
    )
}

/// A connection (made when first needed) and its prepared statements.
pub struct Conn {
    rt: Handle,
    cfg: PgConfig,
    client: Option<Client>,
    stmts: HashMap<&'static str, Statement>,
}

/// Runs `fut` on `rt` within `after`; errors name `what`.
pub fn block<T>(
    rt: &Handle,
    what: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, StoreError> {
    match rt.block_on(async { tokio::time::timeout(after, fut).await }) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StoreError::Postgres { what, source }),
        Err(_) => Err(StoreError::PgTimeout { what, after }),
    }
}

impl Conn {
    pub fn new(cfg: PgConfig, rt: Handle) -> Self {
        Conn {
            rt,
            cfg,
            client: None,
            stmts: HashMap::new(),
        }
    }

    pub fn handle(&self) -> &Handle {
        &self.rt
    }

    /// What it connects to (for a second connection to the same store).
    pub fn config(&self) -> &PgConfig {
        &self.cfg
    }

    /// Forgets the connection (after a failure: it is made again).
    pub fn reset(&mut self) {
        self.client = None;
        self.stmts.clear();
    }

    /// The client, connecting first if there is none or it closed.
    pub fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.stmts.clear();
            self.client = None;
            let client = self.connect()?;
            self.client = Some(client);
        }
        match self.client.as_mut() {
            Some(c) => Ok(c),
            None => Err(StoreError::Failed),
        }
    }

    fn connect(&self) -> Result<Client, StoreError> {
        let what = "connecting";
        let after = CALL_TIMEOUT;
        let client = match &self.cfg.tls {
            None => {
                let (client, conn) = block(
                    &self.rt,
                    what,
                    after,
                    self.cfg.pg.connect(tokio_postgres::NoTls),
                )?;
                self.rt.spawn(drive(conn));
                client
            }
            Some(tls) => {
                let (client, conn) = block(
                    &self.rt,
                    what,
                    after,
                    self.cfg.pg.connect(super::tls::MakeRustls(tls.clone())),
                )?;
                self.rt.spawn(drive(conn));
                client
            }
        };
        block(
            &self.rt,
            "setting up the session",
            after,
            client.batch_execute(&session(&self.cfg)),
        )?;
        Ok(client)
    }

    /// The statement `sql`, prepared on this connection once.
    pub fn stmt(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let rt = self.rt.clone();
        let client = self.client()?;
        let st = block(
            &rt,
            "preparing a statement",
            CALL_TIMEOUT,
            client.prepare(sql),
        );
        let st = self.failed(st)?;
        self.stmts.insert(sql, st.clone());
        Ok(st)
    }

    /// Passes `r` on, dropping the connection if it failed (so the next
    /// call makes a fresh one).
    pub fn failed<T>(&mut self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &r {
            if !matches!(e, StoreError::Deposed { .. }) {
                self.reset();
            }
        }
        r
    }
}

/// Drives a connection's I/O until it ends (its client dropped, or the
/// server gone); the client's next call then fails and reconnects.
async fn drive<S, T>(conn: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = conn.await {
        log::warn!("PostgreSQL store: connection ended: {e}");
    }
}
