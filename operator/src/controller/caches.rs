//! What membership is computed from: the cluster's control planes, tags and namespaces, read
//! from the controllers' reflector stores ([`ClusterCaches`]) or listed ([`snapshot`]), and
//! the [`Snapshot`] of membership computed from them (`meshplane_crds::membership`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use meshplane_crds::membership::{self, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};

use super::Error;

/// What membership is computed from, as the control-plane controller's reflectors hold it. Each
/// store is fed by the same watch that triggers reconciles on its changes, so a reconcile never
/// reads a store older than its trigger.
#[derive(Clone)]
pub struct ClusterCaches {
    pub control_planes: Store<MeshControlPlane>,
    pub tags: Store<MeshRevisionTag>,
    pub namespaces: Store<Namespace>,
    /// True once the tag and namespace stores have seen their first complete list (the control
    /// plane store is ready before any reconcile runs). Reconciles wait on this rather
    /// than on `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
    /// concurrent waiters (the others would hang).
    pub ready: tokio::sync::watch::Receiver<bool>,
}

impl ClusterCaches {
    /// Caches over the three stores, and the task that marks them ready (the one waiter on
    /// the tag and namespace stores).
    pub fn new(
        control_planes: Store<MeshControlPlane>,
        tags: Store<MeshRevisionTag>,
        namespaces: Store<Namespace>,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        // The control plane store is not waited on here: the controller itself waits for its
        // main store before any reconcile, and a second waiter would take its wake-up.
        let stores = (tags.clone(), namespaces.clone());
        let mark_ready = async move {
            let (t, n) = stores;
            if t.wait_until_ready().await.is_ok() && n.wait_until_ready().await.is_ok() {
                let _ = ready_tx.send(true);
            }
        };
        let caches = Self {
            control_planes,
            tags,
            namespaces,
            ready,
        };
        (caches, mark_ready)
    }

    /// Membership from the stores, once each has seen its first complete list.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        let mut ready = self.ready.clone();
        match ready.wait_for(|ready| *ready).await {
            Ok(_) => {}
            Err(_) => return Err(Error::CacheClosed),
        }
        let namespaces = self.namespaces.state();
        Ok(Snapshot::compute(
            cloned(self.control_planes.state()),
            cloned(self.tags.state()),
            namespace_facts(namespaces.iter().map(Arc::as_ref)),
            |name| {
                self.namespaces
                    .get(&ObjectRef::new(name))
                    .map(|n| facts_of(&n))
            },
        ))
    }
}

/// The cluster state membership is computed from.
pub struct Snapshot {
    pub control_planes: Vec<MeshControlPlane>,
    pub tags: Vec<MeshRevisionTag>,
    pub membership: Membership,
}

/// Lists control planes, tags and labelled namespaces, and computes membership.
pub async fn snapshot(client: &Client) -> Result<Snapshot, Error> {
    let control_planes = Api::<MeshControlPlane>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list MeshControlPlanes"))?
        .items;
    let tags = Api::<MeshRevisionTag>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list MeshRevisionTags"))?
        .items;
    // Every namespace: labelled ones can be members or rejected, and any may be named as a
    // control namespace.
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Namespaces"))?
        .items;
    let by_name: HashMap<String, &Namespace> =
        namespaces.iter().map(|n| (n.name_any(), n)).collect();
    Ok(Snapshot::compute(
        control_planes,
        tags,
        namespace_facts(namespaces.iter()),
        |name| by_name.get(name).map(|n| facts_of(n)),
    ))
}

fn facts_of(n: &Namespace) -> NamespaceFacts {
    NamespaceFacts {
        name: n.name_any(),
        labels: n.labels().clone(),
    }
}

/// Membership inputs of the labelled namespaces (only they can be members or rejected).
fn namespace_facts<'a>(namespaces: impl Iterator<Item = &'a Namespace>) -> Vec<NamespaceFacts> {
    namespaces
        .filter(|n| n.labels().contains_key(names::REV_LABEL))
        .map(facts_of)
        .collect()
}

impl Snapshot {
    /// Membership, after dropping the control planes whose control namespace is not theirs
    /// to take (`control_namespace` finds a namespace by name): they claim nothing and evict
    /// nothing, and carry a `ControlNamespaceNotOwned` conflict instead.
    fn compute(
        control_planes: Vec<MeshControlPlane>,
        tags: Vec<MeshRevisionTag>,
        ns_facts: Vec<NamespaceFacts>,
        control_namespace: impl Fn(&str) -> Option<NamespaceFacts>,
    ) -> Self {
        let cp_facts: Vec<ControlPlaneFacts> =
            control_planes.iter().map(ControlPlaneFacts::from).collect();
        let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
        let membership =
            membership::compute_guarded(&ns_facts, &cp_facts, &tag_facts, control_namespace);
        Snapshot {
            control_planes,
            tags,
            membership,
        }
    }
}

fn cloned<K: Clone>(objects: Vec<Arc<K>>) -> Vec<K> {
    objects.iter().map(|o| K::clone(o)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use kube::runtime::reflector;
    use kube::runtime::watcher::Event as Ev;

    fn plane(name: &str, revision: &str) -> MeshControlPlane {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshControlPlane",
            "metadata": {"name": name},
            "spec": {"tenant": "blue", "revision": revision},
        }))
        .expect("a valid MeshControlPlane")
    }

    #[tokio::test]
    async fn every_concurrent_reconcile_sees_the_caches_become_ready() {
        let (control_planes, mut cp_writer) = reflector::store::<MeshControlPlane>();
        let (tags, mut tag_writer) = reflector::store::<MeshRevisionTag>();
        let (namespaces, mut ns_writer) = reflector::store::<Namespace>();
        // kube-runtime's Controller waits for its main store too: that wake-up must not be taken.
        let main_store = control_planes.clone();
        let controller = tokio::spawn(async move { main_store.wait_until_ready().await });
        let (caches, mark_ready) = ClusterCaches::new(control_planes, tags, namespaces);
        let marker = tokio::spawn(mark_ready);
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.snapshot().await.map(|s| s.control_planes.len()) })
            })
            .collect();
        tokio::task::yield_now().await;
        cp_writer.apply_watcher_event(&Ev::Init);
        cp_writer.apply_watcher_event(&Ev::InitApply(plane("a", "a1")));
        cp_writer.apply_watcher_event(&Ev::InitDone);
        tag_writer.apply_watcher_event(&Ev::Init);
        tag_writer.apply_watcher_event(&Ev::InitDone);
        ns_writer.apply_watcher_event(&Ev::Init);
        ns_writer.apply_watcher_event(&Ev::InitDone);
        for task in waiting {
            let seen = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("every waiter wakes up")
                .expect("the task ran")
                .expect("a snapshot");
            assert_eq!(seen, 1);
        }
        marker.await.expect("the marker ran");
        tokio::time::timeout(Duration::from_secs(10), controller)
            .await
            .expect("the controller's wait wakes up")
            .expect("the task ran")
            .expect("the store is ready");
    }
}
