//! Config validation: the shared semantic rules of `meshplane_crds::validation` plus the
//! tenant-boundary rules, for `ServiceEntry`, `EnvoyFilter` and `Sidecar`.
//!
//! Tenant-boundary rules (see `docs/webhooks.md`):
//! - `ServiceEntry.spec.exportTo` and `Sidecar.spec.egress[].hosts` may name only namespaces of
//!   the tenant (members and the control namespace); `.`, `*` and `~` keep their meanings and
//!   `*` means "every namespace of the tenant".
//! - A `ServiceEntry` endpoint IP inside the cluster's pod network must be a pod of the tenant
//!   (when the [`TenantView`] knows the pod network); the refusal names no other tenant or pod.
//! - An `EnvoyFilter`'s reach is decided by where it lives: outside the control namespace it
//!   applies to its own namespace's proxies only (the translator enforces that). The webhook
//!   therefore rejects the Istio fields that select proxies by anything else (`targetRefs`,
//!   `targetRef`, `configPatches[].match.proxy`) in every namespace, and patches that match a
//!   Kubernetes service (`<svc>.<ns>.svc...`) of a namespace outside the tenant.
//! - An `EnvoyFilter` must also stay within the tenant's EnvoyFilter policy
//!   (`spec.meshConfig.envoyFilterPolicy`: namespaces, contexts, targets, operations, filter
//!   types, Lua, added clusters; `meshplane_crds::envoyfilter_policy`), the same check the
//!   instance applies again when it translates.
//!
//! - `VirtualService`, `DestinationRule` and `Gateway` may reference only the tenant: `exportTo`,
//!   hosts and destinations of Kubernetes services (`<svc>.<ns>.svc...`), gateways
//!   (`<ns>/<gateway>`), `sourceNamespace`, and a Gateway server's `<ns>/<host>` must name
//!   tenant namespaces. A DestinationRule's `tls.mode: ISTIO_MUTUAL` is the tenant's mutual
//!   TLS (every tenant has workload identity, contract 11); on a Gateway server it is refused:
//!   the ingress gateway does not terminate the tenant's mutual TLS.
//!
//! - `PeerAuthentication` (`security.meshplane.io`): the modes are the schema's; beyond it,
//!   `portLevelMtls` needs a `selector`, and a `selector` in the control namespace is refused
//!   (there the policy is tenant-wide and Istio ignores the selector): both would otherwise be
//!   silently ignored, which for a STRICT policy means plaintext the admin did not expect.
//! - `AuthorizationPolicy` (group `security.meshplane.io`) may name only peers that could
//!   authenticate to the tenant: principals of its trust domain and namespaces of the tenant
//!   (`meshplane_crds::validation::authorization::foreign_references`); CUSTOM without a
//!   provider, and `targetRef`, are refused.
//!
//! The namespace of the object itself is not checked: the webhook configuration calls this
//! instance only for namespaces attached to its revision.

use meshplane_crds::envoyfilter_policy::{self, PolicyViolation};
use meshplane_crds::networking::virtual_service::Destination;
use meshplane_crds::networking::{
    DestinationRuleSpec, EnvoyFilterSpec, GatewaySpec, ServiceEntrySpec, SidecarSpec,
    VirtualServiceSpec,
};
use meshplane_crds::security::PeerAuthenticationSpec;
use meshplane_crds::validation::{self, ValidationError};
use serde_json::Value;

use crate::tenant::TenantView;

/// API group of the networking config.
pub const NETWORKING_GROUP: &str = "networking.meshplane.io";
/// API group of the security config.
pub const SECURITY_GROUP: &str = "security.meshplane.io";
/// API group of the telemetry config.
pub const TELEMETRY_GROUP: &str = "telemetry.meshplane.io";

/// The config kinds this webhook validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    /// `ServiceEntry`.
    ServiceEntry,
    /// `EnvoyFilter`.
    EnvoyFilter,
    /// `Sidecar`.
    Sidecar,
    /// `VirtualService`.
    VirtualService,
    /// `DestinationRule`.
    DestinationRule,
    /// `Gateway`.
    Gateway,
    /// `PeerAuthentication` (group `security.meshplane.io`).
    PeerAuthentication,
    /// `AuthorizationPolicy` (security group).
    AuthorizationPolicy,
    /// `Telemetry` (group `telemetry.meshplane.io`).
    Telemetry,
    /// `RequestAuthentication` (security group).
    RequestAuthentication,
}

impl ConfigKind {
    /// The kind for an API group and kind name, if this webhook validates it.
    pub fn from_group_kind(group: &str, kind: &str) -> Option<Self> {
        if group == SECURITY_GROUP {
            return match kind {
                "PeerAuthentication" => Some(ConfigKind::PeerAuthentication),
                "AuthorizationPolicy" => Some(ConfigKind::AuthorizationPolicy),
                "RequestAuthentication" => Some(ConfigKind::RequestAuthentication),
                _ => None,
            };
        }
        if group == TELEMETRY_GROUP {
            return (kind == "Telemetry").then_some(ConfigKind::Telemetry);
        }
        if group != NETWORKING_GROUP {
            return None;
        }
        match kind {
            "ServiceEntry" => Some(ConfigKind::ServiceEntry),
            "EnvoyFilter" => Some(ConfigKind::EnvoyFilter),
            "Sidecar" => Some(ConfigKind::Sidecar),
            "VirtualService" => Some(ConfigKind::VirtualService),
            "DestinationRule" => Some(ConfigKind::DestinationRule),
            "Gateway" => Some(ConfigKind::Gateway),
            _ => None,
        }
    }

    /// The kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::ServiceEntry => "ServiceEntry",
            ConfigKind::EnvoyFilter => "EnvoyFilter",
            ConfigKind::Sidecar => "Sidecar",
            ConfigKind::VirtualService => "VirtualService",
            ConfigKind::DestinationRule => "DestinationRule",
            ConfigKind::Gateway => "Gateway",
            ConfigKind::PeerAuthentication => "PeerAuthentication",
            ConfigKind::AuthorizationPolicy => "AuthorizationPolicy",
            ConfigKind::Telemetry => "Telemetry",
            ConfigKind::RequestAuthentication => "RequestAuthentication",
        }
    }
}

/// One broken rule; the message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigViolation {
    /// A shared semantic rule.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A reference to a namespace outside the tenant.
    #[error("{field}: namespace {namespace:?} is not a member of tenant {tenant:?}; {rule}")]
    ForeignNamespace {
        field: String,
        namespace: String,
        tenant: String,
        rule: &'static str,
    },
    /// An EnvoyFilter field that would select proxies other than by its namespace.
    #[error("{field}: not supported; an EnvoyFilter applies to the proxies of its own namespace (narrowed by spec.workloadSelector), or to the whole tenant only from the control namespace {control_namespace:?}")]
    ProxySelection {
        field: String,
        control_namespace: String,
    },
    /// A principal or namespace no peer of the tenant can have.
    #[error("{0}")]
    NeverAuthenticates(meshplane_crds::validation::authorization::ForeignReference),
    /// A ServiceEntry endpoint inside the cluster's pod network that is no pod of the tenant.
    #[error("{field}: {address} is in the cluster's pod network and is not the address of a pod of tenant {tenant:?}; ServiceEntry endpoints may only be pods of the tenant or addresses outside the pod network")]
    ForeignPodAddress {
        field: String,
        address: String,
        tenant: String,
    },
    /// A value meshplane cannot apply yet.
    #[error("{field}: {reason}")]
    Unavailable { field: String, reason: &'static str },
    /// An EnvoyFilter doing what the tenant's EnvoyFilter policy does not allow.
    #[error(transparent)]
    Policy(#[from] PolicyViolation),
    /// The object does not decode into its type.
    #[error("{field}: cannot be decoded as a {kind} spec: {reason}")]
    Malformed {
        field: &'static str,
        kind: &'static str,
        reason: String,
    },
}

const EXPORT_TO_RULE: &str = "exportTo may only name namespaces of the tenant";
const EGRESS_RULE: &str = "Sidecar egress hosts may only name namespaces of the tenant";
const PATCH_MATCH_RULE: &str = "EnvoyFilter patches may only match services of the tenant";
const HOST_RULE: &str = "traffic config may only name hosts of the tenant";
const GATEWAY_RULE: &str = "VirtualServices may only bind to gateways of the tenant";
const SOURCE_RULE: &str = "sourceNamespace may only name namespaces of the tenant";
const SERVER_HOST_RULE: &str = "Gateway servers may only take hosts from namespaces of the tenant";
/// Why a Gateway server's ISTIO_MUTUAL is refused: meshplane's ingress gateway serves traffic
/// entering the tenant and does not terminate the tenant's mutual TLS.
pub const GATEWAY_ISTIO_MUTUAL_UNAVAILABLE: &str = "tls.mode ISTIO_MUTUAL on a Gateway server (terminating the tenant's mutual TLS at the gateway) is not supported by meshplane's ingress gateway; use SIMPLE or MUTUAL with a credentialName";

/// Validates `object` (the full resource as JSON) of `kind` against the shared
/// rules and the tenant-boundary rules; all violations are returned, not just the first.
pub fn validate_config(
    kind: ConfigKind,
    object: &Value,
    view: &dyn TenantView,
) -> Result<(), Vec<ConfigViolation>> {
    let mut violations = Vec::new();
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    match kind {
        ConfigKind::ServiceEntry => match decode::<ServiceEntrySpec>(spec, kind) {
            Ok(se) => {
                push_semantic(&mut violations, validation::validate_service_entry(&se));
                for (i, entry) in se.export_to.iter().enumerate() {
                    check_namespace_ref(
                        &mut violations,
                        view,
                        entry,
                        || format!("spec.exportTo[{i}]"),
                        EXPORT_TO_RULE,
                    );
                }
                check_endpoint_addresses(&mut violations, &se, view);
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::Sidecar => match decode::<SidecarSpec>(spec, kind) {
            Ok(sc) => {
                push_semantic(&mut violations, validation::validate_sidecar(&sc));
                for (i, listener) in sc.egress.iter().enumerate() {
                    for (j, host) in listener.hosts.iter().enumerate() {
                        if let Some((ns, _)) = host.split_once('/') {
                            check_namespace_ref(
                                &mut violations,
                                view,
                                ns,
                                || format!("spec.egress[{i}].hosts[{j}]"),
                                EGRESS_RULE,
                            );
                        }
                    }
                }
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::VirtualService => match decode::<VirtualServiceSpec>(spec, kind) {
            Ok(vs) => {
                push_semantic(&mut violations, validation::validate_virtual_service(&vs));
                check_virtual_service(&mut violations, &vs, view);
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::DestinationRule => match decode::<DestinationRuleSpec>(spec, kind) {
            Ok(dr) => {
                push_semantic(&mut violations, validation::validate_destination_rule(&dr));
                check_host(&mut violations, view, &dr.host, || "spec.host".into());
                check_export_to(&mut violations, view, &dr.export_to);
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::Gateway => match decode::<GatewaySpec>(spec, kind) {
            Ok(gw) => {
                push_semantic(&mut violations, validation::validate_gateway(&gw));
                for (i, server) in gw.servers.iter().enumerate() {
                    for (j, host) in server.hosts.iter().enumerate() {
                        if let Some((ns, _)) = host.split_once('/') {
                            check_namespace_ref(
                                &mut violations,
                                view,
                                ns,
                                || format!("spec.servers[{i}].hosts[{j}]"),
                                SERVER_HOST_RULE,
                            );
                        }
                    }
                }
                for field in validation::traffic::gateway_istio_mutual_fields(&gw) {
                    violations.push(ConfigViolation::Unavailable {
                        field,
                        reason: GATEWAY_ISTIO_MUTUAL_UNAVAILABLE,
                    });
                }
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::PeerAuthentication => match decode::<PeerAuthenticationSpec>(spec, kind) {
            Ok(pa) => {
                let namespace = object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                push_semantic(
                    &mut violations,
                    validation::security::validate_peer_authentication(
                        &pa,
                        namespace == view.control_namespace(),
                    ),
                );
            }
            Err(e) => violations.push(e),
        },
        ConfigKind::AuthorizationPolicy => {
            match decode::<meshplane_crds::security::AuthorizationPolicySpec>(spec, kind) {
                Ok(ap) => {
                    push_semantic(
                        &mut violations,
                        validation::validate_authorization_policy(&ap),
                    );
                    let in_tenant = |ns: &str| view.contains(ns);
                    violations.extend(
                        validation::authorization::foreign_references(
                            &ap,
                            view.trust_domain(),
                            &in_tenant,
                        )
                        .into_iter()
                        .map(ConfigViolation::NeverAuthenticates),
                    );
                }
                Err(e) => violations.push(e),
            }
        }
        ConfigKind::Telemetry => {
            match decode::<meshplane_crds::telemetry::TelemetrySpec>(spec, kind) {
                Ok(t) => push_semantic(&mut violations, validation::validate_telemetry(&t)),
                Err(e) => violations.push(e),
            }
        }
        ConfigKind::RequestAuthentication => {
            match decode::<meshplane_crds::security::RequestAuthenticationSpec>(spec, kind) {
                Ok(ra) => push_semantic(
                    &mut violations,
                    validation::validate_request_authentication(&ra),
                ),
                Err(e) => violations.push(e),
            }
        }
        ConfigKind::EnvoyFilter => {
            check_proxy_selection(&mut violations, object, view);
            match decode::<EnvoyFilterSpec>(spec, kind) {
                Ok(ef) => {
                    push_semantic(&mut violations, validation::validate_envoy_filter(&ef));
                    check_patch_matches(&mut violations, &ef, view);
                    let namespace = object
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    violations.extend(
                        envoyfilter_policy::check(
                            &view.envoy_filter_policy(),
                            namespace,
                            view.control_namespace(),
                            &ef,
                        )
                        .into_iter()
                        .map(ConfigViolation::Policy),
                    );
                }
                Err(e) => violations.push(e),
            }
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

/// Warnings on an object that passes [`validate_config`]: the deprecated fields Istio still
/// accepts that it uses, each with what it is read as.
pub fn config_warnings(kind: ConfigKind, object: &Value) -> Vec<String> {
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    match kind {
        ConfigKind::VirtualService => decode::<VirtualServiceSpec>(spec, kind)
            .map(|vs| validation::traffic::deprecated_virtual_service_fields(&vs))
            .unwrap_or_default(),
        ConfigKind::DestinationRule => decode::<DestinationRuleSpec>(spec, kind)
            .map(|dr| validation::traffic::deprecated_destination_rule_fields(&dr))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    spec: Value,
    kind: ConfigKind,
) -> Result<T, ConfigViolation> {
    if spec.is_null() {
        return Err(ConfigViolation::Malformed {
            field: "spec",
            kind: kind.as_str(),
            reason: "spec is missing".into(),
        });
    }
    serde_json::from_value(spec).map_err(|e| ConfigViolation::Malformed {
        field: "spec",
        kind: kind.as_str(),
        reason: e.to_string(),
    })
}

fn push_semantic(
    violations: &mut Vec<ConfigViolation>,
    result: Result<(), validation::ValidationErrors>,
) {
    if let Err(errs) = result {
        violations.extend(errs.0.into_iter().map(ConfigViolation::Invalid));
    }
}

/// `.`, `*` and `~` are relative to the tenant; anything else must be a tenant namespace.
/// A ServiceEntry endpoint address inside the cluster's pod network must be a pod of the
/// tenant: any other address there is a pod of another tenant (or of no tenant), which the
/// tenant's proxies could never authenticate. The refusal names neither the pod nor its
/// tenant, and says the same whether or not a pod has the address now.
fn check_endpoint_addresses(
    violations: &mut Vec<ConfigViolation>,
    se: &ServiceEntrySpec,
    view: &dyn TenantView,
) {
    let networks = view.pod_networks();
    if networks.is_empty() {
        return;
    }
    for (i, endpoint) in se.endpoints.iter().enumerate() {
        let Ok(address) = endpoint.address.parse::<std::net::IpAddr>() else {
            continue;
        };
        // An IPv4-mapped IPv6 address reaches the IPv4 address it carries.
        let address = address.to_canonical();
        if networks.iter().any(|n| n.contains(&address)) && !view.is_tenant_pod_address(address) {
            violations.push(ConfigViolation::ForeignPodAddress {
                field: format!("spec.endpoints[{i}].address"),
                address: address.to_string(),
                tenant: view.tenant().to_owned(),
            });
        }
    }
}

fn check_namespace_ref(
    violations: &mut Vec<ConfigViolation>,
    view: &dyn TenantView,
    namespace: &str,
    field: impl FnOnce() -> String,
    rule: &'static str,
) {
    if matches!(namespace, "." | "*" | "~") || view.contains(namespace) {
        return;
    }
    violations.push(ConfigViolation::ForeignNamespace {
        field: field(),
        namespace: namespace.to_owned(),
        tenant: view.tenant().to_owned(),
        rule,
    });
}

fn check_export_to(
    violations: &mut Vec<ConfigViolation>,
    view: &dyn TenantView,
    export_to: &[String],
) {
    for (i, entry) in export_to.iter().enumerate() {
        check_namespace_ref(
            violations,
            view,
            entry,
            || format!("spec.exportTo[{i}]"),
            EXPORT_TO_RULE,
        );
    }
}

/// A host naming a Kubernetes service must name one of the tenant's namespaces.
fn check_host(
    violations: &mut Vec<ConfigViolation>,
    view: &dyn TenantView,
    host: &str,
    field: impl FnOnce() -> String,
) {
    if let Some(ns) = service_namespace(host) {
        check_namespace_ref(violations, view, ns, field, HOST_RULE);
    }
}

fn check_virtual_service(
    violations: &mut Vec<ConfigViolation>,
    vs: &VirtualServiceSpec,
    view: &dyn TenantView,
) {
    for (i, host) in vs.hosts.iter().enumerate() {
        check_host(violations, view, host, || format!("spec.hosts[{i}]"));
    }
    let gateway_ns = |g: &str| g.split_once('/').map(|(ns, _)| ns.to_string());
    for (i, g) in vs.gateways.iter().enumerate() {
        if let Some(ns) = gateway_ns(g) {
            check_namespace_ref(
                violations,
                view,
                &ns,
                || format!("spec.gateways[{i}]"),
                GATEWAY_RULE,
            );
        }
    }
    check_export_to(violations, view, &vs.export_to);
    let mut dest = |d: &Destination, field: String| {
        check_host(violations, view, &d.host, || format!("{field}.host"));
    };
    for (i, r) in vs.http.iter().enumerate() {
        for (j, d) in r.route.iter().enumerate() {
            dest(
                &d.destination,
                format!("spec.http[{i}].route[{j}].destination"),
            );
        }
        if let Some(m) = &r.mirror {
            dest(m, format!("spec.http[{i}].mirror"));
        }
        for (j, m) in r.mirrors.iter().enumerate() {
            dest(
                &m.destination,
                format!("spec.http[{i}].mirrors[{j}].destination"),
            );
        }
    }
    for (i, r) in vs.tcp.iter().enumerate() {
        for (j, d) in r.route.iter().enumerate() {
            dest(
                &d.destination,
                format!("spec.tcp[{i}].route[{j}].destination"),
            );
        }
    }
    for (i, r) in vs.tls.iter().enumerate() {
        for (j, d) in r.route.iter().enumerate() {
            dest(
                &d.destination,
                format!("spec.tls[{i}].route[{j}].destination"),
            );
        }
    }
    let mut source = |ns: &str, gateways: &[String], field: String| {
        if !ns.is_empty() {
            check_namespace_ref(
                violations,
                view,
                ns,
                || format!("{field}.sourceNamespace"),
                SOURCE_RULE,
            );
        }
        for (k, g) in gateways.iter().enumerate() {
            if let Some(gns) = gateway_ns(g) {
                check_namespace_ref(
                    violations,
                    view,
                    &gns,
                    || format!("{field}.gateways[{k}]"),
                    GATEWAY_RULE,
                );
            }
        }
    };
    for (i, r) in vs.http.iter().enumerate() {
        for (j, m) in r.match_.iter().enumerate() {
            source(
                &m.source_namespace,
                &m.gateways,
                format!("spec.http[{i}].match[{j}]"),
            );
        }
    }
    for (i, r) in vs.tcp.iter().enumerate() {
        for (j, m) in r.match_.iter().enumerate() {
            source(
                &m.source_namespace,
                &m.gateways,
                format!("spec.tcp[{i}].match[{j}]"),
            );
        }
    }
    for (i, r) in vs.tls.iter().enumerate() {
        for (j, m) in r.match_.iter().enumerate() {
            source(
                &m.source_namespace,
                &m.gateways,
                format!("spec.tls[{i}].match[{j}]"),
            );
        }
    }
}

/// Istio's ways to pick proxies other than by namespace and workload selector. The CRD schema
/// prunes them, but a lenient API server (or an older schema) would pass them silently.
fn check_proxy_selection(
    violations: &mut Vec<ConfigViolation>,
    object: &Value,
    view: &dyn TenantView,
) {
    let spec = object.get("spec");
    let mut reject = |field: String| {
        violations.push(ConfigViolation::ProxySelection {
            field,
            control_namespace: view.control_namespace().to_owned(),
        })
    };
    for key in ["targetRefs", "targetRef"] {
        if spec.and_then(|s| s.get(key)).is_some() {
            reject(format!("spec.{key}"));
        }
    }
    let patches = spec
        .and_then(|s| s.get("configPatches"))
        .and_then(Value::as_array);
    for (i, patch) in patches.into_iter().flatten().enumerate() {
        if patch.get("match").and_then(|m| m.get("proxy")).is_some() {
            reject(format!("spec.configPatches[{i}].match.proxy"));
        }
    }
}

fn check_patch_matches(
    violations: &mut Vec<ConfigViolation>,
    ef: &EnvoyFilterSpec,
    view: &dyn TenantView,
) {
    for (i, patch) in ef.config_patches.iter().enumerate() {
        let Some(m) = &patch.match_ else { continue };
        let mut hosts: Vec<(String, &str)> = Vec::new();
        if let Some(c) = &m.cluster {
            hosts.push((
                format!("spec.configPatches[{i}].match.cluster.service"),
                c.service.as_str(),
            ));
            let name_host = c
                .name
                .strip_prefix("outbound|")
                .and_then(|rest| rest.rsplit('|').next());
            if let Some(host) = name_host {
                hosts.push((format!("spec.configPatches[{i}].match.cluster.name"), host));
            }
        }
        if let Some(vhost) = m
            .route_configuration
            .as_ref()
            .and_then(|r| r.vhost.as_ref())
        {
            let host = vhost
                .name
                .rsplit_once(':')
                .map_or(vhost.name.as_str(), |(h, _)| h);
            hosts.push((
                format!("spec.configPatches[{i}].match.routeConfiguration.vhost.name"),
                host,
            ));
        }
        for (field, host) in hosts {
            if let Some(ns) = service_namespace(host) {
                check_namespace_ref(violations, view, ns, || field, PATCH_MATCH_RULE);
            }
        }
    }
}

/// The namespace of a Kubernetes service host `<svc>.<ns>.svc[.<domain>]` (or `*.<ns>.svc...`).
fn service_namespace(host: &str) -> Option<&str> {
    let mut labels = host.split('.');
    let (_svc, ns, svc_label) = (labels.next()?, labels.next()?, labels.next()?);
    (svc_label == "svc" && !ns.is_empty()).then_some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::StaticTenant;
    use serde_json::json;

    fn blue() -> StaticTenant {
        StaticTenant::new("blue", "meshplane-blue", ["shop", "payments"])
    }

    fn messages(r: Result<(), Vec<ConfigViolation>>) -> Vec<String> {
        r.err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn export_to_a_foreign_namespace_is_denied_with_field_and_rule() {
        let se = json!({"spec": {"hosts": ["api.example.com"], "exportTo": ["green", ".", "payments", "meshplane-blue"]}});
        assert_eq!(
            messages(validate_config(ConfigKind::ServiceEntry, &se, &blue())),
            vec![
                r#"spec.exportTo[0]: namespace "green" is not a member of tenant "blue"; exportTo may only name namespaces of the tenant"#
            ]
        );
    }

    #[test]
    fn export_to_wildcards_stay_inside_the_tenant() {
        for export in [json!(["*"]), json!(["."]), json!(["~"]), json!([])] {
            let se = json!({"spec": {"hosts": ["api.example.com"], "exportTo": export}});
            assert_eq!(
                validate_config(ConfigKind::ServiceEntry, &se, &blue()),
                Ok(())
            );
        }
    }

    fn blue_with_pods() -> StaticTenant {
        blue().with_pods(
            ["198.18.0.0/16".parse().expect("cidr")],
            ["198.18.1.5".parse().expect("ip")],
        )
    }

    fn endpoints(addresses: &[&str]) -> Value {
        let endpoints: Vec<Value> = addresses.iter().map(|a| json!({"address": a})).collect();
        json!({"spec": {"hosts": ["pods.example.com"], "location": "MESH_INTERNAL",
            "resolution": "STATIC", "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "endpoints": endpoints}})
    }

    #[test]
    fn endpoint_at_a_pod_address_outside_the_tenant_is_denied_without_naming_it() {
        let se = endpoints(&["198.18.1.5", "198.18.2.9"]);
        assert_eq!(
            messages(validate_config(
                ConfigKind::ServiceEntry,
                &se,
                &blue_with_pods()
            )),
            vec![
                r#"spec.endpoints[1].address: 198.18.2.9 is in the cluster's pod network and is not the address of a pod of tenant "blue"; ServiceEntry endpoints may only be pods of the tenant or addresses outside the pod network"#
            ]
        );
    }

    #[test]
    fn an_ipv4_mapped_form_of_a_foreign_pod_address_is_denied_too() {
        let se = endpoints(&["::ffff:198.18.2.9", "::ffff:198.18.1.5"]);
        assert_eq!(
            messages(validate_config(
                ConfigKind::ServiceEntry,
                &se,
                &blue_with_pods()
            )),
            vec![
                r#"spec.endpoints[0].address: 198.18.2.9 is in the cluster's pod network and is not the address of a pod of tenant "blue"; ServiceEntry endpoints may only be pods of the tenant or addresses outside the pod network"#
            ]
        );
    }

    #[test]
    fn endpoint_at_a_pod_address_of_the_tenant_is_admitted() {
        let se = endpoints(&["198.18.1.5"]);
        assert_eq!(
            validate_config(ConfigKind::ServiceEntry, &se, &blue_with_pods()),
            Ok(())
        );
    }

    #[test]
    fn endpoints_outside_the_pod_network_and_hostnames_are_admitted() {
        let mut se = endpoints(&["198.19.0.7", "127.0.0.1"]);
        assert_eq!(
            validate_config(ConfigKind::ServiceEntry, &se, &blue_with_pods()),
            Ok(())
        );
        se["spec"]["resolution"] = json!("DNS");
        se["spec"]["endpoints"] = json!([{"address": "api.example.com"}]);
        assert_eq!(
            validate_config(ConfigKind::ServiceEntry, &se, &blue_with_pods()),
            Ok(())
        );
    }

    #[test]
    fn endpoint_addresses_are_not_checked_without_a_known_pod_network() {
        let se = endpoints(&["198.18.2.9"]);
        assert_eq!(
            validate_config(ConfigKind::ServiceEntry, &se, &blue()),
            Ok(())
        );
    }

    #[test]
    fn sidecar_egress_hosts_are_checked_per_namespace_part() {
        let sc = json!({"spec": {"egress": [{"hosts": ["./*", "*/api.example.com", "payments/*", "green/*"]}]}});
        assert_eq!(
            messages(validate_config(ConfigKind::Sidecar, &sc, &blue())),
            vec![
                r#"spec.egress[0].hosts[3]: namespace "green" is not a member of tenant "blue"; Sidecar egress hosts may only name namespaces of the tenant"#
            ]
        );
    }

    #[test]
    fn semantic_errors_come_from_the_shared_validation() {
        let se = json!({"spec": {"hosts": ["Not A Host"]}});
        let msgs = messages(validate_config(ConfigKind::ServiceEntry, &se, &blue()));
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(msgs[0].starts_with("spec.hosts[0]: host"), "{msgs:?}");
    }

    #[test]
    fn envoy_filter_proxy_selection_fields_are_denied() {
        let ef = json!({"spec": {
            "targetRefs": [{"kind": "Service", "name": "web"}],
            "configPatches": [{"applyTo": "CLUSTER", "match": {"proxy": {"proxyVersion": ".*"}}, "patch": {"operation": "REMOVE"}}]
        }});
        let msgs = messages(validate_config(ConfigKind::EnvoyFilter, &ef, &blue()));
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs[0].starts_with("spec.targetRefs: not supported"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].starts_with("spec.configPatches[0].match.proxy: not supported"),
            "{msgs:?}"
        );
    }

    #[test]
    fn envoy_filter_may_not_match_services_of_other_tenants() {
        let ef = json!({"spec": {"configPatches": [
            {"applyTo": "CLUSTER", "match": {"cluster": {"service": "web.shop.svc.cluster.local"}}, "patch": {"operation": "REMOVE"}},
            {"applyTo": "CLUSTER", "match": {"cluster": {"name": "outbound|80||pay.green.svc.cluster.local"}}, "patch": {"operation": "REMOVE"}},
            {"applyTo": "VIRTUAL_HOST", "match": {"routeConfiguration": {"vhost": {"name": "ui.green.svc.cluster.local:8080"}}}, "patch": {"operation": "REMOVE"}},
            {"applyTo": "CLUSTER", "match": {"cluster": {"service": "api.example.com"}}, "patch": {"operation": "REMOVE"}}
        ]}});
        let msgs = messages(validate_config(ConfigKind::EnvoyFilter, &ef, &blue()));
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs[0].starts_with(r#"spec.configPatches[1].match.cluster.name: namespace "green""#),
            "{msgs:?}"
        );
        assert!(
            msgs[1].starts_with(
                r#"spec.configPatches[2].match.routeConfiguration.vhost.name: namespace "green""#
            ),
            "{msgs:?}"
        );
    }

    #[test]
    fn malformed_and_missing_specs_are_denied_not_panics() {
        let bad = json!({"spec": {"hosts": "not-a-list"}});
        let msgs = messages(validate_config(ConfigKind::ServiceEntry, &bad, &blue()));
        assert!(
            msgs[0].starts_with("spec: cannot be decoded as a ServiceEntry spec"),
            "{msgs:?}"
        );
        let missing = json!({"metadata": {}});
        let msgs = messages(validate_config(ConfigKind::Sidecar, &missing, &blue()));
        assert_eq!(
            msgs,
            vec!["spec: cannot be decoded as a Sidecar spec: spec is missing"]
        );
    }

    #[test]
    fn traffic_config_may_not_reach_another_tenant() {
        let vs = json!({"spec": {
            "hosts": ["reviews", "ui.green.svc.cluster.local"],
            "gateways": ["mesh", "green/public", "meshplane-blue/ingress"],
            "exportTo": ["shop", "green"],
            "http": [{
                "match": [{"sourceNamespace": "green"}, {"gateways": ["green/public"]}],
                "route": [
                    {"destination": {"host": "reviews.shop.svc.cluster.local"}, "weight": 50},
                    {"destination": {"host": "pay.green.svc.cluster.local"}, "weight": 50}
                ],
                "mirror": {"host": "audit.green.svc.cluster.local"}
            }],
            "tcp": [{"route": [{"destination": {"host": "db.green.svc.cluster.local"}}]}]
        }});
        let msgs = messages(validate_config(ConfigKind::VirtualService, &vs, &blue()));
        let fields: Vec<&str> = msgs
            .iter()
            .map(|m| m.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            vec![
                "spec.hosts[1]",
                "spec.gateways[1]",
                "spec.exportTo[1]",
                "spec.http[0].route[1].destination.host",
                "spec.http[0].mirror.host",
                "spec.tcp[0].route[0].destination.host",
                "spec.http[0].match[0].sourceNamespace",
                "spec.http[0].match[1].gateways[0]",
            ],
            "{msgs:#?}"
        );
        assert!(
            msgs.iter()
                .all(|m| m.contains(r#"namespace "green" is not a member of tenant "blue""#)),
            "{msgs:#?}"
        );

        let dr = json!({"spec": {"host": "pay.green.svc.cluster.local", "exportTo": ["green"]}});
        assert_eq!(
            messages(validate_config(ConfigKind::DestinationRule, &dr, &blue())).len(),
            2
        );
        let gw = json!({"spec": {"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"},
            "hosts": ["shop/a.example.com", "green/b.example.com", "*/c.example.com"]}]}});
        let msgs = messages(validate_config(ConfigKind::Gateway, &gw, &blue()));
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].starts_with("spec.servers[0].hosts[1]: namespace \"green\""),
            "{msgs:?}"
        );
    }

    #[test]
    fn istio_mutual_is_admitted_on_destination_rules_and_refused_on_gateway_servers() {
        // Every tenant has workload identity (contract 11): sidecars originate ISTIO_MUTUAL.
        let dr = json!({"spec": {"host": "reviews", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
            "subsets": [{"name": "v1", "trafficPolicy": {"tls": {"mode": "DISABLE"}}}]}});
        assert_eq!(
            validate_config(ConfigKind::DestinationRule, &dr, &blue()),
            Ok(())
        );
        let gw = json!({"spec": {"selector": {"app": "gw"}, "servers": [{
            "port": {"number": 443, "name": "tls", "protocol": "HTTPS"},
            "hosts": ["a.example.com"], "tls": {"mode": "ISTIO_MUTUAL"}}]}});
        let msgs = messages(validate_config(ConfigKind::Gateway, &gw, &blue()));
        assert_eq!(
            msgs,
            vec![format!(
                "spec.servers[0].tls.mode: {GATEWAY_ISTIO_MUTUAL_UNAVAILABLE}"
            )]
        );
    }

    #[test]
    fn authorization_policies_may_name_only_peers_of_the_tenant() {
        let tenant = blue().with_trust_domain("blue.example");
        let ap = serde_json::json!({"metadata": {"namespace": "shop"}, "spec": {"rules": [{
            "from": [{"source": {"principals": ["blue.example/ns/shop/sa/web", "green.example/ns/shop/sa/web"],
                                 "namespaces": ["payments", "bank"]}}]}]}});
        let msgs = messages(validate_config(
            ConfigKind::AuthorizationPolicy,
            &ap,
            &tenant,
        ));
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs[0].contains("principals[1]") && msgs[0].contains("trust domain \"green.example\""),
            "{msgs:?}"
        );
        assert!(
            msgs[1].contains("namespaces[1]")
                && msgs[1].contains("namespace \"bank\"")
                && msgs[1].contains("could ever authenticate"),
            "{msgs:?}"
        );
        let custom = serde_json::json!({"spec": {"action": "CUSTOM", "provider": {"name": "opa"}}});
        assert_eq!(
            validate_config(ConfigKind::AuthorizationPolicy, &custom, &tenant),
            Ok(())
        );
        let no_provider = serde_json::json!({"spec": {"action": "CUSTOM"}});
        let msgs = messages(validate_config(
            ConfigKind::AuthorizationPolicy,
            &no_provider,
            &tenant,
        ));
        assert!(
            msgs.iter()
                .any(|m| m.contains("action CUSTOM needs provider.name")),
            "{msgs:?}"
        );
        let fine = serde_json::json!({"spec": {"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin*"]}}]}]}});
        assert_eq!(
            validate_config(ConfigKind::AuthorizationPolicy, &fine, &tenant),
            Ok(())
        );
        assert_eq!(
            ConfigKind::from_group_kind("security.meshplane.io", "AuthorizationPolicy"),
            Some(ConfigKind::AuthorizationPolicy)
        );
        assert_eq!(
            ConfigKind::from_group_kind("security.meshplane.io", "Telemetry"),
            None
        );
    }

    #[test]
    fn request_authentications_need_an_issuer_and_a_key_set_url() {
        assert_eq!(
            ConfigKind::from_group_kind("security.meshplane.io", "RequestAuthentication"),
            Some(ConfigKind::RequestAuthentication)
        );
        let fine = serde_json::json!({"spec": {"jwtRules": [{"issuer": "https://idp.example.com",
            "jwksUri": "https://idp.example.com/keys"}]}});
        assert_eq!(
            validate_config(ConfigKind::RequestAuthentication, &fine, &blue()),
            Ok(())
        );
        let bad = serde_json::json!({"spec": {"jwtRules": [{"issuer": "https://idp.example.com",
            "jwksUri": "ftp://idp.example.com/keys"}]}});
        let msgs = messages(validate_config(
            ConfigKind::RequestAuthentication,
            &bad,
            &blue(),
        ));
        assert!(
            msgs.iter()
                .any(|m| m.contains("spec.jwtRules[0]") && m.contains("jwksUri")),
            "{msgs:?}"
        );
    }

    #[test]
    fn service_namespace_reads_kubernetes_service_hosts_only() {
        assert_eq!(
            service_namespace("web.shop.svc.cluster.local"),
            Some("shop")
        );
        assert_eq!(service_namespace("*.shop.svc"), Some("shop"));
        assert_eq!(service_namespace("api.example.com"), None);
        assert_eq!(service_namespace("web"), None);
    }
}
