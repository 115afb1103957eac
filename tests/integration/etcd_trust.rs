//! etcd secured: `etcds://` with the suite's own CA and client certificates,
//! etcd auth with a role limited to key prefixes and short-lived tokens,
//! exact task keys, a 3-member TLS cluster, `etcdctl lock` interop with
//! TLS and a user, and the operator commands on etcd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leaseagent::testing::{
    AcquireError, AcquireRequest, ClientTrust, EtcdAuthority, ExpiryPolicy, LeaseClient, Outcome,
    TrustFiles, Waiter,
};

use crate::support::etcd::{Etcd, Secure, Tls, poll};
use crate::support::stderr_of;
use crate::support::tls::Pki;

const USER: &str = "agent";
const PASSWORD: &str = "pw-c0ffee-42";
/// The role's key prefixes: tasks named `jobs-…`, and `team/…` (written
/// `team%2F…` in etcd).
const PREFIXES: &[&str] = &["jobs-", "team%2F"];

struct Secured {
    pki: Pki,
    etcd: Etcd,
    password_file: PathBuf,
}

fn tls_files(pki: &Pki) -> Tls {
    Tls {
        ca: pki.path("ca.pem"),
        cert: pki.path("server.pem"),
        key: pki.path("server.key"),
        client_cert: pki.path("client.pem"),
        client_key: pki.path("client.key"),
        require_client_cert: true,
    }
}

/// `n` members with TLS (client certificates required), auth on, tokens
/// that expire after `token_ttl` seconds.
fn secured(n: usize, token_ttl: u32) -> Secured {
    let pki = Pki::new();
    let mut etcd = Etcd::start_secure(
        n,
        Secure {
            tls: Some(tls_files(&pki)),
            auth_token_ttl: Some(token_ttl),
        },
    );
    etcd.enable_auth(USER, PASSWORD, PREFIXES);
    let password_file = pki.secret("etcd-pw", &format!("{PASSWORD}\n"), 0o600);
    Secured {
        pki,
        etcd,
        password_file,
    }
}

impl Secured {
    /// `leaseagent` with every trust flag.
    fn agent(&self, task: &str) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
        c.env("RUST_LOG", "trace")
            .env("XDG_RUNTIME_DIR", self.pki.dir.path())
            .args(["--authority", &self.etcd.url(), "--task", task])
            .arg("--ca-file")
            .arg(self.pki.path("ca.pem"))
            .arg("--client-cert")
            .arg(self.pki.path("client.pem"))
            .arg("--client-key")
            .arg(self.pki.path("client.key"))
            .args(["--etcd-user", USER, "--etcd-password-file"])
            .arg(&self.password_file)
            .stdin(Stdio::null());
        c
    }

    fn files(&self) -> TrustFiles {
        TrustFiles {
            ca_file: Some(self.pki.path("ca.pem")),
            client_cert: Some(self.pki.path("client.pem")),
            client_key: Some(self.pki.path("client.key")),
            etcd_user: Some(USER.into()),
            etcd_password_file: Some(self.password_file.clone()),
            ..Default::default()
        }
    }

    fn authority(&self) -> EtcdAuthority {
        let trust: Arc<ClientTrust> = ClientTrust::load(&self.files(), true).expect("trust");
        EtcdAuthority::with_trust(self.etcd.endpoints(), true, trust)
    }
}

fn req(task: &str, holder: &str) -> AcquireRequest {
    AcquireRequest {
        task: task.into(),
        holder: holder.into(),
        ttl: Duration::from_secs(10),
        on_expiry: ExpiryPolicy::Redispatch,
        grace: Duration::ZERO,
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn exits_125_naming(mut c: Command, cause: &str, marker: &Path) -> String {
    let o = c.arg("--").arg("touch").arg(marker).output().expect("run");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(125), "{e}");
    assert!(e.contains(cause), "`{cause}` not named: {e}");
    assert!(!marker.exists(), "the job ran");
    e
}

#[test]
fn tls_and_auth_grant_reauthenticate_and_keep_secrets_out() {
    // Tokens live 1 s, the heartbeat is 2 s: every renewal finds its token
    // expired and must authenticate again without losing the lease.
    let s = secured(1, 1);
    let env_dump = s.pki.path("env");
    let o = s
        .agent("jobs-a")
        .args(["--ttl", "6s", "--", "sh", "-c"])
        .arg(format!("sleep 5; env > {}", env_dump.display()))
        .output()
        .expect("run");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(
        e.contains("authenticating again"),
        "no re-authentication: {e}"
    );
    let env = std::fs::read_to_string(&env_dump).unwrap();
    assert!(
        !env.contains(PASSWORD) && !e.contains(PASSWORD),
        "password leaked"
    );
    assert!(!env.contains("LEASEAGENT_ETCD"), "{env}");
    assert!(
        env.lines()
            .any(|l| l == format!("LEASE_AUTHORITY={}", s.etcd.url())),
        "{env}"
    );
    assert!(s.etcd.keys("jobs-a/").is_empty(), "key left");
    assert!(s.etcd.leases().is_empty(), "lease left");
}

#[test]
fn credential_and_tls_problems_exit_125_naming_the_cause() {
    let s = secured(1, 300);
    let marker = s.pki.path("ran");
    // Wrong password.
    let bad = s.pki.secret("bad-pw", "nope\n", 0o600);
    let mut c = s.agent("jobs-b");
    c.arg("--etcd-password-file").arg(&bad);
    exits_125_naming(c, "authentication", &marker);
    // A task outside the role's prefixes.
    exits_125_naming(s.agent("other"), "permission denied", &marker);
    // No login at all.
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.args([
        "--authority",
        &s.etcd.url(),
        "--task",
        "jobs-b",
        "--ca-file",
    ])
    .arg(s.pki.path("ca.pem"))
    .arg("--client-cert")
    .arg(s.pki.path("client.pem"))
    .arg("--client-key")
    .arg(s.pki.path("client.key"));
    // (etcd may take the certificate's name as the user: either way refused.)
    let o = c.arg("--").arg("touch").arg(&marker).output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(!marker.exists());
    // Without our CA: the certificate is not accepted.
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.args(["--authority", &s.etcd.url(), "--task", "jobs-b"]);
    exits_125_naming(c, "certificate", &marker);
    // Plain etcd:// to the TLS port.
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.args([
        "--authority",
        &s.etcd.url().replace("etcds://", "etcd://"),
        "--task",
        "jobs-b",
    ]);
    exits_125_naming(c, "TLS", &marker);
    // Nothing was left behind by the refused attempts.
    assert!(s.etcd.leases().is_empty(), "{:?}", s.etcd.leases());
}

#[test]
fn a_waiter_keeps_its_place_across_token_expiry() {
    let s = secured(1, 1);
    let mut holder = s.authority();
    let mut first = s.authority();
    let mut second = s.authority();
    let t = Duration::from_secs(5);
    let g = holder.acquire(&req("jobs-q", "holder"), t).expect("holder");
    let held = |r: Result<_, AcquireError>| {
        assert!(
            matches!(r, Err(AcquireError::Held { retry_after: Some(d), .. }) if d.is_zero()),
            "{r:?}"
        );
    };
    held(first.acquire_wait(&req("jobs-q", "first"), Duration::from_millis(300), t));
    held(second.acquire_wait(&req("jobs-q", "second"), Duration::from_millis(300), t));
    // Let every token expire, then poll again: re-authenticated, still queued.
    std::thread::sleep(Duration::from_millis(2500));
    held(second.acquire_wait(&req("jobs-q", "second"), Duration::from_millis(300), t));
    held(first.acquire_wait(&req("jobs-q", "first"), Duration::from_millis(300), t));
    std::thread::sleep(Duration::from_millis(2500));
    holder
        .release(&g.lease_ref(), Outcome::Succeeded, Some(0), t)
        .expect("release after token expiry");
    // The first waiter is next, though its token expired meanwhile.
    held(second.acquire_wait(&req("jobs-q", "second"), Duration::from_millis(300), t));
    let g1 = first
        .acquire_wait(&req("jobs-q", "first"), Duration::from_secs(3), t)
        .expect("first waiter gets the task");
    assert!(g1.token > g.token);
    first
        .release(&g1.lease_ref(), Outcome::Succeeded, Some(0), t)
        .unwrap();
    let g2 = second
        .acquire_wait(&req("jobs-q", "second"), Duration::from_secs(3), t)
        .expect("then the second");
    assert!(g2.token > g1.token);
    second
        .release(&g2.lease_ref(), Outcome::Succeeded, Some(0), t)
        .unwrap();
}

#[test]
fn task_keys_are_exact_both_ways() {
    let etcd = Etcd::start();
    let t = Duration::from_secs(5);
    let mut a = EtcdAuthority::new(etcd.endpoints());
    let mut b = EtcdAuthority::new(etcd.endpoints());
    // `a` held, then `a/b` is free.
    let ga = a.acquire(&req("a", "A"), t).expect("a");
    let gb = b.acquire(&req("a/b", "B"), t).expect("a/b while a is held");
    assert_eq!(etcd.keys("a/"), vec![format!("a/{}", ga.lease_id)]);
    assert_eq!(etcd.keys("a%2Fb/"), vec![format!("a%2Fb/{}", gb.lease_id)]);
    a.release(&ga.lease_ref(), Outcome::Succeeded, None, t)
        .unwrap();
    // `a/b` held, then `a` is free; and `a/b/c` too.
    let ga = a.acquire(&req("a", "A"), t).expect("a while a/b is held");
    let mut c = EtcdAuthority::new(etcd.endpoints());
    let gc = c.acquire(&req("a/b/c", "C"), t).expect("a/b/c");
    // While held, each is still refused to others.
    let mut d = EtcdAuthority::new(etcd.endpoints());
    for task in ["a", "a/b", "a/b/c"] {
        assert!(matches!(
            d.acquire(&req(task, "D"), t),
            Err(AcquireError::Held { .. })
        ));
    }
    for (auth, g) in [(&mut a, ga), (&mut b, gb), (&mut c, gc)] {
        auth.release(&g.lease_ref(), Outcome::Succeeded, None, t)
            .unwrap();
    }
    assert!(etcd.leases().is_empty());
}

#[test]
fn failover_across_a_tls_cluster_keeps_the_lease() {
    let mut s = secured(3, 300);
    let started = s.pki.path("started");
    let mut child = s
        .agent("jobs-f")
        .env("RUST_LOG", "info")
        .args(["--ttl", "6s", "--", "sh", "-c"])
        .arg(format!("echo x > {}; sleep 8", started.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    poll(Duration::from_secs(15), "the job", || {
        std::fs::metadata(&started).ok()
    });
    std::thread::sleep(Duration::from_millis(1000));
    let leader = s.etcd.leader();
    s.etcd.members[leader].kill();
    let status = poll(Duration::from_secs(40), "the agent", || {
        child.try_wait().ok().flatten()
    });
    let e = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{e}");
    assert!(s.etcd.keys("jobs-f/").is_empty(), "key left");
}

#[test]
fn etcdctl_lock_with_tls_and_a_user_interoperates_both_ways() {
    let s = secured(1, 300);
    let dir = s.pki.dir.path();
    let lock_user = format!("--user={USER}:{PASSWORD}");
    // etcdctl holds jobs-i until `release` exists; leaseagent waits for it.
    let release = dir.join("release");
    let script = format!(
        "echo $ETCD_LOCK_REV > {d}/rev; while [ ! -e {r} ]; do sleep 0.05; done",
        d = dir.display(),
        r = release.display()
    );
    let mut lock = s
        .etcd
        .etcdctl_cmd(&[&lock_user, "lock", "jobs-i", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    let rev: u64 = poll(Duration::from_secs(15), "etcdctl's lock", || {
        std::fs::read_to_string(dir.join("rev"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    let token_file = dir.join("token");
    let mut waiter = s
        .agent("jobs-i")
        .env("RUST_LOG", "info")
        .args(["--wait", "30s", "--", "sh", "-c"])
        .arg(format!("echo $LEASE_TOKEN > {}", token_file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        !token_file.exists(),
        "leaseagent ran while etcdctl held the lock"
    );
    std::fs::write(&release, "").unwrap();
    let status = poll(Duration::from_secs(20), "the waiter", || {
        waiter.try_wait().ok().flatten()
    });
    assert_eq!(status.code(), Some(0));
    let token: u64 = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token > rev, "{token} !> {rev}");
    let _ = lock.wait();
    // leaseagent holds jobs-i; `etcdctl lock` waits for it.
    let (started, ended, tok2) = (dir.join("started"), dir.join("ended"), dir.join("tok2"));
    let mut holder = s
        .agent("jobs-i")
        .env("RUST_LOG", "info")
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo $LEASE_TOKEN > {t}; echo x > {s}; sleep 2; echo x > {e}",
            t = tok2.display(),
            s = started.display(),
            e = ended.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    poll(Duration::from_secs(15), "the holder", || {
        std::fs::metadata(&started).ok()
    });
    let out = s
        .etcd
        .etcdctl_cmd(&[
            &lock_user,
            "lock",
            "jobs-i",
            "--",
            "sh",
            "-c",
            "echo $ETCD_LOCK_REV",
        ])
        .output()
        .expect("etcdctl lock");
    assert!(out.status.success(), "{out:?}");
    assert!(
        ended.exists(),
        "etcdctl got the lock while leaseagent's job ran"
    );
    let lock_rev: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let held_token: u64 = std::fs::read_to_string(&tok2)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(lock_rev > held_token, "{lock_rev} !> {held_token}");
    let _ = holder.wait();
}

#[test]
fn operator_commands_on_etcd() {
    let s = secured(1, 300);
    let t = Duration::from_secs(5);
    let mut holder = s.authority();
    let mut waiter = s.authority();
    let g = holder
        .acquire(&req("team/x", "holder-1"), t)
        .expect("holder");
    assert!(
        waiter
            .acquire_wait(&req("team/x", "waiter-1"), Duration::from_millis(200), t)
            .is_err()
    );
    let op = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
        c.args(args)
            .args(["--authority", &s.etcd.url(), "--ca-file"])
            .arg(s.pki.path("ca.pem"))
            .arg("--client-cert")
            .arg(s.pki.path("client.pem"))
            .arg("--client-key")
            .arg(s.pki.path("client.key"))
            .args(["--etcd-user", "root", "--etcd-password-file"])
            .arg(s.pki.secret("root-pw", "root-pw-91\n", 0o600));
        c.output().expect("run")
    };
    let o = op(&["leases", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["leases"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!(rows[0]["task"], "team/x");
    assert_eq!(rows[0]["state"], "active");
    assert_eq!(rows[0]["holder"], "holder-1");
    assert_eq!(rows[0]["lease_id"], g.lease_id.as_str());
    assert!(rows[0]["expires_in_ms"].as_u64().unwrap() > 0);
    assert_eq!(rows[1]["state"], "waiting");
    assert_eq!(rows[1]["holder"], "waiter-1");
    let o = op(&["revoke", "--json", "team/x"]);
    assert!(o.status.success(), "{o:?}");
    // The holder is refused; the waiter is next.
    assert!(holder.renew(&g.lease_ref(), t).is_err());
    let g2 = waiter
        .acquire_wait(&req("team/x", "waiter-1"), Duration::from_secs(3), t)
        .expect("waiter after revoke");
    assert!(g2.token > g.token);
    // clear: nothing to clear with etcd (exit 1); revoke of a free task: 1.
    let o = op(&["clear", "team/x"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    waiter
        .release(&g2.lease_ref(), Outcome::Succeeded, None, t)
        .unwrap();
    let o = op(&["revoke", "team/x"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    // The restricted user may not list everything: 125, permission denied.
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    let o = c
        .args(["leases", "--authority", &s.etcd.url(), "--ca-file"])
        .arg(s.pki.path("ca.pem"))
        .arg("--client-cert")
        .arg(s.pki.path("client.pem"))
        .arg("--client-key")
        .arg(s.pki.path("client.key"))
        .args(["--etcd-user", USER, "--etcd-password-file"])
        .arg(&s.password_file)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{o:?}");
    assert!(stderr(&o).contains("permission denied"));
}

#[test]
fn a_wait_that_ends_in_an_error_gives_up_its_place() {
    let s = secured(1, 300);
    let t = Duration::from_secs(5);
    let mut holder = s.authority();
    let mut waiter = s.authority();
    let g = holder.acquire(&req("jobs-w", "holder"), t).expect("holder");
    assert!(matches!(
        waiter.acquire_wait(&req("jobs-w", "waiter"), Duration::from_millis(200), t),
        Err(AcquireError::Held { retry_after: Some(d), .. }) if d.is_zero()
    ));
    assert_eq!(s.etcd.keys("jobs-w/").len(), 2, "the waiter is queued");
    // The role may still write (and so revoke its lease) but no longer read:
    // the waiter's polls fail, and the wait ends in an error.
    let ok = |o: Output| assert!(o.status.success(), "{o:?}");
    ok(s.etcd.etcdctl(&[
        "role",
        "revoke-permission",
        "tasks",
        "jobs-",
        "--prefix=true",
    ]));
    ok(s.etcd.etcdctl(&[
        "role",
        "grant-permission",
        "--prefix=true",
        "tasks",
        "write",
        "jobs-",
    ]));
    let r = waiter.acquire_wait(&req("jobs-w", "waiter"), Duration::from_millis(300), t);
    assert!(matches!(r, Err(AcquireError::Transient(_))), "{r:?}");
    // Its place is gone: only the holder's key is left.
    assert_eq!(
        s.etcd.keys("jobs-w/"),
        vec![format!("jobs-w/{}", g.lease_id)],
        "the waiter left its key behind"
    );
    assert_eq!(s.etcd.leases(), vec![g.lease_id.clone()]);
}
