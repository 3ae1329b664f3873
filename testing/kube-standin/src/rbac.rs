//! RBAC authorization of stand-in requests, with the semantics of Kubernetes' RBAC authorizer.
//!
//! Roles, ClusterRoles and their bindings are read from the store; an [`Authorizer`] caches the
//! resolved rules until the store reports an RBAC write (a binding written by the operator
//! still takes effect on the next request, as in a real cluster).
//! A few default cluster roles that every real cluster has are built in (see [`builtin`]).
//! Escalation prevention for writes of RBAC objects is [`check_escalation`].

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef,
    Subject,
};

use super::auth::{parse_service_account_username, UserInfo, GROUP_MASTERS};
use super::lookup::{label_selector_matches, object_labels, ObjectLookup};

const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// What a request wants to do, in RBAC terms (Kubernetes' `RequestInfo`).
///
/// `name` is the object's name for get/update/patch/delete, and also for list/watch with the
/// field selector `metadata.name=<name>`; it is None for create and unfiltered list/watch, so
/// rules with `resourceNames` do not grant those. For `/api/v1/namespaces/<ns>` the real API
/// sets `namespace` to `<ns>` as well.
#[derive(Debug, Clone)]
pub struct RequestAttributes {
    pub user: UserInfo,
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// Past this many cached rule sets of one kind the cache starts over (each costs one
/// resolution to rebuild); it bounds memory when many identities or namespaces come and go.
const MAX_CACHED_RULE_SETS: usize = 50_000;

/// The RBAC authorizer of a server: resolved rules are cached per identity (cluster-wide part)
/// and per identity and namespace (RoleBindings part), as a real API server's authorizer works
/// from informer caches instead of reading every binding per request. An entry is used only
/// while [`ObjectLookup::rbac_generation`] is what it was before the entry was resolved, so
/// every answer is the uncached one and an RBAC write decides the very next request.
/// One Authorizer serves one store (generations of different stores are unrelated).
pub struct Authorizer {
    caching: bool,
    cluster: Mutex<HashMap<UserKey, Cached>>,
    local: Mutex<HashMap<(UserKey, String), Cached>>,
    resolutions: AtomicU64,
}

/// An identity as RBAC sees it: name and groups.
#[derive(Clone, PartialEq, Eq, Hash)]
struct UserKey {
    username: String,
    groups: Vec<String>,
}

struct Cached {
    generation: u64,
    rules: Arc<[PolicyRule]>,
}

/// The rules that apply to a user for one request: cluster-wide ones and, for a namespaced
/// request, those of the namespace's RoleBindings.
pub struct Rules {
    cluster: Arc<[PolicyRule]>,
    local: Arc<[PolicyRule]>,
}

impl Rules {
    pub fn iter(&self) -> impl Iterator<Item = &PolicyRule> {
        self.cluster.iter().chain(self.local.iter())
    }
}

impl Default for Authorizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Authorizer {
    /// An authorizer that caches resolved rules (when the lookup reports `rbac_generation`).
    pub fn new() -> Self {
        Self {
            caching: true,
            cluster: Mutex::default(),
            local: Mutex::default(),
            resolutions: AtomicU64::new(0),
        }
    }

    /// One that resolves rules from the store on every call.
    pub fn uncached() -> Self {
        Self {
            caching: false,
            ..Self::new()
        }
    }

    /// How many rule sets were read from the store so far (the cache's misses).
    pub fn resolutions(&self) -> u64 {
        self.resolutions.load(Ordering::Relaxed)
    }

    /// The rules that apply to `user` in `namespace` (what [`rules_for`] reads).
    pub fn rules(
        &self,
        lookup: &dyn ObjectLookup,
        user: &UserInfo,
        namespace: Option<&str>,
    ) -> Rules {
        let key = UserKey {
            username: user.username.clone(),
            groups: user.groups.clone(),
        };
        // Each generation is read before the rules it validates are resolved: a write during
        // the resolution moves it, and the entry is never used.
        let cluster = self.cached(
            &self.cluster,
            key.clone(),
            lookup.rbac_generation(None),
            || cluster_rules(lookup, user),
        );
        let local = match namespace {
            Some(ns) => self.cached(
                &self.local,
                (key, ns.to_string()),
                lookup.rbac_generation(Some(ns)),
                || namespace_rules(lookup, user, ns),
            ),
            None => Arc::from([]),
        };
        Rules { cluster, local }
    }

    fn cached<K: Eq + Hash>(
        &self,
        map: &Mutex<HashMap<K, Cached>>,
        key: K,
        generation: Option<u64>,
        resolve: impl FnOnce() -> Vec<PolicyRule>,
    ) -> Arc<[PolicyRule]> {
        let Some(generation) = generation.filter(|_| self.caching) else {
            return self.resolve(resolve);
        };
        let lock = || map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = lock().get(&key).filter(|c| c.generation == generation) {
            return hit.rules.clone();
        }
        let rules = self.resolve(resolve);
        let mut entries = lock();
        if entries.len() >= MAX_CACHED_RULE_SETS {
            entries.clear();
        }
        // A concurrent request may have stored a newer resolution meanwhile; keep that one.
        if entries.get(&key).is_none_or(|c| c.generation < generation) {
            entries.insert(
                key,
                Cached {
                    generation,
                    rules: rules.clone(),
                },
            );
        }
        rules
    }

    fn resolve(&self, resolve: impl FnOnce() -> Vec<PolicyRule>) -> Arc<[PolicyRule]> {
        self.resolutions.fetch_add(1, Ordering::Relaxed);
        resolve().into()
    }

    /// Allows or denies a resource request; Err is the reason for the 403 message.
    pub fn authorize(
        &self,
        lookup: &dyn ObjectLookup,
        attrs: &RequestAttributes,
    ) -> Result<(), String> {
        authorize_with(self, lookup, attrs)
    }

    /// Allows or denies a request for a non-resource path (`/api`, `/version`, ...).
    pub fn authorize_non_resource(
        &self,
        lookup: &dyn ObjectLookup,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<(), String> {
        authorize_non_resource_with(self, lookup, user, verb, path)
    }

    /// `POST /apis/authorization.k8s.io/v1/{selfsubjectaccessreviews,subjectaccessreviews}`
    /// (what `kubectl auth can-i` uses): answers the review with `status.allowed`. A self
    /// review asks for `requester`; a SubjectAccessReview for `spec.user` and `spec.groups`.
    /// Err is a 400 message.
    pub fn handle_access_review(
        &self,
        lookup: &dyn ObjectLookup,
        requester: &UserInfo,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        handle_access_review_with(self, lookup, requester, body)
    }

    /// Escalation prevention for writes of RBAC objects, like the real API: a user may create
    /// or update a Role/ClusterRole only with rules it already holds (or the `escalate` verb),
    /// and a RoleBinding/ClusterRoleBinding only to a role whose rules it holds (or the `bind`
    /// verb). `object` is the object as it would be stored; Err is the reason for the 403.
    pub fn check_escalation(
        &self,
        lookup: &dyn ObjectLookup,
        user: &UserInfo,
        object: &serde_json::Value,
    ) -> Result<(), String> {
        check_escalation_with(self, lookup, user, object)
    }
}

/// [`Authorizer::authorize`], uncached.
pub fn authorize(lookup: &dyn ObjectLookup, attrs: &RequestAttributes) -> Result<(), String> {
    Authorizer::uncached().authorize(lookup, attrs)
}

/// [`Authorizer::authorize_non_resource`], uncached.
pub fn authorize_non_resource(
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    verb: &str,
    path: &str,
) -> Result<(), String> {
    Authorizer::uncached().authorize_non_resource(lookup, user, verb, path)
}

/// [`Authorizer::handle_access_review`], uncached.
pub fn handle_access_review(
    lookup: &dyn ObjectLookup,
    requester: &UserInfo,
    body: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    Authorizer::uncached().handle_access_review(lookup, requester, body)
}

/// [`Authorizer::check_escalation`], uncached.
pub fn check_escalation(
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    object: &serde_json::Value,
) -> Result<(), String> {
    Authorizer::uncached().check_escalation(lookup, user, object)
}

fn authorize_with(
    authz: &Authorizer,
    lookup: &dyn ObjectLookup,
    attrs: &RequestAttributes,
) -> Result<(), String> {
    if attrs.user.in_group(GROUP_MASTERS) {
        return Ok(());
    }
    let rules = authz.rules(lookup, &attrs.user, attrs.namespace.as_deref());
    if rules.iter().any(|rule| rule_allows_resource(rule, attrs)) {
        Ok(())
    } else {
        tracing::debug!(user = %attrs.user.username, verb = %attrs.verb, resource = %attrs.resource,
            namespace = ?attrs.namespace, name = ?attrs.name, "RBAC denied");
        Err(denial_reason(attrs))
    }
}

fn authorize_non_resource_with(
    authz: &Authorizer,
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    verb: &str,
    path: &str,
) -> Result<(), String> {
    if user.in_group(GROUP_MASTERS) {
        return Ok(());
    }
    let rules = authz.rules(lookup, user, None);
    let allowed = rules.iter().any(|rule| {
        has_or_all(&rule.verbs, verb)
            && rule
                .non_resource_urls
                .iter()
                .flatten()
                .any(|url| non_resource_url_matches(url, path))
    });
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "User {:?} cannot {verb} path {path:?}",
            user.username
        ))
    }
}

/// The full 403 message of the real API: `pods "x" is forbidden: <reason>`.
pub fn forbidden_message(attrs: &RequestAttributes, reason: &str) -> String {
    let qualified = if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    match &attrs.name {
        Some(name) => format!("{qualified} {name:?} is forbidden: {reason}"),
        None => format!("{qualified} is forbidden: {reason}"),
    }
}

/// The reason line of an RBAC denial, worded like the real API.
fn denial_reason(attrs: &RequestAttributes) -> String {
    let resource = match &attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.clone(),
    };
    let scope = match &attrs.namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "User {:?} cannot {} resource {resource:?} in API group {:?} {scope}",
        attrs.user.username, attrs.verb, attrs.api_group
    )
}

/// Every rule that applies to `user` in `namespace`: built-in rules, ClusterRoleBindings, and
/// (for a namespaced request) RoleBindings of that namespace. Read from the store, uncached.
pub fn rules_for(
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    namespace: Option<&str>,
) -> Vec<PolicyRule> {
    let mut rules = cluster_rules(lookup, user);
    if let Some(ns) = namespace {
        rules.extend(namespace_rules(lookup, user, ns));
    }
    rules
}

/// Rules that apply to `user` everywhere: built-in rules and ClusterRoleBindings.
fn cluster_rules(lookup: &dyn ObjectLookup, user: &UserInfo) -> Vec<PolicyRule> {
    let mut rules = builtin::rules_for_user(user);
    for binding in
        typed::<ClusterRoleBinding>(lookup.list(RBAC_API_VERSION, "ClusterRoleBinding", None))
    {
        if applies_to(binding.subjects.as_deref(), user, None) {
            rules.extend(role_ref_rules(lookup, &binding.role_ref, None).unwrap_or_default());
        }
    }
    rules
}

/// Rules that apply to `user` in `namespace` only: its RoleBindings.
fn namespace_rules(lookup: &dyn ObjectLookup, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for binding in
        typed::<RoleBinding>(lookup.list(RBAC_API_VERSION, "RoleBinding", Some(namespace)))
    {
        if applies_to(binding.subjects.as_deref(), user, Some(namespace)) {
            rules.extend(
                role_ref_rules(lookup, &binding.role_ref, Some(namespace)).unwrap_or_default(),
            );
        }
    }
    rules
}

/// Rules of the role a binding refers to; Err when the role does not exist.
fn role_ref_rules(
    lookup: &dyn ObjectLookup,
    role_ref: &RoleRef,
    namespace: Option<&str>,
) -> Result<Vec<PolicyRule>, String> {
    match (role_ref.kind.as_str(), namespace) {
        ("Role", Some(ns)) => lookup
            .get(RBAC_API_VERSION, "Role", Some(ns), &role_ref.name)
            .and_then(|role| serde_json::from_value::<Role>(role).ok())
            .map(|role| role.rules.unwrap_or_default())
            .ok_or_else(|| {
                format!(
                    "role.rbac.authorization.k8s.io {:?} not found",
                    role_ref.name
                )
            }),
        ("ClusterRole", _) => cluster_role_rules(lookup, &role_ref.name, &mut HashSet::new())
            .ok_or_else(|| {
                format!(
                    "clusterrole.rbac.authorization.k8s.io {:?} not found",
                    role_ref.name
                )
            }),
        (kind, _) => Err(format!("unsupported roleRef kind {kind:?}")),
    }
}

/// Rules of a ClusterRole; for an aggregated one, the union of the rules of the ClusterRoles its
/// selectors match (what the aggregation controller would write into it).
fn cluster_role_rules(
    lookup: &dyn ObjectLookup,
    name: &str,
    visited: &mut HashSet<String>,
) -> Option<Vec<PolicyRule>> {
    if !visited.insert(name.to_string()) {
        return Some(Vec::new());
    }
    let Some(stored) = lookup.get(RBAC_API_VERSION, "ClusterRole", None, name) else {
        return builtin::cluster_role(name);
    };
    let role: ClusterRole = serde_json::from_value(stored).ok()?;
    match role.aggregation_rule {
        Some(aggregation) => Some(aggregated_rules(lookup, &aggregation, visited)),
        None => Some(role.rules.unwrap_or_default()),
    }
}

fn aggregated_rules(
    lookup: &dyn ObjectLookup,
    aggregation: &AggregationRule,
    visited: &mut HashSet<String>,
) -> Vec<PolicyRule> {
    let selectors = aggregation
        .cluster_role_selectors
        .as_deref()
        .unwrap_or_default();
    let mut rules = Vec::new();
    for candidate in lookup.list(RBAC_API_VERSION, "ClusterRole", None) {
        let labels = object_labels(&candidate);
        let selected = selectors
            .iter()
            .any(|selector| label_selector_matches(selector, &labels).unwrap_or(false));
        let name = candidate.pointer("/metadata/name").and_then(|n| n.as_str());
        if let (true, Some(name)) = (selected, name) {
            rules.extend(cluster_role_rules(lookup, name, visited).unwrap_or_default());
        }
    }
    rules
}

/// Whether any subject of a binding is `user`. `namespace` is the RoleBinding's namespace,
/// which ServiceAccount subjects without a namespace default to.
fn applies_to(subjects: Option<&[Subject]>, user: &UserInfo, namespace: Option<&str>) -> bool {
    subjects
        .unwrap_or_default()
        .iter()
        .any(|subject| match subject.kind.as_str() {
            "User" => subject.name == user.username,
            "Group" => user.in_group(&subject.name),
            "ServiceAccount" => {
                let sa_namespace = subject
                    .namespace
                    .as_deref()
                    .filter(|ns| !ns.is_empty())
                    .or(namespace);
                match (sa_namespace, parse_service_account_username(&user.username)) {
                    (Some(sa_ns), Some((ns, name))) => sa_ns == ns && subject.name == name,
                    _ => false,
                }
            }
            _ => false,
        })
}

fn has_or_all(values: &[String], wanted: &str) -> bool {
    values.iter().any(|v| v == "*" || v == wanted)
}

fn rule_allows_resource(rule: &PolicyRule, attrs: &RequestAttributes) -> bool {
    has_or_all(&rule.verbs, &attrs.verb)
        && has_or_all(
            rule.api_groups.as_deref().unwrap_or_default(),
            &attrs.api_group,
        )
        && resource_matches(rule.resources.as_deref().unwrap_or_default(), attrs)
        && resource_name_matches(rule.resource_names.as_deref(), attrs.name.as_deref())
}

fn resource_matches(rule_resources: &[String], attrs: &RequestAttributes) -> bool {
    let combined = match &attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.clone(),
    };
    rule_resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || attrs
                .subresource
                .as_deref()
                .is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
    })
}

/// A rule without names covers every name; one with names only requests for those names.
fn resource_name_matches(rule_names: Option<&[String]>, name: Option<&str>) -> bool {
    match rule_names {
        None | Some([]) => true,
        Some(names) => name.is_some_and(|name| names.iter().any(|n| n == name)),
    }
}

fn non_resource_url_matches(rule_url: &str, path: &str) -> bool {
    rule_url == "*"
        || rule_url == path
        || rule_url
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

fn handle_access_review_with(
    authz: &Authorizer,
    lookup: &dyn ObjectLookup,
    requester: &UserInfo,
    body: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let kind = body
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("SelfSubjectAccessReview");
    let spec = body.get("spec").ok_or("spec is required")?;
    let text = |value: Option<&serde_json::Value>| {
        value
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let user = if kind == "SubjectAccessReview" {
        let groups = spec
            .get("groups")
            .and_then(|g| g.as_array())
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect();
        UserInfo {
            username: text(spec.get("user")),
            groups,
        }
    } else {
        requester.clone()
    };
    let allowed = if let Some(attrs) = spec.get("resourceAttributes") {
        let optional = |key: &str| Some(text(attrs.get(key))).filter(|v| !v.is_empty());
        let request = RequestAttributes {
            user,
            verb: text(attrs.get("verb")),
            api_group: text(attrs.get("group")),
            resource: text(attrs.get("resource")),
            subresource: optional("subresource"),
            namespace: optional("namespace"),
            name: optional("name"),
        };
        authorize_with(authz, lookup, &request).is_ok()
    } else if let Some(attrs) = spec.get("nonResourceAttributes") {
        let verb = text(attrs.get("verb"));
        authorize_non_resource_with(authz, lookup, &user, &verb, &text(attrs.get("path"))).is_ok()
    } else {
        return Err(
            "exactly one of nonResourceAttributes or resourceAttributes must be specified".into(),
        );
    };
    let mut review = body.clone();
    review["apiVersion"] = serde_json::json!("authorization.k8s.io/v1");
    review["kind"] = serde_json::json!(kind);
    review["status"] = serde_json::json!({"allowed": allowed});
    Ok(review)
}

fn check_escalation_with(
    authz: &Authorizer,
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    object: &serde_json::Value,
) -> Result<(), String> {
    let is_rbac = object.get("apiVersion").and_then(|v| v.as_str()) == Some(RBAC_API_VERSION);
    if !is_rbac || user.in_group(GROUP_MASTERS) {
        return Ok(());
    }
    let kind = object
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(|n| n.as_str());
    let name = object
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or_default();
    let rbac_attrs = |verb: &str, resource: &str, object_name: &str, namespace: Option<&str>| {
        RequestAttributes {
            user: user.clone(),
            verb: verb.to_string(),
            api_group: RBAC_GROUP.to_string(),
            resource: resource.to_string(),
            subresource: None,
            namespace: namespace.map(str::to_string),
            name: Some(object_name.to_string()),
        }
    };
    match kind {
        "Role" | "ClusterRole" => {
            let resource = if kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            let scope = if kind == "Role" { namespace } else { None };
            if authorize_with(
                authz,
                lookup,
                &rbac_attrs("escalate", resource, name, scope),
            )
            .is_ok()
            {
                return Ok(());
            }
            // A ClusterRole's aggregation rule can gather anything, so it takes full authority.
            let requested = if object.get("aggregationRule").is_some_and(|a| !a.is_null()) {
                builtin::cluster_role("cluster-admin").unwrap_or_default()
            } else {
                field_of::<Vec<PolicyRule>>(object, "rules", kind)?.unwrap_or_default()
            };
            confirm_no_escalation(authz, lookup, user, scope, &requested)
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let role_ref = &field_of::<RoleRef>(object, "roleRef", kind)?
                .ok_or_else(|| format!("{kind} {name:?} has no roleRef"))?;
            let scope = if kind == "RoleBinding" {
                namespace
            } else {
                None
            };
            let role_resource = if role_ref.kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            // `bind` on a ClusterRole may be granted in the binding's namespace or cluster-wide.
            if authorize_with(
                authz,
                lookup,
                &rbac_attrs("bind", role_resource, &role_ref.name, scope),
            )
            .is_ok()
            {
                return Ok(());
            }
            let requested = role_ref_rules(lookup, role_ref, scope)?;
            confirm_no_escalation(authz, lookup, user, scope, &requested)
        }
        _ => Ok(()),
    }
}

/// One field of an RBAC object, typed (the k8s-openapi object types insist on one `kind`).
fn field_of<T: serde::de::DeserializeOwned>(
    object: &serde_json::Value,
    field: &str,
    kind: &str,
) -> Result<Option<T>, String> {
    match object.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|e| format!("{kind}.{field} is malformed: {e}")),
    }
}

fn confirm_no_escalation(
    authz: &Authorizer,
    lookup: &dyn ObjectLookup,
    user: &UserInfo,
    namespace: Option<&str>,
    requested: &[PolicyRule],
) -> Result<(), String> {
    let held = authz.rules(lookup, user, namespace);
    let missing: Vec<PolicyRule> = requested
        .iter()
        .flat_map(breakdown)
        .filter(|atomic| !held.iter().any(|owner| rule_covers(owner, atomic)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    let missing: Vec<String> = missing.iter().map(describe_rule).collect();
    Err(format!(
        "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        user.username,
        groups.join(" "),
        missing.join("\n")
    ))
}

/// Splits a rule into rules of one group, resource, verb and name (or one URL and verb).
fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |v: &String| Some(vec![v.clone()]);
    let mut atoms = Vec::new();
    for group in rule.api_groups.iter().flatten() {
        for resource in rule.resources.iter().flatten() {
            for verb in &rule.verbs {
                let names = rule.resource_names.as_deref().unwrap_or_default();
                if names.is_empty() {
                    atoms.push(PolicyRule {
                        api_groups: one(group),
                        resources: one(resource),
                        verbs: vec![verb.clone()],
                        ..PolicyRule::default()
                    });
                }
                for name in names {
                    atoms.push(PolicyRule {
                        api_groups: one(group),
                        resources: one(resource),
                        resource_names: one(name),
                        verbs: vec![verb.clone()],
                        ..PolicyRule::default()
                    });
                }
            }
        }
    }
    for url in rule.non_resource_urls.iter().flatten() {
        for verb in &rule.verbs {
            atoms.push(PolicyRule {
                non_resource_urls: one(url),
                verbs: vec![verb.clone()],
                ..PolicyRule::default()
            });
        }
    }
    atoms
}

/// Whether `owner` grants everything `sub` does (a `*` in `sub` needs a `*` in `owner`).
fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let all_in = |set: &[String], wanted: &[String]| {
        set.iter().any(|v| v == "*") || wanted.iter().all(|w| set.contains(w))
    };
    let verbs = all_in(&owner.verbs, &sub.verbs);
    let groups = all_in(
        owner.api_groups.as_deref().unwrap_or_default(),
        sub.api_groups.as_deref().unwrap_or_default(),
    );
    let resources = resources_cover(
        owner.resources.as_deref().unwrap_or_default(),
        sub.resources.as_deref().unwrap_or_default(),
    );
    let urls = sub.non_resource_urls.iter().flatten().all(|wanted| {
        owner.non_resource_urls.iter().flatten().any(|url| {
            url == wanted
                || url
                    .strip_suffix('*')
                    .is_some_and(|prefix| wanted.starts_with(prefix))
        })
    });
    let owner_names = owner.resource_names.as_deref().unwrap_or_default();
    let sub_names = sub.resource_names.as_deref().unwrap_or_default();
    let names = owner_names.is_empty() || (!sub_names.is_empty() && all_in(owner_names, sub_names));
    verbs && groups && resources && urls && names
}

fn resources_cover(owner: &[String], wanted: &[String]) -> bool {
    if owner.iter().any(|r| r == "*") {
        return true;
    }
    wanted.iter().all(|w| {
        owner.contains(w)
            || w.split_once('/')
                .is_some_and(|(_, sub)| owner.iter().any(|r| r.strip_prefix("*/") == Some(sub)))
    })
}

fn describe_rule(rule: &PolicyRule) -> String {
    let list = |values: &[String]| {
        values
            .iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut parts = Vec::new();
    if let Some(urls) = &rule.non_resource_urls {
        parts.push(format!("NonResourceURLs:[{}]", list(urls)));
    } else {
        parts.push(format!(
            "APIGroups:[{}]",
            list(rule.api_groups.as_deref().unwrap_or_default())
        ));
        parts.push(format!(
            "Resources:[{}]",
            list(rule.resources.as_deref().unwrap_or_default())
        ));
        if let Some(names) = &rule.resource_names {
            parts.push(format!("ResourceNames:[{}]", list(names)));
        }
    }
    parts.push(format!("Verbs:[{}]", list(&rule.verbs)));
    format!("{{{}}}", parts.join(", "))
}

fn typed<T: serde::de::DeserializeOwned>(objects: Vec<serde_json::Value>) -> Vec<T> {
    objects
        .into_iter()
        .filter_map(|o| match serde_json::from_value(o) {
            Ok(typed) => Some(typed),
            Err(error) => {
                tracing::warn!(%error, "skipping malformed RBAC object");
                None
            }
        })
        .collect()
}

/// Defaults every real cluster has, which the stand-in does not store as objects.
pub mod builtin {
    use k8s_openapi::api::rbac::v1::PolicyRule;

    use crate::auth::{UserInfo, GROUP_AUTHENTICATED};

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        let strings = |values: &[&str]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            ..PolicyRule::default()
        }
    }

    fn urls(paths: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            non_resource_urls: Some(paths.iter().map(|p| p.to_string()).collect()),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        }
    }

    /// ClusterRoles that bindings may refer to without them being stored.
    pub fn cluster_role(name: &str) -> Option<Vec<PolicyRule>> {
        match name {
            "cluster-admin" => Some(vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])]),
            "system:auth-delegator" => Some(vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ]),
            "system:discovery" | "system:public-info-viewer" => Some(vec![discovery()]),
            "system:basic-user" => Some(basic_user()),
            "system:node" => Some(node()),
            _ => None,
        }
    }

    /// Rules bound by default: `system:discovery` and `system:basic-user` to every authenticated
    /// identity, and the node role to `system:nodes`.
    pub fn rules_for_user(user: &UserInfo) -> Vec<PolicyRule> {
        let mut rules = Vec::new();
        if user.in_group(GROUP_AUTHENTICATED) {
            rules.push(discovery());
            rules.extend(basic_user());
        }
        if user.in_group("system:nodes") {
            rules.extend(node());
        }
        rules
    }

    fn discovery() -> PolicyRule {
        urls(
            &[
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/version",
                "/version/",
                "/healthz",
                "/livez",
                "/readyz",
                "/openapi",
                "/openapi/*",
            ],
            &["get"],
        )
    }

    fn basic_user() -> Vec<PolicyRule> {
        vec![
            rule(
                &["authorization.k8s.io"],
                &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                &["create"],
            ),
            rule(
                &["authentication.k8s.io"],
                &["selfsubjectreviews"],
                &["create"],
            ),
        ]
    }

    /// What the local pod runner needs: it plays kubelet and the workload controllers, so it
    /// reads everything and writes pods, their status and the objects derived from workloads.
    fn node() -> Vec<PolicyRule> {
        vec![
            rule(&["*"], &["*"], &["get", "list", "watch"]),
            rule(
                &[""],
                &[
                    "pods",
                    "pods/status",
                    "pods/binding",
                    "pods/eviction",
                    "nodes",
                    "nodes/status",
                    "endpoints",
                    "events",
                ],
                &["create", "update", "patch", "delete"],
            ),
            rule(&[""], &["serviceaccounts/token"], &["create"]),
            rule(
                &["events.k8s.io"],
                &["events"],
                &["create", "update", "patch"],
            ),
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["create", "update", "patch", "delete"],
            ),
            rule(
                &["apps"],
                &[
                    "replicasets",
                    "replicasets/status",
                    "deployments/status",
                    "statefulsets/status",
                    "daemonsets/status",
                ],
                &["create", "update", "patch", "delete"],
            ),
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["create", "update", "patch", "delete"],
            ),
            rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
            rule(
                &["authorization.k8s.io"],
                &["subjectaccessreviews"],
                &["create"],
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::GROUP_AUTHENTICATED;
    use crate::lookup::tests::MemoryLookup;
    use serde_json::{json, Value};

    fn role(kind: &str, namespace: Option<&str>, name: &str, rules: Value) -> Value {
        let mut metadata = json!({"name": name});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        json!({"apiVersion": RBAC_API_VERSION, "kind": kind, "metadata": metadata, "rules": rules})
    }

    fn binding(
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        role_kind: &str,
        role: &str,
        subjects: Value,
    ) -> Value {
        let mut metadata = json!({"name": name});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        json!({
            "apiVersion": RBAC_API_VERSION, "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": role_kind, "name": role},
            "subjects": subjects,
        })
    }

    fn request(
        user: &UserInfo,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> RequestAttributes {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (resource.to_string(), None),
        };
        RequestAttributes {
            user: user.clone(),
            verb: verb.to_string(),
            api_group: group.to_string(),
            resource,
            subresource,
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.to_string(),
            groups: groups
                .iter()
                .map(|g| g.to_string())
                .chain([GROUP_AUTHENTICATED.to_string()])
                .collect(),
        }
    }

    #[test]
    fn strict_isolation_role_binding_reaches_only_its_namespace() {
        let store = MemoryLookup::with(vec![
            role(
                "Role",
                Some("blue"),
                "reader",
                json!([{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list", "watch"]}]),
            ),
            binding(
                "RoleBinding",
                Some("blue"),
                "reader",
                "Role",
                "reader",
                json!([{"kind": "ServiceAccount", "name": "xds", "namespace": "meshplane-blue"}]),
            ),
        ]);
        let sa = UserInfo::service_account("meshplane-blue", "xds");
        let other_sa = UserInfo::service_account("meshplane-green", "xds");

        assert_eq!(
            authorize(
                &store,
                &request(&sa, "list", "", "pods", Some("blue"), None)
            ),
            Ok(())
        );
        assert_eq!(
            authorize(
                &store,
                &request(&sa, "watch", "", "services", Some("blue"), None)
            ),
            Ok(())
        );
        assert_eq!(
            authorize(&store, &request(&sa, "list", "", "pods", Some("green"), None)),
            Err(r#"User "system:serviceaccount:meshplane-blue:xds" cannot list resource "pods" in API group "" in the namespace "green""#.to_string())
        );
        assert_eq!(
            authorize(&store, &request(&sa, "list", "", "pods", None, None)),
            Err(r#"User "system:serviceaccount:meshplane-blue:xds" cannot list resource "pods" in API group "" at the cluster scope"#.to_string())
        );
        assert!(authorize(
            &store,
            &request(&sa, "delete", "", "pods", Some("blue"), Some("p"))
        )
        .is_err());
        assert!(authorize(
            &store,
            &request(&sa, "get", "", "pods/log", Some("blue"), Some("p"))
        )
        .is_err());
        assert!(authorize(
            &store,
            &request(&other_sa, "list", "", "pods", Some("blue"), None)
        )
        .is_err());
    }

    #[test]
    fn cached_rules_are_reused_until_an_rbac_write() {
        let store = MemoryLookup::with(vec![role(
            "Role",
            Some("blue"),
            "pods-read",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
        )]);
        let grant = binding(
            "RoleBinding",
            Some("blue"),
            "alice-pods",
            "Role",
            "pods-read",
            json!([{"kind": "User", "name": "alice"}]),
        );
        let authorizer = Authorizer::new();
        let alice = user("alice", &[]);
        let list_blue = request(&alice, "list", "", "pods", Some("blue"), None);
        assert!(authorizer.authorize(&store, &list_blue).is_err());

        store.add(grant.clone());
        assert_eq!(authorizer.authorize(&store, &list_blue), Ok(()));
        let resolved = authorizer.resolutions();
        for _ in 0..3 {
            assert_eq!(authorizer.authorize(&store, &list_blue), Ok(()));
        }
        assert_eq!(
            authorizer.resolutions(),
            resolved,
            "answered from the cache"
        );
        // Another namespace: its RoleBindings are resolved, the cluster-wide part is reused.
        let list_green = request(&alice, "list", "", "pods", Some("green"), None);
        assert!(authorizer.authorize(&store, &list_green).is_err());
        assert_eq!(authorizer.resolutions(), resolved + 1);
        // Another identity (same name, other groups) is resolved on its own.
        let alice_ops = user("alice", &["ops"]);
        let list_blue_ops = request(&alice_ops, "list", "", "pods", Some("blue"), None);
        assert_eq!(authorizer.authorize(&store, &list_blue_ops), Ok(()));
        assert_eq!(authorizer.resolutions(), resolved + 3);

        store.remove("RoleBinding", "alice-pods");
        assert!(
            authorizer.authorize(&store, &list_blue).is_err(),
            "revoked on the very next request"
        );
        store.add(grant);
        assert_eq!(authorizer.authorize(&store, &list_blue), Ok(()));
    }

    #[test]
    fn an_uncached_authorizer_resolves_every_request() {
        let store = MemoryLookup::default();
        let authorizer = Authorizer::uncached();
        let bob = user("bob", &[]);
        for _ in 0..3 {
            assert!(authorizer
                .authorize(
                    &store,
                    &request(&bob, "get", "", "pods", Some("a"), Some("p"))
                )
                .is_err());
        }
        assert_eq!(authorizer.resolutions(), 6);
        // Masters are allowed without reading any rule.
        let admin = user("admin", &[GROUP_MASTERS]);
        assert!(authorizer
            .authorize(
                &store,
                &request(&admin, "get", "", "pods", Some("a"), Some("p"))
            )
            .is_ok());
        assert_eq!(authorizer.resolutions(), 6);
    }

    /// Every answer of a caching authorizer is the uncached one, through a series of RBAC
    /// writes: grants and revocations by Role, ClusterRole, both bindings, aggregation labels.
    #[test]
    fn cached_answers_are_the_uncached_ones() {
        let store = MemoryLookup::default();
        let authorizer = Authorizer::new();
        let users = [
            user("alice", &[]),
            user("bob", &["ops"]),
            UserInfo::service_account("blue", "app"),
        ];
        let namespaces = [None, Some("blue"), Some("green")];
        let check = |step: &str| {
            for u in &users {
                for ns in namespaces {
                    for (verb, resource) in [("list", "pods"), ("delete", "configmaps")] {
                        let attrs = request(u, verb, "", resource, ns, None);
                        assert_eq!(
                            authorizer.authorize(&store, &attrs),
                            authorize(&store, &attrs),
                            "{step}: {} {verb} {resource} in {ns:?}",
                            u.username
                        );
                    }
                    assert_eq!(
                        authorizer.authorize_non_resource(&store, u, "get", "/metrics"),
                        authorize_non_resource(&store, u, "get", "/metrics"),
                        "{step}: {} /metrics",
                        u.username
                    );
                }
            }
        };
        check("empty");
        store.add(role(
            "Role",
            Some("blue"),
            "pods",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
        ));
        store.add(binding(
            "RoleBinding",
            Some("blue"),
            "pods",
            "Role",
            "pods",
            json!([{"kind": "ServiceAccount", "name": "app"}, {"kind": "User", "name": "alice"}]),
        ));
        check("role binding");
        store.add(json!({"apiVersion": RBAC_API_VERSION, "kind": "ClusterRole", "metadata": {"name": "agg"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "yes"}}]}}));
        store.add(binding(
            "ClusterRoleBinding",
            None,
            "ops",
            "ClusterRole",
            "agg",
            json!([{"kind": "Group", "name": "ops"}]),
        ));
        check("empty aggregated role");
        let mut part = role(
            "ClusterRole",
            None,
            "cm",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete"]}, {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        );
        part["metadata"]["labels"] = json!({"agg": "yes"});
        store.add(part);
        check("aggregated part");
        store.add(binding(
            "RoleBinding",
            Some("green"),
            "cm",
            "ClusterRole",
            "cm",
            json!([{"kind": "User", "name": "alice"}]),
        ));
        check("cluster role bound in one namespace");
        store.remove("ClusterRole", "cm");
        check("cluster role gone");
        store.remove("RoleBinding", "pods");
        check("role bindings gone");
        store.remove("ClusterRoleBinding", "ops");
        check("cluster role binding gone");
    }

    #[test]
    fn service_account_subject_defaults_to_binding_namespace() {
        let store = MemoryLookup::with(vec![
            role(
                "Role",
                Some("blue"),
                "r",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
            ),
            binding(
                "RoleBinding",
                Some("blue"),
                "b",
                "Role",
                "r",
                json!([{"kind": "ServiceAccount", "name": "app"}]),
            ),
        ]);
        let local = UserInfo::service_account("blue", "app");
        let foreign = UserInfo::service_account("green", "app");
        assert!(authorize(
            &store,
            &request(&local, "get", "", "configmaps", Some("blue"), Some("c"))
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&foreign, "get", "", "configmaps", Some("blue"), Some("c"))
        )
        .is_err());
    }

    #[test]
    fn resource_names_restrict_named_requests_only() {
        let store = MemoryLookup::with(vec![
            role(
                "Role",
                Some("blue"),
                "one-cm",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["boot"], "verbs": ["get", "list", "watch", "update", "create"]}]),
            ),
            binding(
                "RoleBinding",
                Some("blue"),
                "b",
                "Role",
                "one-cm",
                json!([{"kind": "User", "name": "alice"}]),
            ),
        ]);
        let alice = user("alice", &[]);
        assert!(authorize(
            &store,
            &request(&alice, "get", "", "configmaps", Some("blue"), Some("boot"))
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(
                &alice,
                "update",
                "",
                "configmaps",
                Some("blue"),
                Some("boot")
            )
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&alice, "get", "", "configmaps", Some("blue"), Some("other"))
        )
        .is_err());
        // Unfiltered list/watch and create carry no name, so a names-restricted rule grants none.
        assert!(authorize(
            &store,
            &request(&alice, "list", "", "configmaps", Some("blue"), None)
        )
        .is_err());
        assert!(authorize(
            &store,
            &request(&alice, "create", "", "configmaps", Some("blue"), None)
        )
        .is_err());
        // A list filtered by metadata.name=boot is a named request.
        assert!(authorize(
            &store,
            &request(
                &alice,
                "watch",
                "",
                "configmaps",
                Some("blue"),
                Some("boot")
            )
        )
        .is_ok());
    }

    #[test]
    fn cluster_role_binding_grants_everywhere_role_binding_of_cluster_role_only_locally() {
        let store = MemoryLookup::with(vec![
            role(
                "ClusterRole",
                None,
                "ns-reader",
                json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]),
            ),
            role(
                "ClusterRole",
                None,
                "cm-editor",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
            ),
            binding(
                "ClusterRoleBinding",
                None,
                "op-ns",
                "ClusterRole",
                "ns-reader",
                json!([{"kind": "Group", "name": "operators"}]),
            ),
            binding(
                "RoleBinding",
                Some("blue"),
                "op-cm",
                "ClusterRole",
                "cm-editor",
                json!([{"kind": "Group", "name": "operators"}]),
            ),
        ]);
        let op = user("op", &["operators"]);
        assert!(authorize(&store, &request(&op, "list", "", "namespaces", None, None)).is_ok());
        assert!(authorize(
            &store,
            &request(&op, "get", "", "namespaces", Some("green"), Some("green"))
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&op, "delete", "", "configmaps", Some("blue"), Some("x"))
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&op, "delete", "", "configmaps", Some("green"), Some("x"))
        )
        .is_err());
        assert!(authorize(&store, &request(&op, "list", "", "configmaps", None, None)).is_err());
        assert!(authorize(
            &store,
            &request(&user("bob", &[]), "list", "", "namespaces", None, None)
        )
        .is_err());
    }

    #[test]
    fn aggregated_cluster_role_follows_labels() {
        let store = MemoryLookup::with(vec![
            json!({"apiVersion": RBAC_API_VERSION, "kind": "ClusterRole", "metadata": {"name": "mesh-view"},
                "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"meshplane.io/aggregate-to-view": "true"}}]}}),
            binding(
                "ClusterRoleBinding",
                None,
                "viewers",
                "ClusterRole",
                "mesh-view",
                json!([{"kind": "User", "name": "carol"}]),
            ),
        ]);
        let carol = user("carol", &[]);
        let get_mcp = request(
            &carol,
            "get",
            "meshplane.io",
            "meshcontrolplanes",
            None,
            Some("blue"),
        );
        assert!(authorize(&store, &get_mcp).is_err());
        let mut part = role(
            "ClusterRole",
            None,
            "mcp-view",
            json!([{"apiGroups": ["meshplane.io"], "resources": ["meshcontrolplanes"], "verbs": ["get"]}]),
        );
        part["metadata"]["labels"] = json!({"meshplane.io/aggregate-to-view": "true"});
        store.add(part);
        store.add(role(
            "ClusterRole",
            None,
            "unlabelled",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        ));
        assert!(authorize(&store, &get_mcp).is_ok());
        assert!(authorize(
            &store,
            &request(
                &carol,
                "delete",
                "meshplane.io",
                "meshcontrolplanes",
                None,
                Some("blue")
            )
        )
        .is_err());
    }

    #[test]
    fn subresources_and_wildcards() {
        let store = MemoryLookup::with(vec![
            role(
                "ClusterRole",
                None,
                "status-writer",
                json!([
                    {"apiGroups": ["meshplane.io"], "resources": ["meshcontrolplanes/status"], "verbs": ["update", "patch"]},
                    {"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get"]},
                ]),
            ),
            binding(
                "ClusterRoleBinding",
                None,
                "sw",
                "ClusterRole",
                "status-writer",
                json!([{"kind": "User", "name": "op"}]),
            ),
        ]);
        let op = user("op", &[]);
        assert!(authorize(
            &store,
            &request(
                &op,
                "patch",
                "meshplane.io",
                "meshcontrolplanes/status",
                None,
                Some("a")
            )
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(
                &op,
                "patch",
                "meshplane.io",
                "meshcontrolplanes",
                None,
                Some("a")
            )
        )
        .is_err());
        assert!(authorize(
            &store,
            &request(
                &op,
                "get",
                "apps",
                "deployments/scale",
                Some("x"),
                Some("d")
            )
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&op, "get", "apps", "deployments", Some("x"), Some("d"))
        )
        .is_err());
    }

    #[test]
    fn masters_and_missing_roles() {
        let store = MemoryLookup::with(vec![binding(
            "ClusterRoleBinding",
            None,
            "dangling",
            "ClusterRole",
            "does-not-exist",
            json!([{"kind": "User", "name": "dave"}]),
        )]);
        let admin = user("admin", &[GROUP_MASTERS]);
        assert!(authorize(
            &store,
            &request(&admin, "deletecollection", "x.io", "things", None, None)
        )
        .is_ok());
        assert!(authorize(
            &store,
            &request(&user("dave", &[]), "get", "", "pods", Some("a"), Some("p"))
        )
        .is_err());
    }

    #[test]
    fn discovery_paths_for_authenticated_identities() {
        let store = MemoryLookup::default();
        let sa = UserInfo::service_account("blue", "app");
        for path in [
            "/api",
            "/apis",
            "/apis/meshplane.io/v1alpha1",
            "/version",
            "/openapi/v3",
        ] {
            assert_eq!(
                authorize_non_resource(&store, &sa, "get", path),
                Ok(()),
                "{path}"
            );
        }
        assert_eq!(
            authorize_non_resource(&store, &sa, "get", "/metrics"),
            Err(r#"User "system:serviceaccount:blue:app" cannot get path "/metrics""#.to_string())
        );
        let anonymous = UserInfo {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        };
        assert!(authorize_non_resource(&store, &anonymous, "get", "/apis").is_err());
    }

    #[test]
    fn forbidden_message_names_the_object() {
        let sa = UserInfo::service_account("blue", "app");
        let named = request(
            &sa,
            "get",
            "meshplane.io",
            "meshcontrolplanes",
            None,
            Some("blue"),
        );
        assert_eq!(
            forbidden_message(&named, "R"),
            r#"meshcontrolplanes.meshplane.io "blue" is forbidden: R"#
        );
        let unnamed = request(&sa, "list", "", "pods", Some("green"), None);
        assert_eq!(forbidden_message(&unnamed, "R"), "pods is forbidden: R");
    }

    #[test]
    fn access_reviews_answer_can_i() {
        let store = MemoryLookup::with(vec![
            role(
                "Role",
                Some("blue"),
                "r",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
            ),
            binding(
                "RoleBinding",
                Some("blue"),
                "b",
                "Role",
                "r",
                json!([{"kind": "User", "name": "alice"}]),
            ),
        ]);
        let alice = user("alice", &[]);
        let self_review = |ns: &str| {
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": ns, "verb": "list", "resource": "pods"}}})
        };
        let answer = handle_access_review(&store, &alice, &self_review("blue")).unwrap();
        assert_eq!(answer["status"], json!({"allowed": true}));
        let answer = handle_access_review(&store, &alice, &self_review("green")).unwrap();
        assert_eq!(answer["status"], json!({"allowed": false}));

        let admin = user("admin", &[GROUP_MASTERS]);
        let for_alice = json!({"kind": "SubjectAccessReview", "spec": {"user": "alice", "groups": [],
            "resourceAttributes": {"namespace": "green", "verb": "list", "resource": "pods"}}});
        assert_eq!(
            handle_access_review(&store, &admin, &for_alice).unwrap()["status"]["allowed"],
            false
        );
        let path = json!({"kind": "SelfSubjectAccessReview", "spec": {"nonResourceAttributes": {"path": "/apis", "verb": "get"}}});
        assert_eq!(
            handle_access_review(&store, &alice, &path).unwrap()["status"]["allowed"],
            true
        );
        assert!(handle_access_review(&store, &alice, &json!({"spec": {}})).is_err());
    }

    #[test]
    fn escalation_prevention_for_roles_and_bindings() {
        let store = MemoryLookup::with(vec![
            role(
                "ClusterRole",
                None,
                "operator",
                json!([
                    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update"]},
                    {"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list", "watch"]},
                ]),
            ),
            binding(
                "ClusterRoleBinding",
                None,
                "operator",
                "ClusterRole",
                "operator",
                json!([{"kind": "ServiceAccount", "name": "op", "namespace": "sys"}]),
            ),
            role(
                "ClusterRole",
                None,
                "secrets-admin",
                json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]),
            ),
        ]);
        let op = UserInfo::service_account("sys", "op");
        let allowed_role = role(
            "Role",
            Some("blue"),
            "r",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]),
        );
        assert_eq!(check_escalation(&store, &op, &allowed_role), Ok(()));

        let escalating = role(
            "Role",
            Some("blue"),
            "r",
            json!([{"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["list"]}]),
        );
        let err = check_escalation(&store, &op, &escalating).unwrap_err();
        assert!(
            err.contains("attempting to grant RBAC permissions not currently held"),
            "{err}"
        );
        assert!(
            err.contains(r#"{APIGroups:[""], Resources:["secrets"], Verbs:["list"]}"#),
            "{err}"
        );
        assert!(!err.contains(r#"Resources:["pods"]"#), "{err}");

        // A `*` verb is only covered by a `*` the user holds.
        let wildcard = role(
            "Role",
            Some("blue"),
            "r",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]),
        );
        assert!(check_escalation(&store, &op, &wildcard).is_err());

        let bind_secrets = binding(
            "RoleBinding",
            Some("blue"),
            "b",
            "ClusterRole",
            "secrets-admin",
            json!([{"kind": "User", "name": "x"}]),
        );
        assert!(check_escalation(&store, &op, &bind_secrets).is_err());
        store.add(role("ClusterRole", None, "binder", json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["secrets-admin"]}])));
        store.add(binding(
            "RoleBinding",
            Some("blue"),
            "op-binder",
            "ClusterRole",
            "binder",
            json!([{"kind": "ServiceAccount", "name": "op", "namespace": "sys"}]),
        ));
        assert_eq!(check_escalation(&store, &op, &bind_secrets), Ok(()));
        // `bind` granted in blue does not extend to green.
        let mut in_green = bind_secrets.clone();
        in_green["metadata"]["namespace"] = json!("green");
        assert!(check_escalation(&store, &op, &in_green).is_err());

        let aggregated = json!({"apiVersion": RBAC_API_VERSION, "kind": "ClusterRole", "metadata": {"name": "agg"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]}});
        assert!(check_escalation(&store, &op, &aggregated).is_err());
        assert!(check_escalation(&store, &user("admin", &[GROUP_MASTERS]), &aggregated).is_ok());
    }
}
