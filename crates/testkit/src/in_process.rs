//! The lock service and the fenced store served from the test's own tokio runtime, on a port the
//! server binds itself (port 0). Dropping one begins its shutdown; [`LockServer::stop`] and
//! [`StoreServer::stop`] wait for it to finish.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use palisade_proto::v1::locks_client::LocksClient;
use palisade_server::{ServeError, ServerConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::keys::ServiceKey;

/// A raw gRPC client of the lock service at `endpoint` (`http://ADDR`), connected.
pub async fn locks_client(endpoint: &str) -> LocksClient<Channel> {
    LocksClient::connect(endpoint.to_owned())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {endpoint}: {e}"))
}

/// A lock service running in this process: recovered, leader and listening.
#[derive(Debug)]
pub struct LockServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<Result<(), ServeError>>>,
}

impl LockServer {
    /// The configuration of [`LockServer::start`]: `data_dir`, loopback port 0, no metrics, no
    /// lock delay. Change a field and pass it to [`LockServer::start_with`].
    pub fn config(data_dir: &Path) -> ServerConfig {
        ServerConfig::single_node(
            data_dir.to_path_buf(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        )
    }

    /// Starts a lock service on `data_dir` (new or left by an earlier server).
    pub async fn start(data_dir: &Path) -> LockServer {
        LockServer::start_with(&LockServer::config(data_dir)).await
    }

    pub async fn start_with(config: &ServerConfig) -> LockServer {
        let server = palisade_server::Server::start(config)
            .await
            .expect("server starts");
        let addr = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run_until(async {
            let _ = stopped.await;
        }));
        LockServer {
            addr,
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// `http://ADDR`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the server down and asserts that it stopped cleanly (its data directory is then
    /// free for another server).
    pub async fn stop(mut self) {
        let _ = self.stop.take().expect("not stopped yet").send(());
        let served = self.served.take().expect("not stopped yet");
        served
            .await
            .expect("the server task did not panic")
            .expect("the server stopped cleanly");
    }
}

/// A fenced store server running in this process, on a store in a temporary directory.
#[derive(Debug)]
pub struct StoreServer {
    pub addr: SocketAddr,
    /// `http://ADDR`.
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
    // Declared last: removed after the server is told to stop.
    _dir: tempfile::TempDir,
}

impl StoreServer {
    /// A store server over a new store that trusts `service`'s key.
    pub async fn start(service: &ServiceKey) -> StoreServer {
        let (store, dir) = service.store();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let server = palisade_store::StoreServer::bind(Arc::new(store), addr)
            .await
            .expect("store server binds");
        let addr = server
            .local_addr()
            .expect("a bound listener has an address");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            server
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the store server stopped cleanly");
        });
        StoreServer {
            addr,
            url: format!("http://{addr}"),
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        }
    }

    /// Stops the server and waits until it has closed its listener.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.expect("the store server task did not panic");
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
