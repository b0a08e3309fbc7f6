//! The lock service as a running program: [`Server`] starts a [`crate::node::Node`] on its
//! data directory, checks that its listeners and peers are safe to expose, and serves the gRPC
//! services, the web UI and the metrics until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{ServeError, ServerConfig};
use crate::limits::{CONCURRENT_REQUESTS_PER_CONNECTION_MAX, SHUTDOWN_GRACE};
use crate::platform::Platform;
use crate::{
    Listener, admin_token, admission, auth, cluster, grpc, incoming, limits, metrics, node, peer,
    peer_service, service, tls, ui,
};

/// Whether a node's peers are authenticated, and whether they must be.
#[derive(Debug, Clone)]
pub(crate) struct PeerAuthentication {
    /// Why peer authentication is needed here: a policy, or a listener beyond loopback.
    needed: Option<String>,
    /// Why the peers are not authenticated, if they are not.
    missing: Option<String>,
    /// The peer CA shares a root with the client CA: refused wherever peers speak at all.
    shared_ca: bool,
}

impl PeerAuthentication {
    /// The refusal to start (or to add a member) for a node that has, or will have,
    /// `several_members`; `None` when it may go on.
    ///
    /// A one-member cluster answers no Raft message from anyone (its only member is itself,
    /// and a member refuses senders outside its membership), so authentication is needed from
    /// the second member on. A peer CA shared with the clients is refused whatever the size.
    pub(crate) fn refusal(&self, several_members: bool) -> Option<ServeError> {
        let reason = self.missing.clone()?;
        let why = if self.shared_ca {
            "its peers would not be authenticated".to_string()
        } else if several_members {
            format!(
                "this node is a member of a cluster of several nodes and {}, yet its peers would not be authenticated",
                self.needed.clone()?
            )
        } else {
            return None;
        };
        Some(ServeError::PeersUnauthenticated { why, reason })
    }

    /// Why `cluster add` must not grow this one-member cluster, if it must not.
    pub(crate) fn growth_refusal(&self) -> Option<String> {
        Some(format!(
            "this node has no authenticated peers ({}) and {}: a second member would let anyone who \
             reaches a listener speak Raft. Restart the members with --tls-peer-ca (a CA of the nodes' \
             own; see docs/security.md), or with --insecure-peers on a network nothing else reaches",
            self.missing.clone()?,
            self.needed.clone()?
        ))
    }
}

/// Judges the peer authentication of a node configured by `args`, with its loaded `tls`.
/// `own_listener`: the node binds `args.listen` itself (false in a simulation, which supplies
/// its own network).
fn peer_authentication(
    args: &ServerConfig,
    auth: &auth::Auth,
    tls: Option<&tls::ServerTls>,
    own_listener: bool,
) -> PeerAuthentication {
    let needed = if auth.has_policy() {
        Some("it has a policy".to_string())
    } else if own_listener && !args.listen.ip().is_loopback() {
        Some(format!("it listens on {}, beyond loopback", args.listen))
    } else {
        None
    };
    let shared_ca = tls.is_some_and(tls::ServerTls::peer_ca_is_a_client_ca);
    let missing = match tls {
        None => Some(
            "the listener serves no TLS, so nothing tells a peer from anyone else who reaches it"
                .to_string(),
        ),
        Some(tls) if !tls.peers_checked() => Some(
            "no --tls-peer-ca is given, so nothing tells a peer from a client".to_string(),
        ),
        Some(_) if shared_ca => Some(
            "the peer CA (--tls-peer-ca) is also a client CA (--tls-client-ca), so every client certificate would be taken for a peer's"
                .to_string(),
        ),
        Some(_) => None,
    };
    PeerAuthentication {
        needed,
        missing,
        shared_ca,
    }
}

/// Without a policy, nothing listens beyond loopback unless `insecure_listen_any` says so: a
/// deployment without a policy is a loopback one. `exposes`: what anyone reaching `listen`
/// could do.
fn held_to_loopback(
    args: &ServerConfig,
    listen: SocketAddr,
    exposes: &'static str,
) -> Result<(), ServeError> {
    if args.policy_file.is_none() && !listen.ip().is_loopback() && !args.insecure_listen_any {
        return Err(ServeError::InsecureListen { listen, exposes });
    }
    Ok(())
}

/// Runs the lock service until SIGTERM or SIGINT.
pub async fn serve(args: ServerConfig) -> Result<(), ServeError> {
    if let Some(listen) = args.metrics_listen {
        held_to_loopback(&args, listen, "read the service's metrics")?;
        metrics::install(listen)?;
        tracing::info!(%listen, "serving /metrics");
    }
    let server = Server::start(&args).await?;
    reload_on_sighup(server.auth().clone());
    let ui_listen = server
        .ui_addr()
        .map_or_else(|| "off".to_string(), |addr| addr.to_string());
    tracing::info!(
        listen = %server.local_addr(),
        ui_listen = %ui_listen,
        data_dir = %args.data_dir.display(),
        public_key = %server.node().public_key(),
        "palisade lock service ready"
    );
    server.run_until(shutdown_signal()).await
}

/// Reads the token file and the policy again on each SIGHUP. A file that fails to load is
/// logged with the reason, and what was loaded before stays in force.
fn reload_on_sighup(auth: Arc<auth::Auth>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; the policy is reloaded only by a restart");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match auth.reload() {
                Ok(()) => tracing::info!("SIGHUP: tokens and policy reloaded"),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: reload failed; the tokens and policy loaded before stay in force"
                ),
            }
        }
    });
}

/// A started lock service: recovered, leader, and listening.
#[derive(Debug)]
pub struct Server {
    node: Arc<node::Node>,
    listener: Listener,
    connections: limits::ConnectionLimits,
    auth: Arc<auth::Auth>,
    tls: Option<tls::ServerTls>,
    ui: Option<ui::Ui>,
    /// Why this node may not grow into a cluster (`cluster add` is refused), if it may not.
    unauthenticated_peers: Option<String>,
}

impl Server {
    /// Recovers the node from `args.data_dir` and binds `args.listen` (port 0 picks a free one).
    pub async fn start(args: &ServerConfig) -> Result<Server, ServeError> {
        Server::start_on(args, Platform::default()).await
    }

    /// [`Server::start`], reading time from `clock`: tests drive a
    /// [`ManualClock`](palisade_clock::ManualClock) to decide when leases end.
    pub async fn start_with_clock(
        args: &ServerConfig,
        clock: palisade_clock::SharedClock,
    ) -> Result<Server, ServeError> {
        Server::start_on(
            args,
            Platform {
                clock,
                ..Platform::default()
            },
        )
        .await
    }

    /// [`Server::start`] on `platform`.
    pub async fn start_on(args: &ServerConfig, platform: Platform) -> Result<Server, ServeError> {
        let limits = palisade_core::Limits {
            lock_delay_ms: palisade_core::DurationMs::from_duration_floor(args.lock_delay),
            ..Default::default()
        };
        limits.validate().map_err(ServeError::InvalidLockDelay)?;
        let ui_hosts =
            palisade_tls::host::AllowedHosts::new(&args.ui_hosts).map_err(ServeError::UiHost)?;
        let auth = Arc::new(auth::Auth::load(
            args.tokens_file.as_deref(),
            args.policy_file.as_deref(),
        )?);
        if !auth.has_policy() {
            if platform.listener.is_none() {
                held_to_loopback(args, args.listen, "take every lock and change the cluster")?;
            }
            // The web UI shows every lock to whoever reaches it: the same rule.
            if let Some(listen) = args.ui_listen {
                held_to_loopback(args, listen, "read every lock, its holder and its value")?;
            }
            tracing::warn!(
                listen = %args.listen,
                "NO POLICY CONFIGURED: every client that reaches this listener may open sessions, take and release any lock, \
                 read every lock and see the cluster's members and public keys. Backups (they hold the signing key), \
                 membership and key changes and the token floor take the admin token in {}. Configure --tokens and \
                 --policy (docs/security.md)",
                args.data_dir.join(admin_token::ADMIN_TOKEN_FILE).display()
            );
        }
        // Every TLS file is read and checked before anything else starts.
        let tls = args
            .tls
            .as_ref()
            .map(tls::ServerTlsConfig::load)
            .transpose()?;
        let peers = peer_authentication(args, &auth, tls.as_ref(), platform.listener.is_none());
        if !args.insecure_peers {
            let grows = args.join || args.initial_cluster.as_ref().is_some_and(|c| c.len() > 1);
            if let Some(refusal) = peers.refusal(grows) {
                return Err(refusal);
            }
        }
        let dialer = match &tls {
            Some(loaded) => Some(tls::peer_dialer(loaded, platform.dialer)),
            None => platform.dialer,
        };
        let listener = match platform.listener {
            Some(listener) => listener,
            None => Listener::bind(args.listen)
                .await
                .map_err(|source| ServeError::Listen {
                    listen: args.listen,
                    source,
                })?,
        };
        let advertise = match &args.advertise {
            Some(advertise) => advertise.clone(),
            None => listener.local_addr().to_string(),
        };
        let node = node::Node::start(node::NodeConfig {
            node_id: args.node_id,
            data_dir: args.data_dir.clone(),
            limits,
            clock: platform.clock,
            advertise,
            initial_cluster: args.initial_cluster.clone(),
            join: args.join,
            dialer,
            blocking: platform.blocking,
            disk: platform.disk,
        })
        .await
        .map_err(|source| ServeError::Start {
            data_dir: args.data_dir.clone(),
            source,
        })?;
        // The admin token follows the founding key, which a restore may have replaced.
        if let Err(source) = admin_token::write(&args.data_dir, &node.founding_key()) {
            node.shutdown().await;
            return Err(ServeError::Start {
                data_dir: args.data_dir.clone(),
                source: node::StartError::Io(source),
            });
        }
        {
            let node = node.clone();
            auth.set_admin_token(move || admin_token::derive(&node.founding_key()));
        }
        // A directory that is a member of a larger cluster already (grown by `cluster add`).
        let several = args.join
            || args.initial_cluster.as_ref().is_some_and(|c| c.len() > 1)
            || node.cluster_view().members.len() > 1;
        if !args.insecure_peers
            && let Some(refusal) = peers.refusal(several)
        {
            node.shutdown().await;
            return Err(refusal);
        }
        if let Some(missing) = peers.missing.as_ref().filter(|_| several) {
            tracing::warn!(
                "PEERS NOT AUTHENTICATED: {missing}. Whoever reaches this listener may speak Raft as a member \
                 would and change anything in the cluster, the admin token notwithstanding: serve TLS with \
                 --tls-peer-ca (docs/security.md)"
            );
        }
        let ui = match args.ui_listen {
            None => None,
            Some(listen) => {
                if auth.has_policy() && !listen.ip().is_loopback() {
                    tracing::warn!(
                        %listen,
                        "the web UI serves plain HTTP: bearer tokens typed into it cross the network in clear text; \
                         put a TLS-terminating proxy in front of it or listen on loopback"
                    );
                }
                Some(
                    ui::Ui::bind(
                        listen,
                        service::LockService::with_auth(node.clone(), auth.clone()),
                        ui_hosts.clone(),
                    )
                    .await
                    .map_err(|source| ServeError::UiListen { listen, source })?,
                )
            }
        };
        Ok(Server {
            node,
            listener,
            connections: args.connections,
            auth,
            tls,
            ui,
            unauthenticated_peers: (!args.insecure_peers)
                .then(|| peers.growth_refusal())
                .flatten(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Where the web UI listens, if it was asked for.
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui.as_ref().and_then(|ui| ui.local_addr().ok())
    }

    pub fn node(&self) -> &Arc<node::Node> {
        &self.node
    }

    /// The server's authentication and authorization: [`auth::Auth::reload`] re-reads its
    /// files.
    pub fn auth(&self) -> &Arc<auth::Auth> {
        &self.auth
    }

    /// Serves gRPC until `shutdown` resolves, or until this node sees itself removed from its
    /// cluster, then stops Raft.
    ///
    /// Shutdown is graceful for at most [`SHUTDOWN_GRACE`]: long-lived calls are ended at once
    /// (clients see UNAVAILABLE and retry elsewhere or later), short ones may finish.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let node = self.node.clone();
        let removed = self.node.clone();
        let service = palisade_proto::v1::locks_server::LocksServer::new(grpc::GrpcLocks::new(
            service::LockService::with_auth(self.node.clone(), self.auth.clone()),
        ))
        .max_decoding_message_size(palisade_proto::MESSAGE_BYTES_MAX)
        .max_encoding_message_size(palisade_proto::MESSAGE_BYTES_MAX);
        let peers = peer_service::RaftPeerServer::new(
            self.node.raft().clone(),
            self.node.node_id(),
            peer::ClusterName::new(node::CLUSTER_NAME).expect("the cluster name is valid"),
        )
        .with_identity(self.node.incarnation(), self.node.clone())
        .with_stopping(self.node.stopping_signal())
        .into_service();
        let cluster = cluster::GrpcCluster::with_auth(self.node.clone(), self.auth.clone())
            .refusing_growth(self.unauthenticated_peers)
            .into_service();
        if let Some(ui) = self.ui {
            let node = self.node.clone();
            tokio::spawn(ui.run_until(async move { node.stopping().await }));
        }
        let (stopped, stop) = tokio::sync::oneshot::channel::<()>();
        let connection_layer = crate::connection::ConnectionLayer {
            peers_checked: self.tls.as_ref().is_some_and(tls::ServerTls::peers_checked),
        };
        let serving = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(CONCURRENT_REQUESTS_PER_CONNECTION_MAX)
            // What one connection can make the server hold (limits.rs).
            .max_concurrent_streams(limits::HTTP2_STREAMS_PER_CONNECTION_MAX)
            .initial_stream_window_size(limits::HTTP2_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(limits::HTTP2_CONNECTION_WINDOW_BYTES)
            // A peer that stops answering pings loses its connection, and its permit.
            .http2_keepalive_interval(Some(limits::HTTP2_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(limits::HTTP2_KEEPALIVE_TIMEOUT))
            // GOAWAY at this age; `incoming.rs` closes the connection after the grace.
            .max_connection_age(self.connections.age_max)
            // Outermost: refuses a bad credential and counts body bytes before anything else
            // reads the request.
            .layer(admission::AdmissionLayer::new(self.auth.clone()))
            .layer(connection_layer)
            .add_service(service)
            .add_service(peers)
            .add_service(cluster)
            .serve_with_incoming_shutdown(
                incoming::limited(self.listener, self.tls, self.connections),
                async move {
                    tokio::select! {
                        () = shutdown => {}
                        () = removed.removed() => {}
                    }
                    tracing::info!("shutting down");
                    node.begin_shutdown();
                    let _ = stopped.send(());
                },
            );
        tokio::pin!(serving);
        let served = tokio::select! {
            served = &mut serving => served,
            () = async {
                let _ = stop.await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; stopping anyway");
                Ok(())
            }
        };
        self.node.shutdown().await;
        Ok(served?)
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
