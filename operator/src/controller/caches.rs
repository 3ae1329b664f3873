//! What membership is computed from: the cluster's control planes, tags and namespaces, read
//! from the controllers' reflector stores ([`ClusterCaches`]) or listed ([`snapshot`]), and
//! the [`Snapshot`] of membership computed from them (`meshplane_crds::membership`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use meshplane_crds::membership::{self, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};

use super::Error;

/// What membership is computed from, as the controllers' shared watches
/// (`super::watches::SharedWatch`) keep it. Each store is written before its event reaches any
/// trigger, so a reconcile never reads a store older than its trigger.
#[derive(Clone)]
pub struct ClusterCaches {
    pub control_planes: Store<MeshControlPlane>,
    pub tags: Store<MeshRevisionTag>,
    pub namespaces: Store<Namespace>,
    /// Whether each store has seen its first complete list. Reconciles wait on these rather
    /// than on `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
    /// concurrent waiters (the others, the controllers' own wait among them, would hang).
    ready: [Ready; 3],
}

type Ready = tokio::sync::watch::Receiver<bool>;

impl ClusterCaches {
    /// Caches over the three stores, each with its readiness.
    pub fn new(
        control_planes: (Store<MeshControlPlane>, Ready),
        tags: (Store<MeshRevisionTag>, Ready),
        namespaces: (Store<Namespace>, Ready),
    ) -> Self {
        Self {
            control_planes: control_planes.0,
            tags: tags.0,
            namespaces: namespaces.0,
            ready: [control_planes.1, tags.1, namespaces.1],
        }
    }

    /// Membership from the stores, once each has seen its first complete list.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        for ready in &self.ready {
            if ready.clone().wait_for(|ready| *ready).await.is_err() {
                return Err(Error::CacheClosed);
            }
        }
        let namespaces = self.namespaces.state();
        Ok(Snapshot::compute(
            cloned(self.control_planes.state()),
            cloned(self.tags.state()),
            namespaces.iter().map(Arc::as_ref),
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
    /// Every namespace's `metadata.uid`, by name (Events regarding a namespace carry it, so
    /// that `kubectl describe namespace` finds them).
    pub namespace_uids: BTreeMap<String, String>,
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
        namespaces.iter(),
        |name| by_name.get(name).map(|n| facts_of(n)),
    ))
}

fn facts_of(n: &Namespace) -> NamespaceFacts {
    NamespaceFacts::of(&n.metadata)
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
    fn compute<'a>(
        control_planes: Vec<MeshControlPlane>,
        tags: Vec<MeshRevisionTag>,
        namespaces: impl Iterator<Item = &'a Namespace> + Clone,
        control_namespace: impl Fn(&str) -> Option<NamespaceFacts>,
    ) -> Self {
        let ns_facts = namespace_facts(namespaces.clone());
        let namespace_uids = namespaces
            .filter_map(|n| Some((n.name_any(), n.uid()?)))
            .collect();
        let cp_facts: Vec<ControlPlaneFacts> =
            control_planes.iter().map(ControlPlaneFacts::from).collect();
        let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
        let membership =
            membership::compute_guarded(&ns_facts, &cp_facts, &tag_facts, control_namespace);
        Snapshot {
            control_planes,
            tags,
            membership,
            namespace_uids,
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

    use crate::controller::watches::SharedWatch;
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
        let control_planes = SharedWatch::<MeshControlPlane>::new();
        let tags = SharedWatch::<MeshRevisionTag>::new();
        let namespaces = SharedWatch::<Namespace>::new();
        let caches = ClusterCaches::new(
            (control_planes.store(), control_planes.ready()),
            (tags.store(), tags.ready()),
            (namespaces.store(), namespaces.ready()),
        );
        // kube-runtime's Controller waits for its main store too: that wake-up must not be taken.
        let main_store = control_planes.store();
        let controller = tokio::spawn(async move { main_store.wait_until_ready().await });
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.snapshot().await.map(|s| s.control_planes.len()) })
            })
            .collect();
        tokio::task::yield_now().await;
        let (cp_tx, cp_rx) = futures::channel::mpsc::unbounded();
        let (tag_tx, tag_rx) = futures::channel::mpsc::unbounded();
        let (ns_tx, ns_rx) = futures::channel::mpsc::unbounded();
        let _feeds = (
            control_planes.start("MeshControlPlane", cp_rx),
            tags.start("MeshRevisionTag", tag_rx),
            namespaces.start("Namespace", ns_rx),
        );
        for event in [Ev::Init, Ev::InitApply(plane("a", "a1")), Ev::InitDone] {
            cp_tx.unbounded_send(Ok(event)).expect("fed");
        }
        for event in [Ev::Init, Ev::InitDone] {
            tag_tx.unbounded_send(Ok(event)).expect("fed");
        }
        for event in [Ev::Init, Ev::InitDone] {
            ns_tx.unbounded_send(Ok(event)).expect("fed");
        }
        for task in waiting {
            let seen = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("every waiter wakes up")
                .expect("the task ran")
                .expect("a snapshot");
            assert_eq!(seen, 1);
        }
        tokio::time::timeout(Duration::from_secs(10), controller)
            .await
            .expect("the controller's wait wakes up")
            .expect("the task ran")
            .expect("the store is ready");
    }
}
