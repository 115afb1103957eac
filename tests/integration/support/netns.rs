//! Test support: "hosts" as network namespaces on one switch, for real
//! partitions. Host `i` (1-based) is the namespace `la<pid>n<seq>h<i>` with
//! `eth0` = `10.99.0.<i>/24`, a veth whose other end `p<i>` is a port of the
//! bridge `br0` in the namespace `la<pid>n<seq>sw`.
//!
//! [`Net::cut`] sets a host's switch port down: the host's packets are
//! dropped at the veth and nothing reaches it (no RST, no ICMP: the peers'
//! routes stay, the frames just vanish), as with a pulled cable.
//! [`Net::heal`] brings the port back. Every namespace is deleted on drop;
//! processes started in them are the caller's (see [`Proc`]) and must be
//! dropped first. Names carry the test process's pid, so concurrent runs and
//! other users' namespaces never collide.
//!
//! Needs iproute2 (`ip`) and root; a missing `ip` fails the test.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

fn ip(args: &[&str]) {
    super::run_ok(
        Command::new("ip").args(args),
        "`ip` (iproute2) must be installed: apt-get install iproute2",
        format_args!("ip {args:?}"),
    );
}

pub struct Net {
    pub prefix: String,
    pub hosts: usize,
}

impl Net {
    /// `hosts` hosts on one switch, all links up.
    pub fn new(hosts: usize) -> Net {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let net = Net {
            prefix: format!("la{}n{n}", std::process::id()),
            hosts: 0,
        };
        let sw = net.switch();
        ip(&["netns", "add", &sw]);
        let mut net = net;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for i in 1..=hosts {
            let h = net.ns(i);
            ip(&["netns", "add", &h]);
            net.hosts = i;
            let port = format!("p{i}");
            ip(&[
                "link", "add", "eth0", "netns", &h, "type", "veth", "peer", "name", &port, "netns",
                &sw,
            ]);
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &sw, "link", "set", &port, "up"]);
            ip(&[
                "-n",
                &h,
                "addr",
                "add",
                &format!("{}/24", net.ip(i)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &h, "link", "set", "eth0", "up"]);
            ip(&["-n", &h, "link", "set", "lo", "up"]);
        }
        net
    }

    pub fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    pub fn ns(&self, i: usize) -> String {
        format!("{}h{i}", self.prefix)
    }

    pub fn ip(&self, i: usize) -> String {
        format!("10.99.0.{i}")
    }

    /// `program` to be run on host `i`.
    pub fn cmd(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), program]);
        c
    }

    /// Host `i` loses its link: its packets vanish both ways.
    pub fn cut(&self, i: usize) {
        ip(&[
            "-n",
            &self.switch(),
            "link",
            "set",
            &format!("p{i}"),
            "down",
        ]);
    }

    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.switch(), "link", "set", &format!("p{i}"), "up"]);
    }

    /// Names of this net's namespaces that exist on the machine.
    pub fn existing(&self) -> Vec<String> {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&self.prefix))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch()])
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    /// Waits for the exit; None after `within`.
    pub fn wait(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.0.try_wait() {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A host of its own wired straight to the test's namespace by one veth
/// pair, for cutting one flow while the others pass: the test's side has
/// [`Wire::here`] (`10.A.B.1/29`), the host has [`Wire::there`] (`.2`) and
/// [`Wire::source`] (`.3`), and reaches [`Wire::here`] *from*
/// [`Wire::source`] (a route with `src`). The test (and whatever else
/// connects to [`Wire::there`]) keeps talking to the host while
/// [`Wire::cut_source`] makes everything the host sends from
/// [`Wire::source`] vanish: the host's outgoing connections (to a database
/// here) get no answer, no RST, no ICMP, as behind a dead router, and
/// nothing on the test's side gets an error either (a blackhole route here
/// for the one address). `A.B` is unique to the process and the wire, so
/// parallel tests never share a subnet in the test's namespace.
///
/// Why not `tc` filters on a port: the kernels this runs on may lack the
/// `gact` action module (`tc ... action drop` fails), while routing is
/// always there.
pub struct Wire {
    pub ns: String,
    /// This end's interface (in the test's namespace).
    dev: String,
    pub here: String,
    pub there: String,
    pub source: String,
    cut: std::sync::atomic::AtomicBool,
}

impl Wire {
    pub fn new() -> Wire {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let net = format!("10.{}.{}", 200 + n % 50, pid % 256);
        let w = Wire {
            ns: format!("la{pid}w{n}"),
            dev: format!("la{pid}v{n}"),
            here: format!("{net}.1"),
            there: format!("{net}.2"),
            source: format!("{net}.3"),
            cut: std::sync::atomic::AtomicBool::new(false),
        };
        ip(&["netns", "add", &w.ns]);
        ip(&[
            "link", "add", &w.dev, "type", "veth", "peer", "name", "eth0", "netns", &w.ns,
        ]);
        ip(&["addr", "add", &format!("{}/29", w.here), "dev", &w.dev]);
        ip(&["link", "set", &w.dev, "up"]);
        for a in [&w.there, &w.source] {
            ip(&[
                "-n",
                &w.ns,
                "addr",
                "add",
                &format!("{a}/29"),
                "dev",
                "eth0",
            ]);
        }
        ip(&["-n", &w.ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &w.ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &w.ns,
            "route",
            "replace",
            &format!("{}/32", w.here),
            "dev",
            "eth0",
            "src",
            &w.source,
        ]);
        w
    }

    /// `program` to be run on the host.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// What the host sends from [`Wire::source`] vanishes from now on.
    pub fn cut_source(&self) {
        ip(&["route", "add", "blackhole", &format!("{}/32", self.source)]);
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if self.cut.load(Ordering::SeqCst) {
            let _ = Command::new("ip")
                .args(["route", "del", "blackhole", &format!("{}/32", self.source)])
                .stderr(Stdio::null())
                .status();
        }
        // The veth pair goes with the namespace.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
    }
}
