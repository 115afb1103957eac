//! The command is looked up before the lease is asked for: a name that is
//! not on `PATH`, a path that does not exist, or a file this user may not
//! execute exits 127 or 126 naming it, with no token spent and no attempt
//! in the authority's history (a typo under cron would otherwise take the
//! task from every other host for a run that cannot start).
//!
//! The lookup is `execvp`'s (`sys::spawn::find_in_path`: the first regular
//! file along `PATH` that `access(X_OK)` allows, glibc's `/bin:/usr/bin`
//! when `PATH` is unset), on the `PATH` the job gets (the agent's own; the
//! agent adds only `LEASE_*` variables). It is a check, not a promise: the
//! file can change between this look and the keeper's exec, which still
//! reports its own failure (127/126 after the grant, as before). Under
//! `--user` the check is the agent's (root's) view of the execute bits;
//! a file only root may run still fails at the exec, as the other user.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::exit;

/// Why the command cannot run; the message names it and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Unrunnable {
    #[error(
        "cannot run the command: `{name}` is not found in PATH ({path}); give its full path or fix PATH (nothing was acquired)"
    )]
    NotInPath { name: String, path: String },
    #[error("cannot run the command: `{0}` does not exist (nothing was acquired)")]
    NoSuchFile(String),
    #[error(
        "cannot run the command: `{0}` is not executable by this user (chmod +x it, or run it through its interpreter) (nothing was acquired)"
    )]
    NotExecutable(String),
    #[error("cannot run the command: `{0}` is a directory (nothing was acquired)")]
    Directory(String),
}

impl Unrunnable {
    /// 127 for a command that is not there, 126 for one that cannot run.
    pub fn exit_code(&self) -> u8 {
        match self {
            Unrunnable::NotInPath { .. } | Unrunnable::NoSuchFile(_) => exit::NOT_FOUND,
            Unrunnable::NotExecutable(_) | Unrunnable::Directory(_) => exit::CANNOT_EXECUTE,
        }
    }
}

/// Checks that `program` would run under `path` (the `PATH` value; `None`:
/// unset).
pub fn check(program: &OsStr, path: Option<&OsStr>) -> Result<(), Unrunnable> {
    let name = program.to_string_lossy().into_owned();
    if program.as_bytes().contains(&b'/') {
        return check_file(
            Path::new(program),
            &name,
            Unrunnable::NoSuchFile(name.clone()),
        );
    }
    if crate::sys::spawn::find_in_path(program, path).is_some() {
        return Ok(());
    }
    let search = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    // Found somewhere along PATH, but not runnable: say what is wrong with
    // the first one, as execvp's error would.
    for dir in search.as_bytes().split(|b| *b == b':') {
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let candidate = Path::new(OsStr::from_bytes(dir)).join(program);
        if std::fs::symlink_metadata(&candidate).is_ok() {
            let shown = candidate.to_string_lossy().into_owned();
            return check_file(&candidate, &shown, Unrunnable::NoSuchFile(shown.clone()));
        }
    }
    Err(Unrunnable::NotInPath {
        name,
        path: search.to_string_lossy().into_owned(),
    })
}

fn check_file(file: &Path, shown: &str, missing: Unrunnable) -> Result<(), Unrunnable> {
    let meta = match std::fs::metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing),
        // Anything else (EACCES on the way, ELOOP): the exec's own error
        // says it best.
        Err(_) => return Ok(()),
    };
    if meta.is_dir() {
        return Err(Unrunnable::Directory(shown.to_string()));
    }
    if rustix::fs::access(file, rustix::fs::Access::EXEC_OK).is_err() {
        return Err(Unrunnable::NotExecutable(shown.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Unrunnable, check};
    use std::ffi::OsStr;

    #[test]
    fn missing_and_unrunnable_commands_are_named_with_their_status() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let noexec = d.join("noexec");
        std::fs::write(&noexec, "echo hi\n").unwrap();
        let path = d.as_os_str();
        assert!(check(OsStr::new("sh"), Some(OsStr::new("/bin:/usr/bin"))).is_ok());
        let e = check(OsStr::new("nosuch-xyz"), Some(path)).unwrap_err();
        assert!(matches!(e, Unrunnable::NotInPath { .. }), "{e}");
        assert_eq!(e.exit_code(), 127);
        assert!(e.to_string().contains("`nosuch-xyz`"), "{e}");
        let e = check(OsStr::new("noexec"), Some(path)).unwrap_err();
        assert_eq!(e.exit_code(), 126, "{e}");
        let e = check(noexec.as_os_str(), None).unwrap_err();
        assert_eq!(e.exit_code(), 126, "{e}");
        let e = check(d.join("gone").as_os_str(), None).unwrap_err();
        assert_eq!(e.exit_code(), 127, "{e}");
        let e = check(d.as_os_str(), None).unwrap_err();
        assert!(matches!(e, Unrunnable::Directory(_)), "{e}");
    }
}
