//! Which watchers run where: the kinds of each member namespace (Strict isolation: one set per
//! namespace, started and stopped as members change; Shared: one cluster-wide set, filtered),
//! the TLS Secrets of the namespaces the tenant's gateways run in, and the readiness barrier
//! behind the first listings.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use meshplane_crds::controlplane::GatewayDeployment;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::kind_watch::{spawn_kind_watchers, watch_kind, Batch, InitialListing, Refusals};
use crate::kinds::WatchedObject;
use crate::model::SourceEvent;

/// The watchers of the member namespaces' kinds.
pub(super) struct NamespaceWatchers {
    client: Client,
    out: mpsc::Sender<Batch>,
    refusals: Arc<Refusals>,
    control_namespace: String,
    shared: bool,
    /// Per namespace (`None`: the cluster-wide set of Shared mode).
    running: HashMap<Option<String>, Vec<JoinHandle<()>>>,
    /// What the cluster-wide set lets through (Shared mode).
    allowed: watch::Sender<BTreeSet<String>>,
    /// First listings not yet handed to the readiness barrier.
    initial: Vec<oneshot::Receiver<()>>,
}

impl NamespaceWatchers {
    /// Starts the cluster-wide set in Shared mode; Strict mode starts per namespace on
    /// [`Self::follow`].
    pub(super) fn start(
        client: Client,
        out: mpsc::Sender<Batch>,
        refusals: Arc<Refusals>,
        control_namespace: String,
        shared: bool,
    ) -> Self {
        let (allowed, allowed_rx) = watch::channel(BTreeSet::from([control_namespace.clone()]));
        let mut this = Self {
            client,
            out,
            refusals,
            control_namespace,
            shared,
            running: HashMap::new(),
            allowed,
            initial: Vec::new(),
        };
        if shared {
            let handles = spawn_kind_watchers(
                &this.client,
                None,
                &this.out,
                Some(allowed_rx),
                &mut this.initial,
                &this.refusals,
            );
            this.running.insert(None, handles);
        }
        this
    }

    /// Reads the member namespaces `members` and the control namespace, and no other.
    pub(super) fn follow(&mut self, members: &BTreeSet<String>) {
        let mut allowed = members.clone();
        allowed.insert(self.control_namespace.clone());
        if !self.shared {
            self.running.retain(|ns, handles| {
                let keep = ns.as_ref().is_some_and(|n| allowed.contains(n));
                if !keep {
                    handles.iter().for_each(JoinHandle::abort);
                }
                keep
            });
            for ns in &allowed {
                if let Entry::Vacant(slot) = self.running.entry(Some(ns.clone())) {
                    slot.insert(spawn_kind_watchers(
                        &self.client,
                        Some(ns),
                        &self.out,
                        None,
                        &mut self.initial,
                        &self.refusals,
                    ));
                }
            }
        }
        self.allowed.send_replace(allowed);
    }

    /// The first listings started since the last call.
    pub(super) fn take_initial(&mut self) -> Vec<oneshot::Receiver<()>> {
        std::mem::take(&mut self.initial)
    }
}

impl Drop for NamespaceWatchers {
    fn drop(&mut self) {
        self.running.values().flatten().for_each(JoinHandle::abort);
    }
}

/// The watchers of TLS Secrets, one per namespace a gateway of the tenant runs in (what
/// Gateway servers' `credentialName` name); Secrets are read nowhere else.
pub(super) struct SecretWatchers {
    client: Client,
    out: mpsc::Sender<Batch>,
    refusals: Arc<Refusals>,
    running: HashMap<String, JoinHandle<()>>,
}

impl SecretWatchers {
    pub(super) fn new(client: Client, out: mpsc::Sender<Batch>, refusals: Arc<Refusals>) -> Self {
        Self {
            client,
            out,
            refusals,
            running: HashMap::new(),
        }
    }

    /// Watches exactly the namespaces of `gateways`.
    pub(super) fn follow(&mut self, gateways: &[GatewayDeployment]) {
        let namespaces: BTreeSet<&String> = gateways.iter().map(|g| &g.namespace).collect();
        self.running.retain(|ns, handle| {
            let keep = namespaces.contains(ns);
            if !keep {
                handle.abort();
            }
            keep
        });
        for ns in namespaces {
            if let Entry::Vacant(slot) = self.running.entry(ns.clone()) {
                // Readiness does not wait for Secrets: nothing listens to this release.
                let (done, _) = oneshot::channel();
                slot.insert(tokio::spawn(watch_kind::<Secret>(
                    Api::namespaced(self.client.clone(), ns),
                    Some(ns.clone()),
                    Secret::KIND,
                    Secret::into_object,
                    self.out.clone(),
                    InitialListing::new(done, Arc::clone(&self.refusals), Some(ns), Secret::KIND),
                    None,
                )));
            }
        }
    }
}

impl Drop for SecretWatchers {
    fn drop(&mut self) {
        self.running.values().for_each(JoinHandle::abort);
    }
}

/// Sends [`SourceEvent::Ready`] behind every first listing in `waits` on the one ordered
/// channel; a watcher stopped before listing (its namespace left) counts as done.
pub(super) fn ready_after(waits: Vec<oneshot::Receiver<()>>, out: mpsc::Sender<Batch>) {
    tokio::spawn(async move {
        for w in waits {
            let _ = w.await;
        }
        tracing::info!("Kubernetes source synced");
        let _ = out.send(vec![SourceEvent::Ready]).await;
    });
}
