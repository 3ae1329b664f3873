//! Triggers from the kinds the operator may read only where it bound itself its namespace roles
//! ([`Kind::bound_per_namespace`]: Secrets, ServiceAccounts, Deployments, PodDisruptionBudgets,
//! NetworkPolicies). The operator holds no cluster-wide list or watch on them, so they are
//! watched per namespace: in each namespace where one of the operator's access RoleBindings
//! (`meshplane-<rev>-operator`, `meshplane-<rev>-gateway-operator`) exists, and only while it
//! does. The RoleBindings themselves are watched cluster-wide (the operator holds that), which
//! also triggers the control plane that owns each binding.
//!
//! A deleted webhook TLS Secret (or instance Deployment, ...) thus still triggers its control
//! plane at once, which re-creates it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use meshplane_crds::MeshControlPlane;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::triggers::owning_control_plane;
use crate::render::{self, AccessGrant, OperatorAccount};

#[cfg(doc)]
use crate::render::Kind;

/// The namespaces where the operator holds an access binding, kept from RoleBinding watch
/// events.
#[derive(Default)]
pub struct AccessIndex {
    /// `namespace/name` of each access binding → its namespace.
    bindings: BTreeMap<String, (String, AccessGrant)>,
    /// The bindings seen during a relist (replacing `bindings` at its end).
    relisting: Option<BTreeMap<String, (String, AccessGrant)>>,
}

impl AccessIndex {
    /// Takes one event of a watch of the operator's RoleBindings; returns the namespaces where it
    /// holds an access binding, when that set may have changed.
    pub fn observe(
        &mut self,
        event: &watcher::Event<RoleBinding>,
        operator: &OperatorAccount,
    ) -> Option<BTreeSet<String>> {
        let entry = |b: &RoleBinding| {
            let key = format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
            let namespace = serde_json::to_value(b)
                .ok()
                .and_then(|v| render::operator_access(&v, operator));
            (key, namespace)
        };
        match event {
            watcher::Event::Init => {
                self.relisting = Some(BTreeMap::new());
                return None;
            }
            watcher::Event::InitApply(b) => {
                let (key, namespace) = entry(b);
                if let (Some(relisting), Some(ns)) = (self.relisting.as_mut(), namespace) {
                    relisting.insert(key, ns);
                }
                return None;
            }
            watcher::Event::InitDone => {
                self.bindings = self.relisting.take().unwrap_or_default();
            }
            watcher::Event::Apply(b) => match entry(b) {
                (key, Some(ns)) => {
                    self.bindings.insert(key, ns);
                }
                (key, None) => {
                    self.bindings.remove(&key);
                }
            },
            watcher::Event::Delete(b) => {
                self.bindings.remove(&entry(b).0);
            }
        }
        Some(self.namespaces())
    }

    /// The namespaces where the operator holds an access binding.
    pub fn namespaces(&self) -> BTreeSet<String> {
        self.bindings.values().map(|(ns, _)| ns.clone()).collect()
    }

    /// What the bindings grant, by namespace (the widest grant).
    pub fn grants(&self) -> BTreeMap<String, AccessGrant> {
        let mut out: BTreeMap<String, AccessGrant> = BTreeMap::new();
        for (ns, grant) in self.bindings.values() {
            let entry = out.entry(ns.clone()).or_insert(*grant);
            *entry = (*entry).max(*grant);
        }
        out
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Trigger = ObjectRef<MeshControlPlane>;

/// The owning control plane of every change to the operator's RoleBindings (cluster-wide) and
/// to its objects of the kinds it reads only per namespace (in the namespaces of its access
/// bindings). `config` selects the operator's objects (its managed-by label).
pub fn owned_triggers(
    client: Client,
    config: watcher::Config,
    operator: OperatorAccount,
) -> impl Stream<Item = Trigger> + Send + 'static {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Trigger>();
    let manager = tokio::spawn(async move {
        let mut bindings = watcher(Api::<RoleBinding>::all(client.clone()), config.clone())
            .default_backoff()
            .boxed();
        let mut index = AccessIndex::default();
        let mut watches: HashMap<String, (AccessGrant, AbortOnDrop)> = HashMap::new();
        while let Some(event) = bindings.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    warn!(error = %e, "watch of the operator's RoleBindings");
                    continue;
                }
            };
            let touched = match &event {
                watcher::Event::Apply(b)
                | watcher::Event::InitApply(b)
                | watcher::Event::Delete(b) => owning_control_plane(b.clone()),
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            if let Some(owner) = touched {
                if tx.unbounded_send(owner).is_err() {
                    return;
                }
            }
            if index.observe(&event, &operator).is_none() {
                continue;
            }
            let grants = index.grants();
            // A namespace whose grant changed is watched anew, for what it grants now.
            watches.retain(|ns, (grant, _)| grants.get(ns) == Some(grant));
            for (ns, grant) in grants {
                if let std::collections::hash_map::Entry::Vacant(slot) = watches.entry(ns) {
                    let task = tokio::spawn(watch_namespace(
                        client.clone(),
                        slot.key().clone(),
                        grant,
                        config.clone(),
                        tx.clone(),
                    ));
                    slot.insert((grant, AbortOnDrop(task)));
                }
            }
        }
    });
    let guard = AbortOnDrop(manager);
    rx.map(move |trigger| {
        let _keep = &guard;
        trigger
    })
}

/// Forwards the owners of the operator's objects of the per-namespace kinds `grant` covers
/// in `namespace`.
async fn watch_namespace(
    client: Client,
    namespace: String,
    grant: AccessGrant,
    config: watcher::Config,
    tx: futures::channel::mpsc::UnboundedSender<Trigger>,
) {
    let mut watches = vec![
        in_namespace::<ServiceAccount>(&client, &namespace, &config),
        in_namespace::<Deployment>(&client, &namespace, &config),
    ];
    if grant.covers(render::Kind::Secret) {
        watches.extend([
            in_namespace::<Secret>(&client, &namespace, &config),
            in_namespace::<PodDisruptionBudget>(&client, &namespace, &config),
            in_namespace::<NetworkPolicy>(&client, &namespace, &config),
        ]);
    }
    let mut triggers = futures::stream::select_all(watches);
    while let Some(trigger) = triggers.next().await {
        match trigger {
            Ok(Some(owner)) => {
                if tx.unbounded_send(owner).is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, namespace, "watch of the operator's objects"),
        }
    }
}

/// A metadata-only watch of the operator's objects of kind `K` in one namespace, mapped to
/// their owning control plane, backing off on its own errors only.
fn in_namespace<K>(
    client: &Client,
    namespace: &str,
    config: &watcher::Config,
) -> BoxStream<'static, Result<Option<ObjectRef<MeshControlPlane>>, watcher::Error>>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static,
{
    watcher(
        Api::<PartialObjectMeta<K>>::namespaced(client.clone(), namespace),
        config.clone(),
    )
    .default_backoff()
    .touched_objects()
    .map(|r| r.map(owning_control_plane))
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event as Ev;

    fn binding(ns: &str, name: &str, role: &str, subject_ns: &str) -> RoleBinding {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "meshplane-operator",
                          "namespace": subject_ns}],
        }))
        .expect("a valid RoleBinding")
    }

    #[test]
    fn namespaces_follow_the_operators_access_bindings_only() {
        let op = OperatorAccount::default();
        let mut index = AccessIndex::default();
        let control = binding(
            "meshplane-blue",
            "meshplane-blue-v1-operator",
            meshplane_crds::names::CONTROL_NAMESPACE_ROLE,
            "meshplane-system",
        );
        let gateway = binding(
            "shop",
            "meshplane-blue-v1-gateway-operator",
            meshplane_crds::names::GATEWAY_NAMESPACE_ROLE,
            "meshplane-system",
        );
        // Another role, and the right role bound to someone else: no access.
        let restarter = binding(
            "cart",
            "meshplane-blue-v1-restarter",
            meshplane_crds::names::WORKLOAD_RESTARTER_ROLE,
            "meshplane-system",
        );
        let impostor = binding(
            "bank",
            "x",
            meshplane_crds::names::CONTROL_NAMESPACE_ROLE,
            "elsewhere",
        );
        assert_eq!(index.observe(&Ev::Init, &op), None);
        for b in [&control, &restarter, &impostor] {
            assert_eq!(index.observe(&Ev::InitApply(b.clone()), &op), None);
        }
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            index.observe(&Ev::InitDone, &op),
            Some(set(&["meshplane-blue"]))
        );
        assert_eq!(
            index.observe(&Ev::Apply(gateway.clone()), &op),
            Some(set(&["meshplane-blue", "shop"]))
        );
        assert_eq!(
            index.observe(&Ev::Delete(gateway), &op),
            Some(set(&["meshplane-blue"]))
        );
        // A relist without the control binding (deleted while disconnected) drops it.
        index.observe(&Ev::Init, &op);
        index.observe(&Ev::InitApply(restarter), &op);
        assert_eq!(index.observe(&Ev::InitDone, &op), Some(set(&[])));
    }
}
