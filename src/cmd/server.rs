//! `leaseagent serve` hands over to the server binary, `leaseagent-serve`,
//! installed next to `leaseagent`: the flags are checked here (so help,
//! version and every usage error read exactly as for any other subcommand),
//! then the process `exec`s the server with the same arguments. The pid,
//! the open descriptors, the environment and so systemd's `MAINPID` and
//! `NOTIFY_SOCKET` all carry over.
//!
//! Why a second binary: the agent runs next to every job, so its resident
//! memory and start-up time are part of what users pay. The server's HTTP
//! stack (tokio, hyper, tokio-rustls, the auth file's TOML) is most of a
//! megabyte of code; linked into the agent it sits between the agent's own
//! functions, and the kernel maps a binary's cached pages 64 KiB around each
//! page fault, so code the agent never runs still counted in its RSS.
//! `docs/design.md` ("Two binaries") has the reasons, `docs/benchmarks.md`
//! ("Agent memory") the figures.
//!
//! The server binary is looked up next to `/proc/self/exe`, never on
//! `$PATH`: an inherited `PATH` is outside input, and a server of another
//! build could misread this build's flags.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The server binary's file name, next to `leaseagent`.
pub const SERVER_BINARY: &str = "leaseagent-serve";

/// Where the server binary must be: next to the running `leaseagent`.
fn server_path() -> std::io::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let dir = me.parent().ok_or_else(|| {
        std::io::Error::other(format!("{} has no parent directory", me.display()))
    })?;
    Ok(dir.join(SERVER_BINARY))
}

/// Replaces this process by `leaseagent-serve ARGS` (the arguments that
/// followed `serve`). Returns only if that fails: exit 125 with one line
/// that names the file and says how it gets there.
pub fn exec(args: &[OsString]) -> ExitCode {
    let (shown, err) = match server_path() {
        Ok(path) => {
            let err = Command::new(&path).args(args).exec();
            (path.display().to_string(), err)
        }
        Err(e) => (SERVER_BINARY.to_string(), e),
    };
    eprintln!(
        "leaseagent serve: error: cannot run the server binary {shown}: {err} \
         (it is built and installed next to leaseagent: `cargo install --path .` installs both)"
    );
    ExitCode::from(crate::exit::AGENT_FAILED)
}
