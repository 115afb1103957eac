//! The etcd authority through the `LeaseClient` trait (and its queue, the
//! `Waiter`), against real etcd processes on loopback ports (see
//! tests/support_etcd).

use crate::support;

use std::time::{Duration, Instant};

use leaseagent::testing::EtcdAuthority;
use leaseagent::testing::{
    AcquireError, AcquireRequest, ExpiryPolicy, LeaseClient, Outcome, RefusalReason, RenewError,
    Waiter,
};
use support::etcd::{Etcd, etcdctl_lock, poll, read_rev};
use support::stderr_of;

const T: Duration = Duration::from_secs(3);

fn req(task: &str, holder: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        task: task.into(),
        holder: holder.into(),
        ttl,
        on_expiry: ExpiryPolicy::Redispatch,
        grace: Duration::ZERO,
    }
}

fn auth(etcd: &Etcd) -> EtcdAuthority {
    EtcdAuthority::new(etcd.endpoints())
}

#[test]
fn grant_renew_release_and_tokens_increase() {
    let etcd = Etcd::start();
    let mut a = auth(&etcd);
    assert_eq!(a.url(), etcd.url());
    let g1 = a
        .acquire(&req("job", "w1/1", Duration::from_millis(4500)), T)
        .expect("acquire");
    // ttl rounded up to whole seconds.
    assert_eq!(g1.ttl, Duration::from_secs(5));
    let key = format!("job/{}", g1.lease_id);
    assert_eq!(etcd.keys("job/"), vec![key.clone()]);
    assert_eq!(etcd.get(&key).as_deref(), Some("w1/1"));
    assert_eq!(etcd.leases(), vec![g1.lease_id.clone()]);
    let r = a.renew(&g1.lease_ref(), T).expect("renew");
    assert_eq!(r.ttl, Duration::from_secs(5));
    a.release(&g1.lease_ref(), Outcome::Succeeded, Some(0), T)
        .expect("release");
    assert!(etcd.keys("job/").is_empty(), "key left after release");
    assert!(etcd.leases().is_empty(), "lease left after release");
    // Released twice: the lease is gone, said as a refusal.
    assert!(matches!(
        a.release(&g1.lease_ref(), Outcome::Succeeded, Some(0), T),
        Err(RenewError::Refused { .. })
    ));
    let g2 = a
        .acquire(&req("job", "w1/2", Duration::from_secs(5)), T)
        .expect("acquire again");
    assert!(g2.token > g1.token, "{} !> {}", g2.token, g1.token);
    // The token is the store revision at which ownership was confirmed.
    let out = etcd.etcdctl(&["get", "job/", "--prefix", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let create = v["kvs"][0]["create_revision"].as_u64().unwrap();
    assert_eq!(g2.token, create);
    // A renewal after release is refused.
    a.release(&g2.lease_ref(), Outcome::Failed, Some(1), T)
        .unwrap();
    match a.renew(&g2.lease_ref(), T) {
        Err(RenewError::Refused { reason, .. }) => assert!(matches!(
            reason,
            RefusalReason::Expired | RefusalReason::UnknownLease
        )),
        other => panic!("renew after release: {other:?}"),
    }
}

#[test]
fn held_task_names_the_holder_and_leaves_no_trace() {
    let etcd = Etcd::start();
    let mut a = auth(&etcd);
    let mut b = auth(&etcd);
    let g = a
        .acquire(&req("t", "alice", Duration::from_secs(10)), T)
        .unwrap();
    match b.acquire(&req("t", "bob", Duration::from_secs(10)), T) {
        Err(AcquireError::Held { holder, .. }) => assert_eq!(holder, "alice"),
        other => panic!("expected held, got {other:?}"),
    }
    assert_eq!(etcd.keys("t/"), vec![format!("t/{}", g.lease_id)]);
    assert_eq!(
        etcd.leases().len(),
        1,
        "the refused acquirer's lease is left"
    );
    // Other tasks (even with a common name prefix) are independent.
    let g2 = b
        .acquire(&req("t2", "bob", Duration::from_secs(10)), T)
        .expect("another task");
    b.release(&g2.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    a.release(&g.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
}

#[test]
fn policies_other_than_redispatch_are_rejected() {
    let etcd = Etcd::start();
    let mut a = auth(&etcd);
    let mut r = req("t", "h", Duration::from_secs(5));
    r.on_expiry = ExpiryPolicy::Grace;
    assert!(matches!(a.acquire(&r, T), Err(AcquireError::Rejected(_))));
    assert!(etcd.leases().is_empty());
}

#[test]
fn refusals_when_the_lease_is_revoked_or_the_key_deleted_from_outside() {
    let etcd = Etcd::start();
    let mut a = auth(&etcd);
    let g = a
        .acquire(&req("r", "h", Duration::from_secs(10)), T)
        .unwrap();
    let out = etcd.etcdctl(&["lease", "revoke", &g.lease_id]);
    assert!(out.status.success(), "{out:?}");
    match a.renew(&g.lease_ref(), T) {
        Err(RenewError::Refused { .. }) => {}
        other => panic!("renew of a revoked lease: {other:?}"),
    }

    let g = a
        .acquire(&req("r", "h", Duration::from_secs(10)), T)
        .unwrap();
    let out = etcd.etcdctl(&["del", &format!("r/{}", g.lease_id)]);
    assert!(out.status.success(), "{out:?}");
    match a.renew(&g.lease_ref(), T) {
        Err(RenewError::Refused { reason, .. }) => assert_eq!(reason, RefusalReason::Revoked),
        other => panic!("renew with the key deleted: {other:?}"),
    }
    a.release(&g.lease_ref(), Outcome::Lost, None, T).unwrap();
}

#[test]
fn frozen_etcd_gives_transient_within_the_timeout() {
    let etcd = Etcd::start();
    let mut a = auth(&etcd);
    let g = a
        .acquire(&req("f", "h", Duration::from_secs(10)), T)
        .unwrap();
    etcd.members[0].freeze();
    let timeout = Duration::from_millis(700);
    let start = Instant::now();
    let r = a.renew(&g.lease_ref(), timeout);
    let took = start.elapsed();
    assert!(matches!(r, Err(RenewError::Transient(_))), "{r:?}");
    // The contract: every call returns within its timeout (plus scheduling slack).
    assert!(
        took < timeout + Duration::from_secs(2),
        "renew took {took:?}"
    );
    let start = Instant::now();
    let r = a.acquire(&req("f2", "h", Duration::from_secs(10)), timeout);
    assert!(matches!(r, Err(AcquireError::Transient(_))), "{r:?}");
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
    etcd.members[0].thaw();
    a.renew(&g.lease_ref(), T).expect("renew after thaw");
}

#[test]
fn a_dead_endpoint_is_skipped() {
    let etcd = Etcd::start();
    // A port nobody listens on, first in the list.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut eps = vec![dead];
    eps.extend(etcd.endpoints());
    let mut a = EtcdAuthority::new(eps);
    let g = a
        .acquire(&req("d", "h", Duration::from_secs(5)), T)
        .expect("acquire");
    a.renew(&g.lease_ref(), T).expect("renew");
    a.release(&g.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
}

#[test]
fn waiters_keep_their_place_in_the_queue() {
    let etcd = Etcd::start();
    let (mut a, mut b, mut c) = (auth(&etcd), auth(&etcd), auth(&etcd));
    let ttl = Duration::from_secs(10);
    let ga = a.acquire(&req("q", "a", ttl), T).unwrap();
    let slice = Duration::from_millis(300);
    match b.acquire_wait(&req("q", "b", ttl), slice, T) {
        Err(AcquireError::Held {
            holder,
            retry_after,
        }) => {
            assert_eq!(holder, "a");
            assert_eq!(retry_after, Some(Duration::ZERO));
        }
        other => panic!("b: {other:?}"),
    }
    assert!(matches!(
        c.acquire_wait(&req("q", "c", ttl), slice, T),
        Err(AcquireError::Held { .. })
    ));
    // a, b and c are queued, in that order.
    assert_eq!(etcd.keys("q/").len(), 3);
    a.release(&ga.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    // c asks first, but b is ahead of it.
    assert!(matches!(
        c.acquire_wait(&req("q", "c", ttl), slice, T),
        Err(AcquireError::Held { ref holder, .. }) if holder == "b"
    ));
    let gb = b
        .acquire_wait(&req("q", "b", ttl), slice, T)
        .expect("b's turn");
    assert!(gb.token > ga.token);
    b.release(&gb.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    let gc = c
        .acquire_wait(&req("q", "c", ttl), Duration::from_secs(5), T)
        .expect("c's turn");
    assert!(gc.token > gb.token);
    c.release(&gc.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    // Giving up a wait leaves nothing behind.
    let ga = a.acquire(&req("q", "a", ttl), T).unwrap();
    assert!(b.acquire_wait(&req("q", "b", ttl), slice, T).is_err());
    b.abandon_wait(T);
    assert_eq!(etcd.keys("q/"), vec![format!("q/{}", ga.lease_id)]);
    a.release(&ga.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    assert!(etcd.leases().is_empty());
}

#[test]
fn excludes_and_is_excluded_by_etcdctl_lock() {
    let etcd = Etcd::start();
    let tmp = tempfile::tempdir().unwrap();
    // etcdctl holds first.
    let mut lock = etcdctl_lock(&etcd, "x", tmp.path());
    let rev1 = poll(Duration::from_secs(10), "etcdctl lock", || {
        read_rev(tmp.path())
    });
    let mut a = auth(&etcd);
    let ttl = Duration::from_secs(10);
    match a.acquire(&req("x", "agent", ttl), T) {
        Err(AcquireError::Held { holder, .. }) => assert!(holder.contains("x/"), "{holder}"),
        other => panic!("expected held by etcdctl: {other:?}"),
    }
    assert!(matches!(
        a.acquire_wait(&req("x", "agent", ttl), Duration::from_millis(300), T),
        Err(AcquireError::Held { .. })
    ));
    std::fs::write(tmp.path().join("release"), b"").unwrap();
    let g = a
        .acquire_wait(&req("x", "agent", ttl), Duration::from_secs(10), T)
        .expect("granted after etcdctl unlocked");
    assert!(g.token > rev1, "token {} !> ETCD_LOCK_REV {rev1}", g.token);
    let _ = lock.wait();

    // Now we hold: etcdctl lock waits for us.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut lock = etcdctl_lock(&etcd, "x", tmp2.path());
    // etcdctl has queued its key behind ours.
    poll(Duration::from_secs(10), "etcdctl to queue", || {
        (etcd.keys("x/").len() == 2).then_some(())
    });
    assert_eq!(
        read_rev(tmp2.path()),
        None,
        "etcdctl got the lock while we held it"
    );
    a.renew(&g.lease_ref(), T).expect("still ours");
    a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), T)
        .unwrap();
    let rev2 = poll(
        Duration::from_secs(10),
        "etcdctl lock after release",
        || read_rev(tmp2.path()),
    );
    assert!(rev2 > g.token, "ETCD_LOCK_REV {rev2} !> token {}", g.token);
    std::fs::write(tmp2.path().join("release"), b"").unwrap();
    let status = lock.wait().unwrap();
    let err = stderr_of(&mut lock);
    assert!(status.success(), "etcdctl lock: {err}");
}

#[test]
fn a_leader_election_does_not_cost_the_lease() {
    let mut etcd = Etcd::start_cluster(3);
    let mut a = auth(&etcd);
    let g = a
        .acquire(&req("l", "h", Duration::from_secs(6)), T)
        .unwrap();
    let leader = etcd.leader();
    etcd.members[leader].kill();
    // Renew as the agent would (every 2s, timeout 2s), across the election.
    let mut ok_after_kill = 0;
    let deadline = Instant::now() + Duration::from_secs(12);
    while Instant::now() < deadline && ok_after_kill < 3 {
        match a.renew(&g.lease_ref(), Duration::from_secs(2)) {
            Ok(_) => ok_after_kill += 1,
            Err(RenewError::Transient(m)) => eprintln!("transient during election: {m}"),
            Err(e) => panic!("lease lost in a leader election: {e}"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        ok_after_kill, 3,
        "renewals did not resume after the election"
    );
    assert_eq!(etcd.keys("l/"), vec![format!("l/{}", g.lease_id)]);
    a.release(&g.lease_ref(), Outcome::Succeeded, None, T)
        .unwrap();
    assert!(etcd.keys("l/").is_empty());
}
