//! kube-proxy for the local pods: TCP forwarding from each Service's `clusterIP:port` to one of
//! its ready endpoints, so that addresses the operator renders (the ADS address in the
//! bootstrap, webhook Services) reach the right pod.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::endpoints::ServiceRoute;

struct Forwarder {
    backends: Arc<RwLock<Vec<SocketAddr>>>,
    task: JoinHandle<()>,
}

/// The forwarders, one per Service port with a ClusterIP.
#[derive(Default)]
pub struct ServiceProxy {
    forwarders: BTreeMap<SocketAddr, Forwarder>,
    bind_errors: BTreeMap<SocketAddr, String>,
}

impl ServiceProxy {
    /// Makes the forwarders match `routes`: new frontends are bound, gone ones closed, and the
    /// backends of the others replaced.
    pub async fn sync(&mut self, routes: &[ServiceRoute]) {
        let desired: BTreeMap<SocketAddr, Vec<SocketAddr>> = routes
            .iter()
            .filter_map(|r| Some((r.frontend?, r.backends.clone())))
            .collect();
        self.forwarders.retain(|frontend, forwarder| {
            let keep = desired.contains_key(frontend);
            if !keep {
                forwarder.task.abort();
            }
            keep
        });
        for (frontend, backends) in desired {
            if let Some(forwarder) = self.forwarders.get(&frontend) {
                *forwarder
                    .backends
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = backends;
                continue;
            }
            match TcpListener::bind(frontend).await {
                Ok(listener) => {
                    self.bind_errors.remove(&frontend);
                    let backends = Arc::new(RwLock::new(backends));
                    let task = tokio::spawn(forward(listener, Arc::clone(&backends)));
                    self.forwarders
                        .insert(frontend, Forwarder { backends, task });
                }
                Err(error) => {
                    let message = error.to_string();
                    if self.bind_errors.get(&frontend) != Some(&message) {
                        tracing::warn!(%frontend, %message, "cannot listen on the Service's ClusterIP");
                        self.bind_errors.insert(frontend, message);
                    }
                }
            }
        }
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for forwarder in self.forwarders.values() {
            forwarder.task.abort();
        }
    }
}

async fn forward(listener: TcpListener, backends: Arc<RwLock<Vec<SocketAddr>>>) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let backends = backends.read().unwrap_or_else(|e| e.into_inner()).clone();
        let start = next.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Round robin; an endpoint that refuses is skipped, as a connection to a dead pod
            // would be retried by the client anyway.
            for offset in 0..backends.len() {
                let backend = backends[(start + offset) % backends.len()];
                if let Ok(mut outbound) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    return;
                }
            }
        });
    }
}
