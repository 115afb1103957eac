//! The durable writer: one thread that commits every queued change in
//! group transactions through the store ([`crate::engine::store::Store`]).
//!
//! Invariants and the races they guard against:
//! - Changes are queued under the engine's lock, in the order they were
//!   made in memory; the writer commits them in that order, so the disk
//!   never holds a later change without an earlier one.
//! - A change someone waits for (a grant, a release, an operator call)
//!   carries an [`Ack`] that is sent only after the commit that holds it
//!   (or its failure); an `Ack` dropped unsent reads as lost, never as
//!   committed.
//! - Everything queued while one commit runs goes into the next (at most
//!   [`MAX_BATCH`] changes): one fsync covers many grants under load.
//! - After a failed commit memory may be ahead of the disk, so the writer
//!   is marked failed for good: it commits nothing more, the engine stops
//!   granting, and only a restart (which reloads the disk) makes them agree.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::engine::ack::{self, Ack, Pending};
use crate::engine::error::{EngineError, StoreError, chain};
use crate::engine::history::{Bounds, Op};
use crate::engine::rules::TaskRow;
use crate::engine::store::Store;

use super::counters::Counters;

/// Most changes committed in one transaction.
const MAX_BATCH: usize = 4096;

/// One durable change: a task's row (if it changed) and the history of the
/// attempts the change began or ended, committed together.
struct Change {
    row: Option<TaskRow>,
    hist: Vec<Op>,
}

enum Job {
    /// Boxed: a row is a few hundred bytes, and the queue holds many jobs.
    Write(Box<Change>, Option<Ack>),
    Stop,
}

/// The way to the writer thread, and whether it has failed.
#[derive(Clone)]
pub(super) struct Writer {
    jobs: Sender<Job>,
    failed: Arc<AtomicBool>,
}

impl Writer {
    /// Queues a durable write of `row` (if any) and `hist`; with `wait`,
    /// the acknowledgement comes once it is committed.
    pub(super) fn queue(
        &self,
        row: Option<&TaskRow>,
        hist: Vec<Op>,
        wait: bool,
    ) -> Option<Pending> {
        let (ack, rx) = if wait {
            let (t, r) = ack::channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        let change = Change {
            row: row.cloned(),
            hist,
        };
        if self.jobs.send(Job::Write(Box::new(change), ack)).is_err() {
            self.fail();
        }
        rx
    }

    /// False once a commit failed (or one was lost or late).
    pub(super) fn healthy(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    /// Marks the writer failed: nothing more is committed.
    pub(super) fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Asks the thread to stop once it has committed what is queued.
    pub(super) fn stop(&self) {
        let _ = self.jobs.send(Job::Stop);
    }
}

/// Starts the writer thread on `store`.
pub(super) fn start(
    store: impl Store,
    counters: Arc<Counters>,
    bounds: Bounds,
) -> Result<(Writer, JoinHandle<()>), EngineError> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let writer = Writer {
        jobs: tx,
        failed: Arc::new(AtomicBool::new(false)),
    };
    let failed = writer.failed.clone();
    let thread = std::thread::Builder::new()
        .name("lease-writer".into())
        .spawn(move || writer_loop(store, rx, failed, counters, bounds))
        .map_err(|_| EngineError::Unavailable("cannot start the lease writer thread"))?;
    Ok((writer, thread))
}

/// Commits `changes` (rows and their history) and the token sequence in
/// one transaction.
fn commit(store: &mut impl Store, changes: &[&Change], bounds: Bounds) -> Result<(), StoreError> {
    store.transaction(&mut |tx| {
        let mut top = 0;
        for c in changes {
            if let Some(r) = &c.row {
                tx.save(r)?;
                top = top.max(r.last_token);
            }
            for op in &c.hist {
                tx.record(op, bounds)?;
            }
        }
        tx.set_last_issued(top)
    })
}

fn writer_loop(
    mut store: impl Store,
    rx: Receiver<Job>,
    failed: Arc<AtomicBool>,
    counters: Arc<Counters>,
    bounds: Bounds,
) {
    let mut batch = Vec::new();
    loop {
        let Ok(first) = rx.recv() else { return };
        batch.clear();
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let rows: Vec<&Change> = batch
            .iter()
            .filter_map(|j| match j {
                Job::Write(r, _) => Some(r.as_ref()),
                Job::Stop => None,
            })
            .collect();
        let res: Result<(), Arc<StoreError>> = if failed.load(Ordering::Relaxed) {
            Err(Arc::new(StoreError::Failed))
        } else if rows.is_empty() {
            Ok(())
        } else {
            commit(&mut store, &rows, bounds).map_err(Arc::new)
        };
        match &res {
            Ok(()) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters
                    .committed_changes
                    .fetch_add(rows.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                log::error!("lease database commit failed: {}", chain(e.as_ref()));
                failed.store(true, Ordering::Relaxed);
            }
        }
        let mut stop = false;
        for j in batch.drain(..) {
            match j {
                Job::Write(_, Some(ack)) => ack.send(res.clone()),
                Job::Write(_, None) => {}
                Job::Stop => stop = true,
            }
        }
        if stop {
            return;
        }
    }
}
