//! Operating-system helpers with no lease logic. The crate's `unsafe` code
//! lives here and nowhere else, each block with a `// SAFETY:` note: the
//! inherited-fd claim (`fd`), malloc's arena cap (`malloc`), the socket
//! option and pre-exec hook (`priority`), the job's start inside its cgroup
//! (`spawn`), the keeper's start in namespaces of its own (`keeper_spawn`),
//! both through `clone3`'s argument block (`clone3`), the terminal's
//! foreground handed over and back (`terminal`),
//! the SQLite VFS that opens through a checked directory (`sqlite_at`), and
//! the user lookups and the uid switch of `--user` (`user`), and what a
//! job starts without: capabilities, new privileges, descriptors
//! (`confine`). Also: walking
//! configured paths as the kernel's `protected_symlinks` rule would
//! (`walk`), where state and runtime files
//! live, the systemd notification socket, the agent's defences against
//! memory pressure, and the cap every logger of the process applies to the
//! wire crates' records (`logcap`).

#[allow(unsafe_code)]
pub mod clone3;
#[allow(unsafe_code)]
pub mod confine;
#[allow(unsafe_code)]
pub mod detach;
#[allow(unsafe_code)]
pub mod fd;
#[allow(unsafe_code)]
pub mod keeper_spawn;
pub mod logcap;
#[allow(unsafe_code)]
pub mod malloc;
pub mod memory;
pub mod notify;
pub mod paths;
#[allow(unsafe_code)]
pub mod priority;
pub mod signal;
#[allow(unsafe_code)]
pub mod spawn;
#[allow(unsafe_code)]
pub mod sqlite_at;
#[allow(unsafe_code)]
pub mod terminal;
#[allow(unsafe_code)]
pub mod user;
pub mod walk;
