//! The scribe: the agent's filesystem work, in a process of its own.
//!
//! Why: a filesystem can stall (`fsfreeze`, a hung NFS mount, a dying
//! disk), and a thread that writes to it then sleeps in the kernel
//! (`D` state) until it comes back: no signal, no timeout ends the wait.
//! The agent already never *waits* for such a call past a bound (the state
//! file's writer thread, the release thread), but a process is reaped only
//! once its last thread is gone: an agent with one thread asleep on a
//! frozen filesystem ended its main thread at the deadline and was still
//! not reaped, its parent's `wait` and pidfd silent, until the thaw. The
//! job was dead on time; the agent's exit status was not.
//!
//! So every write the agent makes to a filesystem after the grant goes
//! through the scribe, forked while the agent has one thread (before its
//! log thread, before the keeper): the lease state file (`leaseagent
//! check`) and, on the embedded authority, the SQLite database (grant,
//! renewals, release). The agent talks to it over three socket pairs
//! (`SOCK_SEQPACKET`, one JSON message each way per call), one per caller
//! thread so none waits behind another: the **store** lane (acquire,
//! `--wait`, release: the supervisor's handle), the **renew** lane (the
//! heartbeat thread's handle, its own database connection as before), the
//! **state** lane (the state file's writer thread). Every call the agent
//! makes waits for its answer with a deadline, in `poll`, which a signal
//! or `exit_group` ends: no thread of the agent ever sleeps on a
//! filesystem, and at the deadline it exits and is reaped at once. A
//! scribe asleep on the frozen filesystem stays until the thaw, finishes
//! what it was asked (the release, the state file's removal), reads end
//! of file and exits.
//!
//! ```text
//!  agent ─┬─ supervisor ─── store lane ──┐
//!         ├─ heartbeat ──── renew lane ──┼─▶ scribe (own session, not the agent's child)
//!         └─ state-file ─── state lane ──┘      └─ one thread per lane ─▶ SQLite file, state file
//! ```
//!
//! Invariants and the races they guard against:
//! - **Answers are matched by id.** A call that timed out leaves its answer
//!   to come later; the next call on the lane reads past it (ids only grow),
//!   so a late "renewed" is never taken for the answer to a later call.
//! - **Anything that is not an answer is not a success**: end of file (the
//!   scribe died: the OOM killer, a `kill -9` by the job's user in the
//!   fallback containment) or a malformed message is a transient failure
//!   of the store, so the machine stops the job by the deadline as for any
//!   failing authority.
//! - **Not the agent's child**: forked twice ([`crate::sys::detach`]), so
//!   the agent's tree stays agent → keeper → job, and its proof that the
//!   job's tree is gone (no child left: it is the orphans' subreaper) is
//!   untouched. An agent that is itself an init (PID 1 of a container)
//!   adopts it all the same: its pid is then spared, by that proof (it
//!   must be the only child, counted in `/proc`) and by the agent's own
//!   kill of the tree (`keeper/handle.rs`). The front's and callers' pipes
//!   are not held by it (it keeps no descriptor but its lanes).
//! - **Its log lines are the agent's**: it has no stderr (one it held could
//!   keep a caller's `2>&1 | …` open past the agent's exit); each thread's
//!   lines go with its next answer, and the agent writes them through its
//!   own queue (`agent/logging.rs`).
//! - **Out of the job's reach as the agent is**: it inherits the agent's
//!   non-dumpable flag (set before the fork), so a job of the same user can
//!   neither trace it nor reach its sockets through `/proc`; in a PID
//!   namespace the job cannot name it at all.
//! - **Its files are closed when the agent's exit is seen**: at its end the
//!   agent shuts every lane down and waits (1 s at most) on the scribe's
//!   pidfd ([`ScribeEnd`]), so a script that unmounts the state's
//!   filesystem right after `leaseagent` returns does not find it busy.
//!   On a stalled filesystem that wait is what the exit costs, no more.
//! - **An agent that dies leaves no state file**: the state lane's end of
//!   file without a removal removes the file (the agent was SIGKILLed; its
//!   keeper stops the job).
//! - **No scribe, no change**: where the fork fails (it refuses when the
//!   agent already has a second thread), the agent does the same work in
//!   its own threads, as before, and says so.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::agent::state_file::{LeaseStateFile, StateSink, StateWriter};
use crate::authority::embedded::EmbeddedAuthority;
use crate::authority::error::{Failure, FailureKind};
use crate::authority::{
    AcquireError, AcquireRequest, Grant, LeaseClient, LeaseRef, Operator, Outcome, RenewError,
    Renewed, Renewer, Waiter,
};

/// The largest message either side sends (a grant, an error, a state
/// file's view: a few hundred bytes).
const MAX_MESSAGE: usize = 64 * 1024;

/// How much longer than a call's own timeout its answer is waited for, so
/// a call that keeps its timeout answers with its own error.
const ANSWER_SLACK: Duration = Duration::from_millis(50);

/// Why a call to the scribe got no answer.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    #[error("no answer from the agent's store process within {}", crate::time::duration::format(*.0))]
    Timeout(Duration),
    #[error("the agent's store process is gone ({0})")]
    Gone(String),
    #[error("a malformed message from the agent's store process: {0}")]
    Malformed(String),
}

impl LaneError {
    fn failure(&self, what: &str) -> Failure {
        let kind = match self {
            LaneError::Timeout(_) => FailureKind::Timeout,
            _ => FailureKind::Store,
        };
        Failure::new(kind, format!("{what}: {self}"))
    }
}

/// The agent's end of one lane: one call at a time, answers matched by id.
struct Lane {
    fd: OwnedFd,
    next: u64,
    buf: Vec<u8>,
}

impl Lane {
    fn new(fd: OwnedFd) -> Self {
        Lane {
            fd,
            next: 0,
            buf: vec![0; MAX_MESSAGE],
        }
    }

    /// Sends `call` and waits for its answer until `within` has passed.
    fn call<Q: Serialize, A: DeserializeOwned>(
        &mut self,
        call: &Q,
        within: Duration,
    ) -> Result<A, LaneError> {
        let deadline = Instant::now() + within;
        let id = self.send(call, deadline, within)?;
        self.answer(id, deadline, within)
    }

    /// Sends `call` (waiting for room until `deadline`); its id, for
    /// [`Lane::answer`]. Sent ahead, a call's answer is read later and the
    /// scribe's work overlaps the agent's.
    fn send<Q: Serialize>(
        &mut self,
        call: &Q,
        deadline: Instant,
        within: Duration,
    ) -> Result<u64, LaneError> {
        use rustix::net::SendFlags;
        self.next += 1;
        let id = self.next;
        let msg =
            serde_json::to_vec(&(id, call)).map_err(|e| LaneError::Malformed(e.to_string()))?;
        loop {
            match rustix::net::send(&self.fd, &msg, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(_) => return Ok(id),
                Err(rustix::io::Errno::AGAIN) => {
                    self.wait(rustix::event::PollFlags::OUT, deadline, within)?
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(LaneError::Gone(e.to_string())),
            }
        }
    }

    /// Waits until `deadline` for the answer to call `id`, reading past
    /// answers to earlier calls.
    fn answer<A: DeserializeOwned>(
        &mut self,
        id: u64,
        deadline: Instant,
        within: Duration,
    ) -> Result<A, LaneError> {
        use rustix::net::{RecvFlags, recv};
        loop {
            match recv(&self.fd, &mut self.buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Err(LaneError::Gone("end of file".into())),
                Ok((n, full)) if full > n => {
                    return Err(LaneError::Malformed(format!("{full} bytes")));
                }
                Ok((n, _)) => {
                    let (got, answer, lines): (u64, serde_json::Value, Vec<String>) =
                        serde_json::from_slice(&self.buf[..n])
                            .map_err(|e| LaneError::Malformed(e.to_string()))?;
                    // What the scribe logged on the way, written as ours.
                    for line in &lines {
                        crate::agent::logging::relay(line);
                    }
                    // An answer to an earlier call that timed out: skipped.
                    if got != id {
                        continue;
                    }
                    return serde_json::from_value(answer)
                        .map_err(|e| LaneError::Malformed(e.to_string()));
                }
                Err(rustix::io::Errno::AGAIN) => {
                    self.wait(rustix::event::PollFlags::IN, deadline, within)?
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(LaneError::Gone(e.to_string())),
            }
        }
    }

    /// Polls for `flags` until `deadline` (a timeout of `within` past it).
    fn wait(
        &self,
        flags: rustix::event::PollFlags,
        deadline: Instant,
        within: Duration,
    ) -> Result<(), LaneError> {
        use rustix::event::{PollFd, poll};
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LaneError::Timeout(within));
            }
            let ts = rustix::time::Timespec::try_from(left).ok();
            let mut fds = [PollFd::new(&self.fd, flags)];
            match poll(&mut fds, ts.as_ref()) {
                Ok(0) | Err(rustix::io::Errno::INTR) => {}
                Ok(_) => return Ok(()),
                Err(e) => return Err(LaneError::Gone(e.to_string())),
            }
        }
    }
}

/// The scribe's side of a lane: serves calls one by one until the agent's
/// end closes. `handle` gets each call and a `reply` to answer it with (it
/// may go on working after answering: the answer is not held back).
fn serve<Q: DeserializeOwned, A: Serialize>(
    fd: &OwnedFd,
    mut handle: impl FnMut(Q, &mut dyn FnMut(A)),
) {
    use rustix::net::{RecvFlags, SendFlags, recv, send};
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let n = match recv(fd, &mut buf[..], RecvFlags::empty()) {
            Ok((0, _)) => return,
            Ok((n, full)) if full <= n => n,
            Ok(_) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        };
        let Ok((id, call)) = serde_json::from_slice::<(u64, Q)>(&buf[..n]) else {
            continue;
        };
        handle(call, &mut |answer: A| {
            // The lines this thread logged since its last answer go with
            // this one (`agent/logging.rs`).
            let lines = crate::agent::logging::take_collected();
            if let Ok(msg) = serde_json::to_vec(&(id, answer, lines)) {
                let _ = send(fd, &msg, SendFlags::NOSIGNAL);
            }
        });
    }
}

// ------------------------------------------------------------ the protocol

#[derive(Serialize, Deserialize)]
enum StoreCall {
    /// Use the database at `path`; `prepare`: check (and make) its
    /// directory first, as `authority::open` does.
    Open {
        path: PathBuf,
        prepare: bool,
    },
    Acquire {
        req: AcquireRequest,
        timeout: Duration,
    },
    AcquireWait {
        req: AcquireRequest,
        wait: Duration,
        timeout: Duration,
    },
    AbandonWait {
        timeout: Duration,
    },
    Renew {
        lease: LeaseRef,
        timeout: Duration,
    },
    Release {
        lease: LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    },
}

#[derive(Serialize, Deserialize)]
enum StoreAnswer {
    Opened(Result<(), String>),
    Granted(Result<Grant, AcquireError>),
    Renewed(Result<Renewed, RenewError>),
    Released(Result<(), RenewError>),
    Abandoned,
    /// A call before `Open` (never made by the agent).
    NotOpen,
}

#[derive(Serialize, Deserialize)]
enum StateCall {
    /// Make the writer: in the runtime directory, or (`group`: a job of
    /// another user) a directory of the run's own of that group.
    Open {
        group: Option<u32>,
    },
    Write(Box<LeaseStateFile>),
    Remove,
}

#[derive(Serialize, Deserialize)]
enum StateAnswer {
    Opened(Result<PathBuf, String>),
    Written(Result<(), String>),
    Removed,
    NotOpen,
}

// ------------------------------------------------------------ the scribe

/// The scribe's body: one thread per lane, until every lane has closed.
fn run_scribe(
    (store, renew, state): (OwnedFd, OwnedFd, OwnedFd),
    db: Option<PathBuf>,
    agent_pid: u32,
) -> i32 {
    // The renewals on the embedded authority are made here now: the same
    // defences against memory pressure as the agent's (`mlockall` is not
    // inherited across fork).
    let _ = crate::sys::memory::protect();
    crate::agent::logging::init_collecting();
    let threads = [
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || serve_store(&store, db)),
        std::thread::Builder::new()
            .name("renew".into())
            .spawn(move || serve_store(&renew, None)),
        std::thread::Builder::new()
            .name("state".into())
            .spawn(move || serve_state(&state, agent_pid)),
    ];
    let mut code = 0;
    for t in threads {
        match t {
            Ok(t) => {
                let _ = t.join();
            }
            // The lane's socket went with the closure: the agent reads
            // end of file on it and counts the store or file as failing.
            Err(_) => code = 1,
        }
    }
    code
}

/// How long the scribe waits for the database's locks when it opens the
/// database ahead of the agent's first call: a database busy longer is
/// opened by that call, within its own timeout.
const AHEAD_WITHIN: Duration = Duration::from_millis(200);

/// Serves a store lane. `ahead`: the database to check and open at once,
/// before the agent asks (the agent meanwhile starts its keeper: on two
/// cores the two overlap); the agent's `Open` of it then finds it done.
fn serve_store(fd: &OwnedFd, ahead: Option<PathBuf>) {
    let mut db: Option<EmbeddedAuthority> = None;
    let mut prepared: Option<(PathBuf, Result<(), String>)> = None;
    if let Some(path) = ahead {
        let checked = crate::sys::paths::prepare_db_file(&path).map_err(|e| e.to_string());
        if checked.is_ok() {
            let mut ahead = EmbeddedAuthority::new(path.clone());
            ahead.open_now(AHEAD_WITHIN);
            db = Some(ahead);
        }
        prepared = Some((path, checked));
    }
    serve(fd, |call: StoreCall, reply: &mut dyn FnMut(StoreAnswer)| {
        if let StoreCall::Open { path, prepare } = call {
            let opened = match prepared.take() {
                // Done ahead: the same path's answer, its connection kept.
                Some((done, checked)) if done == path && prepare => {
                    return reply(StoreAnswer::Opened(checked));
                }
                _ if prepare => {
                    crate::sys::paths::prepare_db_file(&path).map_err(|e| e.to_string())
                }
                _ => Ok(()),
            };
            if opened.is_ok() {
                db = Some(EmbeddedAuthority::new(path));
            }
            return reply(StoreAnswer::Opened(opened));
        }
        let Some(db) = db.as_mut() else {
            return reply(StoreAnswer::NotOpen);
        };
        match call {
            StoreCall::Open { .. } => {}
            StoreCall::Acquire { req, timeout } => {
                reply(StoreAnswer::Granted(db.acquire(&req, timeout)));
            }
            StoreCall::AcquireWait { req, wait, timeout } => {
                let waited = db.waiter().map(|mut w| w.acquire_wait(&req, wait, timeout));
                let answer = match waited {
                    Some(answer) => answer,
                    None => db.acquire(&req, timeout),
                };
                reply(StoreAnswer::Granted(answer));
            }
            StoreCall::AbandonWait { timeout } => {
                if let Some(mut w) = db.waiter() {
                    w.abandon_wait(timeout);
                }
                reply(StoreAnswer::Abandoned);
            }
            StoreCall::Renew { lease, timeout } => {
                let answer = db.renew(&lease, timeout);
                let renewed = answer.is_ok();
                reply(StoreAnswer::Renewed(answer));
                // The WAL's checkpoint once the answer is out, as the
                // heartbeat's own handle does (`embedded.rs`).
                if renewed {
                    db.after_renewal();
                }
            }
            StoreCall::Release {
                lease,
                outcome,
                exit_code,
                timeout,
            } => reply(StoreAnswer::Released(
                db.release(&lease, outcome, exit_code, timeout),
            )),
        }
    });
}

fn serve_state(fd: &OwnedFd, agent_pid: u32) {
    let mut writer: Option<StateWriter> = None;
    let mut removed = false;
    serve(
        fd,
        |call: StateCall, reply: &mut dyn FnMut(StateAnswer)| match call {
            StateCall::Open { group } => {
                let opened = match group {
                    Some(gid) => StateWriter::for_group(gid, agent_pid).map_err(|e| e.to_string()),
                    None => crate::sys::paths::runtime_dir()
                        .map(|(path, dir)| StateWriter::in_checked_dir(&path, dir, agent_pid))
                        .map_err(|e| e.to_string()),
                };
                let answer = match &opened {
                    Ok(w) => Ok(w.path().to_path_buf()),
                    Err(e) => Err(e.clone()),
                };
                writer = opened.ok();
                reply(StateAnswer::Opened(answer));
            }
            StateCall::Write(view) => match writer.as_mut() {
                Some(w) => reply(StateAnswer::Written(
                    w.write(&view).map_err(|e| e.to_string()),
                )),
                None => reply(StateAnswer::NotOpen),
            },
            StateCall::Remove => {
                if let Some(w) = writer.as_mut() {
                    w.remove();
                }
                removed = true;
                reply(StateAnswer::Removed);
            }
        },
    );
    // The agent's end closed without a removal: it died (SIGKILL, the
    // OOM killer). Its view of the lease is void: the file goes.
    if !removed && let Some(w) = writer.as_mut() {
        w.remove();
    }
}

// ------------------------------------------------------------ the agent's side

/// The agent's handle on its scribe: the lanes not yet handed out.
pub struct Scribe {
    /// Its pid: the agent spares it when it proves the job's tree gone
    /// (an agent that is an init adopted it).
    pid: i32,
    store: Option<Lane>,
    renew: Option<Lane>,
    state: Option<Lane>,
    /// The database's `Open`, sent at the start: its call id and path.
    store_open: Option<(u64, PathBuf)>,
    /// The state file's `Open`, sent at the start: its call id and group.
    state_open: Option<(u64, Option<u32>)>,
}

/// Waits this long for room to send a call at the start (the scribe has
/// read nothing yet: the socket's buffer is empty, so never in practice).
const SEND_AHEAD_WITHIN: Duration = Duration::from_millis(100);

impl Scribe {
    /// Forks the scribe, which opens the embedded database `db` (if the
    /// run uses one) at once, and asks it at once for the database and for
    /// the state file (a job of another user's: of `group`), the answers
    /// read when the agent needs them ([`Scribe::embedded`],
    /// [`Scribe::state_file`]): every answer is a scheduling round trip,
    /// and these two, sent ahead, cost the start-up none. Only while the
    /// agent has one thread (refused otherwise: the caller then does the
    /// work itself).
    pub fn start(db: Option<PathBuf>, group: Option<u32>) -> std::io::Result<(Scribe, ScribeEnd)> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
        let pair = || {
            socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
        };
        let (store, store_theirs) = pair()?;
        let (renew, renew_theirs) = pair()?;
        let (state, state_theirs) = pair()?;
        let agent_pid = std::process::id();
        let keep = [
            store_theirs.as_raw_fd(),
            renew_theirs.as_raw_fd(),
            state_theirs.as_raw_fd(),
        ];
        // The scribe's copies of the agent's ends are closed by `detach`
        // (they are not in `keep`): its reads see the agent's close.
        let ahead = db.clone();
        let pid = crate::sys::detach::spawn_detached(&keep, move || {
            run_scribe((store_theirs, renew_theirs, state_theirs), ahead, agent_pid)
        })?;
        let ending = ScribeEnd::new(pid, [&store, &renew, &state]);
        let (mut store, mut state) = (Lane::new(store), Lane::new(state));
        let renew = renew;
        let deadline = Instant::now() + SEND_AHEAD_WITHIN;
        let store_open = db.and_then(|path| {
            let call = StoreCall::Open {
                path: path.clone(),
                prepare: true,
            };
            let id = store.send(&call, deadline, SEND_AHEAD_WITHIN).ok()?;
            Some((id, path))
        });
        let state_open = state
            .send(&StateCall::Open { group }, deadline, SEND_AHEAD_WITHIN)
            .ok()
            .map(|id| (id, group));
        let scribe = Scribe {
            pid,
            store: Some(store),
            renew: Some(Lane::new(renew)),
            state: Some(state),
            store_open,
            state_open,
        };
        Ok((scribe, ending))
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The embedded authority at `path`, served by the scribe: its
    /// directory checked (and made) there, as [`crate::authority::open`]
    /// does; the answer waited for `within`.
    pub fn embedded(&mut self, path: &Path, within: Duration) -> Result<ScribedAuthority, String> {
        let mut lane = self
            .store
            .take()
            .ok_or_else(|| "the store lane is already in use".to_string())?;
        let answer = match self.store_open.take() {
            Some((id, asked)) if asked == path => lane.answer(id, Instant::now() + within, within),
            _ => {
                let call = StoreCall::Open {
                    path: path.to_path_buf(),
                    prepare: true,
                };
                lane.call(&call, within)
            }
        };
        match answer {
            Ok(StoreAnswer::Opened(Ok(()))) => Ok(ScribedAuthority {
                url: format!("sqlite:{}", path.display()),
                path: path.to_path_buf(),
                lane,
                renew: self.renew.take(),
            }),
            Ok(StoreAnswer::Opened(Err(e))) => Err(e),
            Ok(_) => Err(format!("{}: an answer of another call", path.display())),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The lease state file, written by the scribe: in the runtime
    /// directory, or for a job of another user (`group`) in a directory of
    /// the run's own; the answer waited for `within`.
    pub fn state_file(
        &mut self,
        group: Option<u32>,
        within: Duration,
    ) -> Result<ScribedState, String> {
        let mut lane = self
            .state
            .take()
            .ok_or_else(|| "the state lane is already in use".to_string())?;
        let answer = match self.state_open.take() {
            Some((id, asked)) if asked == group => lane.answer(id, Instant::now() + within, within),
            _ => lane.call(&StateCall::Open { group }, within),
        };
        match answer {
            Ok(StateAnswer::Opened(Ok(path))) => Ok(ScribedState { lane, path }),
            Ok(StateAnswer::Opened(Err(e))) => Err(e),
            Ok(_) => Err("an answer of another call".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The agent's last word to its scribe: at its exit, the agent ends every
/// lane (whichever thread still holds it) and waits, bounded, until the
/// scribe is gone, so that its files (the database, the state directory)
/// are closed when the agent's exit is seen: a script that unmounts the
/// state's filesystem right after `leaseagent` returns must not find it
/// busy. On a stalled filesystem the wait ends at its bound.
pub struct ScribeEnd {
    /// The scribe itself, `None` where it could not be opened (then the
    /// exit does not wait).
    pidfd: Option<OwnedFd>,
    /// Copies of the agent's ends of the lanes, for `shutdown`.
    lanes: Vec<OwnedFd>,
}

impl ScribeEnd {
    fn new(pid: i32, lanes: [&OwnedFd; 3]) -> Self {
        let lanes: Vec<OwnedFd> = lanes
            .iter()
            .filter_map(|l| rustix::io::fcntl_dupfd_cloexec(l, 3).ok())
            .collect();
        // The pid is the scribe's only while the scribe lives: its lanes
        // not hung up after the open prove the pidfd names it.
        let pidfd = rustix::process::Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
            .filter(|_| {
                lanes.first().is_some_and(|l| {
                    use rustix::event::{PollFd, PollFlags, poll};
                    let mut fds = [PollFd::new(l, PollFlags::RDHUP)];
                    let zero = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    matches!(poll(&mut fds, Some(&zero)), Ok(0))
                })
            });
        ScribeEnd { pidfd, lanes }
    }

    /// Ends every lane and waits until the scribe has exited, `within` at
    /// most; whether it has.
    pub fn wait_gone(self, within: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, poll};
        for lane in &self.lanes {
            let _ = rustix::net::shutdown(lane, rustix::net::Shutdown::Both);
        }
        let Some(pidfd) = &self.pidfd else {
            return false;
        };
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(ts) = rustix::time::Timespec::try_from(left) else {
                return false;
            };
            let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => return false,
                Ok(_) => return true,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return false,
            }
        }
    }
}

/// The embedded authority, its calls made by the scribe.
pub struct ScribedAuthority {
    url: String,
    path: PathBuf,
    lane: Lane,
    /// The heartbeat's lane, handed out by [`LeaseClient::renewer`].
    renew: Option<Lane>,
}

impl ScribedAuthority {
    fn ask(&mut self, call: &StoreCall, timeout: Duration) -> Result<StoreAnswer, Failure> {
        self.lane
            .call(call, timeout + ANSWER_SLACK)
            .map_err(|e| e.failure(&self.url))
    }
}

/// An answer of the wrong kind: never a success.
fn mismatched(url: &str) -> Failure {
    Failure::new(
        FailureKind::Store,
        format!("{url}: the agent's store process answered another call"),
    )
}

impl LeaseClient for ScribedAuthority {
    fn url(&self) -> String {
        self.url.clone()
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        let call = StoreCall::Acquire {
            req: req.clone(),
            timeout,
        };
        match self.ask(&call, timeout).map_err(AcquireError::Transient)? {
            StoreAnswer::Granted(answer) => answer,
            _ => Err(AcquireError::Transient(mismatched(&self.url))),
        }
    }

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        renew_on(&mut self.lane, &self.url, lease, timeout)
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        let call = StoreCall::Release {
            lease: lease.clone(),
            outcome,
            exit_code,
            timeout,
        };
        match self.ask(&call, timeout).map_err(RenewError::Transient)? {
            StoreAnswer::Released(answer) => answer,
            _ => Err(RenewError::Transient(mismatched(&self.url))),
        }
    }

    /// The renew lane, its own database connection in the scribe (opened
    /// at the first renewal, as the in-process renewer's is). The agent
    /// makes one renewer per run; a second one has no lane and fails
    /// every renewal (a transient failure: the machine stops the job by
    /// the deadline), never renews.
    fn renewer(&mut self) -> Box<dyn Renewer> {
        Box::new(ScribedRenewer {
            url: self.url.clone(),
            path: self.path.clone(),
            lane: self.renew.take(),
            opened: false,
        })
    }

    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        Some(Box::new(ScribedWaiter(self)))
    }

    /// The agent makes no operator calls (`leases`, `revoke`, … open the
    /// database in their own process).
    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        None
    }
}

fn renew_on(
    lane: &mut Lane,
    url: &str,
    lease: &LeaseRef,
    timeout: Duration,
) -> Result<Renewed, RenewError> {
    let call = StoreCall::Renew {
        lease: lease.clone(),
        timeout,
    };
    match lane.call(&call, timeout + ANSWER_SLACK) {
        Ok(StoreAnswer::Renewed(answer)) => answer,
        Ok(_) => Err(RenewError::Transient(mismatched(url))),
        Err(e) => Err(RenewError::Transient(e.failure(url))),
    }
}

/// `--wait` through the scribe: the queue's place is the scribe's
/// handle's (the embedded authority's waiter id lives there).
struct ScribedWaiter<'a>(&'a mut ScribedAuthority);

impl Waiter for ScribedWaiter<'_> {
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        let call = StoreCall::AcquireWait {
            req: req.clone(),
            wait,
            timeout,
        };
        match self
            .0
            .ask(&call, timeout)
            .map_err(AcquireError::Transient)?
        {
            StoreAnswer::Granted(answer) => answer,
            _ => Err(AcquireError::Transient(mismatched(&self.0.url))),
        }
    }

    fn abandon_wait(&mut self, timeout: Duration) {
        let _ = self.0.ask(&StoreCall::AbandonWait { timeout }, timeout);
    }
}

/// The heartbeat thread's handle: renewals on the renew lane.
struct ScribedRenewer {
    url: String,
    path: PathBuf,
    lane: Option<Lane>,
    opened: bool,
}

impl Renewer for ScribedRenewer {
    fn renew(
        &mut self,
        lease: &LeaseRef,
        timeout: Duration,
        report: &mut dyn FnMut(Result<Renewed, RenewError>),
    ) {
        let Some(lane) = self.lane.as_mut() else {
            return report(Err(RenewError::Transient(Failure::new(
                FailureKind::Store,
                format!(
                    "{}: no lane to the agent's store process for a second renewer",
                    self.url
                ),
            ))));
        };
        let started = Instant::now();
        if !self.opened {
            let call = StoreCall::Open {
                path: self.path.clone(),
                prepare: false,
            };
            match lane.call(&call, timeout + ANSWER_SLACK) {
                Ok(StoreAnswer::Opened(Ok(()))) => self.opened = true,
                Ok(_) => return report(Err(RenewError::Transient(mismatched(&self.url)))),
                Err(e) => return report(Err(RenewError::Transient(e.failure(&self.url)))),
            }
        }
        let left = timeout.saturating_sub(started.elapsed());
        report(renew_on(lane, &self.url, lease, left));
    }
}

/// The lease state file, written by the scribe.
pub struct ScribedState {
    lane: Lane,
    path: PathBuf,
}

/// How long a write of the state file is waited for. Longer than any
/// write takes on a working filesystem (tens of µs) by far; a stalled one
/// costs the writer thread this much per view, never the loop.
const WRITE_WITHIN: Duration = Duration::from_secs(1);

impl StateSink for ScribedState {
    fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, state: &LeaseStateFile) -> std::io::Result<()> {
        match self
            .lane
            .call(&StateCall::Write(Box::new(state.clone())), WRITE_WITHIN)
        {
            Ok(StateAnswer::Written(Ok(()))) => Ok(()),
            Ok(StateAnswer::Written(Err(e))) => Err(std::io::Error::other(e)),
            Ok(_) => Err(std::io::Error::other("an answer of another call")),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    fn remove(&mut self) {
        let _ = self
            .lane
            .call::<_, StateAnswer>(&StateCall::Remove, WRITE_WITHIN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    /// A scribe's lane served by a thread: each call's answer is its
    /// number doubled, the first one only once `gate` lets it go.
    fn doubling(
        theirs: OwnedFd,
        gate: crossbeam_channel::Receiver<()>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut first = true;
            serve(&theirs, |n: u64, reply: &mut dyn FnMut(u64)| {
                if std::mem::take(&mut first) {
                    let _ = gate.recv();
                }
                reply(n * 2);
            });
        })
    }

    #[test]
    fn a_late_answer_is_never_taken_for_a_later_calls() {
        let (ours, theirs) = pair();
        let (open, gate) = crossbeam_channel::bounded(1);
        let server = doubling(theirs, gate);
        let mut lane = Lane::new(ours);
        let late = lane.call::<_, u64>(&21u64, Duration::from_millis(50));
        assert!(matches!(late, Err(LaneError::Timeout(_))), "{late:?}");
        open.send(()).unwrap();
        // The answer to 21 (42) comes first on the socket: skipped.
        assert_eq!(
            lane.call::<_, u64>(&5u64, Duration::from_secs(10)).unwrap(),
            10
        );
        assert_eq!(
            lane.call::<_, u64>(&7u64, Duration::from_secs(10)).unwrap(),
            14
        );
        drop(lane);
        server.join().unwrap();
    }

    #[test]
    fn a_scribe_that_is_gone_or_babbles_never_answers() {
        let (ours, theirs) = pair();
        drop(theirs);
        let mut lane = Lane::new(ours);
        let gone = lane.call::<_, u64>(&1u64, Duration::from_secs(10));
        assert!(matches!(gone, Err(LaneError::Gone(_))), "{gone:?}");

        let (ours, theirs) = pair();
        let babbler = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let _ = rustix::net::recv(&theirs, &mut buf[..], rustix::net::RecvFlags::empty());
            let _ = rustix::net::send(&theirs, b"\xff{not json", rustix::net::SendFlags::empty());
            theirs
        });
        let mut lane = Lane::new(ours);
        let bad = lane.call::<_, u64>(&1u64, Duration::from_secs(10));
        assert!(matches!(bad, Err(LaneError::Malformed(_))), "{bad:?}");
        drop(babbler.join().unwrap());
    }

    #[test]
    fn a_renewal_without_an_answer_is_transient_never_renewed() {
        // The scribe's end is open but never answers: the call's own
        // timeout (+ slack) ends the wait.
        let (ours, theirs) = pair();
        let mut renewer = ScribedRenewer {
            url: "sqlite:/x".into(),
            path: "/x".into(),
            lane: Some(Lane::new(ours)),
            opened: true,
        };
        let lease = LeaseRef {
            lease_id: "l".into(),
            token: 1,
            task: "t".into(),
        };
        let started = Instant::now();
        let mut answers = Vec::new();
        renewer.renew(&lease, Duration::from_millis(100), &mut |a| answers.push(a));
        assert!(started.elapsed() >= Duration::from_millis(100));
        match answers.as_slice() {
            [Err(RenewError::Transient(f))] => {
                assert_eq!(f.kind, FailureKind::Timeout, "{f}");
                assert!(f.message.starts_with("sqlite:/x: no answer"), "{f}");
            }
            other => panic!("{other:?}"),
        }
        // Gone: the same, of kind Store.
        drop(theirs);
        answers.clear();
        renewer.renew(&lease, Duration::from_secs(10), &mut |a| answers.push(a));
        assert!(
            matches!(answers.as_slice(), [Err(RenewError::Transient(f))] if f.kind == FailureKind::Store),
            "{answers:?}"
        );
    }

    #[test]
    fn the_store_lane_serves_an_embedded_database_end_to_end() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("leases.sqlite3");
        let (ours, theirs) = pair();
        let (renew_ours, renew_theirs) = pair();
        // Opened ahead, as the agent's scribe does: the agent's `Open`
        // finds it done.
        let ahead = db.clone();
        let store = std::thread::spawn(move || serve_store(&theirs, Some(ahead)));
        let renew = std::thread::spawn(move || serve_store(&renew_theirs, None));
        let mut scribe = Scribe {
            pid: 0,
            store: Some(Lane::new(ours)),
            renew: Some(Lane::new(renew_ours)),
            state: None,
            store_open: None,
            state_open: None,
        };
        let mut auth = scribe.embedded(&db, Duration::from_secs(10)).unwrap();
        let req = AcquireRequest {
            task: "t".into(),
            holder: "h".into(),
            ttl: Duration::from_secs(5),
            on_expiry: crate::authority::ExpiryPolicy::Redispatch,
            grace: Duration::ZERO,
        };
        let grant = auth.acquire(&req, Duration::from_secs(10)).unwrap();
        assert_eq!((grant.task.as_str(), grant.token), ("t", 1));
        // Held: a second acquire is refused with the holder's name.
        let held = auth.acquire(&req, Duration::from_secs(10));
        assert!(
            matches!(&held, Err(AcquireError::Held { holder, .. }) if holder == "h"),
            "{held:?}"
        );
        let mut renewer = auth.renewer();
        let mut answers = Vec::new();
        renewer.renew(&grant.lease_ref(), Duration::from_secs(10), &mut |a| {
            answers.push(a)
        });
        assert!(
            matches!(answers.as_slice(), [Ok(Renewed { .. })]),
            "{answers:?}"
        );
        auth.release(
            &grant.lease_ref(),
            Outcome::Succeeded,
            Some(0),
            Duration::from_secs(10),
        )
        .unwrap();
        // Released: a renewal is refused, not renewed.
        answers.clear();
        renewer.renew(&grant.lease_ref(), Duration::from_secs(10), &mut |a| {
            answers.push(a)
        });
        assert!(
            matches!(answers.as_slice(), [Err(RenewError::Refused { .. })]),
            "{answers:?}"
        );
        drop((auth, renewer));
        store.join().unwrap();
        renew.join().unwrap();
    }
}
