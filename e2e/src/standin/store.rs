//! The in-memory object store: resource registry, objects, `resourceVersion`, the bounded event
//! history that watches resume from, and the lifecycle rules that run on every write
//! (finalizers, owner-reference garbage collection, namespace termination, CRD registration).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use super::error::{ApiError, Target};
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

struct State {
    rv: u64,
    types: Vec<ResourceType>,
    objects: HashMap<ResourceKey, ObjectMap>,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Watches may resume from this version or later; older ones get 410 Gone.
    oldest_resumable: u64,
    next_cluster_ip: u32,
}

/// The stand-in's storage; shared by the HTTP handlers and the test handle.
pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<StoredEvent>>,
    /// Bumped to end every open watch (fault injection).
    watch_epoch: watch::Sender<u64>,
}

fn object_key(obj: &Value) -> (String, String) {
    (
        object::namespace(obj).unwrap_or_default().to_string(),
        object::name(obj).to_string(),
    )
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
        let old = self.bucket(key).insert(k, obj.clone());
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
        self.rv += 1;
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
    fn collect_garbage(&mut self, events: &broadcast::Sender<Arc<StoredEvent>>) {
        for _round in 0..1000 {
            if !self.collect_garbage_once(events) {
                return;
            }
        }
        tracing::warn!("garbage collection did not settle after 1000 rounds");
    }

    fn snapshot(&self) -> Vec<(ResourceKey, Value)> {
        self.objects
            .iter()
            .flat_map(|(k, m)| m.values().map(move |o| (k.clone(), o.clone())))
            .collect()
    }

    fn collect_garbage_once(&mut self, events: &broadcast::Sender<Arc<StoredEvent>>) -> bool {
        let all = self.snapshot();
        let uids: HashSet<&str> = all.iter().filter_map(|(_, o)| object::uid(o)).collect();
        let dependents_of = |uid: &str| -> Vec<(ResourceKey, Value, bool)> {
            all.iter()
                .filter_map(|(k, o)| {
                    let r = object::owner_refs(o).into_iter().find(|r| r.uid == uid)?;
                    Some((k.clone(), o.clone(), r.block_owner_deletion))
                })
                .collect()
        };
        for (key, obj) in &all {
            let (ns, name) = object_key(obj);
            let finalizers = object::finalizers(obj);
            let deleting = object::is_deleting(obj);
            if deleting && finalizers.is_empty() && !self.is_namespace_holding(key, obj) {
                self.remove(key, &ns, &name, events);
                return true;
            }
            let uid = object::uid(obj).unwrap_or_default();
            if deleting && finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
                for (dk, mut dep, _) in dependents_of(uid) {
                    object::remove_owner_ref(&mut dep, uid);
                    self.put(&dk, dep, events);
                }
                self.drop_finalizer(key, obj, ORPHAN_FINALIZER, events);
                return true;
            }
            if deleting && finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
                let deps = dependents_of(uid);
                let mut changed = false;
                for (dk, dep, _) in &deps {
                    if !object::is_deleting(dep) {
                        let (dns, dname) = object_key(dep);
                        self.delete(dk, &dns, &dname, Propagation::Foreground, events);
                        changed = true;
                    }
                }
                if changed {
                    return true;
                }
                if !deps.iter().any(|(_, _, block)| *block) {
                    self.drop_finalizer(key, obj, FOREGROUND_FINALIZER, events);
                    return true;
                }
            }
            if deleting
                && key.group.is_empty()
                && key.plural == "namespaces"
                && self.terminate_namespace(&name, obj, events)
            {
                return true;
            }
            let owners = object::owner_refs(obj);
            if !deleting
                && !owners.is_empty()
                && owners.iter().all(|r| !uids.contains(r.uid.as_str()))
            {
                self.delete(key, &ns, &name, Propagation::Background, events);
                return true;
            }
        }
        false
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
        obj: &Value,
        events: &broadcast::Sender<Arc<StoredEvent>>,
    ) -> bool {
        let contents: Vec<(ResourceKey, String, bool)> = self
            .objects
            .iter()
            .flat_map(|(k, m)| {
                m.iter()
                    .filter(|((ons, _), _)| ons == ns)
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
        let holding = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if contents.is_empty() && holding {
            let mut released = obj.clone();
            released["spec"]["finalizers"] = json!([]);
            let key = ResourceKey {
                group: String::new(),
                plural: "namespaces".into(),
            };
            self.put(&key, released, events);
            return true;
        }
        false
    }

    fn allocate_cluster_ip(&mut self) -> String {
        let n = self.next_cluster_ip;
        self.next_cluster_ip += 1;
        // 127.0.1.1 upward, skipping .0 and .255 of each /24.
        let third = 1 + n / 254;
        let fourth = 1 + n % 254;
        format!("127.0.{third}.{fourth}")
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
        let store = Arc::new(Self {
            state: Mutex::new(State {
                rv: 1,
                types: builtin_types(),
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                oldest_resumable: 0,
                next_cluster_ip: 0,
            }),
            events,
            watch_epoch,
        });
        for ns in ["default", "kube-system", "kube-public"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            let ctx = WriteCtx {
                manager: "kube-standin".into(),
                subresource: None,
                dry_run: false,
                record_update: true,
            };
            if let Some(rt) = store.find_type("", "v1", "namespaces") {
                if let Err(e) = store.create(&rt, obj, &ctx) {
                    tracing::error!(error = %e, "creating built-in namespace");
                }
            }
        }
        store
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

    fn presented(rt: &ResourceType, mut obj: Value) -> Value {
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
        let mut matching = state
            .objects
            .get(&rt.key())
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(|((ons, _), _)| ns.is_none_or(|ns| ons == ns))
            .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s))
            .filter(|((_, name), _)| filter.fields.exact_name().is_none_or(|n| n == name))
            .filter(|(_, o)| filter.matches(o));
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
            let _ = &k;
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
        let stored = state.put(&key, obj, &self.events);
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
        let old = state
            .get(&key, &ns, &name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target(rt, &name)))?;
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
            return Ok(Self::presented(rt, old));
        }
        if ctx.dry_run {
            return Ok(Self::presented(rt, obj));
        }
        let stored = state.put(&key, obj, &self.events);
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
    /// `current_of`: also snapshot the current objects of that resource, atomically with the
    /// subscription, for watches that start with the current state.
    pub fn watch_from(
        &self,
        since: Option<u64>,
        current_of: Option<&ResourceKey>,
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
        let current = current_of
            .and_then(|key| state.objects.get(key))
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
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
}
