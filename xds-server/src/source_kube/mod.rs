//! Kubernetes source: watches the kinds of [`crate::kinds`] read per member namespace in the
//! tenant's member namespaces and its control namespace, the TLS Secrets of its gateways'
//! namespaces, and follows the members ConfigMap (contract 2).
//!
//! Strict isolation reads only what namespace-scoped RoleBindings allow: the members ConfigMap
//! (contract 2) in the control namespace, then one watcher per kind per member namespace,
//! started and stopped as members change. Shared isolation runs cluster-wide watchers and
//! filters in process. `kube::runtime::watcher` relists on 410 Gone and reconnects; each
//! relist becomes `Resync` + `Upsert`s + `Synced`, delivered as one uninterrupted batch.
//!
//! Parts: `members` (the members ConfigMap, decoded once per event), `namespaces` (which
//! watchers run where, and the readiness barrier), `kind_watch` (one watcher of one kind), and
//! [`SharedVerifier`] (Shared mode's check of the listed members).

mod kind_watch;
mod members;
mod namespaces;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use meshplane_contracts::proxies::{MembersStale, RefusedWatches};
use tokio::sync::{mpsc, watch};

use kind_watch::{Batch, Refusals};
pub use members::{
    decode_event, parse_gateways, parse_members, parse_mesh_config, read_members, Decoded,
    MembersFollower, RevisionSettings,
};
use namespaces::{ready_after, NamespaceWatchers, SecretWatchers};

use crate::metrics::Metrics;
use crate::model::SourceEvent;

/// What the Kubernetes source watches.
#[derive(Clone, Debug)]
pub struct KubeSourceConfig {
    pub tenant: String,
    pub control_namespace: String,
    pub revision: String,
    /// Shared isolation: cluster-wide watchers filtered in process, reading only the listed
    /// members that membership confirms ([`crate::shared_members`]).
    pub shared: bool,
    /// Where `members_stale`, `members_unverified` and `refused_watches` are reported.
    pub metrics: Arc<Metrics>,
    /// Whether, since when and why the members in use are stale: what
    /// [`crate::report::proxy_count`] applies next to the count (contract 3).
    pub members_stale: watch::Sender<Option<MembersStale>>,
    /// The watches the API server refuses now (403 before they first listed), which the
    /// instance serves without: what [`crate::report::proxy_count`] applies next to the
    /// count (contract 3).
    pub refused_watches: watch::Sender<Option<RefusedWatches>>,
    /// Which namespaces' config this revision writes the status of (contract 2: its attached
    /// namespaces, and the control namespace when it is the tenant's status writer), from the
    /// last readable members ConfigMap; `None` until one was read.
    pub status_scope: watch::Sender<Option<StatusScope>>,
}

/// The namespaces whose config status one revision writes (contract 2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusScope {
    pub control_namespace: String,
    pub members: meshplane_contracts::members::MembersData,
}

impl StatusScope {
    /// Whether this revision writes the status of config in `namespace`.
    pub fn owns(&self, namespace: &str) -> bool {
        self.members
            .writes_status_of(namespace, &self.control_namespace)
    }
}

/// Runs the source until `out` closes. Sends [`SourceEvent::Ready`] once the members and every
/// initial namespace watch have been listed, or refused (403): one namespace the instance may
/// not read never keeps the whole instance unready.
pub async fn run(client: Client, config: KubeSourceConfig, out: mpsc::Sender<SourceEvent>) {
    let (batch_tx, batch_rx) = mpsc::channel::<Batch>(256);
    let funnel = tokio::spawn(funnel(batch_rx, out));
    let refusals = Arc::new(Refusals::new(
        Arc::clone(&config.metrics),
        config.refused_watches.clone(),
    ));
    let mut namespaces = NamespaceWatchers::start(
        client.clone(),
        batch_tx.clone(),
        Arc::clone(&refusals),
        config.control_namespace.clone(),
        config.shared,
    );
    let mut secrets = SecretWatchers::new(client.clone(), batch_tx.clone(), refusals);
    let mut verifier = config
        .shared
        .then(|| SharedVerifier::spawn(client.clone(), &config));

    let members_api: Api<ConfigMap> = Api::namespaced(client.clone(), &config.control_namespace);
    let name = meshplane_crds::names::members_configmap(&config.revision);
    let selector = format!("metadata.name={name}");
    let mut stream = watcher(members_api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut follower = MembersFollower::default();
    let mut settings = RevisionSettings::default();
    let mut members: Option<BTreeSet<String>> = None;
    let mut ready_armed = false;
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => Some(event),
                None => break,
            },
            changed = async {
                match verifier.as_mut() {
                    Some(v) => v.confirmed.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    break;
                }
                None
            }
        };
        if let Some(event) = event {
            match event.map(members::decode_event) {
                Ok(event) => {
                    if let Event::InitApply(Ok(data)) | Event::Apply(Ok(data)) = &event {
                        let scope = StatusScope {
                            control_namespace: config.control_namespace.clone(),
                            members: data.clone(),
                        };
                        config.status_scope.send_if_modified(|old| {
                            let differs = old.as_ref().is_none_or(|o| {
                                o.members.attached != scope.members.attached
                                    || o.members.status_writer != scope.members.status_writer
                            });
                            if differs {
                                *old = Some(scope);
                            }
                            differs
                        });
                        let changes = settings.update(data);
                        for change in &changes {
                            if let SourceEvent::GatewayDeployments(gateways) = change {
                                secrets.follow(gateways);
                            }
                        }
                        if !changes.is_empty() && batch_tx.send(changes).await.is_err() {
                            break;
                        }
                    }
                    follower.on_decoded(&event, members::now_rfc3339());
                }
                Err(e) => {
                    tracing::warn!(error = %e, configmap = %name, "members watch failed, retrying");
                    follower.on_error(&e, members::now_rfc3339());
                }
            }
            config.metrics.set_members_stale(follower.stale().is_some());
            let mark = follower.stale().cloned();
            config.members_stale.send_if_modified(|old| {
                let differs = *old != mark;
                if differs {
                    *old = mark;
                }
                differs
            });
        }
        let Some(listed) = follower.known() else {
            continue;
        };
        let next = match verifier.as_mut() {
            None => listed.clone(),
            Some(v) => match v.read(listed) {
                Some(read) => read,
                None => continue,
            },
        };
        if members.as_ref() != Some(&next) {
            tracing::info!(members = ?next, "tenant members changed");
            if batch_tx
                .send(vec![SourceEvent::Members(next.clone())])
                .await
                .is_err()
            {
                break;
            }
            namespaces.follow(&next);
            members = Some(next);
        }
        let initial = namespaces.take_initial();
        if !ready_armed && members.is_some() {
            ready_armed = true;
            ready_after(initial, batch_tx.clone());
        }
    }
    drop((namespaces, secrets));
    funnel.abort();
}

/// One writer keeps each relist batch contiguous on the output channel.
async fn funnel(mut batches: mpsc::Receiver<Batch>, out: mpsc::Sender<SourceEvent>) {
    while let Some(batch) = batches.recv().await {
        for event in batch {
            if out.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// Shared isolation: the listed members that membership confirms (the tenant's by their
/// labels and the cluster's control planes and tags), so a members ConfigMap written by
/// anyone else cannot widen what the cluster-wide watchers let through.
struct SharedVerifier {
    confirmed: watch::Receiver<Option<BTreeSet<String>>>,
    unverified: BTreeSet<String>,
    metrics: Arc<Metrics>,
}

impl SharedVerifier {
    fn spawn(client: Client, config: &KubeSourceConfig) -> Self {
        Self {
            confirmed: crate::shared_members::spawn(client, config.tenant.clone()),
            unverified: BTreeSet::new(),
            metrics: Arc::clone(&config.metrics),
        }
    }

    /// The members to read of `listed`; `None` until membership has listed.
    fn read(&mut self, listed: &BTreeSet<String>) -> Option<BTreeSet<String>> {
        let confirmed = self.confirmed.borrow_and_update().clone()?;
        let (read, dropped) = crate::shared_members::verify(listed, &confirmed);
        if dropped != self.unverified {
            if !dropped.is_empty() {
                tracing::warn!(
                    namespaces = ?dropped,
                    "the members ConfigMap lists namespaces that are not the tenant's by their labels and the cluster's control planes and tags: not read"
                );
            }
            self.metrics.set_members_unverified(dropped.len());
            self.unverified = dropped;
        }
        Some(read)
    }
}
