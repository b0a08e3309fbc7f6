//! A small network of Linux network namespaces, one per cluster node, for partition tests.
//!
//! [`Network::new`] builds, in the root namespace, a bridge with an address, and for each node
//! a namespace joined to the bridge by a veth pair, with `lo` up and an address of its own on
//! a `/24` no other network of this machine uses (`10.A.B.N`, node `N`, the bridge `.254`). A
//! node runs as `ip netns exec NS palisade serve ...` ([`InNamespace`]; `ip netns exec` execs
//! the program, so the child's pid is the server's) and listens on its namespace address with
//! the fixed port [`PORT`]: nothing else binds in a private namespace. The test process stays
//! in the root namespace and reaches every node through the bridge; faults are never put
//! between it and a node, so a test can always ask every node what it sees.
//!
//! # Faults
//!
//! A fault drops packets where they **arrive**, like a cable cut: an `ip rule ... blackhole`
//! in the receiving node's namespace that matches the sender's address on the veth. Nothing
//! tells the sender: its new connections hang in `connect` and its established ones stop
//! delivering (routing is decided per packet, and a rule change invalidates every cached
//! route, so established TCP connections are cut too; the unit tests below prove it) until
//! the fault is healed and TCP retransmits. To let a rule match before the local table, each
//! namespace moves the `lookup local` rule from preference 0 to [`LOCAL_RULE_PREF`].
//!
//! - [`Network::cut`]: a two-way partition between two sets of nodes (with `&[1], &[3]` the
//!   non-transitive "bridge" topology of three nodes: 2 sees 1 and 3, they do not see each
//!   other);
//! - [`Network::cut_one_way`]: `from` can no longer call `to` (its packets to `to`'s port are
//!   dropped), while `to`'s own connections to `from` keep working in both directions. A
//!   one-way cut of every packet would break every TCP connection in both directions, so the
//!   cut is by connection, as a stateful firewall would make it;
//! - [`Network::heal`]: removes every fault.
//!
//! # Names and leftovers
//!
//! Every name carries the test process's pid and a per-process counter: namespaces
//! `palisade-PID-C-N`, the bridge `plbPIDxC` and the root ends of the veths `plvPIDxC_N` (pid
//! and counter in hex, so interface names stay within Linux's 15 characters). [`Network::new`]
//! first removes what a test process that no longer runs left behind (a `kill -9`ed test
//! cannot run its `Drop`): it kills the processes still in such a namespace and deletes it and
//! its bridge. The subnet is chosen and the bridge made under an exclusive lock on
//! [`LOCK_FILE`], so concurrent test processes never pick the same one. `Drop` kills whatever
//! still runs in the namespaces, then deletes them and the bridge, also when a test panics.
//!
//! Needs root and iproute2's `ip` (no iptables, no `tc`); tests that build a network are gated
//! by [`enabled`] on `PALISADE_TEST_NETNS`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// The variable that turns the namespace tests on: set to anything but empty or `0`.
pub const ENABLE_VAR: &str = "PALISADE_TEST_NETNS";

/// The port every node listens on, inside its own namespace.
pub const PORT: u16 = 7457;

/// Where the `lookup local` rule moves, so that the faults' rules (preference
/// [`FAULT_RULE_PREF`]) come before it.
pub const LOCAL_RULE_PREF: u32 = 1000;

/// The preference of every fault's rule.
pub const FAULT_RULE_PREF: u32 = 100;

/// Held while stale networks are removed and a subnet is chosen and taken.
pub const LOCK_FILE: &str = "/tmp/palisade-testkit-netns.lock";

/// The prefix of every namespace this module makes.
const NAMESPACE_PREFIX: &str = "palisade-";
/// The prefixes of the bridge and of the root ends of the veths.
const BRIDGE_PREFIX: &str = "plb";
const VETH_PREFIX: &str = "plv";
/// The name of a node's end of its veth, inside its namespace.
const NODE_DEVICE: &str = "pl0";
/// Linux's `IFNAMSIZ` less the terminating NUL.
const INTERFACE_NAME_MAX: usize = 15;

/// Whether a test that builds namespaces should run: `PALISADE_TEST_NETNS` is set (and not
/// empty or `0`). Otherwise prints one line saying why `test` is skipped and returns false.
pub fn enabled(test: &str) -> bool {
    match std::env::var(ENABLE_VAR) {
        Ok(value) if !value.is_empty() && value != "0" => true,
        _ => {
            eprintln!(
                "skipping: {test} builds network namespaces; set {ENABLE_VAR}=1 (needs root and \
                 iproute2)"
            );
            false
        }
    }
}

/// The `ip` program: `/usr/sbin/ip` or `/sbin/ip` if present, else `ip` on the `PATH`.
pub fn ip_program() -> PathBuf {
    ["/usr/sbin/ip", "/sbin/ip"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("ip"))
}

/// An `ip` command that failed, or could not run: the command line and what it said.
#[derive(Debug, Clone)]
pub struct NetnsError {
    pub command: String,
    pub message: String,
}

impl fmt::Display for NetnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` failed: {}", self.command, self.message)
    }
}

impl std::error::Error for NetnsError {}

/// Runs `ip ARGS...` to completion; its standard output, or its standard error as the error.
fn ip<S: AsRef<OsStr>>(args: &[S]) -> Result<String, NetnsError> {
    let program = ip_program();
    let line = std::iter::once(program.as_os_str())
        .chain(args.iter().map(AsRef::as_ref))
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let output = Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError {
            command: line.clone(),
            message: format!("cannot run {}: {e}", program.display()),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetnsError {
            command: line,
            message: format!(
                "{} ({})",
                String::from_utf8_lossy(&output.stderr).trim(),
                output.status
            ),
        })
    }
}

/// How to run a program inside one node's namespace: `ip netns exec NS PROGRAM`. Cheap to
/// clone into a [`crate::ServerProcess`]'s command builder.
#[derive(Debug, Clone)]
pub struct InNamespace {
    ip: PathBuf,
    namespace: String,
}

impl InNamespace {
    /// `program` in the namespace, with a [scrubbed](crate::scrub) environment and no standard
    /// input: `ip netns exec` execs it, so the child's pid is the program's own.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = crate::command(&self.ip);
        command
            .args(["netns", "exec", &self.namespace])
            .arg(program);
        command
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// One node's place in a [`Network`].
#[derive(Debug)]
struct Member {
    namespace: String,
    /// The root namespace's end of the veth, a port of the bridge.
    veth: String,
    address: Ipv4Addr,
}

/// One fault: packets from `from` arriving at `at` are dropped (only those to [`PORT`] if
/// `port_only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Fault {
    at: u64,
    from: u64,
    port_only: bool,
}

/// Counts networks made by this process, for unique names.
static NETWORKS: AtomicU32 = AtomicU32::new(0);
/// The tags (`PIDxC`) of this process's networks that are alive, which the stale sweep keeps.
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// A bridge and one namespace per node; see the [module documentation](self).
#[derive(Debug)]
pub struct Network {
    tag: String,
    bridge: String,
    /// `10.A.B`: the first three octets of every address.
    subnet: [u8; 3],
    members: BTreeMap<u64, Member>,
    faults: Mutex<BTreeSet<Fault>>,
}

impl Network {
    /// A network of one namespace for each of `ids` (1..=253). Fails with the first `ip`
    /// command that fails, having removed whatever it made.
    pub fn new(ids: impl IntoIterator<Item = u64>) -> Result<Network, NetnsError> {
        let ids: BTreeSet<u64> = ids.into_iter().collect();
        assert!(
            ids.iter().all(|id| (1..=253).contains(id)),
            "node ids 1..=253 make the last octet of their address: {ids:?}"
        );
        let pid = std::process::id();
        let counter = NETWORKS.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{pid:x}x{counter:x}");
        let bridge = format!("{BRIDGE_PREFIX}{tag}");
        let members: BTreeMap<u64, Member> = ids
            .iter()
            .map(|&id| {
                let member = Member {
                    namespace: format!("{NAMESPACE_PREFIX}{pid}-{counter}-{id}"),
                    veth: format!("{VETH_PREFIX}{tag}_{id}"),
                    address: Ipv4Addr::UNSPECIFIED,
                };
                (id, member)
            })
            .collect();
        for name in std::iter::once(&bridge).chain(members.values().map(|m| &m.veth)) {
            assert!(
                name.len() <= INTERFACE_NAME_MAX,
                "interface name {name:?} is longer than {INTERFACE_NAME_MAX}"
            );
        }
        LIVE.lock().unwrap().insert(tag.clone());
        let mut network = Network {
            tag,
            bridge,
            subnet: [10, 0, 0],
            members,
            faults: Mutex::new(BTreeSet::new()),
        };
        // On failure, dropping `network` removes what was made.
        network.build()?;
        Ok(network)
    }

    fn build(&mut self) -> Result<(), NetnsError> {
        {
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(LOCK_FILE)
                .map_err(|e| NetnsError {
                    command: format!("open {LOCK_FILE}"),
                    message: e.to_string(),
                })?;
            lock.lock().map_err(|e| NetnsError {
                command: format!("flock {LOCK_FILE}"),
                message: e.to_string(),
            })?;
            remove_stale()?;
            self.subnet = free_subnet(&self.tag)?;
            ip(&["link", "add", &self.bridge, "type", "bridge"])?;
            ip(&[
                "addr",
                "add",
                &format!("{}/24", self.bridge_address()),
                "dev",
                &self.bridge,
            ])?;
            // The lock is released when `lock` is dropped: the subnet is taken now.
        }
        ip(&["link", "set", &self.bridge, "up"])?;
        let [a, b, c] = self.subnet;
        for (&id, member) in &mut self.members {
            let ns = member.namespace.as_str();
            member.address = Ipv4Addr::new(a, b, c, u8::try_from(id).expect("checked"));
            ip(&["netns", "add", ns])?;
            ip(&[
                "link",
                "add",
                &member.veth,
                "type",
                "veth",
                "peer",
                "name",
                NODE_DEVICE,
                "netns",
                ns,
            ])?;
            ip(&["link", "set", &member.veth, "master", &self.bridge, "up"])?;
            let address = format!("{}/24", member.address);
            ip(&["-n", ns, "addr", "add", &address, "dev", NODE_DEVICE])?;
            ip(&["-n", ns, "link", "set", NODE_DEVICE, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            // The faults' rules must come before the local table, or a packet to this node's
            // own address would be delivered before any rule could drop it.
            let local = LOCAL_RULE_PREF.to_string();
            ip(&["-n", ns, "rule", "add", "pref", &local, "lookup", "local"])?;
            ip(&["-n", ns, "rule", "del", "pref", "0", "lookup", "local"])?;
        }
        Ok(())
    }

    /// The node ids of this network.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.members.keys().copied()
    }

    /// Node `id`'s address and [`PORT`]: where it listens, and where every node and the test
    /// process reach it.
    pub fn addr(&self, id: u64) -> SocketAddr {
        SocketAddr::from((self.member(id).address, PORT))
    }

    /// The address of the bridge, the test process's address on this network.
    pub fn bridge_address(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 254)
    }

    /// The name of node `id`'s namespace (for `ip netns exec`, `ip -n`).
    pub fn namespace(&self, id: u64) -> &str {
        &self.member(id).namespace
    }

    /// How to run a program in node `id`'s namespace.
    pub fn launcher(&self, id: u64) -> InNamespace {
        InNamespace {
            ip: ip_program(),
            namespace: self.member(id).namespace.clone(),
        }
    }

    fn member(&self, id: u64) -> &Member {
        self.members
            .get(&id)
            .unwrap_or_else(|| panic!("node {id} is not in this network"))
    }

    /// A two-way partition: no packet between a node of `one` and a node of `other` arrives,
    /// on new or established connections, until [`Network::heal`]. Nodes on the same side,
    /// and the test process, still reach each other.
    pub fn cut(&self, one: &[u64], other: &[u64]) -> Result<(), NetnsError> {
        for &a in one {
            for &b in other {
                assert_ne!(a, b, "node {a} is on both sides");
                self.drop_packets(Fault {
                    at: a,
                    from: b,
                    port_only: false,
                })?;
                self.drop_packets(Fault {
                    at: b,
                    from: a,
                    port_only: false,
                })?;
            }
        }
        Ok(())
    }

    /// `from` can no longer call `to`: its packets to `to`'s [`PORT`] are dropped on arrival,
    /// so its new connections hang and its established ones stop delivering. `to` still calls
    /// `from`, and gets its answers.
    pub fn cut_one_way(&self, from: u64, to: u64) -> Result<(), NetnsError> {
        assert_ne!(from, to);
        self.drop_packets(Fault {
            at: to,
            from,
            port_only: true,
        })
    }

    /// `at` goes deaf to `from`: no packet from a node of `from` arrives at `at`, on new or
    /// established connections, while everything `at` sends still arrives (its answers and
    /// acknowledgements never come back). Half of [`Network::cut`].
    pub fn cut_inbound(&self, at: u64, from: &[u64]) -> Result<(), NetnsError> {
        for &b in from {
            assert_ne!(at, b);
            self.drop_packets(Fault {
                at,
                from: b,
                port_only: false,
            })?;
        }
        Ok(())
    }

    /// Removes every fault: packets flow again, and TCP delivers what it had to retransmit.
    pub fn heal(&self) -> Result<(), NetnsError> {
        let mut faults = self.faults.lock().unwrap();
        while let Some(fault) = faults.first().copied() {
            ip(&self.rule("del", fault))?;
            faults.remove(&fault);
        }
        Ok(())
    }

    fn drop_packets(&self, fault: Fault) -> Result<(), NetnsError> {
        let mut faults = self.faults.lock().unwrap();
        if !faults.contains(&fault) {
            ip(&self.rule("add", fault))?;
            faults.insert(fault);
        }
        Ok(())
    }

    /// `ip -n NS rule add|del pref P from ADDR iif pl0 [ipproto tcp dport PORT] blackhole`.
    fn rule(&self, verb: &str, fault: Fault) -> Vec<String> {
        let mut args: Vec<String> = [
            "-n",
            self.namespace(fault.at),
            "rule",
            verb,
            "pref",
            &FAULT_RULE_PREF.to_string(),
            "from",
            &format!("{}/32", self.member(fault.from).address),
            "iif",
            NODE_DEVICE,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if fault.port_only {
            args.extend(["ipproto", "tcp", "dport", &PORT.to_string()].map(String::from));
        }
        args.push("blackhole".into());
        args
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for member in self.members.values() {
            kill_everything_in(&member.namespace);
            let _ = ip(&["netns", "del", &member.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        for member in self.members.values() {
            // Gone with its namespace unless a process we could not kill still holds it.
            if link_exists(&member.veth) {
                let _ = ip(&["link", "del", &member.veth]);
            }
        }
        LIVE.lock().unwrap().remove(&self.tag);
    }
}

/// `kill -9` every process in namespace `ns` (a namespace lives as long as one does).
fn kill_everything_in(ns: &str) {
    let Ok(pids) = ip(&["netns", "pids", ns]) else {
        return;
    };
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Whether the network tagged `PIDxC` (pid and counter in hex) is a leftover: its test process
/// no longer runs, or it is this process and the network is not one of its live ones (an
/// earlier process with the same pid left it).
fn is_stale(pid: u32, counter: u32) -> bool {
    if pid == std::process::id() {
        let tag = format!("{pid:x}x{counter:x}");
        !LIVE.lock().unwrap().contains(&tag)
    } else {
        !runs(pid)
    }
}

/// Whether process `pid` exists and is not a zombie (a `kill -9`ed test process stays one until
/// whoever adopted it reaps it).
fn runs(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `PID (COMM) STATE ...`; COMM may itself hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// Removes the namespaces, bridges and veths that a test process which no longer runs left.
fn remove_stale() -> Result<(), NetnsError> {
    for line in ip(&["netns", "list"])?.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NAMESPACE_PREFIX) else {
            continue;
        };
        let parts: Vec<&str> = rest.split('-').collect();
        let [pid, counter, _id] = parts[..] else {
            continue;
        };
        let (Ok(pid), Ok(counter)) = (pid.parse(), counter.parse()) else {
            continue;
        };
        if is_stale(pid, counter) {
            kill_everything_in(name);
            ip(&["netns", "del", name])?;
        }
    }
    let links = std::fs::read_dir("/sys/class/net").map_err(|e| NetnsError {
        command: "read /sys/class/net".into(),
        message: e.to_string(),
    })?;
    for link in links.flatten() {
        let name = link.file_name().to_string_lossy().into_owned();
        let tag = name.strip_prefix(BRIDGE_PREFIX).or_else(|| {
            name.strip_prefix(VETH_PREFIX)
                .and_then(|t| t.split('_').next())
        });
        let Some((pid, counter)) = tag.and_then(|t| t.split_once('x')) else {
            continue;
        };
        let (Ok(pid), Ok(counter)) = (
            u32::from_str_radix(pid, 16),
            u32::from_str_radix(counter, 16),
        ) else {
            continue;
        };
        if is_stale(pid, counter) && link_exists(&name) {
            // A veth may vanish with its namespace meanwhile.
            let _ = ip(&["link", "del", &name]);
        }
    }
    Ok(())
}

/// A `10.A.B.0/24` that no address or route of the root namespace overlaps, starting from a
/// place derived from `tag` (so concurrent processes rarely even look at the same one).
fn free_subnet(tag: &str) -> Result<[u8; 3], NetnsError> {
    let routes = ip(&["-4", "route", "show", "table", "all"])?;
    let addresses = ip(&["-4", "-o", "addr", "show"])?;
    let mut taken: Vec<(u32, u32)> = Vec::new();
    for word in routes
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
        })
        .chain(addresses.lines().filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()
        }))
    {
        if let Some(prefix) = parse_prefix(word) {
            taken.push(prefix);
        }
    }
    // Second octet 100..=254, third 0..=255: 39,680 subnets.
    let count: u32 = 155 * 256;
    let start = tag
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % count;
    for step in 0..count {
        let index = (start + step) % count;
        let [b, c] = [100 + index / 256, index % 256].map(|x| u8::try_from(x).expect("fits"));
        let ours = (u32::from(Ipv4Addr::new(10, b, c, 0)), 24);
        if !taken.iter().any(|theirs| overlaps(*theirs, ours)) {
            return Ok([10, b, c]);
        }
    }
    Err(NetnsError {
        command: "choose a subnet".into(),
        message: "every 10.100-254.x.0/24 is in use".into(),
    })
}

/// `A.B.C.D` or `A.B.C.D/LEN` as (network, length).
fn parse_prefix(text: &str) -> Option<(u32, u32)> {
    let (address, length) = match text.split_once('/') {
        Some((address, length)) => (address, length.parse().ok()?),
        None => (text, 32),
    };
    let address: Ipv4Addr = address.parse().ok()?;
    (length <= 32).then_some((u32::from(address), length))
}

fn overlaps((a, a_len): (u32, u32), (b, b_len): (u32, u32)) -> bool {
    let len = a_len.min(b_len);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & mask == b & mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd as _;
    use std::time::Duration;

    #[test]
    fn prefixes_overlap_when_one_contains_the_other() {
        let p = |s| parse_prefix(s).unwrap();
        assert!(overlaps(p("10.0.0.0/8"), p("10.200.3.0/24")));
        assert!(overlaps(p("10.200.3.7"), p("10.200.3.0/24")));
        assert!(!overlaps(p("10.200.4.0/24"), p("10.200.3.0/24")));
        assert!(!overlaps(p("192.0.2.0/24"), p("10.200.3.0/24")));
        assert!(overlaps(p("0.0.0.0/0"), p("10.200.3.0/24")));
        assert_eq!(parse_prefix("default"), None);
    }

    /// Runs `f` on a thread that has entered node `id`'s namespace: sockets it makes belong
    /// there, wherever they are used afterwards.
    fn in_namespace<T: Send + 'static>(
        net: &Network,
        id: u64,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let path = Path::new("/run/netns").join(net.namespace(id));
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("the namespace's file");
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("the thread in the namespace")
    }

    /// A listener at node `id`'s address that echoes every connection's bytes.
    fn echo_server(net: &Network, id: u64) {
        let addr = net.addr(id);
        let listener = in_namespace(net, id, move || TcpListener::bind(addr).expect("bind"));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = [0; 64];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    /// Connects from node `from` (or the root namespace) to `to`'s echo server.
    fn connect(net: &Network, from: Option<u64>, to: u64) -> std::io::Result<TcpStream> {
        let addr = net.addr(to);
        let connect = move || TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        match from {
            Some(from) => in_namespace(net, from, connect),
            None => connect(),
        }
    }

    /// Sends `bytes` and reads them back within `timeout`; the error if they do not come.
    fn echo(stream: &mut TcpStream, bytes: &[u8], timeout: Duration) -> std::io::Result<()> {
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(bytes)?;
        read_back(stream, bytes)
    }

    fn read_back(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
        let mut got = vec![0; bytes.len()];
        stream.read_exact(&mut got)?;
        assert_eq!(got, bytes);
        Ok(())
    }

    fn timed_out(result: std::io::Result<impl fmt::Debug>) -> bool {
        matches!(result, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
    }

    const QUICK: Duration = Duration::from_secs(5);
    /// Long enough for TCP to retransmit after a cut of a few seconds.
    const RETRANSMIT: Duration = Duration::from_secs(20);
    const SILENCE: Duration = Duration::from_millis(1500);

    #[test]
    fn a_cut_stops_established_and_new_connections_and_heal_resumes_them() {
        if !enabled("a_cut_stops_established_and_new_connections_and_heal_resumes_them") {
            return;
        }
        let net = Network::new([1, 2, 3]).unwrap_or_else(|e| panic!("{e}"));
        for id in net.ids() {
            echo_server(&net, id);
        }
        let mut two_to_one = connect(&net, Some(2), 1).expect("2 reaches 1");
        echo(&mut two_to_one, b"before", QUICK).expect("2 and 1 talk");
        let mut two_to_three = connect(&net, Some(2), 3).expect("2 reaches 3");

        net.cut(&[1], &[2, 3]).unwrap();
        assert!(
            timed_out(echo(&mut two_to_one, b"during", SILENCE)),
            "an established connection across the cut still delivers"
        );
        assert!(
            timed_out(connect(&net, Some(1), 2)),
            "a new connection across the cut was made"
        );
        echo(&mut two_to_three, b"same side", QUICK).expect("2 and 3 are on the same side");
        let mut root_to_one = connect(&net, None, 1).expect("the test process reaches 1");
        echo(&mut root_to_one, b"root", QUICK).expect("the test process talks to 1");

        net.heal().unwrap();
        two_to_one.set_read_timeout(Some(RETRANSMIT)).unwrap();
        read_back(&mut two_to_one, b"during").expect("retransmitted after the heal");
        echo(&mut two_to_one, b"after", QUICK).expect("2 and 1 talk again");
        let mut one_to_two = connect(&net, Some(1), 2).expect("1 reaches 2 again");
        echo(&mut one_to_two, b"new", QUICK).expect("a new connection works");
    }

    #[test]
    fn a_one_way_cut_stops_only_the_calls_of_one_side() {
        if !enabled("a_one_way_cut_stops_only_the_calls_of_one_side") {
            return;
        }
        let net = Network::new([1, 2]).unwrap_or_else(|e| panic!("{e}"));
        echo_server(&net, 1);
        echo_server(&net, 2);
        let mut one_to_two = connect(&net, Some(1), 2).expect("1 reaches 2");
        let mut two_to_one = connect(&net, Some(2), 1).expect("2 reaches 1");
        echo(&mut one_to_two, b"a", QUICK).unwrap();
        echo(&mut two_to_one, b"b", QUICK).unwrap();

        net.cut_one_way(1, 2).unwrap();
        assert!(
            timed_out(echo(&mut one_to_two, b"c", SILENCE)),
            "1's established connection to 2 still delivers"
        );
        assert!(
            timed_out(connect(&net, Some(1), 2)),
            "1 made a new connection to 2"
        );
        echo(&mut two_to_one, b"d", QUICK).expect("2's connection to 1 works both ways");
        let mut again = connect(&net, Some(2), 1).expect("2 makes new connections to 1");
        echo(&mut again, b"e", QUICK).unwrap();

        net.heal().unwrap();
        one_to_two.set_read_timeout(Some(RETRANSMIT)).unwrap();
        read_back(&mut one_to_two, b"c").expect("retransmitted after the heal");
    }

    #[test]
    fn a_node_runs_in_its_namespace_under_its_own_pid_and_everything_goes_on_drop() {
        if !enabled("a_node_runs_in_its_namespace_under_its_own_pid_and_everything_goes_on_drop") {
            return;
        }
        let net = Network::new([1]).unwrap_or_else(|e| panic!("{e}"));
        let namespace = net.namespace(1).to_owned();
        let bridge = net.bridge.clone();
        let veth = net.members[&1].veth.clone();
        let mut child = net
            .launcher(1)
            .command("sleep")
            .arg("60")
            .spawn()
            .expect("ip netns exec sleep");
        let pid = child.id().to_string();
        // `ip` enters the namespace, then execs the program under its own pid: the pid a test
        // signals is the program's.
        crate::wait_until(
            "the child's pid to run sleep in the namespace",
            QUICK,
            || {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                comm.trim() == "sleep"
                    && ip(&["netns", "pids", &namespace])
                        .unwrap()
                        .split_whitespace()
                        .any(|p| p == pid)
            },
        );
        assert!(link_exists(&bridge) && link_exists(&veth));

        drop(net);
        // Drop killed the child, which still runs in the namespace.
        crate::child::wait_with_timeout(&mut child, QUICK);
        crate::wait_until("the veth to go with its namespace", QUICK, || {
            !link_exists(&veth)
        });
        assert!(!link_exists(&bridge));
        let left = ip(&["netns", "list"]).unwrap();
        assert!(!left.contains(&namespace), "{left}");
    }

    #[test]
    fn leftovers_of_a_test_process_that_is_gone_are_removed() {
        if !enabled("leftovers_of_a_test_process_that_is_gone_are_removed") {
            return;
        }
        // A pid that runs no process: larger than any the kernel hands out.
        let dead = 0x3f_ffff_u32 + 1;
        assert!(!runs(dead) && runs(std::process::id()));
        let namespace = format!("{NAMESPACE_PREFIX}{dead}-0-1");
        let bridge = format!("{BRIDGE_PREFIX}{dead:x}x0");
        let _ = ip(&["netns", "del", &namespace]);
        let _ = ip(&["link", "del", &bridge]);
        ip(&["netns", "add", &namespace]).unwrap();
        ip(&["link", "add", &bridge, "type", "bridge"]).unwrap();

        let net = Network::new([1]).unwrap_or_else(|e| panic!("{e}"));

        assert!(!link_exists(&bridge), "the stale bridge is still there");
        let left = ip(&["netns", "list"]).unwrap();
        assert!(!left.contains(&namespace), "{left}");
        assert!(left.contains(net.namespace(1)), "{left}");
    }
}
