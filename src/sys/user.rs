//! `--user NAME[:GROUP]`: who the job runs as, looked up the way `runuser`
//! looks it up, and the switch to it in the job's child before `exec`.
//!
//! **Lookups read `/etc/passwd` and `/etc/group`** as glibc's `files` NSS
//! source does (the first entry of a name wins; comments and NIS `+`/`-`
//! lines are skipped; supplementary groups as `initgroups`: the primary
//! group and every group whose member list names the user), not through
//! `getpwnam_r` and `getgrouplist`. The binaries are linked statically, and
//! a static glibc that meets a source beyond `files` in `nsswitch.conf`
//! (Debian's default `passwd: files systemd`) `dlopen`s that module and
//! its shared libc into the process: asked for a name `files` does not
//! know, the agent died of SIGSEGV, on the very glibc it was built
//! against. A user from LDAP or SSSD is therefore not found (exit 125,
//! "no such user"), where `runuser` would find it; a local account is
//! found the same way. Every lookup happens in the agent before the
//! acquire, so an unknown user or group is a usage error (exit 125) and
//! nothing is granted.
//!
//! **The switch** happens in the job's own child, between `clone`/`fork`
//! and `exec` ([`Switch::apply`]): supplementary groups, then the group,
//! then the user (each later step needs the privilege the earlier ones
//! keep), with the raw system calls. glibc's `setuid` wrappers broadcast the
//! change to every thread of the process (a lock and a signal per thread),
//! which is neither needed nor safe in a child copied from a threaded
//! parent; the raw calls are per thread, and the child has one thread.
//! Then the change is checked, not assumed: real, effective and saved ids
//! and the group list read back, and for a user other than root no
//! capability left (a uid change from root clears them; an agent that held
//! ambient capabilities without being root would otherwise hand them on,
//! so they are cleared first). Any mismatch and the job never runs.
//!
//! The agent and the keeper keep their own ids: only the job's child
//! switches, so the job cannot signal, trace or stop either of them.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// Who the job runs as: what the keeper's child switches to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// The supplementary groups, sorted, without duplicates.
    pub groups: Vec<u32>,
}

impl Identity {
    /// The form the keeper gets on its command line: `UID:GID:G1,G2,...`.
    pub fn to_arg(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }

    /// Reads [`Identity::to_arg`]'s form back.
    pub fn from_arg(s: &str) -> Option<Identity> {
        let mut parts = s.splitn(3, ':');
        let uid = parts.next()?.parse().ok()?;
        let gid = parts.next()?.parse().ok()?;
        let list = parts.next()?;
        let mut groups = Vec::new();
        for g in list.split(',').filter(|g| !g.is_empty()) {
            groups.push(g.parse().ok()?);
        }
        Some(Identity::new(uid, gid, groups))
    }

    /// An identity with the group list sorted and deduplicated (the kernel
    /// keeps it sorted, so [`Switch::apply`] compares it as it reads it).
    pub fn new(uid: u32, gid: u32, mut groups: Vec<u32>) -> Identity {
        groups.sort_unstable();
        groups.dedup();
        Identity { uid, gid, groups }
    }

    /// The ids this process runs with now (effective ids, current groups).
    pub fn current() -> Identity {
        let groups = rustix::process::getgroups()
            .map(|g| g.iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        Identity::new(
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
            groups,
        )
    }
}

/// A user as the password file has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: OsString,
    pub shell: OsString,
}

/// A database that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct LookupFailed {
    pub path: &'static str,
    #[source]
    pub source: std::io::Error,
}

/// The password and group files.
pub const PASSWD: &str = "/etc/passwd";
pub const GROUP: &str = "/etc/group";

fn read(path: &'static str) -> Result<Vec<u8>, LookupFailed> {
    std::fs::read(path).map_err(|source| LookupFailed { path, source })
}

/// The `:`-separated fields of each entry of a `files` database: comments,
/// blank lines and NIS `+`/`-` lines (which `files` ignores too) skipped.
fn entries(text: &[u8]) -> impl Iterator<Item = Vec<&[u8]>> {
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty() && !matches!(l[0], b'#' | b'+' | b'-'))
        .map(|l| l.split(|b| *b == b':').collect::<Vec<_>>())
}

fn number(field: &[u8]) -> Option<u32> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// The first well-formed entry of the password file `text` that `want`
/// picks.
fn find_user(text: &[u8], want: impl Fn(&[u8], u32) -> bool) -> Option<Account> {
    entries(text).find_map(|f| {
        let [name, _, uid, gid, _, home, shell] = f[..] else {
            return None;
        };
        let (uid, gid) = (number(uid)?, number(gid)?);
        let name = std::str::from_utf8(name).ok()?;
        want(name.as_bytes(), uid).then(|| Account {
            name: name.to_string(),
            uid,
            gid,
            home: OsString::from_vec(home.to_vec()),
            shell: OsString::from_vec(shell.to_vec()),
        })
    })
}

/// The user `name`; `None`: no such user.
pub fn user_by_name(name: &str) -> Result<Option<Account>, LookupFailed> {
    Ok(find_user(&read(PASSWD)?, |n, _| n == name.as_bytes()))
}

/// The first user whose uid is `uid`; `None`: no such user.
pub fn user_by_uid(uid: u32) -> Result<Option<Account>, LookupFailed> {
    Ok(find_user(&read(PASSWD)?, |_, u| u == uid))
}

/// The gid of the group `name`; `None`: no such group.
pub fn group_by_name(name: &str) -> Result<Option<u32>, LookupFailed> {
    Ok(group_in(&read(GROUP)?, name))
}

fn group_in(text: &[u8], name: &str) -> Option<u32> {
    entries(text).find_map(|f| match f[..] {
        [n, _, gid, _] if n == name.as_bytes() => number(gid),
        _ => None,
    })
}

/// `name`'s groups as `initgroups(name, gid)` sets them from the files:
/// `gid` and every group whose member list names `name`.
pub fn group_list(name: &str, gid: u32) -> Result<Vec<u32>, LookupFailed> {
    Ok(groups_in(&read(GROUP)?, name, gid))
}

fn groups_in(text: &[u8], name: &str, gid: u32) -> Vec<u32> {
    let mut out = vec![gid];
    for f in entries(text) {
        let [_, _, g, members] = f[..] else { continue };
        let named = members.split(|b| *b == b',').any(|m| m == name.as_bytes());
        if let (true, Some(g)) = (named, number(g)) {
            out.push(g);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

// ---------------------------------------------------------------- the switch

/// Which step of [`Switch::apply`] failed (the job never runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchStep {
    Groups,
    Gid,
    Uid,
    /// The ids or groups read back are not the ones set.
    Check,
    /// A capability is left after a switch to a user other than root.
    Capabilities,
    /// The capabilities that reach the guardians could not be dropped
    /// (`sys::confine`).
    Confine,
    /// NoNewPrivs could not be set.
    NoNewPrivs,
}

impl SwitchStep {
    pub fn describe(self) -> &'static str {
        match self {
            SwitchStep::Groups => "setgroups",
            SwitchStep::Gid => "setresgid",
            SwitchStep::Uid => "setresuid",
            SwitchStep::Check => "the ids read back after the switch differ",
            SwitchStep::Capabilities => "capabilities are left after the switch",
            SwitchStep::Confine => "dropping the capabilities that reach the guardians",
            SwitchStep::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
        }
    }

    pub fn code(self) -> u32 {
        match self {
            SwitchStep::Groups => 1,
            SwitchStep::Gid => 2,
            SwitchStep::Uid => 3,
            SwitchStep::Check => 4,
            SwitchStep::Capabilities => 5,
            SwitchStep::Confine => 6,
            SwitchStep::NoNewPrivs => 7,
        }
    }

    pub fn from_code(code: u32) -> Option<SwitchStep> {
        Some(match code {
            1 => SwitchStep::Groups,
            2 => SwitchStep::Gid,
            3 => SwitchStep::Uid,
            4 => SwitchStep::Check,
            5 => SwitchStep::Capabilities,
            6 => SwitchStep::Confine,
            7 => SwitchStep::NoNewPrivs,
            _ => return None,
        })
    }
}

/// An [`Identity`] prepared for a child before `exec`: everything in
/// memory made before the fork, so [`Switch::apply`] allocates nothing.
#[derive(Clone, Debug)]
pub struct Switch {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl Switch {
    pub fn new(id: &Identity) -> Switch {
        Switch {
            uid: id.uid,
            gid: id.gid,
            groups: id.groups.clone(),
        }
    }

    /// In the child, between `fork`/`clone` and `exec`: groups, gid, uid,
    /// then the check. Async-signal-safe: raw system calls on memory made
    /// before the fork and on this stack frame, no allocation, no lock.
    /// `Err`: the step and its errno (0 for a failed check).
    pub fn apply(&self) -> Result<(), (SwitchStep, i32)> {
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: raw system calls with integer arguments, and `groups`,
        // a live array of `len` gids; each call affects only this thread,
        // the only one of the child.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) != 0 {
                return Err((SwitchStep::Groups, errno()));
            }
            if libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) != 0 {
                return Err((SwitchStep::Gid, errno()));
            }
            if self.uid != 0 {
                // An agent with ambient capabilities (not root) would hand
                // them on through the uid change; none may reach the job.
                // EINVAL before Linux 4.3, which has no ambient set.
                libc::syscall(
                    libc::SYS_prctl,
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                );
            }
            if libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) != 0 {
                return Err((SwitchStep::Uid, errno()));
            }
        }
        self.check()
    }

    /// Reads the ids, groups and capabilities back (child only, as
    /// [`Switch::apply`]).
    fn check(&self) -> Result<(), (SwitchStep, i32)> {
        let (mut r, mut e, mut s) = (0 as libc::uid_t, 0, 0);
        let (mut rg, mut eg, mut sg) = (0 as libc::gid_t, 0, 0);
        let mut groups = [0 as libc::gid_t; 64];
        // SAFETY: each pointer is to a live local of the type the call
        // writes; `groups` holds 64 entries and 64 is passed.
        let n = unsafe {
            libc::syscall(libc::SYS_getresuid, &mut r, &mut e, &mut s);
            libc::syscall(libc::SYS_getresgid, &mut rg, &mut eg, &mut sg);
            libc::syscall(libc::SYS_getgroups, groups.len(), groups.as_mut_ptr())
        };
        let ids_ok = [r, e, s] == [self.uid; 3] && [rg, eg, sg] == [self.gid; 3];
        // More than 64 groups (n < 0, EINVAL) are not read back; the
        // setgroups call itself succeeded.
        let groups_ok =
            n < 0 || (n as usize <= groups.len() && groups[..n as usize] == self.groups[..]);
        if !ids_ok || !groups_ok {
            return Err((SwitchStep::Check, 0));
        }
        if self.uid != 0 {
            let left = super::confine::sets().is_none_or(|sets| sets.iter().any(|s| *s != 0));
            if left {
                return Err((SwitchStep::Capabilities, 0));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_nobody_are_found_by_name_and_uid() {
        let root = user_by_name("root").unwrap().expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(root.home, OsString::from("/root"));
        assert_eq!(user_by_uid(0).unwrap().unwrap().name, "root");
        let nobody = user_by_name("nobody").unwrap().expect("nobody exists");
        assert_eq!(nobody.uid, 65534);
        assert_eq!(group_by_name("root").unwrap(), Some(0));
    }

    #[test]
    fn unknown_names_are_none_not_errors() {
        assert_eq!(user_by_name("no-such-user-leaseagent").unwrap(), None);
        assert_eq!(user_by_name("nul\0inside").unwrap(), None);
        assert_eq!(group_by_name("no-such-group-leaseagent").unwrap(), None);
        assert_eq!(user_by_uid(4_000_000_000).unwrap(), None);
    }

    const PASSWD_TEXT: &[u8] = b"# a comment\n\
root:x:0:0:root:/root:/bin/bash\n\
+nis-user::::::\n\
broken:x:12\n\
bad-uid:x:-1:5::/:/bin/sh\n\
alice:x:1000:1000:Alice,,,:/home/alice:\n\
alice:x:1001:1001::/second:/bin/sh\n\
bob:x:1002:100::/home/b\xffb:/bin/zsh\n";

    const GROUP_TEXT: &[u8] = b"root:x:0:\n\
users:x:100:alice,bob\n\
wheel:x:10:carol,alice\n\
-nis-group:::\n\
short:x:11\n\
other:x:12:alicex\n";

    #[test]
    fn the_files_are_read_as_glibcs_files_source_reads_them() {
        let alice = find_user(PASSWD_TEXT, |n, _| n == b"alice").unwrap();
        // The first entry of a name wins; an empty shell stays empty.
        assert_eq!((alice.uid, alice.gid), (1000, 1000));
        assert_eq!(alice.home, OsString::from("/home/alice"));
        assert!(alice.shell.is_empty());
        // Malformed lines, NIS lines and negative ids are never matched.
        for name in [&b"broken"[..], b"bad-uid", b"+nis-user", b"nis-user"] {
            assert_eq!(find_user(PASSWD_TEXT, |n, _| n == name), None);
        }
        // A home that is no UTF-8 is kept as bytes.
        let bob = find_user(PASSWD_TEXT, |_, u| u == 1002).unwrap();
        assert_eq!(bob.home.as_encoded_bytes(), b"/home/b\xffb");
        assert_eq!(group_in(GROUP_TEXT, "wheel"), Some(10));
        assert_eq!(group_in(GROUP_TEXT, "short"), None);
        assert_eq!(group_in(GROUP_TEXT, "nis-group"), None);
        // initgroups: the primary group and every group naming the user.
        assert_eq!(groups_in(GROUP_TEXT, "alice", 1000), vec![10, 100, 1000]);
        assert_eq!(groups_in(GROUP_TEXT, "bob", 100), vec![100]);
        assert_eq!(groups_in(GROUP_TEXT, "nobody", 4242), vec![4242]);
    }

    #[test]
    fn an_identity_round_trips_through_its_argument() {
        let id = Identity::new(65534, 65534, vec![7, 3, 7, 100]);
        assert_eq!(id.groups, vec![3, 7, 100]);
        assert_eq!(id.to_arg(), "65534:65534:3,7,100");
        assert_eq!(Identity::from_arg(&id.to_arg()), Some(id));
        let none = Identity::new(1, 2, vec![]);
        assert_eq!(Identity::from_arg(&none.to_arg()), Some(none));
        for bad in ["", "1", "1:2", "x:2:", "1:2:a", "-1:2:"] {
            assert_eq!(Identity::from_arg(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn step_codes_round_trip() {
        for s in [
            SwitchStep::Groups,
            SwitchStep::Gid,
            SwitchStep::Uid,
            SwitchStep::Check,
            SwitchStep::Capabilities,
            SwitchStep::Confine,
            SwitchStep::NoNewPrivs,
        ] {
            assert_eq!(SwitchStep::from_code(s.code()), Some(s));
        }
        assert_eq!(SwitchStep::from_code(0), None);
    }
}
