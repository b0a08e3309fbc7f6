//! Test support: a lock service's key pair, sequencers signed with it (or with an impostor's),
//! and a store or store server in a temporary directory.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use palisade_sequencer::SigningKey;
use palisade_store::{Store, StoreServer};
use tokio::sync::oneshot;

/// The lock service's key, as far as the tests are concerned.
pub struct Service {
    pub key: SigningKey,
}

impl Service {
    pub fn new() -> Service {
        Service {
            key: SigningKey::generate(),
        }
    }

    /// The sequencer of the grant of `lock` with `token`, held by `session`.
    pub fn grant(&self, lock: &str, token: u64, session: u64) -> String {
        self.key
            .sign(lock, token, session)
            .expect("test grants are valid")
            .as_str()
            .to_owned()
    }

    /// A store in a fresh temporary directory (kept alive by the returned guard).
    pub fn store(&self) -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), self.key.public_key()).unwrap();
        (store, dir)
    }
}

/// A sequencer signed by a key the store was not given.
pub fn impostor_grant(lock: &str, token: u64, session: u64) -> String {
    SigningKey::generate()
        .sign(lock, token, session)
        .unwrap()
        .as_str()
        .to_owned()
}

/// A store server on a free loopback port, stopped when dropped.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl RunningServer {
    pub async fn start(service: &Service) -> RunningServer {
        let (store, dir) = service.store();
        let server = StoreServer::bind(Arc::new(store), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        RunningServer {
            addr,
            url: format!("http://{addr}"),
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Stops the server and waits until it has closed its listener.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
