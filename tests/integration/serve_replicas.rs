//! `serve` replicas on one PostgreSQL store (`--store`): the schema serve
//! makes and refuses, exactly one replica leading, what a standby answers,
//! and failover (kill -9 of the leader, a leader stopped past its
//! leadership ttl and then resumed). Each test runs its own PostgreSQL 15
//! as `nobody` (`support::postgres`), stopped when the test ends, however
//! it ends.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};

use crate::support;
use support::authority::{Store, poll, post, request, spawn_serve_on, spawn_serve_via};
use support::postgres::Postgres;

/// The leadership ttl of these tests' replicas.
const LEADER_TTL: &str = "2s";
const LEADER_TTL_MS: u64 = 2000;

fn store(pg: &Postgres) -> Store {
    Store::Postgres {
        url: pg.url("postgres"),
        password_file: pg.password_file.clone(),
        leader_ttl: LEADER_TTL,
    }
}

/// One replica: its process (SIGCONTed and killed on drop) and address.
struct Replica {
    child: Child,
    addr: String,
    _stderr: std::sync::mpsc::Receiver<String>,
}

impl Replica {
    fn start(store: &Store) -> Replica {
        Self::start_with(store, &[])
    }

    fn start_with(store: &Store, flags: &[&str]) -> Replica {
        let mut args: Vec<std::ffi::OsString> = vec!["--listen".into(), "127.0.0.1:0".into()];
        args.extend(flags.iter().map(Into::into));
        Self::spawned(spawn_serve_on(store, &args))
    }

    /// A replica on `wire`'s host, listening on its address.
    fn start_in(wire: &support::netns::Wire, store: &Store) -> Replica {
        let cmd = wire.cmd(support::bin().to_str().unwrap());
        let listen = format!("{}:0", wire.there);
        // Plain HTTP beyond loopback, on a wire only this test uses.
        let args = ["--listen".into(), listen.into(), "--insecure-listen".into()];
        Self::spawned(spawn_serve_via(cmd, store, &args))
    }

    fn spawned(s: support::authority::Spawned) -> Replica {
        Replica {
            child: s.child,
            addr: s.addr,
            _stderr: s.stderr,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `/healthz`: (status, body), or None when it does not answer.
    fn health(&self) -> Option<(u16, Value)> {
        let (st, b) = request(&self.addr, "GET", "/healthz", b"", Duration::from_secs(2)).ok()?;
        Some((st, serde_json::from_slice(&b).unwrap_or(Value::Null)))
    }

    fn leads(&self) -> bool {
        self.health().is_some_and(|(st, _)| st == 200)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post(&self.addr, path, body)
    }

    fn acquire(&self, task: &str, holder: &str, ttl_ms: u64) -> (u16, Value) {
        self.post(
            "/v1/acquire",
            &json!({"task": task, "holder": holder, "ttl_ms": ttl_ms}),
        )
    }

    fn renew(&self, g: &Value) -> (u16, Value) {
        self.post(
            "/v1/renew",
            &json!({"lease_id": g["lease_id"], "token": g["token"]}),
        )
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, sig: Signal) {
        if let Some(pid) = Pid::from_raw(self.pid()) {
            let _ = kill_process(pid, sig);
        }
    }

    /// SIGSTOP, returning once every thread of it is stopped.
    fn freeze(&self) {
        self.signal(Signal::STOP);
        let pid = self.pid();
        let stopped = support::all_threads_stopped(pid as u32, Duration::from_secs(10));
        assert!(stopped.is_some(), "serve {pid} did not stop");
    }

    fn thaw(&self) {
        self.signal(Signal::CONT);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(Signal::CONT);
        }
        self.kill9();
    }
}

/// Waits until exactly one of `rs` leads (and the others say standby);
/// its index.
fn one_leader(rs: &[&Replica], within: Duration) -> usize {
    poll("exactly one replica to lead", within, || {
        let states: Vec<Option<(u16, Value)>> = rs.iter().map(|r| r.health()).collect();
        let leading: Vec<usize> = (0..rs.len())
            .filter(|i| states[*i].as_ref().is_some_and(|(st, _)| *st == 200))
            .collect();
        let standing_by = states
            .iter()
            .filter(|s| {
                s.as_ref()
                    .is_some_and(|(st, b)| *st == 503 && b["standby"] == true)
            })
            .count();
        (leading.len() == 1 && standing_by == rs.len() - 1).then(|| leading[0])
    })
}

/// Runs `serve` on `store` expecting it to refuse to start: its exit code
/// and what it said.
fn refused(store: &Store, extra: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(support::authority::bin())
        .arg("serve")
        .args(["--no-auth", "--listen", "127.0.0.1:0"])
        .args(store.args())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = support::wait_exit(&mut child, Duration::from_secs(30));
    let Some(st) = st else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve did not refuse to start within 30 s");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (st.code(), err)
}

#[test]
fn serve_makes_its_schema_and_refuses_a_newer_one() {
    let pg = Postgres::start();
    let s = store(&pg);
    let r = Replica::start(&s);
    one_leader(&[&r], Duration::from_secs(30));
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT value FROM leaseagent.meta WHERE key = 'schema_version'"
        ),
        "2"
    );
    let (st, g) = r.acquire("schema", "h", 60_000);
    assert_eq!(st, 200, "{g}");
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT token, holder FROM leaseagent.tasks WHERE task = 'schema'"
        ),
        format!("{}|h", g["token"]),
        "the grant is on record in PostgreSQL"
    );
    drop(r);
    pg.psql(
        "postgres",
        "UPDATE leaseagent.meta SET value = '99' WHERE key = 'schema_version'",
    );
    let (code, err) = refused(&s, &[]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("schema version 99 is newer than this leaseagent knows (2)"),
        "{err}"
    );
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT value FROM leaseagent.meta WHERE key = 'schema_version'"
        ),
        "99",
        "a refused schema is left as it was"
    );
}

#[test]
fn secrets_are_refused_from_the_url_and_from_a_loose_file() {
    let pg = Postgres::start();
    let with_pw = Store::Postgres {
        url: format!(
            "postgresql://{}:hunter2@127.0.0.1:{}/postgres",
            support::postgres::USER,
            pg.port
        ),
        password_file: pg.password_file.clone(),
        leader_ttl: LEADER_TTL,
    };
    let (code, err) = refused(&with_pw, &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("--store-password-file") && !err.contains("hunter2"),
        "{err}"
    );
    set_mode(&pg.password_file, 0o644);
    let (code, err) = refused(&store(&pg), &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("chmod 600"), "{err}");
    set_mode(&pg.password_file, 0o600);
    // The wrong password: PostgreSQL's refusal, named.
    let d = tempfile::tempdir().unwrap();
    let wrong = d.path().join("pw");
    std::fs::write(&wrong, "not-it\n").unwrap();
    set_mode(&wrong, 0o600);
    let bad = Store::Postgres {
        url: pg.url("postgres"),
        password_file: wrong,
        leader_ttl: LEADER_TTL,
    };
    let (code, err) = refused(&bad, &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("password authentication failed"), "{err}");
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn one_of_three_replicas_leads_and_standbys_name_it() {
    let pg = Postgres::start();
    let s = store(&pg);
    let rs: Vec<Replica> = (0..3).map(|_| Replica::start(&s)).collect();
    let refs: Vec<&Replica> = rs.iter().collect();
    let l = one_leader(&refs, Duration::from_secs(30));
    for (i, r) in rs.iter().enumerate().filter(|(i, _)| *i != l) {
        // A standby that has not read the new leadership row yet says
        // `"leader": null`; within a few of its reads it names the leader.
        poll(
            "the standby to name the leader",
            Duration::from_secs(10),
            || {
                let (st, v) = r.acquire("t", "h", 10_000);
                assert_eq!(st, 503, "replica {i}: {v}");
                assert_eq!(v["error"], "not_leader", "{v}");
                assert!(v["leader"].is_null() || v["leader"].is_string(), "{v}");
                (v["leader"] == rs[l].url()).then_some(())
            },
        );
        let (st, v) = r.post("/v1/renew", &json!({"lease_id": "x", "token": 1}));
        assert_eq!((st, v["error"].as_str()), (503, Some("not_leader")), "{v}");
        let (st, page) = request(&r.addr, "GET", "/", b"", Duration::from_secs(5)).unwrap();
        let page = String::from_utf8_lossy(&page);
        assert_eq!(st, 200);
        assert!(
            page.contains("standing by") && page.contains(&rs[l].url()),
            "{page}"
        );
        let (st, m) = request(&r.addr, "GET", "/metrics", b"", Duration::from_secs(5)).unwrap();
        let m = String::from_utf8_lossy(&m);
        assert_eq!(st, 200);
        assert!(m.contains("\nleaseagent_leader 0\n"), "{m}");
    }
    let (st, g) = rs[l].acquire("t", "h", 10_000);
    assert_eq!(st, 200, "{g}");
    let (_, m) = request(&rs[l].addr, "GET", "/metrics", b"", Duration::from_secs(5)).unwrap();
    assert!(String::from_utf8_lossy(&m).contains("\nleaseagent_leader 1\n"));
    // The run history is read from the store by any replica.
    for r in &rs {
        let (st, h) = request(
            &r.addr,
            "GET",
            "/v1/history?task=t",
            b"",
            Duration::from_secs(5),
        )
        .unwrap();
        let h: Value = serde_json::from_slice(&h).unwrap();
        assert_eq!(st, 200, "{h}");
        assert_eq!(h["attempts"][0]["token"], g["token"], "{h}");
        assert_eq!(h["attempts"][0]["holder"], "h", "{h}");
    }
}

#[test]
fn kill_9_of_the_leader_a_standby_takes_over_keeping_leases_and_raising_tokens() {
    let pg = Postgres::start();
    let s = store(&pg);
    let mut rs: Vec<Replica> = (0..3).map(|_| Replica::start(&s)).collect();
    let l = one_leader(&rs.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    let ttl = 20_000;
    let (st, live) = rs[l].acquire("live", "alive", ttl);
    assert_eq!(st, 200, "{live}");
    let (st, dead) = rs[l].acquire("dead", "gone", ttl);
    assert_eq!(st, 200, "{dead}");
    let mut old = rs.remove(l);
    let killed = Instant::now();
    old.kill9();
    let refs: Vec<&Replica> = rs.iter().collect();
    let n = one_leader(&refs, Duration::from_secs(3 * LEADER_TTL_MS / 1000 + 20));
    let took = killed.elapsed();
    eprintln!("takeover after kill -9: {took:?} (leader ttl {LEADER_TTL})");
    let new = &rs[n];
    // The live holder keeps its lease: renewing it on the new leader works.
    let (st, v) = new.renew(&live);
    assert_eq!(
        st, 200,
        "a live holder keeps its lease across a failover: {v}"
    );
    // The dead holder's task stays held for a full ttl after the takeover.
    let (st, v) = new.acquire("dead", "next", ttl);
    assert_eq!((st, v["error"].as_str()), (409, Some("held")), "{v}");
    assert!(
        v["retry_after_ms"].as_u64().unwrap() > ttl - took.as_millis() as u64 - 1000,
        "the lease on record got at least a ttl from the takeover: {v}"
    );
    let (st, g) = new.acquire("fresh", "h", ttl);
    assert_eq!(st, 200, "{g}");
    assert!(
        g["token"].as_u64() > dead["token"].as_u64(),
        "tokens go on above every committed one: {g} after {dead}"
    );
    // The takeover is on record and counted.
    let (_, m) = request(&new.addr, "GET", "/metrics", b"", Duration::from_secs(5)).unwrap();
    let m = String::from_utf8_lossy(&m);
    assert!(m.contains("\nleaseagent_failovers_total 1\n"), "{m}");
    assert_eq!(
        pg.psql("postgres", "SELECT count(*) FROM leaseagent.takeovers"),
        "2",
        "the first leader's takeover and this one"
    );
}

#[test]
fn a_leader_stopped_past_its_ttl_answers_nothing_as_leader_when_it_wakes() {
    let pg = Postgres::start();
    let s = store(&pg);
    let rs: Vec<Replica> = (0..2).map(|_| Replica::start(&s)).collect();
    let a = one_leader(&[&rs[0], &rs[1]], Duration::from_secs(30));
    let (old, new) = (&rs[a], &rs[1 - a]);
    let (st, kept) = old.acquire("kept", "h", 60_000);
    assert_eq!(st, 200, "{kept}");
    // Grants keep coming at the leader while it is stopped: some are in
    // flight (sent, not answered) across the stop.
    let stop = Arc::new(AtomicBool::new(false));
    // (token, sent, answer received) of every grant answered 200.
    let answered: Arc<Mutex<Vec<(u64, Instant, Instant)>>> = Arc::default();
    let hammer = {
        let (addr, stop, answered) = (old.addr.clone(), stop.clone(), answered.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            let mut late = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({"task": format!("a-{i}"), "holder": "a", "ttl_ms": 60_000});
                let sent = Instant::now();
                let r = request(
                    &addr,
                    "POST",
                    "/v1/acquire",
                    body.to_string().as_bytes(),
                    Duration::from_secs(30),
                );
                let Ok((st, b)) = r else { continue };
                let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
                if st == 200 {
                    answered.lock().unwrap().push((
                        v["token"].as_u64().unwrap(),
                        sent,
                        Instant::now(),
                    ));
                } else {
                    late.push((st, v));
                    // Paced: a deposed leader answers at once.
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            late
        })
    };
    poll("grants at the leader", Duration::from_secs(20), || {
        (answered.lock().unwrap().len() >= 5).then_some(())
    });
    old.freeze();
    let frozen = Instant::now();
    one_leader_of(new, Duration::from_secs(30));
    let (st, b_grant) = new.acquire("b-1", "b", 60_000);
    assert_eq!(st, 200, "{b_grant}");
    // Stopped for longer than its leadership ttl (the scenario itself, not
    // a wait for something to happen: the new leader may lead sooner,
    // counting from the old one's last renewal).
    std::thread::sleep(Duration::from_millis(LEADER_TTL_MS).saturating_sub(frozen.elapsed()));
    assert!(frozen.elapsed() >= Duration::from_millis(LEADER_TTL_MS));
    old.thaw();
    let thawed = Instant::now();
    // Awake: it answers lease calls only as a standby naming the new leader.
    for _ in 0..5 {
        let (st, v) = old.acquire("after-wake", "a", 60_000);
        assert_eq!((st, v["error"].as_str()), (503, Some("not_leader")), "{v}");
        let (st, v) = old.renew(&kept);
        assert_eq!((st, v["error"].as_str()), (503, Some("not_leader")), "{v}");
    }
    poll(
        "the old leader to say standby",
        Duration::from_secs(20),
        || {
            old.health()
                .is_some_and(|(st, v)| {
                    st == 503 && v["standby"] == true && v["leader"] == new.url()
                })
                .then_some(())
        },
    );
    stop.store(true, Ordering::Relaxed);
    let late = hammer.join().unwrap();
    eprintln!(
        "the stopped leader answered {} grants, then {} refusals",
        answered.lock().unwrap().len(),
        late.len()
    );
    for (st, v) in &late {
        assert!(
            *st == 503 && v["error"] == "not_leader",
            "the stopped leader answered a grant in flight with {st} {v}"
        );
    }
    // Every grant it answered is on record; none of its writes landed
    // after the new leader's (tokens); one whose answer arrived after the
    // thaw was sent before the stop: committed while it led, its answer
    // held up with the process (as a slow network would, which the
    // agent's deadline, counted from the send, already allows for), never
    // new work taken on after waking.
    let answered = answered.lock().unwrap().clone();
    let b_token = b_grant["token"].as_u64().unwrap();
    for (token, sent, at) in &answered {
        assert!(
            *at < thawed || *sent < frozen,
            "grant {token}, sent after the stop, answered as leader after waking"
        );
        assert!(
            *token < b_token,
            "the old leader's token {token} after the new leader's {b_token}"
        );
        let on_record = pg.psql(
            "postgres",
            &format!("SELECT count(*) FROM leaseagent.history WHERE token = {token}"),
        );
        assert_eq!(on_record, "1", "answered grant {token} lost");
    }
    let max_a = pg.psql(
        "postgres",
        "SELECT coalesce(max(token), 0) FROM leaseagent.history WHERE holder = 'a'",
    );
    assert!(
        max_a.parse::<u64>().unwrap() < b_token,
        "a write of the deposed leader landed after the new leader's ({max_a} vs {b_token})"
    );
    // The new leader still knows the lease the old one granted.
    let (st, v) = new.renew(&kept);
    assert_eq!(st, 200, "{v}");
}

fn one_leader_of(r: &Replica, within: Duration) {
    let deadline = Instant::now() + within;
    while !r.leads() {
        if Instant::now() > deadline {
            let said: Vec<String> = r._stderr.try_iter().collect();
            panic!(
                "{} did not lead within {within:?}; it said:\n{}",
                r.addr,
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tls_verify_full_with_a_ca_file_and_nothing_else() {
    let pki = support::tls::Pki::new();
    let pg = Postgres::start_with(Some((&pki.path("server.pem"), &pki.path("server.key"))));
    let with = |query: &str| Store::Postgres {
        url: format!("{}{query}", pg.url("postgres")),
        password_file: pg.password_file.clone(),
        leader_ttl: LEADER_TTL,
    };
    let ca = pki.path("ca.pem").display().to_string();
    let r = Replica::start(&with(&format!("?sslmode=verify-full&sslrootcert={ca}")));
    one_leader(&[&r], Duration::from_secs(30));
    let (st, g) = r.acquire("over-tls", "h", 10_000);
    assert_eq!(st, 200, "{g}");
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'leaseagent-serve' AND NOT s.ssl"
        ),
        "0",
        "every connection of serve is TLS"
    );
    drop(r);
    // A server whose certificate another CA signed is refused.
    let other = pki.path("other-ca.pem").display().to_string();
    let (code, err) = refused(
        &with(&format!("?sslmode=verify-full&sslrootcert={other}")),
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(
        err.contains("certificate") || err.contains("UnknownIssuer"),
        "{err}"
    );
    // Plain text, even on loopback, where the server demands TLS.
    let (code, err) = refused(&with(""), &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("pg_hba.conf") || err.contains("no encryption"),
        "{err}"
    );
    // A mode that checks nothing is refused before connecting.
    let (code, err) = refused(&with("?sslmode=require"), &[]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("verify-full"), "{err}");
}

#[test]
fn an_agent_given_every_replica_keeps_its_job_through_a_failover() {
    let pg = Postgres::start();
    let s = store(&pg);
    let mut rs: Vec<Replica> = (0..2).map(|_| Replica::start(&s)).collect();
    let l = one_leader(&[&rs[0], &rs[1]], Duration::from_secs(30));
    // The standby first: the agent's first try is answered `not_leader`
    // and goes on, within the same try, to the leader.
    let authority = format!("{},{}", rs[1 - l].url(), rs[l].url());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("agent.log");
    let mut agent = Command::new(support::authority::bin())
        .args(["--authority", &authority, "--task", "ha", "--ttl", "10s"])
        .args([
            "--",
            "sh",
            "-c",
            "echo $LEASE_TOKEN > token; while [ ! -e go ]; do sleep 0.05; done",
        ])
        .current_dir(d)
        .env("LEASEAGENT_STATE_DIR", d.join("state"))
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let token: u64 = poll("the job to start", Duration::from_secs(30), || {
        std::fs::read_to_string(d.join("token"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let mut old = rs.remove(l);
    old.kill9();
    let new = &rs[0];
    one_leader_of(new, Duration::from_secs(30));
    let renewals = || -> f64 {
        let (_, m) = request(&new.addr, "GET", "/metrics", b"", Duration::from_secs(5)).unwrap();
        String::from_utf8_lossy(&m)
            .lines()
            .find_map(|l| l.strip_prefix("leaseagent_renewals_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    poll(
        "the agent to renew on the new leader",
        Duration::from_secs(30),
        || (renewals() >= 1.0).then_some(()),
    );
    assert!(
        agent.try_wait().unwrap().is_none(),
        "the agent ended during the failover: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    std::fs::write(d.join("go"), "").unwrap();
    let st = support::wait_exit(&mut agent, Duration::from_secs(30)).expect("the agent to end");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(st.success(), "{st:?}: {text}");
    for line in text.lines().filter(|l| l.contains("authority")) {
        eprintln!("agent: {line}");
    }
    assert!(
        text.contains("does not lead"),
        "the agent's log says which replica: {text}"
    );
    // Released on the new leader: the task is free, with a higher token.
    let (st, g) = new.acquire("ha", "next", 10_000);
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > token, "{g} after {token}");
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_leader_cut_off_from_the_store_stops_answering_before_another_leads() {
    let pg = Postgres::start();
    // The leader reaches PostgreSQL only through a proxy that the test
    // turns into a black hole (its connections cut, new ones swallowed);
    // agents still reach the leader itself.
    let proxy = support::Proxy::start(format!("127.0.0.1:{}", pg.port).parse().unwrap());
    let a = Replica::start(&store_at(&pg, "127.0.0.1", proxy.addr.port()));
    leader_cut_off(&pg, a, store(&pg), || {
        proxy.set(support::ProxyMode::Blackhole)
    });
}

/// The same cut as a real partition: the leader runs on a host of its own
/// (a network namespace) whose packets to PostgreSQL vanish (no RST, no
/// ICMP: its connection and every new one just get no answer), while the
/// test, as the agents, still reaches it.
#[test]
fn a_leader_on_a_host_cut_off_from_the_store_stops_answering_before_another_leads() {
    let wire = support::netns::Wire::new();
    // Beyond loopback serve talks to PostgreSQL over verified TLS only.
    let pki = support::tls::Pki::new();
    let san = format!("IP:{},IP:127.0.0.1", wire.here);
    pki.issue("wire", "pg", &san, "serverAuth");
    let pg =
        Postgres::start_tls_also_on((&pki.path("wire.pem"), &pki.path("wire.key")), &wire.here);
    let tls_at = |host: &str| {
        let mut store = store_at(&pg, host, pg.port);
        if let Store::Postgres { url, .. } = &mut store {
            let ca = pki.path("ca.pem");
            url.push_str(&format!(
                "?sslmode=verify-full&sslrootcert={}",
                ca.display()
            ));
        }
        store
    };
    let a = Replica::start_in(&wire, &tls_at(&wire.here));
    leader_cut_off(&pg, a, tls_at("127.0.0.1"), || wire.cut_source());
}

/// `pg`'s store, reached at `host`:`port`.
fn store_at(pg: &Postgres, host: &str, port: u16) -> Store {
    Store::Postgres {
        url: format!(
            "postgresql://{}@{host}:{port}/postgres",
            support::postgres::USER,
        ),
        password_file: pg.password_file.clone(),
        leader_ttl: LEADER_TTL,
    }
}

/// `a` leads (reaching `pg` through what `cut` cuts), a standby on
/// `standby` follows;
/// while renewals go to `a`, `cut` cuts it off from the store: `a` answers
/// no renewal as leader once the standby took over, and says not_leader.
fn leader_cut_off(pg: &Postgres, a: Replica, standby: Store, cut: impl FnOnce()) {
    one_leader_of(&a, Duration::from_secs(30));
    let b = Replica::start(&standby);
    assert_eq!(one_leader(&[&a, &b], Duration::from_secs(30)), 0);
    let (st, g) = a.acquire("cut", "h", 60_000);
    assert_eq!(st, 200, "{g}");
    let stop = Arc::new(AtomicBool::new(false));
    // Renewals at the cut-off leader: (wall ms sent, status).
    let renewing = {
        let (addr, stop, g) = (a.addr.clone(), stop.clone(), g.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let body = json!({"lease_id": g["lease_id"], "token": g["token"]}).to_string();
            while !stop.load(Ordering::Relaxed) {
                let sent = wall_ms();
                let r = request(
                    &addr,
                    "POST",
                    "/v1/renew",
                    body.as_bytes(),
                    Duration::from_secs(10),
                );
                if let Ok((st, b)) = r {
                    seen.push((sent, st, String::from_utf8_lossy(&b).into_owned()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        })
    };
    cut();
    let cut = wall_ms();
    one_leader_of(&b, Duration::from_secs(30));
    // Renewals go on a while longer, then stop.
    poll(
        "the cut-off leader to say not_leader",
        Duration::from_secs(20),
        || {
            let (st, v) = a.renew(&g);
            (st == 503 && v["error"] == "not_leader").then_some(())
        },
    );
    stop.store(true, Ordering::Relaxed);
    let seen = renewing.join().unwrap();
    let took_over: u64 = pg
        .psql(
            "postgres",
            "SELECT at_ms FROM leaseagent.takeovers ORDER BY epoch DESC LIMIT 1",
        )
        .parse()
        .unwrap();
    assert!(took_over > cut, "the standby took over before the cut?");
    let answered: Vec<&(u64, u16, String)> = seen.iter().filter(|(_, st, _)| *st == 200).collect();
    assert!(
        answered.iter().any(|(sent, _, _)| *sent > cut),
        "the leader went on answering from memory for a while after the cut"
    );
    for (sent, _, body) in &answered {
        assert!(
            *sent < took_over,
            "a renewal sent at {sent} (after the takeover at {took_over}) was answered as leader: {body}"
        );
    }
    for (sent, st, body) in seen.iter().filter(|(_, st, _)| *st != 200) {
        assert_eq!(*st, 503, "{sent}: {body}");
        assert!(body.contains("not_leader"), "{body}");
    }
    let last = answered.iter().map(|(s, _, _)| *s).max().unwrap();
    eprintln!(
        "cut at {cut}: last renewal answered as leader was sent {} ms after the cut; \
         the standby took over {} ms after the cut",
        last - cut,
        took_over - cut
    );
    // The new leader kept the lease (a full ttl from its takeover).
    let (st, v) = b.renew(&g);
    assert_eq!(st, 200, "{v}");
}

#[test]
fn an_asynchronous_standby_is_refused_unless_allowed_and_a_synchronous_one_passes() {
    let primary = Postgres::start();
    let standby = Postgres::standby_of(&primary);
    let streaming = |state: &str| {
        primary.psql(
            "postgres",
            &format!("SELECT count(*) FROM pg_stat_replication WHERE {state}"),
        )
    };
    poll("the standby to stream", Duration::from_secs(30), || {
        (streaming("state = 'streaming' AND sync_state = 'async'") == "1").then_some(())
    });
    let s = store(&primary);
    let (code, err) = refused(&s, &[]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("1 standby(s) stream from this primary and none is synchronous")
            && err.contains("--store-allow-async")
            && err.contains("synchronous_mode"),
        "{err}"
    );
    assert_eq!(
        primary.psql(
            "postgres",
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'leaseagent'"
        ),
        "0",
        "nothing written to a refused store"
    );
    // Opted in: it runs (and says the risk in its log).
    let r = Replica::start_with(&s, &["--store-allow-async"]);
    one_leader_of(&r, Duration::from_secs(30));
    drop(r);
    // The primary waits for its standby: accepted without the flag, and an
    // answered grant is on the standby.
    primary.psql(
        "postgres",
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
    );
    primary.psql("postgres", "SELECT pg_reload_conf()");
    poll(
        "the standby to be synchronous",
        Duration::from_secs(30),
        || (streaming("sync_state = 'sync'") == "1").then_some(()),
    );
    let r = Replica::start(&s);
    one_leader_of(&r, Duration::from_secs(30));
    let (st, g) = r.acquire("sync", "h", 60_000);
    assert_eq!(st, 200, "{g}");
    poll("the grant on the standby", Duration::from_secs(10), || {
        let t = standby.psql(
            "postgres",
            "SELECT coalesce(max(token), 0) FROM leaseagent.tasks WHERE task = 'sync'",
        );
        (t.parse::<u64>().ok() == g["token"].as_u64()).then_some(())
    });
    // A store URL that reaches the standby itself is refused.
    let (code, err) = refused(&store(&standby), &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("is a standby (in recovery)"), "{err}");
}

#[test]
fn a_failover_of_postgresql_loses_no_answered_grant_and_reuses_no_token() {
    let mut primary = Postgres::start();
    let standby = Postgres::standby_of(&primary);
    primary.psql(
        "postgres",
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
    );
    primary.psql("postgres", "SELECT pg_reload_conf()");
    poll(
        "the standby to be synchronous",
        Duration::from_secs(30),
        || {
            let n = primary.psql(
                "postgres",
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            );
            (n == "1").then_some(())
        },
    );
    // Both hosts in the URL: serve connects to whichever accepts writes.
    let s = Store::Postgres {
        url: format!(
            "postgresql://{}@127.0.0.1:{},127.0.0.1:{}/postgres",
            support::postgres::USER,
            primary.port,
            standby.port
        ),
        password_file: primary.password_file.clone(),
        leader_ttl: LEADER_TTL,
    };
    let r = Replica::start(&s);
    one_leader_of(&r, Duration::from_secs(30));
    let stop = Arc::new(AtomicBool::new(false));
    // (sent, token) of every grant answered.
    let answered: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let load = {
        let (addr, stop, answered) = (r.addr.clone(), stop.clone(), answered.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({"task": format!("pf-{}", i % 50), "holder": format!("h{i}"), "ttl_ms": 1000});
                let sent = Instant::now();
                let Ok((st, b)) = request(
                    &addr,
                    "POST",
                    "/v1/acquire",
                    body.to_string().as_bytes(),
                    Duration::from_secs(10),
                ) else {
                    continue;
                };
                if st == 200 {
                    let v: Value = serde_json::from_slice(&b).unwrap();
                    answered
                        .lock()
                        .unwrap()
                        .push((sent, v["token"].as_u64().unwrap()));
                } else {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };
    let count = || answered.lock().unwrap().len();
    poll(
        "grants before the failover",
        Duration::from_secs(30),
        || (count() >= 30).then_some(()),
    );
    // The primary crashes (immediate shutdown) under load; the standby is
    // promoted.
    let crashed = Instant::now();
    primary.stop();
    let before = count();
    assert_eq!(standby.psql("postgres", "SELECT pg_promote()"), "t");
    let promoted = Instant::now();
    poll(
        "grants on the promoted primary",
        Duration::from_secs(60),
        || (count() >= before + 30).then_some(()),
    );
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let all = answered.lock().unwrap().clone();
    let answered: Vec<u64> = all.iter().map(|(_, t)| *t).collect();
    let unique: std::collections::HashSet<u64> = answered.iter().copied().collect();
    assert_eq!(unique.len(), answered.len(), "a token was answered twice");
    let on_record: std::collections::HashSet<u64> = standby
        .psql("postgres", "SELECT token FROM leaseagent.history")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let lost: Vec<&u64> = answered.iter().filter(|t| !on_record.contains(t)).collect();
    assert!(
        lost.is_empty(),
        "answered grants lost in the failover: {lost:?}"
    );
    // Asked before the crash, or after the promotion (a grant asked in
    // between may have committed on either side).
    let last_before = all
        .iter()
        .filter(|(sent, _)| *sent < crashed)
        .map(|(_, t)| t)
        .max()
        .unwrap();
    let first_after = all
        .iter()
        .filter(|(sent, _)| *sent > promoted)
        .map(|(_, t)| t)
        .min()
        .unwrap();
    assert!(
        first_after > last_before,
        "token {first_after} after the failover is not above {last_before}"
    );
    eprintln!(
        "{} grants answered before the PostgreSQL failover, {} after; none lost",
        before,
        answered.len() - before
    );
}

#[test]
fn sigterm_lets_go_of_the_leadership_so_a_standby_leads_at_once() {
    let pg = Postgres::start();
    // A leadership ttl far longer than the wait below: only a leader that
    // lets go can be followed that soon.
    let s = Store::Postgres {
        url: pg.url("postgres"),
        password_file: pg.password_file.clone(),
        leader_ttl: "60s",
    };
    let mut rs: Vec<Replica> = (0..2).map(|_| Replica::start(&s)).collect();
    let l = one_leader(&[&rs[0], &rs[1]], Duration::from_secs(30));
    let (st, g) = rs[l].acquire("kept", "h", 120_000);
    assert_eq!(st, 200, "{g}");
    let mut old = rs.remove(l);
    old.signal(Signal::TERM);
    let st = support::wait_exit(&mut old.child, Duration::from_secs(20)).expect("serve to exit");
    assert!(st.success(), "{st:?}");
    one_leader_of(&rs[0], Duration::from_secs(20));
    let (st, v) = rs[0].renew(&g);
    assert_eq!(st, 200, "the lease survived the handover: {v}");
}

/// Garbage in the store (a bad restore, another program, a hand edit) is
/// named and never read as a default: a replica whose store holds a row it
/// cannot read does not lead (no grant, so no token can restart), says
/// which table, task and column on stderr once, and tries again ever more
/// slowly, not several takeovers a second; once the row is mended it leads
/// and the next token is above every one before.
#[test]
fn garbage_rows_in_the_store_are_named_and_nothing_is_granted_until_mended() {
    let pg = Postgres::start();
    let mut a = Replica::start(&store(&pg));
    one_leader_of(&a, Duration::from_secs(30));
    let (st, g) = a.acquire("victim", "h", 60_000);
    assert_eq!(st, 200, "{g}");
    let token = g["token"].as_u64().unwrap();
    a.kill9();
    let epoch = || -> u64 {
        pg.psql("postgres", "SELECT epoch FROM leaseagent.leader")
            .parse()
            .unwrap()
    };
    for (break_it, mend, named) in [
        (
            "UPDATE leaseagent.tasks SET policy = 'forever' WHERE task = 'victim'",
            "UPDATE leaseagent.tasks SET policy = 'redispatch' WHERE task = 'victim'",
            "policy is unknown (\"forever\")",
        ),
        (
            "UPDATE leaseagent.tasks SET token = last_token + 7 WHERE task = 'victim'",
            "UPDATE leaseagent.tasks SET token = last_token WHERE task = 'victim'",
            "token is",
        ),
        (
            "UPDATE leaseagent.seq SET last_token = -1",
            "UPDATE leaseagent.seq SET last_token = (SELECT max(last_token) FROM leaseagent.tasks)",
            "-1",
        ),
    ] {
        pg.psql("postgres", break_it);
        let b = Replica::start(&store(&pg));
        let before = epoch();
        // Watched for 3 s: never leading, never granting.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let (st, v) = b.acquire("other", "h", 10_000);
            assert_eq!(st, 503, "{break_it}: {v}");
            assert_eq!(v["error"], "not_leader", "{break_it}: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let tries = epoch() - before;
        let said: Vec<String> = b._stderr.try_iter().collect();
        let errors: Vec<&String> = said.iter().filter(|l| l.contains(": error: ")).collect();
        assert!(
            errors.iter().any(|l| l.contains(named)),
            "{break_it}: stderr does not name it:\n{}",
            said.join("\n")
        );
        assert!(
            errors.len() <= 2,
            "{break_it}: the same error said {} times in 3 s:\n{}",
            errors.len(),
            said.join("\n")
        );
        // A doubling wait from 100 ms: 0, 100, 200, 400, 800, 1,600 ms...
        // about 6 tries in 3 s (before: about 6 a second).
        assert!(tries <= 10, "{break_it}: {tries} takeovers in 3 s");
        pg.psql("postgres", mend);
        one_leader_of(&b, Duration::from_secs(30));
        let (st, g) = b.acquire("after", "h", 10_000);
        assert_eq!(st, 200, "{mend}: {g}");
        assert!(
            g["token"].as_u64().unwrap() > token,
            "{mend}: {g} after {token}"
        );
        let (st, g) = b.post("/v1/revoke", &json!({"task": "after", "force": true}));
        assert_eq!(st, 200, "{g}");
        drop(b);
    }
}
