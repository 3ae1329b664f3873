//! The trigger mappers: which control planes and tags a watch event concerns.
//!
//! - A Namespace change concerns the tenants of the revisions and tags its `meshplane.io/rev`
//!   label names now or named before: a namespace whose label is removed or changed must still
//!   reach the revision it left (to prune its bootstrap ConfigMap and reader RoleBinding
//!   there), so the index remembers each namespace's previous label.
//! - An object the operator owns concerns the control plane in its owner references
//!   (contract 8); an instance pod, the control plane of its revision (contract 3).
//! - A sibling control plane or tag concerns every control plane only when its membership facts
//!   change ([`fact_changes`]), never on a status write.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};

/// Namespace name → the `meshplane.io/rev` value it had when last seen.
pub type NamespaceIndex = HashMap<String, String>;

/// The label values (current and previous) a namespace change concerns; updates the index.
pub fn label_values(ns: &Namespace, index: &mut NamespaceIndex) -> BTreeSet<String> {
    let name = ns.name_any();
    let current = ns.labels().get(names::REV_LABEL).cloned();
    let deleted = ns.metadata.deletion_timestamp.is_some();
    let previous = match (&current, deleted) {
        (Some(v), false) => index.insert(name, v.clone()),
        _ => index.remove(&name),
    };
    current.into_iter().chain(previous).collect()
}

/// Every control plane of every tenant that a revision or tag in the namespace's current or
/// previous label belongs to: a namespace joining or leaving changes the bootstrap ConfigMaps
/// and reader RBAC of all revisions of the tenant.
pub fn control_planes_for_namespace(
    ns: &Namespace,
    index: &mut NamespaceIndex,
    control_planes: &[Arc<MeshControlPlane>],
) -> Vec<ObjectRef<MeshControlPlane>> {
    let values = label_values(ns, index);
    if values.is_empty() {
        return Vec::new();
    }
    let tenants: BTreeSet<&str> = control_planes
        .iter()
        .filter(|cp| {
            values.contains(&cp.revision())
                || cp
                    .status
                    .as_ref()
                    .is_some_and(|s| s.tags.iter().any(|t| values.contains(t)))
        })
        .map(|cp| cp.spec.tenant.as_str())
        .collect();
    control_planes
        .iter()
        .filter(|cp| tenants.contains(cp.spec.tenant.as_str()))
        .map(|cp| ObjectRef::from_obj(cp.as_ref()))
        .collect()
}

/// Tags named by the namespace's current or previous label (their member lists change).
pub fn tags_for_namespace(
    ns: &Namespace,
    index: &mut NamespaceIndex,
    tags: &[Arc<MeshRevisionTag>],
) -> Vec<ObjectRef<MeshRevisionTag>> {
    let values = label_values(ns, index);
    tags.iter()
        .filter(|t| values.contains(&t.name_any()))
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

/// The control plane whose instance runs in `pod` (by its revision label).
pub(super) fn control_plane_of_instance_pod(
    pod: &PartialObjectMeta<Pod>,
    control_planes: &[Arc<MeshControlPlane>],
) -> Option<ObjectRef<MeshControlPlane>> {
    let revision = pod.labels().get(names::REVISION_LABEL)?;
    control_planes
        .iter()
        .find(|m| {
            m.revision() == *revision
                && m.control_namespace() == pod.namespace().unwrap_or_default()
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
}

/// The control plane that owns an object. `Controller::owns` would key a cluster-scoped owner
/// by the namespace of each namespaced child, so one control plane would be reconciled under
/// many keys at once (racing itself on finalizers and applies).
pub(super) fn owning_control_plane<K: Resource>(obj: K) -> Option<ObjectRef<MeshControlPlane>> {
    obj.owner_references()
        .iter()
        .find(|r| {
            r.kind == "MeshControlPlane" && r.api_version == MeshControlPlane::api_version(&())
        })
        .map(|r| ObjectRef::new(&r.name))
}

/// The objects of a watch whose membership facts (`facts`, plus whether it is being deleted)
/// changed, that appeared, or that disappeared; status-only writes pass nothing on. The first
/// listing passes nothing either: every reconcile waits for the caches and sees it. A later
/// relist (after a 410) reports only what differs from before.
pub(super) fn fact_changes<K, F>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    facts: fn(&K) -> F,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + Send + 'static,
    F: PartialEq + Send + 'static,
{
    let mut known: HashMap<String, ((F, bool), K)> = HashMap::new();
    let mut relisted: HashSet<String> = HashSet::new();
    let mut listed_once = false;
    events.flat_map(move |event| {
        let mut out = Vec::new();
        let key = |obj: &K| {
            format!(
                "{}/{}",
                obj.meta().namespace.as_deref().unwrap_or_default(),
                obj.meta().name.as_deref().unwrap_or_default()
            )
        };
        let observe = |obj: K, known: &mut HashMap<String, ((F, bool), K)>| {
            let current = (facts(&obj), obj.meta().deletion_timestamp.is_some());
            let changed = known
                .get(&key(&obj))
                .is_none_or(|(seen, _)| *seen != current);
            known.insert(key(&obj), (current, obj.clone()));
            changed.then_some(obj)
        };
        match event {
            Err(e) => out.push(Err(e)),
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(obj)) => {
                relisted.insert(key(&obj));
                if let Some(obj) = observe(obj, &mut known).filter(|_| listed_once) {
                    out.push(Ok(obj));
                }
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = known
                    .keys()
                    .filter(|k| !relisted.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some((_, obj)) = known.remove(&k) {
                        out.push(Ok(obj));
                    }
                }
                listed_once = true;
            }
            Ok(watcher::Event::Apply(obj)) => out.extend(observe(obj, &mut known).map(Ok)),
            Ok(watcher::Event::Delete(obj)) => {
                known.remove(&key(&obj));
                out.push(Ok(obj));
            }
        }
        futures::stream::iter(out)
    })
}

/// Every object of a store, as reconcile requests.
pub(super) fn all_refs<K: Resource<DynamicType = ()>>(objects: &[Arc<K>]) -> Vec<ObjectRef<K>> {
    objects
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;
    use meshplane_crds::membership::ControlPlaneFacts;
    use meshplane_crds::{MeshControlPlaneSpec, MeshControlPlaneStatus};
    use watcher::Event as Ev;

    fn namespace(name: &str, rev: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: rev.map(|r| [(names::REV_LABEL.to_string(), r.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn cp(name: &str, tenant: &str, tags: &[&str]) -> Arc<MeshControlPlane> {
        let spec: MeshControlPlaneSpec =
            serde_json::from_value(serde_json::json!({"tenant": tenant})).unwrap();
        let mut mcp = MeshControlPlane::new(name, spec);
        mcp.status = Some(MeshControlPlaneStatus {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        });
        Arc::new(mcp)
    }

    fn names_of(refs: Vec<ObjectRef<MeshControlPlane>>) -> Vec<String> {
        let mut v: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        v.sort();
        v
    }

    #[test]
    fn a_removed_label_still_reaches_the_tenant_it_left() {
        let cps = [
            cp("blue-v1", "blue", &["blue-stable"]),
            cp("blue-v2", "blue", &[]),
            cp("green", "green", &[]),
        ];
        let mut index = NamespaceIndex::default();
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", Some("blue-stable")),
                &mut index,
                &cps
            )),
            ["blue-v1", "blue-v2"]
        );
        // Moved to green: both tenants are concerned.
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", Some("green")),
                &mut index,
                &cps
            )),
            ["blue-v1", "blue-v2", "green"]
        );
        // Label removed: green (the tenant it left) still hears about it.
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", None),
                &mut index,
                &cps
            )),
            ["green"]
        );
        // Nothing remembered any more.
        assert!(
            control_planes_for_namespace(&namespace("shop", None), &mut index, &cps).is_empty()
        );
    }

    fn plane(name: &str, revision: &str, proxies: u32) -> MeshControlPlane {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshControlPlane",
            "metadata": {"name": name},
            "spec": {"tenant": "blue", "revision": revision},
            "status": {"connectedProxies": proxies},
        }))
        .expect("a valid MeshControlPlane")
    }

    fn deleting(mut mcp: MeshControlPlane) -> MeshControlPlane {
        mcp.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        mcp
    }

    /// Names of the objects `fact_changes` passes on for `events`.
    async fn passed(events: Vec<Ev<MeshControlPlane>>) -> Vec<String> {
        let input = stream::iter(events.into_iter().map(Ok));
        fact_changes(input, |c| ControlPlaneFacts::from(c))
            .map(|r| r.map(|o| o.name_any()).unwrap_or_default())
            .collect()
            .await
    }

    #[tokio::test]
    async fn only_membership_facts_deletion_and_disappearance_pass() {
        let passed = passed(vec![
            // First listing: nothing (reconciles wait for the caches and see it).
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 0)),
            Ev::InitApply(plane("b", "b1", 0)),
            Ev::InitDone,
            // A status write: nothing.
            Ev::Apply(plane("a", "a1", 3)),
            // A new control plane and a spec change pass.
            Ev::Apply(plane("c", "c1", 0)),
            Ev::Apply(plane("b", "b2", 0)),
            // Deletion starting and the object going both pass.
            Ev::Apply(deleting(plane("a", "a1", 3))),
            Ev::Delete(deleting(plane("a", "a1", 3))),
            // A relist after a 410: c vanished while disconnected, b changed, d is new.
            Ev::Init,
            Ev::InitApply(plane("b", "b3", 0)),
            Ev::InitApply(plane("d", "d1", 0)),
            Ev::InitDone,
        ])
        .await;
        assert_eq!(passed, ["c", "b", "a", "a", "b", "d", "c"]);
    }

    #[test]
    fn a_namespaced_child_maps_to_its_cluster_scoped_control_plane() {
        let child: PartialObjectMeta<ConfigMap> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "meshplane-blue-v1-bootstrap",
                "namespace": "shop",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "1"},
                    {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
                     "name": "blue-v1", "uid": "2"},
                ],
            },
        }))
        .expect("a valid ConfigMap");
        let owner = owning_control_plane(child).expect("owned by blue-v1");
        assert_eq!(owner, ObjectRef::<MeshControlPlane>::new("blue-v1"));
        assert_eq!(owner.namespace, None, "one key per control plane");
        let orphan: PartialObjectMeta<ConfigMap> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop"},
        }))
        .expect("a valid ConfigMap");
        assert_eq!(owning_control_plane(orphan), None);
    }

    #[tokio::test]
    async fn a_relist_without_differences_passes_nothing() {
        let passed = passed(vec![
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 0)),
            Ev::InitDone,
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 7)),
            Ev::InitDone,
        ])
        .await;
        assert!(passed.is_empty(), "{passed:?}");
    }
}
