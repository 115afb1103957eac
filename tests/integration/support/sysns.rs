//! Test support: a real systemd booted as PID 1 of private pid, mount, uts,
//! ipc and network namespaces (`tests/helpers/systemd-boot.sh` does the
//! isolation; read its header), with the shipped units installed verbatim and
//! the built binary bound over `/usr/local/bin/leaseagent`.
//!
//! The harness drives it from outside with `nsenter ... systemctl`, reads
//! files through `/proc/PID/root`, and cgroups through the machine's
//! `/sys/fs/cgroup/systemd`: systemd is started in a cgroup of its own
//! (`leaseagent-test-PID-N-NANOS`), which it takes as its root, so booted
//! systemds of concurrent tests never share a unit's cgroup.
//!
//! Teardown ([`Drop`]): SIGKILL to the namespace's PID 1 (the kernel kills
//! every process of the pid namespace), wait for the cgroups to empty, remove
//! them, remove the work directory. The namespaces and their mounts die with
//! their last process. `setpriv --pdeathsig KILL` plus `unshare --kill-child`
//! take it all down even when the test process itself dies.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

const HIERARCHIES: &str = "/sys/fs/cgroup";

/// Files to place inside before boot: absolute path inside -> content.
/// Paths below `/etc/` or `/srv/` only; `*.sh` files are made executable.
#[derive(Default, Clone)]
pub struct Stage {
    files: Vec<(String, String)>,
    /// Paths of `files` written with mode 0600 (secrets: tokens, auth files).
    secrets: Vec<String>,
}

impl Stage {
    pub fn new() -> Self {
        Stage::default()
    }

    pub fn file(mut self, path: &str, content: &str) -> Self {
        assert!(
            path.starts_with("/etc/") || path.starts_with("/srv/"),
            "stage only /etc or /srv: {path}"
        );
        self.files.push((path.to_string(), content.to_string()));
        self
    }

    /// A file as [`Stage::file`], with mode 0600 (root's, as the package
    /// writes its secrets).
    pub fn secret(mut self, path: &str, content: &str) -> Self {
        self = self.file(path, content);
        self.secrets.push(path.to_string());
        self
    }

    /// A helper script of `tests/helpers`, copied to `/srv/NAME`.
    pub fn helper(self, name: &str) -> Self {
        let text = std::fs::read_to_string(format!(
            "{}/tests/helpers/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        self.file(&format!("/srv/{name}"), &text)
    }
}

/// A booted systemd; everything of it goes away on drop.
pub struct Systemd {
    pub work: PathBuf,
    pub name: String,
    /// The systemd process, as the machine numbers it.
    pub pid: i32,
    unshare: Child,
}

impl Systemd {
    /// Boots systemd and waits until it reports `running`.
    pub fn boot(stage: &Stage) -> Systemd {
        Systemd::boot_in(stage, false)
    }

    /// Boots systemd in a fresh root: a copy-on-write overlay of the
    /// machine's `/` (its upper layer a tmpfs of the namespace) with no
    /// leaseagent in it, for installing the Debian package
    /// (`SYSNS_ROOT=overlay` in `systemd-boot.sh`).
    pub fn boot_fresh_root() -> Systemd {
        Systemd::boot_in(&Stage::new(), true)
    }

    fn boot_in(stage: &Stage, fresh_root: bool) -> Systemd {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("leaseagent-test-{}-{n}-{nanos}", std::process::id());
        // Not below /tmp: units with PrivateTmp= could not see it, and the
        // boot script mounts a private /tmp anyway.
        let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&name);
        std::fs::create_dir_all(work.join("stage")).unwrap();
        for (path, content) in &stage.files {
            let dest = work.join("stage").join(path.trim_start_matches('/'));
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::write(&dest, content).unwrap();
            use std::os::unix::fs::PermissionsExt;
            if path.ends_with(".sh") {
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            if stage.secrets.contains(path) {
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        for h in own_cgroups(&name) {
            std::fs::create_dir(&h)
                .unwrap_or_else(|e| panic!("create cgroup {}: {e}", h.display()));
        }
        let log = std::fs::File::create(work.join("boot.log")).unwrap();
        let repo = env!("CARGO_MANIFEST_DIR");
        let unshare = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "unshare", "--pid", "--fork"])
            .args(["--kill-child=SIGKILL", "--mount", "--mount-proc", "--uts"])
            .args(["--ipc", "--net", "--propagation", "private", "sh"])
            .arg(format!("{repo}/tests/helpers/systemd-boot.sh"))
            .arg(&work)
            .arg(&name)
            .args(if fresh_root {
                ["-".to_string(), "-".to_string()]
            } else {
                [
                    env!("CARGO_BIN_EXE_leaseagent").to_string(),
                    format!("{repo}/systemd"),
                ]
            })
            .env("SYSNS_ROOT", if fresh_root { "overlay" } else { "" })
            .env(
                "SYSNS_CGROUPS",
                own_cgroups(&name)
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("setpriv/unshare (util-linux) must be installed");
        let mut sd = Systemd {
            work,
            name,
            pid: 0,
            unshare,
        };
        let unshare_pid = sd.unshare.id() as i32;
        let until = Instant::now() + Duration::from_secs(60);
        sd.pid = loop {
            // The forked child of unshare becomes systemd (exec keeps the pid).
            let kids =
                std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
                    .unwrap_or_default();
            if let Some(p) = kids.split_whitespace().next() {
                let p: i32 = p.parse().unwrap();
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                if comm.trim() == "systemd" {
                    break p;
                }
            }
            if let Ok(Some(st)) = sd.unshare.try_wait() {
                panic!("boot script ended ({st}):\n{}", sd.boot_log());
            }
            assert!(
                Instant::now() < until,
                "systemd did not start:\n{}",
                sd.boot_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let out = sd.run(&["systemctl", "is-system-running"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if state == "running" {
                break;
            }
            assert!(
                state != "degraded" && Instant::now() < until,
                "systemd is {state:?}:\n{}\n{}",
                sd.boot_log(),
                sd.text(&["systemctl", "--failed", "--no-pager"])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        sd
    }

    pub fn boot_log(&self) -> String {
        std::fs::read_to_string(self.work.join("boot.log")).unwrap_or_default()
    }

    /// Runs a command inside every namespace of the booted system.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.pid.to_string())
            .args(["-m", "-p", "-u", "-i", "-n", "--"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("nsenter (util-linux) must be installed")
    }

    /// stdout (and stderr, after it) of a command inside.
    pub fn text(&self, args: &[&str]) -> String {
        let out = self.run(args);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `systemctl ARGS`, which must succeed.
    pub fn systemctl(&self, args: &[&str]) -> String {
        let mut a = vec!["systemctl"];
        a.extend_from_slice(args);
        let out = self.run(&a);
        assert!(
            out.status.success(),
            "systemctl {args:?}: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.journal_all()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One property of a unit (`systemctl show -P`).
    pub fn prop(&self, unit: &str, name: &str) -> String {
        self.text(&["systemctl", "show", "-P", name, unit])
            .trim()
            .to_string()
    }

    /// Polls a property until `f` accepts it; panics with the journal after `within`.
    pub fn wait_prop(
        &self,
        unit: &str,
        name: &str,
        within: Duration,
        f: impl Fn(&str) -> bool,
    ) -> String {
        let until = Instant::now() + within;
        loop {
            let v = self.prop(unit, name);
            if f(&v) {
                return v;
            }
            assert!(
                Instant::now() < until,
                "{unit} {name}={v:?} after {within:?}\n{}",
                self.journal(unit)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn journal(&self, unit: &str) -> String {
        self.text(&[
            "journalctl",
            "--no-pager",
            "-o",
            "short-monotonic",
            "-u",
            unit,
        ])
    }

    pub fn journal_all(&self) -> String {
        self.text(&["journalctl", "--no-pager", "-o", "short-monotonic"])
    }

    /// A path inside, as seen from the machine.
    pub fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.pid))
    }

    pub fn read(&self, inside: &str) -> String {
        std::fs::read_to_string(self.path(inside)).unwrap_or_default()
    }

    /// Machine pids in a unit's cgroup (and its sub-cgroups).
    pub fn cgroup_pids(&self, unit: &str) -> Vec<i32> {
        let cg = self.prop(unit, "ControlGroup");
        if cg.is_empty() {
            return Vec::new();
        }
        let dir = tracking_hierarchy().join(cg.trim_start_matches('/'));
        let mut out = Vec::new();
        collect_procs(&dir, &mut out);
        out
    }

    /// The machine pids of every process of the booted system.
    pub fn processes(&self) -> Vec<i32> {
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid)) else {
            return Vec::new();
        };
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
            .filter(|p| {
                std::fs::read_link(format!("/proc/{p}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&ns)
            })
            .collect()
    }

    /// The machine pid of a pid inside the namespace.
    pub fn host_pid(&self, ns_pid: i32) -> Option<i32> {
        for p in self.processes() {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let nspid = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last().map(str::to_string));
            if nspid.as_deref() == Some(&ns_pid.to_string()) {
                return Some(p);
            }
        }
        None
    }

    /// The machine pid of a unit's main process.
    pub fn main_pid(&self, unit: &str) -> i32 {
        let ns: i32 = self.prop(unit, "MainPID").parse().unwrap();
        assert!(ns > 0, "{unit} has no main pid\n{}", self.journal(unit));
        self.host_pid(ns).unwrap()
    }

    /// A GET of `http://127.0.0.1:PORT/PATH` from inside (curl).
    pub fn http_get(&self, port: u16, path: &str) -> Output {
        self.run(&[
            "curl",
            "-sS",
            "-m",
            "10",
            "-i",
            &format!("http://127.0.0.1:{port}{path}"),
        ])
    }

    /// The HTTP status of `GET http://127.0.0.1:PORT/PATH` from inside
    /// (curl), with the token in `token_file` (a path inside) as the
    /// bearer when given.
    pub fn http_status(&self, port: u16, path: &str, token_file: Option<&str>) -> String {
        let auth = token_file
            .map(|f| format!("-H \"Authorization: Bearer $(cat {f})\""))
            .unwrap_or_default();
        let script = format!(
            "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:{port}{path}"
        );
        self.text(&["sh", "-c", &script])
    }

    /// `leaseagent revoke TASK` from inside, against `authority` with the
    /// token in `token_file` (a path inside).
    pub fn revoke(&self, authority: &str, token_file: &str, task: &str) -> Output {
        self.run(&[
            "leaseagent",
            "revoke",
            "--authority",
            authority,
            "--auth-token-file",
            token_file,
            task,
        ])
    }

    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let v2 = Path::new(HIERARCHIES).join(&self.name);
        if v2.is_dir() {
            out.push(v2);
        }
        if let Ok(rd) = std::fs::read_dir(HIERARCHIES) {
            for h in rd.flatten() {
                let d = h.path().join(&self.name);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
        out
    }

    /// Whether anything of this system is left on the machine.
    pub fn leftovers(name: &str, work: &Path, pid: i32) -> Vec<String> {
        let mut left = Vec::new();
        if pid > 0 && Path::new(&format!("/proc/{pid}")).exists() {
            left.push(format!("process {pid}"));
        }
        if Path::new(HIERARCHIES).join(name).exists() {
            left.push(format!("cgroup {HIERARCHIES}/{name}"));
        }
        if let Ok(rd) = std::fs::read_dir(HIERARCHIES) {
            for h in rd.flatten() {
                let d = h.path().join(name);
                if d.exists() {
                    left.push(format!("cgroup {}", d.display()));
                }
            }
        }
        if work.exists() {
            left.push(format!("directory {}", work.display()));
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts.contains(name) {
            left.push("a mount".to_string());
        }
        left
    }
}

/// The hierarchy systemd tracks processes in: `name=systemd` on a hybrid
/// (v1) machine, the unified one on a pure cgroup v2 machine.
fn tracking_hierarchy() -> PathBuf {
    let v1 = Path::new(HIERARCHIES).join("systemd");
    if v1.is_dir() {
        v1
    } else {
        PathBuf::from(HIERARCHIES)
    }
}

/// The cgroups a booted systemd starts in (and takes as its root).
fn own_cgroups(name: &str) -> Vec<PathBuf> {
    let base = Path::new(HIERARCHIES);
    if base.join("systemd").is_dir() {
        let mut v = vec![base.join("systemd").join(name)];
        if base.join("unified").is_dir() {
            v.push(base.join("unified").join(name));
        }
        v
    } else {
        vec![base.join(name)]
    }
}

fn collect_procs(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_procs(&e.path(), out);
            }
        }
    }
}

fn dirs_depth_first(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs_depth_first(&e.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

impl Drop for Systemd {
    fn drop(&mut self) {
        // PID 1 of the namespace: its death kills everything inside.
        if self.pid > 0 {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(self.pid).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = self.unshare.try_wait() {
                break;
            }
            if Instant::now() >= until {
                let _ = self.unshare.kill();
                let _ = self.unshare.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Empty cgroups can be removed, deepest first; processes that are
        // still exiting keep theirs busy for a moment.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let mut busy = false;
            for top in self.cgroup_dirs() {
                let mut dirs = Vec::new();
                dirs_depth_first(&top, &mut dirs);
                for d in dirs {
                    if std::fs::remove_dir(&d).is_err() {
                        busy = true;
                    }
                }
            }
            if !busy || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}
