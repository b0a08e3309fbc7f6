//! A lock service (and fenced store) running inside this process on temporary directories and
//! free loopback ports: what `palisade demo` and the tests start, so they need no setup.
//!
//! Each service is stopped by [`LocalLockService::stop`] (or, best effort, when dropped); its
//! directory is removed after it stopped.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::target::Target;

/// A lock service on a temporary directory and a free loopback port.
#[derive(Debug)]
pub struct LocalLockService {
    address: SocketAddr,
    public_key: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), palisade_server::ServeError>>>,
    // Declared last: removed after the server stopped writing to it.
    _dir: tempfile::TempDir,
}

impl LocalLockService {
    /// Starts a fresh, empty lock service.
    pub async fn start() -> anyhow::Result<LocalLockService> {
        let dir = tempfile::Builder::new()
            .prefix("palisade-lock-service-")
            .tempdir()
            .context("cannot create a temporary directory for the lock service")?;
        let args = palisade_server::ServerConfig::single_node(
            dir.path().to_path_buf(),
            "127.0.0.1:0".parse().expect("a literal address parses"),
        );
        let server = palisade_server::Server::start(&args).await?;
        let address = server.local_addr();
        let public_key = server.node().public_key().to_string();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until(async move {
            let _ = stopped.await;
        }));
        Ok(LocalLockService {
            address,
            public_key,
            shutdown: Some(shutdown),
            task: Some(task),
            _dir: dir,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT`, for [`palisade_client::Client::connect`].
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// `palisade://127.0.0.1:PORT`, for the benchmarks.
    pub fn target(&self) -> Target {
        Target::Palisade {
            address: self.address.to_string(),
        }
    }

    /// The key resources verify sequencers with (`ed25519:…`).
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// Stops serving, closes the log, and removes the directory.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match self.task.take() {
            Some(task) => Ok(task.await.context("the lock service task failed")??),
            None => Ok(()),
        }
    }
}

impl Drop for LocalLockService {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// A fenced store on a temporary directory and a free loopback port, trusting one lock
/// service's public key.
#[derive(Debug)]
pub struct LocalStore {
    address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl LocalStore {
    /// Starts an empty store that verifies sequencers with `public_key` (`ed25519:…`).
    pub async fn start(public_key: &str) -> anyhow::Result<LocalStore> {
        let dir = tempfile::Builder::new()
            .prefix("palisade-store-")
            .tempdir()
            .context("cannot create a temporary directory for the store")?;
        let public_key = palisade_sequencer::PublicKey::parse(public_key)
            .map_err(|e| anyhow::anyhow!("invalid public key {public_key:?}: {e}"))?;
        let store = std::sync::Arc::new(palisade_store::Store::open(dir.path(), public_key)?);
        let server = palisade_store::StoreServer::bind(
            store,
            "127.0.0.1:0".parse().expect("a literal address parses"),
        )
        .await
        .context("cannot bind the store to a loopback port")?;
        let address = server.local_addr()?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until(async move {
            let _ = stopped.await;
        }));
        Ok(LocalStore {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`, for [`palisade_store::StoreClient::new`].
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// `127.0.0.1:PORT`, as `palisade bench --store` takes it.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving and removes the directory.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match self.task.take() {
            Some(task) => Ok(task.await.context("the store task failed")??),
            None => Ok(()),
        }
    }
}

impl Drop for LocalStore {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}
