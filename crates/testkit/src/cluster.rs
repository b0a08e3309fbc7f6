//! A replicated lock service: `palisade serve` processes with node ids, each on its own data
//! directory, started with `--initial-cluster` or `--join`, on loopback or each in a network
//! namespace of its own ([`LocalCluster::start_in_namespaces`], for partitions).
//!
//! Unlike a single server, a cluster's addresses must be known before its nodes start (each
//! node is told the others'). On loopback the kit picks them with [`crate::unused_port`];
//! another process could take one of those ports before the node binds it, and the node's start
//! then fails with "Address already in use" in its output. In namespaces every node has an
//! address of its own and the fixed port [`crate::netns::PORT`], so there is no such race.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::netns::{InNamespace, Network};
use crate::process::{Announce, ServerProcess};
use crate::{Ran, command, run};

/// How long a cluster may take to agree on a leader.
pub const ELECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// One node of a [`LocalCluster`].
#[derive(Debug)]
pub struct ClusterNode {
    pub id: u64,
    pub addr: SocketAddr,
    pub process: ServerProcess,
}

impl ClusterNode {
    /// `host:port`, as the membership records it.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }
}

/// Nodes of one cluster, each a `palisade serve` process on a directory under `dir`.
#[derive(Debug)]
pub struct LocalCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub nodes: BTreeMap<u64, ClusterNode>,
    /// The namespaces the nodes run in, if they do. Declared after `nodes`, so it is dropped
    /// after them: the nodes are killed before their namespaces are deleted.
    network: Option<Network>,
}

/// `palisade serve` as node `id` on a fixed `addr`, with `flags` after the built-in ones; in
/// a network namespace if `launcher` says which.
fn node_process(
    bin: &Path,
    data_dir: PathBuf,
    id: u64,
    addr: SocketAddr,
    flags: Vec<String>,
    launcher: Option<InNamespace>,
) -> ServerProcess {
    let bin = bin.to_path_buf();
    let dir = data_dir.clone();
    ServerProcess::custom(
        &format!("palisade serve (node {id})"),
        data_dir,
        Announce::LockService,
        move |_ports| {
            let mut command = match &launcher {
                Some(launcher) => launcher.command(&bin),
                None => crate::command(&bin),
            };
            command
                .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
                .arg(&dir)
                .args(["--node-id", &id.to_string()])
                .args(&flags)
                .env("RUST_LOG", "info");
            // A node in a network namespace listens on its namespace's address, not loopback:
            // without a policy, `palisade serve` refuses that unless told the network is
            // trusted (the test's namespaces are reachable from nothing else), and a cluster's
            // nodes there speak Raft in plaintext, unauthenticated, only if told so too.
            if !addr.ip().is_loopback() {
                command.args(["--insecure-listen-any", "--insecure-peers"]);
            }
            command
        },
    )
}

fn loopback_port() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, crate::unused_port()))
}

impl LocalCluster {
    /// A new cluster of nodes `1..=size` started with `--initial-cluster`, returned once they
    /// have elected a leader.
    pub fn start(bin: impl AsRef<Path>, size: u64) -> LocalCluster {
        let members = (1..=size).map(|id| (id, loopback_port())).collect();
        LocalCluster::bootstrap(LocalCluster::empty(bin), members)
    }

    /// A new cluster of nodes `1..=size` like [`LocalCluster::start`], each node in a network
    /// namespace of its own (`ip netns exec`) on its own address (see [`crate::netns`]), so a
    /// test can [partition](LocalCluster::network) them. The test process reaches every node.
    /// Needs root and iproute2; panics with the failing `ip` command if the network cannot be
    /// built. Gate the test on [`crate::netns::enabled`].
    pub fn start_in_namespaces(bin: impl AsRef<Path>, size: u64) -> LocalCluster {
        let network = Network::new(1..=size)
            .unwrap_or_else(|e| panic!("cannot build the nodes' network namespaces: {e}"));
        let members = network.ids().map(|id| (id, network.addr(id))).collect();
        let mut cluster = LocalCluster::empty(bin);
        cluster.network = Some(network);
        LocalCluster::bootstrap(cluster, members)
    }

    /// Starts `members` with `--initial-cluster` in an empty `cluster`, and waits for a
    /// leader.
    fn bootstrap(mut cluster: LocalCluster, members: BTreeMap<u64, SocketAddr>) -> LocalCluster {
        let initial = members
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        for (&id, &addr) in &members {
            let launcher = cluster.network.as_ref().map(|n| n.launcher(id));
            let process = node_process(
                &cluster.bin,
                cluster.dir.path().join(format!("node-{id}")),
                id,
                addr,
                vec!["--initial-cluster".into(), initial.clone()],
                launcher,
            );
            cluster.nodes.insert(id, ClusterNode { id, addr, process });
        }
        // The lowest id bootstraps once the others answer, so it starts (and announces) last.
        for node in cluster.nodes.values_mut().rev() {
            node.process.start();
        }
        cluster.leader();
        cluster
    }

    /// No nodes yet; see [`LocalCluster::add_single`] and [`LocalCluster::start_joining`].
    pub fn empty(bin: impl AsRef<Path>) -> LocalCluster {
        LocalCluster {
            bin: bin.as_ref().to_path_buf(),
            dir: tempfile::tempdir().expect("a temporary directory"),
            nodes: BTreeMap::new(),
            network: None,
        }
    }

    /// Starts node 1 as a plain `palisade serve` (a one-member cluster).
    pub fn add_single(&mut self) -> &ClusterNode {
        self.add_node(1, Vec::new())
    }

    /// Starts node `id` with `--join`: it waits for `palisade cluster add`.
    pub fn start_joining(&mut self, id: u64) -> &ClusterNode {
        self.add_node(id, vec!["--join".into()])
    }

    fn add_node(&mut self, id: u64, flags: Vec<String>) -> &ClusterNode {
        assert!(
            self.network.is_none(),
            "nodes are added on loopback only; a namespaced cluster has its nodes from the start"
        );
        let addr = loopback_port();
        let mut process = node_process(
            &self.bin,
            self.dir.path().join(format!("node-{id}")),
            id,
            addr,
            flags,
            None,
        );
        process.start();
        self.nodes.insert(id, ClusterNode { id, addr, process });
        &self.nodes[&id]
    }

    pub fn node(&mut self, id: u64) -> &mut ClusterNode {
        self.nodes.get_mut(&id).expect("a node of this cluster")
    }

    /// The endpoints of the nodes whose processes run, comma-separated.
    pub fn endpoints(&mut self) -> String {
        self.nodes
            .values_mut()
            .filter_map(|n| n.process.is_running().then(|| n.address()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs `palisade --endpoint ENDPOINTS ARGS...` as an operator on node 1's host would: with
    /// `PALISADE_AUTH_TOKEN_FILE` naming the cluster's admin token in node 1's data directory
    /// (once node 1 has written it), which the cluster's administration takes without a policy
    /// and every other call accepts.
    pub fn palisade(&self, endpoints: &str, args: &[&str]) -> Ran {
        let mut cmd = command(&self.bin);
        cmd.args(["--endpoint", endpoints]).args(args);
        let admin_token = self.admin_token_file();
        if admin_token.exists() {
            cmd.env("PALISADE_AUTH_TOKEN_FILE", admin_token);
        }
        run(cmd)
    }

    /// Runs `palisade --endpoint ENDPOINTS ARGS...` without any credential.
    pub fn anonymous(&self, endpoints: &str, args: &[&str]) -> Ran {
        let mut cmd = command(&self.bin);
        cmd.args(["--endpoint", endpoints]).args(args);
        run(cmd)
    }

    /// The cluster's admin token: `admin.token` in node 1's data directory (node 1 founds every
    /// cluster the kit starts, and every member derives the same token).
    pub fn admin_token_file(&self) -> PathBuf {
        self.dir.path().join("node-1").join("admin.token")
    }

    /// `palisade cluster status --json` through the running nodes.
    pub fn status(&mut self) -> serde_json::Value {
        let endpoints = self.endpoints();
        let ran = self.palisade(&endpoints, &["cluster", "status", "--json"]);
        ran.expect_success();
        ran.json()
    }

    /// Waits until the running nodes agree on a leader that reports itself as leading, and
    /// returns its id; panics after [`ELECTION_TIMEOUT`].
    pub fn leader(&mut self) -> u64 {
        let deadline = Instant::now() + ELECTION_TIMEOUT;
        loop {
            let status = self.status();
            let leader = status["leader"].as_u64();
            let leading = leader.is_some_and(|id| {
                status["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["id"].as_u64() == Some(id) && m["role"] == "leader")
            });
            if leading {
                return leader.expect("checked");
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {ELECTION_TIMEOUT:?}; last status: {status}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The leader's `host:port`.
    pub fn leader_address(&mut self) -> String {
        let leader = self.leader();
        self.nodes[&leader].address()
    }

    /// The directory holding the nodes' data directories.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The network of a cluster [started in namespaces](LocalCluster::start_in_namespaces):
    /// where faults are put and healed.
    pub fn network(&self) -> &Network {
        self.network
            .as_ref()
            .expect("a cluster started with start_in_namespaces")
    }
}
