//! External authorization (`action: CUSTOM`): the tenant's ext_authz providers
//! (`meshConfig.extensionProviders`) resolved in the tenant's own registry, and the Envoy
//! filters that send the requests a CUSTOM policy's rules match to them.
//!
//! Only requests the rules match reach the authorizer. As in Istio, an RBAC HTTP filter with
//! the CUSTOM policies' rules as *shadow* rules (`istio-ext-authz-...`, stat prefix
//! `istio_ext_authz_`) runs first: it enforces nothing and writes the policy that matched into
//! the request's dynamic metadata (`envoy.filters.http.rbac`,
//! `istio_ext_authz_shadow_effective_policy_id`); the `envoy.filters.http.ext_authz` filter
//! that follows is enabled only when that metadata names a CUSTOM rule
//! (`filter_enabled_metadata`). Rules are evaluated per request, on every attribute a rule may
//! use (peer identity, headers, paths, `when` conditions), which per-route disabling could not
//! express.
//!
//! On a chain without HTTP (a TCP port), a CUSTOM policy of a gRPC provider works the same way
//! with the network filters: a network RBAC filter with the shadow rules (metadata namespace
//! `envoy.filters.network.rbac`), then `envoy.filters.network.ext_authz`, which asks the
//! authorizer once per connection, before any byte reaches the workload. A CUSTOM policy of an
//! HTTP provider denies the connections its rules match there (fail closed).
//!
//! A provider resolves when it is declared, is `envoyExtAuthzHttp` or `envoyExtAuthzGrpc`, and
//! its `service` is a host of the tenant's registry (a Service of a member namespace, or a
//! ServiceEntry of the tenant) with that port. The registry holds nothing of other tenants, so a
//! provider outside the tenant never resolves.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType;
use envoy_types::pb::envoy::config::core::v3::{
    GrpcService, HeaderValue as CoreHeaderValue, HttpUri,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ext_authz::Services;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationRequest, AuthorizationResponse, BufferSettings, ExtAuthz, HttpService,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::{path_segment, PathSegment};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, StringMatcher, ValueMatcher,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::util::pack_any;
use meshplane_crds::providers::{
    parse_service, status_code, ExtAuthzGrpcProvider, ExtAuthzHttpProvider, ProviderKind,
    RequestBodyInCheck,
};
use meshplane_crds::security::authorization::{AuthorizationAction, AuthorizationPolicy};

use super::cluster_id::HostPort;
use super::registry::{Registry, ServiceModel};

/// Name of Envoy's ext_authz HTTP filter.
pub const HTTP_EXT_AUTHZ_FILTER: &str = "envoy.filters.http.ext_authz";
/// Prefix of the CUSTOM policies' rule names in the shadow RBAC filter.
pub const SHADOW_POLICY_PREFIX: &str = "istio-ext-authz-";
/// Dynamic-metadata namespace the RBAC HTTP filter writes.
pub const RBAC_METADATA_NAMESPACE: &str = "envoy.filters.http.rbac";
/// Envoy's default timeout of a check, as Istio's (10 minutes).
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 600;

/// The shadow rules' stat prefix of the `index`-th provider of a workload: Istio's
/// `istio_ext_authz_` for the first.
pub fn shadow_stat_prefix(index: usize) -> String {
    if index == 0 {
        "istio_ext_authz_".to_string()
    } else {
        format!("istio_ext_authz_{index}_")
    }
}

/// An ext_authz provider of the tenant, resolved to the cluster of its host and port.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedProvider<'a> {
    /// Its name in `meshConfig.extensionProviders`.
    pub name: String,
    /// HTTP or gRPC, with its settings.
    pub kind: ExtAuthzKind<'a>,
    /// The host the service names in the registry.
    pub service: &'a ServiceModel,
    /// Its port.
    pub port: u32,
}

/// The protocol of an ext_authz provider.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExtAuthzKind<'a> {
    Http(&'a ExtAuthzHttpProvider),
    Grpc(&'a ExtAuthzGrpcProvider),
}

impl ResolvedProvider<'_> {
    /// The outbound cluster the proxy reaches the authorizer through.
    pub fn cluster(&self) -> String {
        HostPort::new(&self.service.hostname, self.port).cluster_name()
    }
}

/// Resolves provider `name` in the tenant's mesh config and registry; `Err` says why it
/// cannot be used (for the policy's status and the deny-all rule's name).
pub fn resolve<'a>(registry: &'a Registry, name: &str) -> Result<ResolvedProvider<'a>, String> {
    let Some(provider) = registry.mesh_config.extension_provider(name) else {
        return Err(format!(
            "no extension provider {name:?} is declared in the tenant's meshConfig.extensionProviders"
        ));
    };
    let (kind, service, port) = match provider.kind() {
        Some(ProviderKind::ExtAuthzHttp(h)) => (ExtAuthzKind::Http(h), &h.service, h.port),
        Some(ProviderKind::ExtAuthzGrpc(g)) => (ExtAuthzKind::Grpc(g), &g.service, g.port),
        Some(other) => {
            return Err(format!(
                "extension provider {name:?} is of kind {}, not an external authorizer (envoyExtAuthzHttp or envoyExtAuthzGrpc)",
                other.field()
            ))
        }
        None => return Err(format!("extension provider {name:?} is invalid")),
    };
    let parsed = parse_service(service, "service")
        .map_err(|e| format!("extension provider {name:?}: {e}"))?;
    let found = registry.services_named(&parsed.host).find(|s| {
        parsed
            .namespace
            .as_deref()
            .is_none_or(|ns| s.namespace == ns)
    });
    let Some(svc) = found else {
        return Err(format!(
            "extension provider {name:?} names {service:?}, which is no Service or ServiceEntry host of the tenant"
        ));
    };
    if !svc.ports.iter().any(|p| p.port == port) {
        return Err(format!(
            "extension provider {name:?}: {} has no port {port}",
            svc.hostname
        ));
    }
    Ok(ResolvedProvider {
        name: name.to_string(),
        kind,
        service: svc,
        port,
    })
}

/// The ext_authz providers the workload's CUSTOM policies name, each resolved or with why it
/// cannot be used. Dry-run policies name none (they are not applied).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CustomProviders<'a> {
    pub by_name: BTreeMap<String, Result<ResolvedProvider<'a>, String>>,
}

impl<'a> CustomProviders<'a> {
    /// Resolves the providers of `policies`' CUSTOM policies.
    pub fn of(registry: &'a Registry, policies: &[&AuthorizationPolicy]) -> Self {
        let mut by_name = BTreeMap::new();
        for p in policies {
            if p.spec.action != AuthorizationAction::Custom {
                continue;
            }
            let name = p
                .spec
                .provider
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_default();
            by_name
                .entry(name.clone())
                .or_insert_with(|| resolve(registry, &name));
        }
        Self { by_name }
    }

    /// Why the provider of a CUSTOM policy cannot be used, if it cannot.
    pub fn problem(&self, policy: &AuthorizationPolicy) -> Option<&str> {
        let name = policy.spec.provider.as_ref().map(|p| p.name.as_str())?;
        match self.by_name.get(name) {
            Some(Ok(_)) => None,
            Some(Err(why)) => Some(why),
            None => Some("the provider was not resolved"),
        }
    }

    /// The resolved providers, in name order.
    pub fn resolved(&self) -> impl Iterator<Item = &ResolvedProvider<'a>> {
        self.by_name.values().filter_map(|r| r.as_ref().ok())
    }
}

fn duration(value: Option<&meshplane_crds::duration::Duration>) -> PbDuration {
    match value {
        Some(d) => PbDuration {
            seconds: i64::try_from(d.get().as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.get().subsec_nanos()).unwrap_or(0),
        },
        None => PbDuration {
            seconds: DEFAULT_TIMEOUT_SECONDS,
            nanos: 0,
        },
    }
}

fn http_status(code: Option<&str>) -> Option<HttpStatus> {
    let code = code.and_then(status_code)?;
    let code = i32::try_from(code).ok()?;
    StatusCode::try_from(code)
        .ok()
        .map(|c| HttpStatus { code: c as i32 })
}

/// `exact`, `prefix*` or `*suffix` as an Envoy string matcher (header names ignore case).
fn header_pattern(value: &str) -> StringMatcher {
    let pattern = if let Some(prefix) = value.strip_suffix('*') {
        MatchPattern::Prefix(prefix.to_string())
    } else if let Some(suffix) = value.strip_prefix('*') {
        MatchPattern::Suffix(suffix.to_string())
    } else {
        MatchPattern::Exact(value.to_string())
    };
    StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: true,
    }
}

fn header_list(values: &[String]) -> Option<ListStringMatcher> {
    (!values.is_empty()).then(|| ListStringMatcher {
        patterns: values.iter().map(|v| header_pattern(v)).collect(),
    })
}

fn body(settings: Option<&RequestBodyInCheck>) -> Option<BufferSettings> {
    settings.map(|b| BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

/// Enables a filter only for requests whose shadow RBAC result (stat prefix `prefix`) names a
/// CUSTOM rule.
fn enabled_by_shadow(prefix: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: RBAC_METADATA_NAMESPACE.to_string(),
        path: vec![PathSegment {
            segment: Some(path_segment::Segment::Key(format!(
                "{prefix}shadow_effective_policy_id"
            ))),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(ValuePattern::StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Prefix(SHADOW_POLICY_PREFIX.to_string())),
                ignore_case: false,
            })),
        }),
        invert: false,
    }
}

/// Name of Envoy's ext_authz network filter.
pub const NETWORK_EXT_AUTHZ_FILTER: &str = "envoy.filters.network.ext_authz";
/// Dynamic-metadata namespace the RBAC network filter writes.
pub const NETWORK_RBAC_METADATA_NAMESPACE: &str = "envoy.filters.network.rbac";

/// The network ext_authz filter calling gRPC provider `provider` for each connection the
/// shadow RBAC network filter of stat prefix `prefix` matched; `None` for an HTTP provider
/// (Envoy asks only gRPC authorizers about connections). The check carries the connection's
/// addresses and the peer's identity; `failOpen` and `timeout` as the provider says.
pub fn network_ext_authz_filter(
    provider: &ResolvedProvider<'_>,
    prefix: &str,
) -> Option<envoy_types::pb::envoy::config::listener::v3::Filter> {
    use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
    let ExtAuthzKind::Grpc(g) = provider.kind else {
        return None;
    };
    let mut enabled = enabled_by_shadow(prefix);
    enabled.filter = NETWORK_RBAC_METADATA_NAMESPACE.to_string();
    let config = NetworkExtAuthz {
        stat_prefix: format!("ext_authz_{}", provider.name.replace(['.', '/'], "_")),
        grpc_service: Some(GrpcService {
            timeout: Some(duration(g.timeout.as_ref())),
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: provider.cluster(),
                authority: provider.service.hostname.clone(),
                ..Default::default()
            })),
            ..Default::default()
        }),
        failure_mode_allow: g.fail_open,
        include_peer_certificate: true,
        // Envoy's enum: V3.
        transport_api_version: 2,
        filter_enabled_metadata: Some(enabled),
        ..Default::default()
    };
    Some(envoy_types::pb::envoy::config::listener::v3::Filter {
        name: NETWORK_EXT_AUTHZ_FILTER.to_string(),
        config_type: Some(ConfigType::TypedConfig(pack_any(config))),
    })
}

/// The ext_authz filter calling `provider`, enabled by the shadow RBAC filter of stat prefix
/// `prefix`: failOpen, statusOnError, timeout, body and headers as the provider says.
pub fn ext_authz_filter(provider: &ResolvedProvider<'_>, prefix: &str) -> HttpFilter {
    let cluster = provider.cluster();
    let host = provider.service.hostname.clone();
    let mut config = ExtAuthz {
        // Envoy's enum: V3.
        transport_api_version: 2,
        filter_enabled_metadata: Some(enabled_by_shadow(prefix)),
        stat_prefix: format!("ext_authz_{}", provider.name.replace(['.', '/'], "_")),
        ..Default::default()
    };
    match provider.kind {
        ExtAuthzKind::Http(h) => {
            config.failure_mode_allow = h.fail_open;
            config.clear_route_cache = h.clear_route_cache;
            config.status_on_error = http_status(h.status_on_error.as_deref());
            config.with_request_body = body(h.include_request_body_in_check.as_ref());
            let mut included = h.include_request_headers_in_check.clone();
            included.extend(h.include_headers_in_check.iter().cloned());
            config.allowed_headers = header_list(&included);
            config.services = Some(Services::HttpService(HttpService {
                server_uri: Some(HttpUri {
                    uri: format!("http://{host}:{}", provider.port),
                    timeout: Some(duration(h.timeout.as_ref())),
                    http_upstream_type: Some(HttpUpstreamType::Cluster(cluster)),
                }),
                path_prefix: h.path_prefix.clone().unwrap_or_default(),
                authorization_request: (!h.include_additional_headers_in_check.is_empty()).then(
                    || AuthorizationRequest {
                        headers_to_add: h
                            .include_additional_headers_in_check
                            .iter()
                            .map(|(k, v)| CoreHeaderValue {
                                key: k.clone(),
                                value: v.clone(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    },
                ),
                authorization_response: Some(AuthorizationResponse {
                    allowed_upstream_headers: header_list(&h.headers_to_upstream_on_allow),
                    allowed_client_headers: header_list(&h.headers_to_downstream_on_deny),
                    allowed_client_headers_on_success: header_list(
                        &h.headers_to_downstream_on_allow,
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }));
        }
        ExtAuthzKind::Grpc(g) => {
            config.failure_mode_allow = g.fail_open;
            config.clear_route_cache = g.clear_route_cache;
            config.status_on_error = http_status(g.status_on_error.as_deref());
            config.with_request_body = body(g.include_request_body_in_check.as_ref());
            config.services = Some(Services::GrpcService(GrpcService {
                timeout: Some(duration(g.timeout.as_ref())),
                target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                    cluster_name: cluster,
                    authority: host,
                    ..Default::default()
                })),
                ..Default::default()
            }));
        }
    }
    HttpFilter {
        name: HTTP_EXT_AUTHZ_FILTER.to_string(),
        config_type: Some(HttpFilterConfig::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}
