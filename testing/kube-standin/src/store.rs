//! The in-memory object store: resource registry, objects, `resourceVersion`, the bounded event
//! history that watches resume from, and the lifecycle rules that run on every write
//! (finalizers, owner-reference garbage collection, namespace termination, CRD registration).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use super::error::{ApiError, Target};
use super::event_views;
use super::fields::{self, Scope};
use super::lookup::ObjectLookup;
use super::object;
use super::query::Filter;
use super::resources::{builtin_types, types_from_crd, ResourceKey, ResourceType};

/// Added, Modified or Deleted, as in watch events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the history and broadcast to watches.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub rv: u64,
    pub resource: ResourceKey,
    pub kind: EventKind,
    pub object: Value,
    /// The object before the change, so selector watches can turn it into ADDED/DELETED.
    pub old: Option<Value>,
}

/// How a delete treats dependents (`propagationPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
const ORPHAN_FINALIZER: &str = "orphan";
const NAMESPACE_FINALIZER: &str = "kubernetes";
/// Roles, ClusterRoles and their bindings; writes of these move `rbac_generation`.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// ClusterIP of the `kubernetes` Service in `default` (the first of 198.19.0.0/16).
pub const KUBERNETES_SERVICE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 19, 0, 1);
/// Offset of the first ClusterIP handed to other Services (198.19.0.10).
const FIRST_ALLOCATED_CLUSTER_IP: u32 = 9;

/// Who writes, and how.
#[derive(Debug, Clone)]
pub struct WriteCtx {
    /// Field manager for `managedFields` (`Update` operations).
    pub manager: String,
    pub subresource: Option<String>,
    pub dry_run: bool,
    /// False for server-side apply, whose managed fields were computed by the apply itself.
    pub record_update: bool,
}

type ObjectMap = BTreeMap<(String, String), Value>;

/// Where an object is stored: its resource, namespace ("" when cluster-scoped) and name.
type ObjectRef = (ResourceKey, String, String);

/// Upper bound on lifecycle steps per write, a guard against a rule that never settles. Every
/// step removes an object, marks one deleting, or drops a finalizer or owner reference, so the
/// rules settle well within it; work left over stays pending for the next write.
const GC_STEP_LIMIT: usize = 1_000_000;

struct State {
    rv: u64,
    types: Vec<ResourceType>,
    objects: HashMap<ResourceKey, ObjectMap>,
    /// Every stored object's uid. Kept in step with `objects` by `track`.
    uids: HashMap<String, ObjectRef>,
    /// Owner uid → the objects whose `ownerReferences` name it (whether or not it exists).
    /// Kept in step with `objects` by `track`.
    dependents: HashMap<String, BTreeSet<ObjectRef>>,
    /// Objects a lifecycle rule may apply to; `collect_garbage` examines them. Invariant (after
    /// each write): every object some rule applies to is in here. `track` keeps it.
    pending: BTreeSet<ObjectRef>,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Watches may resume from this version or later; older ones get 410 Gone.
    oldest_resumable: u64,
    next_cluster_ip: u32,
    /// Version of the last write of a ClusterRole or ClusterRoleBinding (`rbac_generation`).
    rbac_cluster_rv: u64,
    /// Version of the last write of a Role or RoleBinding, per namespace. Entries are never
    /// removed: the generation must not fall back to a value a cache may still hold.
    rbac_namespace_rv: HashMap<String, u64>,
}

/// The stand-in's storage; shared by the HTTP handlers and the test handle.
pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<StoredEvent>>,
    /// Bumped to end every open watch (fault injection).
    watch_epoch: watch::Sender<u64>,
    /// Open watch streams per resource (test instrumentation, see [`OpenWatch`]).
    watches_by_resource: watch::Sender<BTreeMap<String, usize>>,
}

/// One open watch stream, counted per resource in [`Store::watches_by_resource`] until dropped,
/// so that tests can tell that a client watches each kind once.
pub struct OpenWatch {
    store: Arc<Store>,
    resource: String,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.store.watches_by_resource.send_modify(|open| {
            if let Some(n) = open.get_mut(&self.resource) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&self.resource);
                }
            }
        });
    }
}

fn object_key(obj: &Value) -> (String, String) {
    (
        object::namespace(obj).unwrap_or_default().to_string(),
        object::name(obj).to_string(),
    )
}

fn namespaces_key() -> ResourceKey {
    ResourceKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn target<'a>(rt: &'a ResourceType, name: &'a str) -> Target<'a> {
    Target {
        group: &rt.group,
        resource: &rt.plural,
        name,
    }
}

/// Compares two versions of an object ignoring what every write changes anyway.
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        let meta = object::metadata_mut(&mut v);
        meta.remove("resourceVersion");
        if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
            for e in entries {
                if let Some(e) = e.as_object_mut() {
                    e.remove("time");
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// The part of an object whose change bumps `metadata.generation`.
fn generation_view(obj: &Value, has_status: bool) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if has_status {
            m.remove("status");
        }
    }
    v
}

impl State {
    fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
    }

    fn type_of_key(&self, key: &ResourceKey) -> Option<&ResourceType> {
        self.types.iter().find(|t| t.key() == *key)
    }

    fn bucket(&mut self, key: &ResourceKey) -> &mut ObjectMap {
        self.objects.entry(key.clone()).or_default()
    }

    fn get(&self, key: &ResourceKey, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(key)?
            .get(&(ns.to_string(), name.to_string()))
    }

    fn get_ref(&self, r: &ObjectRef) -> Option<&Value> {
        self.get(&r.0, &r.1, &r.2)
    }

    fn is_deleting_ref(&self, r: &ObjectRef) -> bool {
        self.get_ref(r).is_some_and(object::is_deleting)
    }

    /// Updates the indexes for an object stored (`new`) or removed (`new` None) at `at`, and
    /// marks what the lifecycle rules must look at again because of it:
    /// - the object itself when deleting (finalizers, namespace termination) or owned (its
    ///   owners may all be gone);
    /// - its deleting owners, old and new (foreground deletion waits on dependents);
    /// - its namespace when terminating (waits for the namespace to empty);
    /// - the dependents of a uid that went away (background collection).
    fn track(&mut self, at: &ObjectRef, old: Option<&Value>, new: Option<&Value>) {
        let old_uid = old.and_then(object::uid);
        let new_uid = new.and_then(object::uid);
        let old_owners = old.map(object::owner_refs).unwrap_or_default();
        let new_owners = new.map(object::owner_refs).unwrap_or_default();
        for r in &old_owners {
            if let Some(set) = self.dependents.get_mut(&r.uid) {
                set.remove(at);
                if set.is_empty() {
                    self.dependents.remove(&r.uid);
                }
            }
        }
        for r in &new_owners {
            self.dependents
                .entry(r.uid.clone())
                .or_default()
                .insert(at.clone());
        }
        let mut marks: Vec<ObjectRef> = Vec::new();
        if let Some(gone) = old_uid.filter(|u| Some(*u) != new_uid) {
            if self.uids.get(gone) == Some(at) {
                self.uids.remove(gone);
                if let Some(deps) = self.dependents.get(gone) {
                    marks.extend(deps.iter().cloned());
                }
            }
        }
        if let Some(uid) = new_uid {
            self.uids.insert(uid.to_string(), at.clone());
        }
        if let Some(new) = new {
            if object::is_deleting(new) || !new_owners.is_empty() {
                marks.push(at.clone());
            }
        }
        for r in old_owners.iter().chain(&new_owners) {
            if let Some(owner) = self.uids.get(&r.uid) {
                if self.is_deleting_ref(owner) {
                    marks.push(owner.clone());
                }
            }
        }
        if !at.1.is_empty() {
            let ns = (namespaces_key(), String::new(), at.1.clone());
            if self.is_deleting_ref(&ns) {
                marks.push(ns);
            }
        }
        self.pending.extend(marks);
    }

    fn record(
        &mut self,
        resource: ResourceKey,
        kind: EventKind,
        object: Value,
        old: Option<Value>,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) {
        let event = Arc::new(StoredEvent {
            rv: self.rv,
            resource,
            kind,
            object,
            old,
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(evicted) = self.history.pop_front() {
                self.oldest_resumable = self.oldest_resumable.max(evicted.rv);
            }
        }
        // No receiver is fine: nobody watches.
        let _ = events.send(event);
    }

    /// Stores `obj` with a new resourceVersion and records the event.
    fn put(
        &mut self,
        key: &ResourceKey,
        mut obj: Value,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> Value {
        self.rv += 1;
        object::metadata_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let k = object_key(&obj);
        self.note_rbac_write(key, &k.0);
        let at = (key.clone(), k.0.clone(), k.1.clone());
        let old = self.bucket(key).insert(k, obj.clone());
        self.track(&at, old.as_ref(), Some(&obj));
        let kind = if old.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        self.record(key.clone(), kind, obj.clone(), old, events);
        if key.group == "apiextensions.k8s.io" {
            self.refresh_crd_types();
        }
        obj
    }

    /// Notes a write at the current version if it is of an RBAC object (`rbac_generation`).
    fn note_rbac_write(&mut self, key: &ResourceKey, ns: &str) {
        if key.group != RBAC_GROUP {
            return;
        }
        if ns.is_empty() {
            self.rbac_cluster_rv = self.rv;
        } else {
            self.rbac_namespace_rv.insert(ns.to_string(), self.rv);
        }
    }

    /// Removes an object for good and records the DELETED event.
    fn remove(
        &mut self,
        key: &ResourceKey,
        ns: &str,
        name: &str,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> Option<Value> {
        let mut obj = self
            .bucket(key)
            .remove(&(ns.to_string(), name.to_string()))?;
        self.track(
            &(key.clone(), ns.to_string(), name.to_string()),
            Some(&obj),
            None,
        );
        self.rv += 1;
        self.note_rbac_write(key, ns);
        object::metadata_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.record(key.clone(), EventKind::Deleted, obj.clone(), None, events);
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            self.drop_custom_resources(&obj, events);
            self.refresh_crd_types();
        }
        Some(obj)
    }

    fn drop_custom_resources(&mut self, crd: &Value, events: &broadcast::Sender<Arc<StoredEvent>>) {
        let Ok(types) = types_from_crd(crd) else {
            return;
        };
        let Some(rt) = types.first() else { return };
        let key = rt.key();
        let names: Vec<(String, String)> = self.bucket(&key).keys().cloned().collect();
        for (ns, name) in names {
            self.remove(&key, &ns, &name, events);
        }
    }

    fn refresh_crd_types(&mut self) {
        let crd_key = ResourceKey {
            group: "apiextensions.k8s.io".into(),
            plural: "customresourcedefinitions".into(),
        };
        let mut types = builtin_types();
        if let Some(crds) = self.objects.get(&crd_key) {
            for crd in crds.values() {
                if let Ok(t) = types_from_crd(crd) {
                    types.extend(t);
                }
            }
        }
        self.types = types;
    }

    /// Starts deleting an object: sets `deletionTimestamp` when finalizers hold it, else removes it.
    fn delete(
        &mut self,
        key: &ResourceKey,
        ns: &str,
        name: &str,
        policy: Propagation,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> Option<Value> {
        let current = self.get(key, ns, name)?.clone();
        let mut obj = current.clone();
        let is_namespace = key.group.is_empty() && key.plural == "namespaces";
        let mut finalizers = object::finalizers(&obj);
        let policy_finalizer = match policy {
            Propagation::Foreground => Some(FOREGROUND_FINALIZER),
            Propagation::Orphan => Some(ORPHAN_FINALIZER),
            Propagation::Background => None,
        };
        if let Some(f) = policy_finalizer {
            if !finalizers.iter().any(|x| x == f) && !object::is_deleting(&obj) {
                finalizers.push(f.to_string());
            }
        }
        if object::is_deleting(&obj) {
            if finalizers != object::finalizers(&current) {
                object::set_finalizers(&mut obj, finalizers);
                return Some(self.put(key, obj, events));
            }
            return Some(current);
        }
        if finalizers.is_empty() && !is_namespace {
            return self.remove(key, ns, name, events);
        }
        object::set_finalizers(&mut obj, finalizers);
        let meta = object::metadata_mut(&mut obj);
        meta.insert("deletionTimestamp".into(), json!(object::now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if is_namespace {
            obj["status"] = json!({"phase": "Terminating"});
        }
        Some(self.put(key, obj, events))
    }

    /// Runs finalizer, garbage-collection and namespace rules until nothing changes.
    ///
    /// Only the pending objects (see `track`) are examined: an object no rule applies to costs
    /// nothing here, so a write costs what it touches rather than the size of the store.
    fn collect_garbage(&mut self, events: &broadcast::Sender<Arc<StoredEvent>>) {
        let mut steps = 0;
        while let Some(at) = self.pending.pop_first() {
            if self.collect_garbage_at(&at, events) {
                // It may have more to do once this step's effects are examined.
                self.pending.insert(at);
                steps += 1;
                if steps >= GC_STEP_LIMIT {
                    tracing::warn!("garbage collection did not settle after {steps} steps");
                    return;
                }
            }
        }
    }

    /// The objects whose `ownerReferences` name `uid`.
    fn dependents_of(&self, uid: &str) -> Vec<ObjectRef> {
        self.dependents
            .get(uid)
            .map(|deps| deps.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Applies the first lifecycle rule that holds for one object; false when none does.
    fn collect_garbage_at(
        &mut self,
        at: &ObjectRef,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> bool {
        let (key, ns, name) = at;
        let Some(obj) = self.get_ref(at) else {
            return false;
        };
        if !object::is_deleting(obj) {
            // Background deletion: every owner is gone.
            let owners = object::owner_refs(obj);
            if !owners.is_empty() && owners.iter().all(|r| !self.uids.contains_key(&r.uid)) {
                self.delete(key, ns, name, Propagation::Background, events);
                return true;
            }
            return false;
        }
        let finalizers = object::finalizers(obj);
        if finalizers.is_empty() && !self.is_namespace_holding(key, obj) {
            self.remove(key, ns, name, events);
            return true;
        }
        let uid = object::uid(obj).unwrap_or_default().to_string();
        if finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
            let obj = obj.clone();
            for dep_at in self.dependents_of(&uid) {
                if let Some(mut dep) = self.get_ref(&dep_at).cloned() {
                    object::remove_owner_ref(&mut dep, &uid);
                    self.put(&dep_at.0, dep, events);
                }
            }
            self.drop_finalizer(key, &obj, ORPHAN_FINALIZER, events);
            return true;
        }
        if finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
            // (where, deleting, blocks the owner's deletion)
            let deps: Vec<(ObjectRef, bool, bool)> = self
                .dependents_of(&uid)
                .into_iter()
                .filter_map(|d| {
                    let dep = self.get_ref(&d)?;
                    let block = object::owner_refs(dep)
                        .into_iter()
                        .find(|r| r.uid == uid)?
                        .block_owner_deletion;
                    Some((d, object::is_deleting(dep), block))
                })
                .collect();
            let obj = obj.clone();
            let mut changed = false;
            for ((dk, dns, dname), deleting, _) in &deps {
                if !deleting {
                    self.delete(dk, dns, dname, Propagation::Foreground, events);
                    changed = true;
                }
            }
            if changed {
                return true;
            }
            if !deps.iter().any(|(_, _, block)| *block) {
                self.drop_finalizer(key, &obj, FOREGROUND_FINALIZER, events);
                return true;
            }
        }
        key.group.is_empty() && key.plural == "namespaces" && self.terminate_namespace(name, events)
    }

    /// A namespace stays while `spec.finalizers` still lists `kubernetes`.
    fn is_namespace_holding(&self, key: &ResourceKey, obj: &Value) -> bool {
        key.group.is_empty()
            && key.plural == "namespaces"
            && obj
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|f| f == NAMESPACE_FINALIZER))
    }

    fn drop_finalizer(
        &mut self,
        key: &ResourceKey,
        obj: &Value,
        finalizer: &str,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) {
        let mut obj = obj.clone();
        let rest: Vec<String> = object::finalizers(&obj)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        object::set_finalizers(&mut obj, rest);
        self.put(key, obj, events);
    }

    /// Deletes a terminating namespace's contents; once empty, releases the namespace.
    fn terminate_namespace(
        &mut self,
        ns: &str,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> bool {
        let from = (ns.to_string(), String::new());
        let contents: Vec<(ResourceKey, String, bool)> = self
            .objects
            .iter()
            .flat_map(|(k, m)| {
                m.range(&from..)
                    .take_while(|((ons, _), _)| ons == ns)
                    .map(move |((_, name), o)| (k.clone(), name.clone(), object::is_deleting(o)))
            })
            .collect();
        let mut changed = false;
        for (key, name, deleting) in &contents {
            if !deleting {
                self.delete(key, ns, name, Propagation::Background, events);
                changed = true;
            }
        }
        if changed {
            return true;
        }
        let key = namespaces_key();
        let Some(obj) = self.get(&key, "", ns) else {
            return false;
        };
        let holding = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if contents.is_empty() && holding {
            let mut released = obj.clone();
            released["spec"]["finalizers"] = json!([]);
            self.put(&key, released, events);
            return true;
        }
        false
    }

    fn allocate_cluster_ip(&mut self) -> String {
        // 198.19.0.10 upward (198.19.0.0/16, the test network's Service range), skipping .0
        // and .255 of each /24; below .10 is reserved (.1 is the `kubernetes` Service).
        let n = self.next_cluster_ip + FIRST_ALLOCATED_CLUSTER_IP;
        self.next_cluster_ip += 1;
        let third = n / 254;
        let fourth = 1 + n % 254;
        format!("198.19.{third}.{fourth}")
    }
}

/// One delete: which object, how to propagate, and its preconditions.
#[derive(Debug, Clone, Copy)]
pub struct DeleteRequest<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub policy: Propagation,
    pub precondition_rv: Option<&'a str>,
    pub precondition_uid: Option<&'a str>,
    pub dry_run: bool,
}

/// A list page.
pub struct ListResult {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// A watch's starting point: past events to replay and the live feed that follows them.
pub struct WatchStart {
    pub replay: Vec<Arc<StoredEvent>>,
    /// The resource's objects when the watch started (for watches starting at current state).
    pub current: Vec<Value>,
    pub live: broadcast::Receiver<Arc<StoredEvent>>,
    pub epoch: watch::Receiver<u64>,
    pub resource_version: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Arc<Self> {
        let (events, _) = broadcast::channel(16_384);
        let (watch_epoch, _) = watch::channel(0);
        let (watches_by_resource, _) = watch::channel(BTreeMap::new());
        let store = Arc::new(Self {
            state: Mutex::new(State {
                rv: 1,
                types: builtin_types(),
                objects: HashMap::new(),
                uids: HashMap::new(),
                dependents: HashMap::new(),
                pending: BTreeSet::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                oldest_resumable: 0,
                next_cluster_ip: 0,
                rbac_cluster_rv: 0,
                rbac_namespace_rv: HashMap::new(),
            }),
            events,
            watch_epoch,
            watches_by_resource,
        });
        for ns in ["default", "kube-system", "kube-public"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            store.create_system_object("namespaces", obj);
        }
        // The API server's own Service, as kube-apiserver keeps it; its EndpointSlice is
        // written by `advertise_api` once the API is reachable from pods.
        let kubernetes = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": KUBERNETES_SERVICE_IP.to_string(),
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
        });
        store.create_system_object("services", kubernetes);
        store
    }

    fn create_system_object(&self, plural: &str, obj: Value) {
        let ctx = WriteCtx {
            manager: "kube-standin".into(),
            subresource: None,
            dry_run: false,
            record_update: true,
        };
        let group = if plural == "endpointslices" {
            ("discovery.k8s.io", "v1")
        } else {
            ("", "v1")
        };
        if let Some(rt) = self.find_type(group.0, group.1, plural) {
            if let Err(e) = self.create(&rt, obj, &ctx) {
                tracing::error!(error = %e, plural, "creating a built-in object");
            }
        }
    }

    /// Writes the `kubernetes` Service's EndpointSlice: the address pods reach the API at
    /// (e.g. a relay in the test network), as kube-apiserver advertises its own address.
    pub fn advertise_api(&self, address: std::net::SocketAddr) {
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address.ip().to_string()],
                           "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": [{"name": "https", "port": address.port(), "protocol": "TCP"}],
        });
        self.create_system_object("endpointslices", slice);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written object (writes are single
        // map inserts), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn types(&self) -> Vec<ResourceType> {
        self.lock().types.clone()
    }

    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.lock().find_type(group, version, plural).cloned()
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// The CRD object that registered a custom resource type.
    pub fn crd_of(&self, rt: &ResourceType) -> Option<Value> {
        let name = rt.crd_name.as_deref()?;
        let key = ResourceKey {
            group: "apiextensions.k8s.io".into(),
            plural: "customresourcedefinitions".into(),
        };
        self.lock().get(&key, "", name).cloned()
    }

    /// A stored object as `rt`'s view shows it (`event_views`), with its `apiVersion` and
    /// `kind`.
    fn presented(rt: &ResourceType, obj: Value) -> Value {
        let mut obj = event_views::to_view(rt, obj);
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), json!(rt.api_version()));
            m.insert("kind".into(), json!(rt.kind));
        }
        obj
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .get(&rt.key(), ns, name)
            .cloned()
            .map(|o| Self::presented(rt, o))
            .ok_or_else(|| ApiError::not_found(target(rt, name)))
    }

    pub fn namespace_exists(&self, ns: &str) -> Result<bool, ApiError> {
        let key = ResourceKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        match self.lock().get(&key, "", ns) {
            None => Ok(false),
            Some(o) if object::is_deleting(o) => Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))),
            Some(_) => Ok(true),
        }
    }

    /// Lists objects (`ns` None: all namespaces) sorted by namespace and name, one page at a time.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        filter: &Filter,
        limit: Option<u64>,
        continue_from: Option<&str>,
    ) -> Result<ListResult, ApiError> {
        let state = self.lock();
        let start = continue_from.map(decode_continue).transpose()?;
        // Objects are sorted by (namespace, name): seek to the first one after the continue
        // key and within the namespace, and stop at the namespace's end.
        let from = match (start, ns) {
            (Some(s), Some(ns)) if s.0.as_str() < ns => {
                Bound::Included((ns.to_string(), String::new()))
            }
            (Some(s), _) => Bound::Excluded(s),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut matching = state
            .objects
            .get(&rt.key())
            .into_iter()
            .flat_map(|m| m.range((from.clone(), Bound::Unbounded)))
            .take_while(|((ons, _), _)| ns.is_none_or(|ns| ons == ns))
            .filter(|((_, name), _)| filter.fields.exact_name().is_none_or(|n| n == name))
            .filter(|(_, o)| match event_views::is_events_view(rt) {
                // Selectors of a converted view apply to the view's shape.
                true => filter.matches(&event_views::to_view(rt, (*o).clone())),
                false => filter.matches(o),
            });
        let mut items = Vec::new();
        let mut last_key = None;
        for (k, o) in matching.by_ref() {
            if limit.is_some_and(|l| items.len() as u64 >= l) {
                // Put the look-ahead back into the count below.
                let remaining = 1 + matching.count() as u64;
                let token = last_key.map(encode_continue);
                return Ok(ListResult {
                    items,
                    resource_version: state.rv,
                    continue_token: token,
                    remaining: Some(remaining),
                });
            }
            items.push(Self::presented(rt, o.clone()));
            last_key = Some(k.clone());
        }
        Ok(ListResult {
            items,
            resource_version: state.rv,
            continue_token: None,
            remaining: None,
        })
    }

    /// Creates an object; system metadata is set here.
    pub fn create(
        &self,
        rt: &ResourceType,
        mut obj: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        let mut state = self.lock();
        let key = rt.key();
        let (ns, name) = object_key(&obj);
        if state.get(&key, &ns, &name).is_some() {
            return Err(ApiError::already_exists(target(rt, &name)));
        }
        if rt.crd_name.is_none() && key.group == "apiextensions.k8s.io" {
            types_from_crd(&obj)
                .map_err(|e| ApiError::invalid(&rt.kind, &name, &rt.group, &[e]))?;
            set_crd_status(&mut obj);
        }
        if key.group.is_empty() && key.plural == "services" {
            default_service(&mut obj, None, &mut state);
        }
        if key.group.is_empty() && key.plural == "namespaces" {
            default_namespace(&mut obj);
        }
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), json!(rt.api_version()));
            m.insert("kind".into(), json!(rt.kind));
        }
        let meta = object::metadata_mut(&mut obj);
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(object::now_rfc3339()));
        meta.insert("generation".into(), json!(1));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            meta.remove(k);
        }
        if ctx.record_update {
            meta.remove("managedFields");
            let scope = Scope::of(ctx.subresource.as_deref(), rt.has_status);
            fields::record_update(None, &mut obj, &ctx.manager, scope, None, &rt.api_version());
        }
        if ctx.dry_run {
            return Ok(obj);
        }
        let stored = state.put(&key, event_views::to_storage(rt, obj), &self.events);
        state.collect_garbage(&self.events);
        Ok(Self::presented(rt, stored))
    }

    /// Replaces an object. `obj` already carries what the write may change (see the server's
    /// request preparation); `expected_rv` is the version it was computed from.
    pub fn update(
        &self,
        rt: &ResourceType,
        expected_rv: &str,
        mut obj: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        let mut state = self.lock();
        let key = rt.key();
        let (ns, name) = object_key(&obj);
        let stored_old = state
            .get(&key, &ns, &name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target(rt, &name)))?;
        // `obj` is in `rt`'s view; so is what it is compared with (`event_views`).
        let old = event_views::to_view(rt, stored_old.clone());
        if object::resource_version(&old) != Some(expected_rv) {
            return Err(ApiError::stale(target(rt, &name)));
        }
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            let meta_old = object::metadata(&old).and_then(|m| m.get(k)).cloned();
            let meta = object::metadata_mut(&mut obj);
            match meta_old {
                Some(v) => meta.insert(k.into(), v),
                None => meta.remove(k),
            };
        }
        if rt.crd_name.is_none() && key.group == "apiextensions.k8s.io" {
            types_from_crd(&obj)
                .map_err(|e| ApiError::invalid(&rt.kind, &name, &rt.group, &[e]))?;
            set_crd_status(&mut obj);
        }
        if key.group.is_empty() && key.plural == "services" {
            default_service(&mut obj, Some(&old), &mut state);
        }
        if key.group.is_empty() && key.plural == "namespaces" {
            default_namespace(&mut obj);
        }
        if generation_view(&old, rt.has_status) != generation_view(&obj, rt.has_status) {
            let generation = object::metadata(&old)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(1);
            object::metadata_mut(&mut obj).insert("generation".into(), json!(generation + 1));
        }
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), json!(rt.api_version()));
            m.insert("kind".into(), json!(rt.kind));
        }
        if ctx.record_update {
            let scope = Scope::of(ctx.subresource.as_deref(), rt.has_status);
            fields::record_update(
                Some(&old),
                &mut obj,
                &ctx.manager,
                scope,
                ctx.subresource.as_deref(),
                &rt.api_version(),
            );
        }
        object::metadata_mut(&mut obj).insert("resourceVersion".into(), json!(expected_rv));
        if same_content(&old, &obj) {
            return Ok(Self::presented(rt, stored_old));
        }
        if ctx.dry_run {
            return Ok(Self::presented(rt, event_views::to_storage(rt, obj)));
        }
        let stored = state.put(&key, event_views::to_storage(rt, obj), &self.events);
        state.collect_garbage(&self.events);
        let current = state.get(&key, &ns, &name).cloned().unwrap_or(stored);
        Ok(Self::presented(rt, current))
    }

    /// Deletes (or starts deleting) an object; returns it as last seen.
    pub fn delete(&self, rt: &ResourceType, req: &DeleteRequest<'_>) -> Result<Value, ApiError> {
        let DeleteRequest {
            namespace: ns,
            name,
            policy,
            precondition_rv,
            precondition_uid,
            dry_run,
        } = *req;
        let mut state = self.lock();
        let key = rt.key();
        let current = state
            .get(&key, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target(rt, name)))?;
        if precondition_rv.is_some_and(|rv| Some(rv) != object::resource_version(&current)) {
            return Err(ApiError::conflict(target(rt, name), "the ResourceVersion in the precondition does not match the ResourceVersion in record. The object might have been modified"));
        }
        if precondition_uid.is_some_and(|uid| Some(uid) != object::uid(&current)) {
            return Err(ApiError::conflict(target(rt, name), "the UID in the precondition does not match the UID in record. The object might have been deleted and then recreated"));
        }
        if dry_run {
            return Ok(Self::presented(rt, current));
        }
        let result = state
            .delete(&key, ns, name, policy, &self.events)
            .unwrap_or(current);
        state.collect_garbage(&self.events);
        Ok(Self::presented(rt, result))
    }

    /// Where a watch from `since` starts, or 410 Gone when history no longer reaches back there.
    /// `since` None: only future events.
    /// `current_of`: also snapshot the current objects of that resource (in one namespace, or
    /// all), atomically with the subscription, for watches that start with the current state.
    pub fn watch_from(
        &self,
        since: Option<u64>,
        current_of: Option<(&ResourceKey, Option<&str>)>,
    ) -> Result<WatchStart, ApiError> {
        let state = self.lock();
        let live = self.events.subscribe();
        let epoch = self.watch_epoch.subscribe();
        let replay = match since {
            None => Vec::new(),
            Some(rv) if rv < state.oldest_resumable => {
                return Err(ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    state.oldest_resumable
                )))
            }
            Some(rv) => state
                .history
                .iter()
                .filter(|e| e.rv > rv)
                .cloned()
                .collect(),
        };
        // Objects are sorted by (namespace, name): a namespaced watch copies its namespace only.
        let current = match current_of {
            Some((key, namespace)) => state
                .objects
                .get(key)
                .map(|m| match namespace {
                    Some(ns) => m
                        .range((ns.to_string(), String::new())..)
                        .take_while(|((ons, _), _)| ons == ns)
                        .map(|(_, o)| o.clone())
                        .collect(),
                    None => m.values().cloned().collect(),
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        Ok(WatchStart {
            replay,
            current,
            live,
            epoch,
            resource_version: state.rv,
        })
    }

    /// How many watch streams are open (tests await a client's watch before acting).
    pub fn open_watches(&self) -> usize {
        self.events.receiver_count()
    }

    /// Counts a watch stream of `rt` as open until the returned guard is dropped.
    pub fn open_watch(self: &Arc<Self>, rt: &ResourceType) -> OpenWatch {
        let resource = if rt.group.is_empty() {
            rt.plural.clone()
        } else {
            format!("{}.{}", rt.plural, rt.group)
        };
        self.watches_by_resource
            .send_modify(|open| *open.entry(resource.clone()).or_default() += 1);
        OpenWatch {
            store: self.clone(),
            resource,
        }
    }

    /// Open watch streams by `<plural>[.<group>]` (a resource with none is absent), kept
    /// current: tests await a count with `wait_for`.
    pub fn watches_by_resource(&self) -> watch::Receiver<BTreeMap<String, usize>> {
        self.watches_by_resource.subscribe()
    }

    /// Ends every open watch stream (fault injection).
    pub fn drop_all_watches(&self) {
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    /// Forgets the event history, so that resuming from any version seen so far gets 410 Gone.
    pub fn expire_history(&self) {
        let mut state = self.lock();
        state.history.clear();
        // A fresh version that lists will report and watches may resume from.
        state.rv += 1;
        state.oldest_resumable = state.rv;
    }

    /// The type for an `apiVersion` + `kind`.
    pub fn type_for_kind(&self, api_version: &str, kind: &str) -> Option<ResourceType> {
        self.lock()
            .types
            .iter()
            .find(|t| t.api_version() == api_version && t.kind == kind)
            .cloned()
    }

    /// The presented form of a stored event's object for the resource type `rt`.
    pub fn present(rt: &ResourceType, obj: &Value) -> Value {
        Self::presented(rt, obj.clone())
    }

    /// Whether a key still names a registered type (watches of a deleted CRD's kind end).
    pub fn key_registered(&self, key: &ResourceKey) -> bool {
        self.lock().type_of_key(key).is_some()
    }
}

fn set_crd_status(crd: &mut Value) {
    let now = object::now_rfc3339();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
}

fn default_namespace(ns: &mut Value) {
    let name = object::name(ns).to_string();
    let meta = object::metadata_mut(ns);
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
    if !object::is_deleting(ns) {
        ns["status"] = json!({"phase": "Active"});
    }
    if ns.pointer("/spec/finalizers").is_none() {
        ns["spec"] = json!({"finalizers": [NAMESPACE_FINALIZER]});
    }
}

fn default_service(svc: &mut Value, old: Option<&Value>, state: &mut State) {
    if !svc.get("spec").is_some_and(Value::is_object) {
        svc["spec"] = json!({});
    }
    let old_ip = old
        .and_then(|o| o.pointer("/spec/clusterIP"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let spec = &mut svc["spec"];
    let ip = match spec.get("clusterIP").and_then(Value::as_str) {
        Some(ip) if !ip.is_empty() => ip.to_string(),
        _ => match old_ip {
            Some(ip) => ip,
            None => state.allocate_cluster_ip(),
        },
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if spec.get("type").is_none() {
        spec["type"] = json!("ClusterIP");
    }
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none() {
                if let Some(port) = p.get("port").cloned() {
                    p["targetPort"] = port;
                }
            }
        }
    }
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-4{:x}{:02x}-{:x}{:x}{:02x}-{}",
        b[0],
        b[1],
        b[2],
        b[3],
        b[4],
        b[5],
        b[6] & 0x0f,
        b[7],
        8 | (b[8] & 0x3),
        b[8] >> 4,
        b[9],
        b[10..16]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    )
}

fn encode_continue(key: (String, String)) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!([key.0, key.1]).to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    use base64::Engine;
    let invalid = || ApiError::bad_request("continue key is not valid");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| invalid())?;
    let (ns, name): (String, String) = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    Ok((ns, name))
}

impl ObjectLookup for Store {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rt = self.type_for_kind(api_version, kind)?;
        Store::get(self, &rt, namespace.unwrap_or_default(), name).ok()
    }

    fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let Some(rt) = self.type_for_kind(api_version, kind) else {
            return Vec::new();
        };
        Store::list(self, &rt, namespace, &Filter::default(), None, None)
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// The latest version at which an RBAC object that applies in `namespace` was written:
    /// both parts only grow and every write has a new version, so any such write changes it.
    fn rbac_generation(&self, namespace: Option<&str>) -> Option<u64> {
        let state = self.lock();
        let local = namespace
            .and_then(|ns| state.rbac_namespace_rv.get(ns))
            .copied()
            .unwrap_or(0);
        Some(state.rbac_cluster_rv.max(local))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> WriteCtx {
        WriteCtx {
            manager: "test".into(),
            subresource: None,
            dry_run: false,
            record_update: true,
        }
    }

    struct Fixture {
        store: Arc<Store>,
        namespaces: ResourceType,
        configmaps: ResourceType,
        secrets: ResourceType,
    }

    impl Fixture {
        fn new() -> Self {
            let store = Store::new(100_000);
            let namespaces = store.find_type("", "v1", "namespaces").unwrap();
            let configmaps = store.find_type("", "v1", "configmaps").unwrap();
            let secrets = store.find_type("", "v1", "secrets").unwrap();
            let f = Fixture {
                store,
                namespaces,
                configmaps,
                secrets,
            };
            f.store
                .create(&f.namespaces, json!({"metadata": {"name": "ns"}}), &ctx())
                .unwrap();
            f
        }

        /// Creates a ConfigMap in `ns` owned by `owners` (uid, blockOwnerDeletion) and holding
        /// `finalizers`; returns its uid.
        fn configmap(&self, name: &str, owners: &[(&str, bool)], finalizers: &[&str]) -> String {
            self.create(&self.configmaps, "ns", name, owners, finalizers)
        }

        fn create(
            &self,
            rt: &ResourceType,
            ns: &str,
            name: &str,
            owners: &[(&str, bool)],
            finalizers: &[&str],
        ) -> String {
            let mut meta = json!({"name": name, "namespace": ns});
            if !owners.is_empty() {
                meta["ownerReferences"] = owners
                    .iter()
                    .map(|(uid, block)| {
                        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                               "uid": uid, "blockOwnerDeletion": block})
                    })
                    .collect();
            }
            if !finalizers.is_empty() {
                meta["finalizers"] = json!(finalizers);
            }
            let created = self
                .store
                .create(rt, json!({"metadata": meta}), &ctx())
                .unwrap();
            object::uid(&created).unwrap().to_string()
        }

        fn get(&self, name: &str) -> Option<Value> {
            self.store.get(&self.configmaps, "ns", name).ok()
        }

        fn delete(&self, rt: &ResourceType, ns: &str, name: &str, policy: Propagation) {
            let req = DeleteRequest {
                namespace: ns,
                name,
                policy,
                precondition_rv: None,
                precondition_uid: None,
                dry_run: false,
            };
            self.store.delete(rt, &req).unwrap();
        }

        /// Rewrites a ConfigMap's finalizers through an update.
        fn set_finalizers(&self, rt: &ResourceType, ns: &str, name: &str, finalizers: &[&str]) {
            let mut obj = self.store.get(rt, ns, name).unwrap();
            let rv = object::resource_version(&obj).unwrap().to_string();
            object::set_finalizers(&mut obj, finalizers.iter().map(|f| f.to_string()).collect());
            self.store.update(rt, &rv, obj, &ctx()).unwrap();
        }

        /// Fails when the incremental bookkeeping missed work or went out of step: the indexes
        /// must match the objects, and a sweep over every object (what the lifecycle rules
        /// used to do after each write) must find nothing to do.
        fn assert_settled(&self) {
            let mut state = self.store.lock();
            let mut uids = HashMap::new();
            let mut dependents: HashMap<String, BTreeSet<ObjectRef>> = HashMap::new();
            let mut all = Vec::new();
            for (key, m) in &state.objects {
                for ((ns, name), o) in m {
                    let at = (key.clone(), ns.clone(), name.clone());
                    if let Some(uid) = object::uid(o) {
                        uids.insert(uid.to_string(), at.clone());
                    }
                    for r in object::owner_refs(o) {
                        dependents.entry(r.uid).or_default().insert(at.clone());
                    }
                    all.push(at);
                }
            }
            assert_eq!(state.uids, uids, "uid index out of step");
            assert_eq!(state.dependents, dependents, "dependents index out of step");
            assert!(state.pending.is_empty(), "work left pending");
            let rv = state.rv;
            state.pending.extend(all);
            state.collect_garbage(&self.store.events);
            assert_eq!(
                state.rv, rv,
                "a full sweep found work the writes did not do"
            );
        }
    }

    #[test]
    fn deleting_an_owner_collects_its_dependents_transitively() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        let child = f.configmap("child", &[(&owner, false)], &[]);
        f.configmap("grandchild", &[(&child, true)], &[]);
        f.configmap("bystander", &[], &[]);
        f.assert_settled();
        f.delete(&f.configmaps, "ns", "owner", Propagation::Background);
        assert!(f.get("owner").is_none());
        assert!(f.get("child").is_none());
        assert!(f.get("grandchild").is_none());
        assert!(f.get("bystander").is_some());
        f.assert_settled();
    }

    #[test]
    fn a_dependent_stays_while_any_owner_remains() {
        let f = Fixture::new();
        let a = f.configmap("a", &[], &[]);
        let b = f.configmap("b", &[], &[]);
        f.configmap("shared", &[(&a, false), (&b, false)], &[]);
        f.delete(&f.configmaps, "ns", "a", Propagation::Background);
        assert!(f.get("shared").is_some());
        f.assert_settled();
        f.delete(&f.configmaps, "ns", "b", Propagation::Background);
        assert!(f.get("shared").is_none());
        f.assert_settled();
    }

    #[test]
    fn a_dependent_with_a_finalizer_is_marked_deleting_until_released() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        f.configmap("held", &[(&owner, false)], &["example.com/hold"]);
        f.delete(&f.configmaps, "ns", "owner", Propagation::Background);
        let held = f.get("held").unwrap();
        assert!(object::is_deleting(&held));
        f.assert_settled();
        f.set_finalizers(&f.configmaps, "ns", "held", &[]);
        assert!(f.get("held").is_none());
        f.assert_settled();
    }

    #[test]
    fn an_object_created_with_a_dangling_owner_is_collected() {
        let f = Fixture::new();
        f.configmap("orphaned", &[("no-such-uid", false)], &[]);
        assert!(f.get("orphaned").is_none());
        f.assert_settled();
    }

    #[test]
    fn orphan_deletion_keeps_dependents_without_the_owner_reference() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        let other = f.configmap("other", &[], &[]);
        f.configmap("dep", &[(&owner, true), (&other, false)], &[]);
        f.configmap("only", &[(&owner, false)], &[]);
        f.delete(&f.configmaps, "ns", "owner", Propagation::Orphan);
        assert!(f.get("owner").is_none());
        let dep = f.get("dep").unwrap();
        let refs: Vec<String> = object::owner_refs(&dep)
            .into_iter()
            .map(|r| r.uid)
            .collect();
        assert_eq!(refs, vec![other]);
        let only = f.get("only").unwrap();
        assert!(object::owner_refs(&only).is_empty());
        assert!(!object::is_deleting(&only));
        f.assert_settled();
    }

    #[test]
    fn orphan_finalizer_added_by_a_client_waits_for_deletion() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[ORPHAN_FINALIZER]);
        f.configmap("dep", &[(&owner, false)], &[]);
        f.assert_settled();
        assert!(f.get("owner").is_some());
        f.delete(&f.configmaps, "ns", "owner", Propagation::Background);
        assert!(f.get("owner").is_none());
        assert!(object::owner_refs(&f.get("dep").unwrap()).is_empty());
        f.assert_settled();
    }

    #[test]
    fn foreground_deletion_waits_for_blocking_dependents() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        f.configmap("blocking", &[(&owner, true)], &["example.com/hold"]);
        f.configmap("free", &[(&owner, false)], &[]);
        f.delete(&f.configmaps, "ns", "owner", Propagation::Foreground);
        let held = f.get("owner").unwrap();
        assert!(object::is_deleting(&held));
        assert_eq!(object::finalizers(&held), vec![FOREGROUND_FINALIZER]);
        assert!(
            f.get("free").is_none(),
            "a dependent without a finalizer goes at once"
        );
        let blocking = f.get("blocking").unwrap();
        assert!(object::is_deleting(&blocking));
        f.assert_settled();
        f.set_finalizers(&f.configmaps, "ns", "blocking", &[]);
        assert!(f.get("blocking").is_none());
        assert!(f.get("owner").is_none());
        f.assert_settled();
    }

    #[test]
    fn foreground_deletion_releases_when_the_last_dependent_stops_blocking() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        f.configmap("blocking", &[(&owner, true)], &["example.com/hold"]);
        f.delete(&f.configmaps, "ns", "owner", Propagation::Foreground);
        assert!(f.get("owner").is_some());
        // The dependent stops blocking (still deleting, still held by its own finalizer).
        let mut dep = f.get("blocking").unwrap();
        let rv = object::resource_version(&dep).unwrap().to_string();
        dep["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(false);
        f.store.update(&f.configmaps, &rv, dep, &ctx()).unwrap();
        assert!(f.get("owner").is_none());
        // Its owner is gone, but it is already deleting: its finalizer still holds it.
        assert!(f.get("blocking").is_some());
        f.assert_settled();
    }

    #[test]
    fn a_dependent_created_under_a_foreground_deleting_owner_is_deleted() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        f.configmap("blocking", &[(&owner, true)], &["example.com/hold"]);
        f.delete(&f.configmaps, "ns", "owner", Propagation::Foreground);
        f.configmap("late", &[(&owner, true)], &["example.com/hold"]);
        assert!(object::is_deleting(&f.get("late").unwrap()));
        f.assert_settled();
        f.set_finalizers(&f.configmaps, "ns", "blocking", &[]);
        assert!(f.get("owner").is_some(), "the late dependent still blocks");
        f.set_finalizers(&f.configmaps, "ns", "late", &[]);
        assert!(f.get("owner").is_none());
        f.assert_settled();
    }

    #[test]
    fn deleting_a_namespace_removes_its_contents_then_the_namespace() {
        let f = Fixture::new();
        f.store
            .create(
                &f.namespaces,
                json!({"metadata": {"name": "other"}}),
                &ctx(),
            )
            .unwrap();
        f.configmap("plain", &[], &[]);
        f.create(&f.secrets, "ns", "held", &[], &["example.com/hold"]);
        f.create(&f.configmaps, "other", "elsewhere", &[], &[]);
        f.delete(&f.namespaces, "", "ns", Propagation::Background);
        let ns = f.store.get(&f.namespaces, "", "ns").unwrap();
        assert!(object::is_deleting(&ns));
        assert_eq!(ns["status"]["phase"], "Terminating");
        assert!(f.get("plain").is_none());
        assert!(object::is_deleting(
            &f.store.get(&f.secrets, "ns", "held").unwrap()
        ));
        f.assert_settled();
        f.set_finalizers(&f.secrets, "ns", "held", &[]);
        assert!(f.store.get(&f.namespaces, "", "ns").is_err());
        assert!(f.store.get(&f.configmaps, "other", "elsewhere").is_ok());
        f.assert_settled();
    }

    #[test]
    fn an_object_written_into_a_terminating_namespace_is_deleted() {
        let f = Fixture::new();
        f.create(&f.secrets, "ns", "held", &[], &["example.com/hold"]);
        f.delete(&f.namespaces, "", "ns", Propagation::Background);
        // The server refuses this (namespace_exists); the store still keeps the rule.
        f.configmap("late", &[], &[]);
        assert!(f.get("late").is_none());
        f.assert_settled();
    }

    #[test]
    fn a_namespace_with_its_own_finalizer_waits_for_it() {
        let f = Fixture::new();
        f.configmap("plain", &[], &[]);
        f.set_finalizers(&f.namespaces, "", "ns", &["example.com/ns"]);
        f.delete(&f.namespaces, "", "ns", Propagation::Background);
        assert!(f.get("plain").is_none());
        let ns = f.store.get(&f.namespaces, "", "ns").unwrap();
        assert_eq!(ns["spec"]["finalizers"], json!([]));
        f.assert_settled();
        f.set_finalizers(&f.namespaces, "", "ns", &[]);
        assert!(f.store.get(&f.namespaces, "", "ns").is_err());
        f.assert_settled();
    }

    #[test]
    fn plain_writes_of_live_objects_leave_everything() {
        let f = Fixture::new();
        let owner = f.configmap("owner", &[], &[]);
        for i in 0..20 {
            f.configmap(&format!("dep-{i}"), &[(&owner, i % 2 == 0)], &[]);
        }
        let before = f.store.current_rv();
        let mut dep = f.get("dep-3").unwrap();
        let rv = object::resource_version(&dep).unwrap().to_string();
        dep["data"] = json!({"k": "v"});
        f.store.update(&f.configmaps, &rv, dep, &ctx()).unwrap();
        assert_eq!(
            f.store.current_rv(),
            before + 1,
            "one write, no lifecycle writes"
        );
        assert!(f.get("owner").is_some());
        for i in 0..20 {
            assert!(f.get(&format!("dep-{i}")).is_some());
        }
        let state = f.store.lock();
        assert_eq!(
            state
                .history
                .iter()
                .filter(|e| e.kind == EventKind::Deleted)
                .count(),
            0
        );
        drop(state);
        f.assert_settled();
    }

    #[test]
    fn rbac_generation_moves_with_rbac_writes_in_scope() {
        let f = Fixture::new();
        f.store
            .create(
                &f.namespaces,
                json!({"metadata": {"name": "other"}}),
                &ctx(),
            )
            .unwrap();
        let rbac = |plural: &str| f.store.find_type(RBAC_GROUP, "v1", plural).unwrap();
        let (roles, bindings, cluster_roles) =
            (rbac("roles"), rbac("rolebindings"), rbac("clusterroles"));
        let generations =
            || [None, Some("ns"), Some("other")].map(|ns| f.store.rbac_generation(ns).unwrap());
        let mut before = generations();
        // (what changed, which of cluster / ns / other must have moved)
        let mut expect = |what: &str, moved: [bool; 3]| {
            let now = generations();
            for (i, scope) in ["cluster", "ns", "other"].iter().enumerate() {
                assert_eq!(now[i] != before[i], moved[i], "{what}: {scope}");
                assert!(now[i] >= before[i], "{what}: {scope} went back");
            }
            before = now;
        };
        f.configmap("cm", &[], &[]);
        expect("a ConfigMap", [false, false, false]);
        let role = json!({"metadata": {"name": "r", "namespace": "ns"}, "rules": []});
        let created = f.store.create(&roles, role, &ctx()).unwrap();
        expect("a Role created in ns", [false, true, false]);
        let mut changed = created.clone();
        changed["rules"] = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let rv = object::resource_version(&created).unwrap().to_string();
        f.store.update(&roles, &rv, changed, &ctx()).unwrap();
        expect("a Role updated", [false, true, false]);
        let binding = json!({"metadata": {"name": "b", "namespace": "other"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "r"}});
        f.store.create(&bindings, binding, &ctx()).unwrap();
        expect("a RoleBinding in other", [false, false, true]);
        f.delete(&bindings, "other", "b", Propagation::Background);
        expect("a RoleBinding deleted", [false, false, true]);
        let cluster_role = json!({"metadata": {"name": "c"}, "rules": []});
        f.store
            .create(&cluster_roles, cluster_role, &ctx())
            .unwrap();
        expect("a ClusterRole", [true, true, true]);
        f.delete(&cluster_roles, "", "c", Propagation::Background);
        expect("a ClusterRole deleted", [true, true, true]);
        f.delete(&f.namespaces, "", "ns", Propagation::Background);
        expect("ns deleted with its Role", [false, true, false]);
        assert!(f.store.get(&roles, "ns", "r").is_err());
    }

    #[test]
    fn a_namespaced_watch_snapshots_its_namespace_only() {
        let f = Fixture::new();
        for ns in ["a", "b", "c"] {
            f.store
                .create(&f.namespaces, json!({"metadata": {"name": ns}}), &ctx())
                .unwrap();
            for name in ["x", "y"] {
                f.create(&f.configmaps, ns, name, &[], &[]);
            }
        }
        let key = f.configmaps.key();
        let names = |namespace: Option<&str>| {
            let start = f.store.watch_from(None, Some((&key, namespace))).unwrap();
            start
                .current
                .iter()
                .map(|o| format!("{}/{}", object::namespace(o).unwrap(), object::name(o)))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(Some("b")), vec!["b/x", "b/y"]);
        assert!(names(Some("d")).is_empty());
        assert_eq!(names(None), vec!["a/x", "a/y", "b/x", "b/y", "c/x", "c/y"]);
    }

    #[test]
    fn lists_page_through_one_namespace_or_all() {
        let f = Fixture::new();
        for ns in ["a", "b", "c"] {
            f.store
                .create(&f.namespaces, json!({"metadata": {"name": ns}}), &ctx())
                .unwrap();
            for name in ["x", "y"] {
                f.create(&f.configmaps, ns, name, &[], &[]);
            }
        }
        let page = |ns: Option<&str>, token: Option<&str>| {
            f.store
                .list(&f.configmaps, ns, &Filter::default(), Some(1), token)
                .unwrap()
        };
        let names = |ns: Option<&str>| {
            let mut seen = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let p = page(ns, token.as_deref());
                seen.extend(
                    p.items
                        .iter()
                        .map(|o| format!("{}/{}", object::namespace(o).unwrap(), object::name(o))),
                );
                match p.continue_token {
                    Some(t) => token = Some(t),
                    None => return seen,
                }
            }
        };
        assert_eq!(names(Some("b")), vec!["b/x", "b/y"]);
        assert_eq!(names(None), vec!["a/x", "a/y", "b/x", "b/y", "c/x", "c/y"]);
        assert_eq!(page(Some("b"), None).remaining, Some(1));
        // A continue key from another namespace: before it starts at its beginning, after it
        // finds nothing.
        let from_a = encode_continue(("a".into(), "y".into()));
        assert_eq!(page(Some("b"), Some(&from_a)).items.len(), 1);
        let from_c = encode_continue(("c".into(), "x".into()));
        assert!(page(Some("b"), Some(&from_c)).items.is_empty());
    }

    /// A deterministic random mix of writes; after each, the bookkeeping must agree with a
    /// full sweep.
    #[test]
    fn random_writes_keep_the_bookkeeping_in_step() {
        let f = Fixture::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let finalizer_sets: [&[&str]; 4] = [&[], &["example.com/hold"], &[ORPHAN_FINALIZER], &[]];
        for step in 0..400 {
            let names: Vec<(String, String)> = {
                let state = f.store.lock();
                state
                    .objects
                    .get(&f.configmaps.key())
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default()
            };
            let uids: Vec<String> = names
                .iter()
                .filter_map(|(ns, n)| f.store.get(&f.configmaps, ns, n).ok())
                .filter_map(|o| object::uid(&o).map(str::to_string))
                .collect();
            match next(6) {
                0 | 1 if names.len() < 40 => {
                    let mut owners = Vec::new();
                    for _ in 0..next(3) {
                        if !uids.is_empty() {
                            owners.push((uids[next(uids.len())].as_str(), next(2) == 0));
                        }
                    }
                    f.configmap(&format!("cm-{step}"), &owners, finalizer_sets[next(4)]);
                }
                2 | 3 if !names.is_empty() => {
                    let (ns, name) = &names[next(names.len())];
                    let policy = [
                        Propagation::Background,
                        Propagation::Foreground,
                        Propagation::Orphan,
                    ][next(3)];
                    f.delete(&f.configmaps, ns, name, policy);
                }
                4 if !names.is_empty() => {
                    let (ns, name) = &names[next(names.len())];
                    f.set_finalizers(&f.configmaps, ns, name, &[]);
                }
                _ if !names.is_empty() => {
                    // Rewrite the owner references.
                    let (ns, name) = &names[next(names.len())];
                    let mut obj = f.store.get(&f.configmaps, ns, name).unwrap();
                    let rv = object::resource_version(&obj).unwrap().to_string();
                    let refs: Vec<Value> = (0..next(3))
                        .filter(|_| !uids.is_empty())
                        .map(|_| {
                            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                                   "uid": uids[next(uids.len())], "blockOwnerDeletion": next(2) == 0})
                        })
                        .collect();
                    object::metadata_mut(&mut obj).insert("ownerReferences".into(), json!(refs));
                    f.store.update(&f.configmaps, &rv, obj, &ctx()).unwrap();
                }
                _ => {}
            }
            f.assert_settled();
        }
    }
}
