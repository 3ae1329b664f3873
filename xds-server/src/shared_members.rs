//! Shared isolation: which namespaces the instance reads is not left to the members ConfigMap.
//!
//! In Shared mode the instance may read every namespace, so whoever can edit the members
//! ConfigMap (contract 2) in the control namespace would decide what it reads: a cluster admin
//! who binds `edit` there for the tenant's admins, say, lets them list `kube-system` or another
//! tenant's namespace. The instance therefore computes its tenant's members itself, with the
//! operator's own rules ([`meshplane_crds::membership::compute_guarded`]), from objects no
//! tenant admin can change: the Namespaces' labels (cluster-scoped) and the cluster-scoped
//! MeshControlPlanes and MeshRevisionTags (a namespace joins only with a `meshplane.io/rev`
//! label naming one of the tenant's revisions or tags, inside that revision's
//! `namespaceSelector`). It reads the namespaces the ConfigMap lists *and* membership
//! confirms ([`verify`]); the others are logged and counted
//! (`meshplane_xds_members_unverified`), never read. Either side narrows at once: a namespace
//! that leaves by its label stops being read before the operator rewrites the ConfigMap.

use std::collections::{BTreeMap, BTreeSet};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use meshplane_crds::membership::{self, ControlPlaneFacts, NamespaceFacts, TagFacts};
use meshplane_crds::names::REV_LABEL;
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use tokio::sync::watch;

/// The namespaces the members ConfigMap lists that membership confirms (read), and those it
/// does not (not read).
pub fn verify(
    listed: &BTreeSet<String>,
    confirmed: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    listed
        .iter()
        .cloned()
        .partition(|namespace| confirmed.contains(namespace))
}

/// One kind's objects as the last complete list and the watch since say.
#[derive(Debug)]
struct Followed<T> {
    current: BTreeMap<String, T>,
    relist: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Followed<T> {
    fn default() -> Self {
        Self {
            current: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<T: PartialEq> Followed<T> {
    /// Folds one event (`facts` names an object and says what counts of it); true when what
    /// counts changed.
    fn fold<K>(&mut self, event: Event<K>, facts: impl Fn(&K) -> (String, T)) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(o) => {
                let (name, t) = facts(&o);
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, t);
                false
            }
            Event::InitDone => {
                let next = self.relist.take().unwrap_or_default();
                let changed = !self.listed || next != self.current;
                self.current = next;
                self.listed = true;
                changed
            }
            Event::Apply(o) => {
                let (name, t) = facts(&o);
                let changed = self.current.get(&name) != Some(&t);
                self.current.insert(name, t);
                changed
            }
            Event::Delete(o) => self.current.remove(&facts(&o).0).is_some(),
        }
    }
}

/// What membership is computed from: every Namespace (labels; any may be named as a control
/// namespace), every MeshControlPlane and every MeshRevisionTag.
#[derive(Debug, Default)]
pub struct MembershipView {
    namespaces: Followed<NamespaceFacts>,
    control_planes: Followed<ControlPlaneFacts>,
    tags: Followed<TagFacts>,
}

impl MembershipView {
    /// Folds a Namespace event (labels are all membership needs of it).
    pub fn on_namespace(&mut self, event: Event<PartialObjectMeta<Namespace>>) -> bool {
        self.namespaces.fold(event, |n| {
            let facts = NamespaceFacts::of(&n.metadata);
            (facts.name.clone(), facts)
        })
    }

    /// Folds a MeshControlPlane event.
    pub fn on_control_plane(&mut self, event: Event<MeshControlPlane>) -> bool {
        self.control_planes
            .fold(event, |c| (c.name_any(), ControlPlaneFacts::from(c)))
    }

    /// Folds a MeshRevisionTag event.
    pub fn on_tag(&mut self, event: Event<MeshRevisionTag>) -> bool {
        self.tags.fold(event, |t| (t.name_any(), TagFacts::from(t)))
    }

    /// The members of `tenant` as the operator computes them; `None` until every kind has
    /// been listed once (a partial view would confirm too little, or too much).
    pub fn members(&self, tenant: &str) -> Option<BTreeSet<String>> {
        if !(self.namespaces.listed && self.control_planes.listed && self.tags.listed) {
            return None;
        }
        // Only labelled namespaces can be members; any may be looked up as a control namespace.
        let labelled: Vec<NamespaceFacts> = self
            .namespaces
            .current
            .values()
            .filter(|n| n.labels.contains_key(REV_LABEL))
            .cloned()
            .collect();
        let control_planes: Vec<ControlPlaneFacts> =
            self.control_planes.current.values().cloned().collect();
        let tags: Vec<TagFacts> = self.tags.current.values().cloned().collect();
        let m = membership::compute_guarded(&labelled, &control_planes, &tags, |name| {
            self.namespaces.current.get(name).cloned()
        });
        Some(m.tenant_members(tenant))
    }
}

enum Fact {
    Namespace(Event<PartialObjectMeta<Namespace>>),
    // Boxed: a control plane is large, and most events are namespaces.
    ControlPlane(Box<Event<MeshControlPlane>>),
    Tag(Event<MeshRevisionTag>),
}

/// Watches Namespaces (metadata only), MeshControlPlanes and MeshRevisionTags cluster-wide and
/// publishes `tenant`'s members as membership computes them (`None` until all are listed).
pub fn spawn(client: Client, tenant: String) -> watch::Receiver<Option<BTreeSet<String>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let config = watcher::Config::default;
        let namespaces = watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            config(),
        )
        .default_backoff()
        .map(|e| e.map(Fact::Namespace))
        .boxed();
        let control_planes = watcher(Api::<MeshControlPlane>::all(client.clone()), config())
            .default_backoff()
            .map(|e| e.map(|e| Fact::ControlPlane(Box::new(e))))
            .boxed();
        let tags = watcher(Api::<MeshRevisionTag>::all(client), config())
            .default_backoff()
            .map(|e| e.map(Fact::Tag))
            .boxed();
        let mut facts = stream::select_all([namespaces, control_planes, tags]);
        let mut view = MembershipView::default();
        while let Some(fact) = facts.next().await {
            let changed = match fact {
                Ok(Fact::Namespace(e)) => view.on_namespace(e),
                Ok(Fact::ControlPlane(e)) => view.on_control_plane(*e),
                Ok(Fact::Tag(e)) => view.on_tag(e),
                Err(e) => {
                    // The last view stays: the watcher relists once it can.
                    tracing::warn!(error = %e, "membership watch failed, retrying");
                    false
                }
            };
            if changed {
                let members = view.members(&tenant);
                tx.send_if_modified(|old| {
                    let differs = *old != members;
                    if differs {
                        *old = members;
                    }
                    differs
                });
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ObjectMeta;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn namespace(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<Namespace> {
        PartialObjectMeta {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn control_plane(name: &str, tenant: &str, selector: serde_json::Value) -> MeshControlPlane {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"tenant": tenant, "namespaceSelector": selector},
        }))
        .expect("control plane")
    }

    fn tag(name: &str, revision: &str) -> MeshRevisionTag {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag",
            "metadata": {"name": name},
            "spec": {"revision": revision},
        }))
        .expect("tag")
    }

    /// A complete list of `objects`, as the watcher delivers it.
    fn listed<K>(objects: Vec<Event<K>>) -> Vec<Event<K>> {
        let mut out = vec![Event::Init];
        out.extend(objects);
        out.push(Event::InitDone);
        out
    }

    /// Blue (revision blue-v1, tag blue-stable, selector team!=green) and green (green-v1).
    fn cluster() -> MembershipView {
        let mut view = MembershipView::default();
        for e in listed(vec![
            Event::InitApply(namespace("shop", &[(REV_LABEL, "blue-stable")])),
            Event::InitApply(namespace("cart", &[(REV_LABEL, "blue-v1")])),
            Event::InitApply(namespace("bank", &[(REV_LABEL, "green-v1")])),
            // Labelled for blue but outside its selector: rejected, not a member.
            Event::InitApply(namespace(
                "vault",
                &[(REV_LABEL, "blue-v1"), ("team", "green")],
            )),
            Event::InitApply(namespace("kube-system", &[])),
        ]) {
            view.on_namespace(e);
        }
        let not_green = serde_json::json!({"matchExpressions": [
            {"key": "team", "operator": "NotIn", "values": ["green"]}]});
        for e in listed(vec![
            Event::InitApply(control_plane("blue-v1", "blue", not_green)),
            Event::InitApply(control_plane("green-v1", "green", serde_json::json!({}))),
        ]) {
            view.on_control_plane(e);
        }
        for e in listed(vec![Event::InitApply(tag("blue-stable", "blue-v1"))]) {
            view.on_tag(e);
        }
        view
    }

    /// In Shared mode, a members ConfigMap that lists another tenant's
    /// namespace, a system namespace or one outside the tenant's selector does not make the
    /// instance read it; only namespaces membership confirms are read.
    #[test]
    fn only_namespaces_membership_confirms_are_read() {
        let view = cluster();
        let confirmed = view.members("blue").expect("listed");
        assert_eq!(confirmed, set(&["cart", "shop"]));
        let listed = set(&["shop", "cart", "bank", "kube-system", "vault", "nowhere"]);
        let (read, dropped) = verify(&listed, &confirmed);
        assert_eq!(read, set(&["cart", "shop"]));
        assert_eq!(dropped, set(&["bank", "kube-system", "nowhere", "vault"]));
        // A confirmed namespace the ConfigMap does not list (yet) is not read either.
        let (read, _) = verify(&set(&["shop"]), &confirmed);
        assert_eq!(read, set(&["shop"]));
    }

    #[test]
    fn nothing_is_confirmed_until_every_kind_is_listed_and_labels_decide_at_once() {
        let mut view = MembershipView::default();
        view.on_namespace(Event::Init);
        view.on_namespace(Event::InitApply(namespace(
            "shop",
            &[(REV_LABEL, "blue-v1")],
        )));
        assert!(view.on_namespace(Event::InitDone));
        view.on_control_plane(Event::Init);
        view.on_control_plane(Event::InitApply(control_plane(
            "blue-v1",
            "blue",
            serde_json::json!({}),
        )));
        view.on_control_plane(Event::InitDone);
        assert_eq!(view.members("blue"), None, "tags not listed yet");
        view.on_tag(Event::Init);
        view.on_tag(Event::InitDone);
        assert_eq!(view.members("blue"), Some(set(&["shop"])));

        // Relabelled to green: no longer blue's, whatever the ConfigMap says.
        assert!(view.on_namespace(Event::Apply(namespace("shop", &[(REV_LABEL, "green-v1")]))));
        assert_eq!(view.members("blue"), Some(set(&[])));
        assert!(
            !view.on_namespace(Event::Apply(namespace("shop", &[(REV_LABEL, "green-v1")]))),
            "an unchanged object changes nothing"
        );
        // A tag pointing at blue-v1 brings the namespaces carrying it.
        view.on_namespace(Event::Apply(namespace(
            "pay",
            &[(REV_LABEL, "blue-stable")],
        )));
        assert!(view.on_tag(Event::Apply(tag("blue-stable", "blue-v1"))));
        assert_eq!(view.members("blue"), Some(set(&["pay"])));
        assert!(view.on_tag(Event::Delete(tag("blue-stable", "blue-v1"))));
        assert_eq!(view.members("blue"), Some(set(&[])));
    }
}
