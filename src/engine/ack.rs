//! The writer's acknowledgement of one durable change, from the writer
//! thread to the request that waits for it, as a future.
//!
//! Why: `leaseagent serve` answers grants from its event loop. Waiting for
//! the fsync there as a future costs no thread and no hand-off to a thread
//! pool (two context switches per grant fewer than a blocking wait on a
//! pool thread); the engine stays free of any async runtime (a future needs
//! only `std`). The waiter bounds the wait itself.
//!
//! Invariants: the writer sends at most once, after the commit that holds
//! the change (or its failure); an acknowledgement dropped unsent (the
//! writer gone) reads as [`Acked::Lost`], never as committed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::error::StoreError;

/// What the writer reports.
#[derive(Debug)]
pub enum Acked {
    /// Committed (fsync'd) with its batch, or the batch failed.
    Done(Result<(), Arc<StoreError>>),
    /// The writer dropped the change without an answer (it stopped).
    Lost,
}

#[derive(Default)]
struct Slot {
    done: Option<Acked>,
    waker: Option<Waker>,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // The slot is one assignment at a time: a panic cannot tear it.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, done: Acked) {
        let waker = {
            let mut s = self.lock();
            s.done = Some(done);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The writer's end (`None` once sent).
pub struct Ack(Option<Arc<Shared>>);

/// The waiting end: `.await` it.
pub struct Pending(Arc<Shared>);

/// A new acknowledgement.
pub fn channel() -> (Ack, Pending) {
    let shared = Arc::new(Shared::default());
    (Ack(Some(shared.clone())), Pending(shared))
}

impl Ack {
    /// Reports the commit's outcome.
    pub fn send(mut self, r: Result<(), Arc<StoreError>>) {
        if let Some(s) = self.0.take() {
            s.finish(Acked::Done(r));
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.finish(Acked::Lost);
        }
    }
}

impl Future for Pending {
    type Output = Acked;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Acked> {
        let mut s = self.0.lock();
        match s.done.take() {
            Some(d) => Poll::Ready(d),
            None => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Runs a future to completion on this thread (for tests of the engine's
/// blocking callers).
#[cfg(test)]
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_thread_gets_the_outcome() {
        let (ack, pending) = channel();
        let t = std::thread::spawn(move || block_on(pending));
        std::thread::sleep(std::time::Duration::from_millis(20));
        ack.send(Ok(()));
        assert!(matches!(t.join().unwrap(), Acked::Done(Ok(()))));
    }

    #[test]
    fn a_dropped_ack_is_lost_not_committed() {
        let (ack, pending) = channel();
        drop(ack);
        assert!(matches!(block_on(pending), Acked::Lost));
    }
    #[test]
    fn the_future_wakes_when_the_writer_reports() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::task::Wake;
        struct Flag(AtomicBool);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let (ack, mut pending) = channel();
        assert!(Pin::new(&mut pending).poll(&mut cx).is_pending());
        ack.send(Ok(()));
        assert!(flag.0.load(Ordering::SeqCst));
        assert!(matches!(
            Pin::new(&mut pending).poll(&mut cx),
            Poll::Ready(Acked::Done(Ok(())))
        ));
    }
}
