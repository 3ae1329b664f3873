//! Semantic validation that the CRD schema and CEL rules cannot express.
//!
//! One implementation for the operator (status conditions), the validating webhook (admission
//! errors) and the xds-server (ignoring bad objects from the directory source). Every error
//! names the field and the rule it broke.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::controlplane::{MeshControlPlane, MeshRevisionTag};
use crate::names::{MAX_REVISION_LEN, MAX_TENANT_LEN};
use crate::networking::{
    ApplyTo, EnvoyFilterSpec, Port, Resolution, ServiceEntrySpec, SidecarSpec,
};

pub mod authorization;
pub mod request_authentication;
pub mod security;
pub mod telemetry;
pub mod traffic;

pub use authorization::validate_authorization_policy;
pub use request_authentication::validate_request_authentication;
pub use telemetry::validate_telemetry;
pub use traffic::{validate_destination_rule, validate_gateway, validate_virtual_service};

/// One violated rule, with the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// A required value is empty.
    #[error("{field}: must not be empty")]
    Empty { field: String },
    /// A name that must be a DNS-1123 (or DNS-1035) label is not.
    #[error("{field}: {value:?} is not a valid DNS label (lowercase letters, digits and '-', starting with a {start} and ending alphanumeric)")]
    InvalidDnsLabel {
        field: String,
        value: String,
        start: &'static str,
    },
    /// A value is longer than meshplane allows.
    #[error("{field}: {value:?} is {len} characters long, more than the {max} allowed so that the names derived from it fit Kubernetes limits")]
    TooLong {
        field: String,
        value: String,
        len: usize,
        max: usize,
    },
    /// A hostname is malformed.
    #[error("{field}: host {value:?} is invalid: {reason}")]
    InvalidHost {
        field: String,
        value: String,
        reason: String,
    },
    /// An `exportTo` entry is malformed.
    #[error("{field}: exportTo entry {value:?} is invalid: {reason}")]
    InvalidExportTo {
        field: String,
        value: String,
        reason: String,
    },
    /// A label selector is malformed.
    #[error("{field}: invalid label selector: {reason}")]
    InvalidSelector { field: String, reason: String },
    /// A label key or value is malformed.
    #[error("{field}: invalid label {what} {value:?}: {reason}")]
    InvalidLabel {
        field: String,
        what: &'static str,
        value: String,
        reason: String,
    },
    /// A port is out of range or duplicated.
    #[error("{field}: invalid port: {reason}")]
    InvalidPort { field: String, reason: String },
    /// An address is not an IP, a CIDR or (for DNS) a hostname.
    #[error("{field}: invalid address {value:?}: {reason}")]
    InvalidAddress {
        field: String,
        value: String,
        reason: String,
    },
    /// An EnvoyFilter patch is inconsistent.
    #[error("{field}: invalid patch: {reason}")]
    InvalidPatch { field: String, reason: String },
    /// A value breaks a rule of its kind (routes, policies, gateway servers).
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl ValidationError {
    /// The field path the error concerns.
    pub fn field(&self) -> &str {
        match self {
            ValidationError::Empty { field }
            | ValidationError::InvalidDnsLabel { field, .. }
            | ValidationError::TooLong { field, .. }
            | ValidationError::InvalidHost { field, .. }
            | ValidationError::InvalidExportTo { field, .. }
            | ValidationError::InvalidSelector { field, .. }
            | ValidationError::InvalidLabel { field, .. }
            | ValidationError::InvalidPort { field, .. }
            | ValidationError::InvalidAddress { field, .. }
            | ValidationError::InvalidPatch { field, .. }
            | ValidationError::Invalid { field, .. } => field,
        }
    }
}

/// All errors of one object; empty means valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl ValidationErrors {
    /// `Ok` when no rule was broken.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }

    fn check(&mut self, r: Result<(), ValidationError>) {
        if let Err(e) = r {
            self.0.push(e);
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msgs: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&msgs.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}

fn is_label_body(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// DNS-1123 label: at most 63 of `[a-z0-9-]`, alphanumeric at both ends (namespace names).
pub fn validate_dns1123_label(value: &str, field: &str) -> Result<(), ValidationError> {
    check_label(value, field, 63, false)
}

/// DNS-1035 label at most `max` long: like DNS-1123 but starting with a letter (Service names,
/// so revision, tag and tenant names).
pub fn validate_dns1035_label(value: &str, field: &str, max: usize) -> Result<(), ValidationError> {
    check_label(value, field, max, true)
}

fn check_label(
    value: &str,
    field: &str,
    max: usize,
    letter_first: bool,
) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::Empty {
            field: field.into(),
        });
    }
    if value.len() > max {
        return Err(ValidationError::TooLong {
            field: field.into(),
            value: value.into(),
            len: value.len(),
            max,
        });
    }
    let first_ok = value
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || (!letter_first && b.is_ascii_digit()));
    let last_ok = value
        .bytes()
        .last()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !(first_ok && last_ok && is_label_body(value)) {
        return Err(ValidationError::InvalidDnsLabel {
            field: field.into(),
            value: value.into(),
            start: if letter_first {
                "letter"
            } else {
                "letter or digit"
            },
        });
    }
    Ok(())
}

/// A label key: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn validate_label_key(key: &str, field: &str) -> Result<(), ValidationError> {
    let invalid = |reason: &str| ValidationError::InvalidLabel {
        field: field.into(),
        what: "key",
        value: key.into(),
        reason: reason.into(),
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty()
            || p.len() > 253
            || p.split('.')
                .any(|l| check_label(l, field, 63, false).is_err())
        {
            return Err(invalid("prefix must be a DNS subdomain"));
        }
    }
    if name.is_empty() || name.len() > 63 || !is_label_name(name) {
        return Err(invalid(
            "name must be at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends",
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends.
pub fn validate_label_value(value: &str, field: &str) -> Result<(), ValidationError> {
    if value.is_empty() || (value.len() <= 63 && is_label_name(value)) {
        Ok(())
    } else {
        Err(ValidationError::InvalidLabel {
            field: field.into(),
            what: "value",
            value: value.into(),
            reason: "must be at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends"
                .into(),
        })
    }
}

/// A `LabelSelector` as the API server checks it: valid keys and values, and each expression's
/// operator one of `In` and `NotIn` (with values) or `Exists` and `DoesNotExist` (without).
pub fn validate_label_selector(sel: &LabelSelector, field: &str) -> Result<(), ValidationError> {
    for (k, v) in sel.match_labels.iter().flatten() {
        validate_label_key(k, &format!("{field}.matchLabels"))?;
        validate_label_value(v, &format!("{field}.matchLabels[{k}]"))?;
    }
    for (i, expr) in sel.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        validate_label_key(&expr.key, &format!("{at}.key"))?;
        let values = expr.values.as_deref().unwrap_or_default();
        for v in values {
            validate_label_value(v, &format!("{at}.values"))?;
        }
        let invalid = |reason: String| ValidationError::InvalidSelector {
            field: at.clone(),
            reason,
        };
        match expr.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(invalid(
                    "operator In and NotIn need at least one value".into(),
                ))
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(invalid(
                    "operator Exists and DoesNotExist take no values".into(),
                ))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(invalid(format!(
                    "unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"
                )))
            }
        }
    }
    Ok(())
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A service host: an FQDN or short name (`web`, `web.shop.svc.cluster.local`), optionally with a
/// leading `*.` wildcard. The bare `*` is allowed only where `allow_any` (Sidecar imports).
pub fn validate_host(host: &str, field: &str, allow_any: bool) -> Result<(), ValidationError> {
    let invalid = |reason: &str| ValidationError::InvalidHost {
        field: field.into(),
        value: host.into(),
        reason: reason.into(),
    };
    if host.is_empty() {
        return Err(invalid("empty"));
    }
    if host == "*" {
        return if allow_any {
            Ok(())
        } else {
            Err(invalid(
                "'*' alone is not allowed here; use a domain such as '*.example.com'",
            ))
        };
    }
    if host.len() > 253 {
        return Err(invalid("longer than 253 characters"));
    }
    let rest = host.strip_prefix("*.").unwrap_or(host);
    if rest.contains('*') {
        return Err(invalid(
            "a wildcard is allowed only as the leftmost label '*.'",
        ));
    }
    for label in rest.split('.') {
        let lower = label.to_ascii_lowercase();
        if check_label(&lower, field, 63, false).is_err() {
            return Err(invalid(&format!(
                "label {label:?} is not a DNS label (letters, digits and '-', alphanumeric at both ends)"
            )));
        }
    }
    Ok(())
}

/// `exportTo`: `*` (the tenant), `.` (own namespace), `~` (nobody, alone) or namespace names.
pub fn validate_export_to(entries: &[String], field: &str) -> Result<(), ValidationError> {
    let invalid = |value: &str, reason: &str| ValidationError::InvalidExportTo {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    };
    for (i, e) in entries.iter().enumerate() {
        match e.as_str() {
            "*" | "." => {}
            "~" if entries.len() > 1 => {
                return Err(invalid(
                    e,
                    "'~' (export to nobody) cannot be combined with other entries",
                ))
            }
            "~" => {}
            ns => {
                if validate_dns1123_label(ns, field).is_err() {
                    return Err(invalid(
                        ns,
                        "must be '.', '*', '~' or a namespace name (a DNS-1123 label)",
                    ));
                }
            }
        }
        if entries[..i].contains(e) {
            return Err(invalid(e, "duplicate entry"));
        }
    }
    Ok(())
}

/// A Sidecar egress host `namespace/dnsName`: namespace `.`, `*`, `~` or a name; host `*`, an
/// FQDN or a `*.` wildcard.
pub fn validate_sidecar_host(entry: &str, field: &str) -> Result<(), ValidationError> {
    let invalid = |reason: &str| ValidationError::InvalidHost {
        field: field.into(),
        value: entry.into(),
        reason: reason.into(),
    };
    let Some((ns, host)) = entry.split_once('/') else {
        return Err(invalid(
            "must have the form namespace/dnsName, e.g. './*' or 'shop/*'",
        ));
    };
    match ns {
        "." | "*" | "~" => {}
        other => {
            if validate_dns1123_label(other, field).is_err() {
                return Err(invalid(
                    "namespace part must be '.', '*', '~' or a namespace name",
                ));
            }
        }
    }
    validate_host(host, field, true)
}

pub(crate) fn validate_port(port: &Port, field: &str) -> Result<(), ValidationError> {
    if port.number == 0 || port.number > 65535 {
        return Err(ValidationError::InvalidPort {
            field: field.into(),
            reason: format!("number {} is outside 1-65535", port.number),
        });
    }
    if port.target_port.is_some_and(|t| t == 0 || t > 65535) {
        return Err(ValidationError::InvalidPort {
            field: field.into(),
            reason: "targetPort is outside 1-65535".into(),
        });
    }
    let proto = port.protocol.to_ascii_uppercase();
    if !proto.is_empty() && !KNOWN_PROTOCOLS.contains(&proto.as_str()) {
        return Err(ValidationError::InvalidPort {
            field: field.into(),
            reason: format!(
                "unknown protocol {:?}; use one of {}",
                port.protocol,
                KNOWN_PROTOCOLS.join(", ")
            ),
        });
    }
    Ok(())
}

/// Protocols a port may declare.
pub const KNOWN_PROTOCOLS: &[&str] = &[
    "HTTP", "HTTP2", "GRPC", "TCP", "TLS", "HTTPS", "MONGO", "REDIS", "MYSQL",
];

fn validate_unique_ports(ports: &[Port], field: &str, errs: &mut ValidationErrors) {
    for (i, p) in ports.iter().enumerate() {
        errs.check(validate_port(p, &format!("{field}[{i}]")));
        if ports[..i].iter().any(|q| q.number == p.number) {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{field}[{i}]"),
                reason: format!("port {} is declared twice", p.number),
            });
        }
        if !p.name.is_empty() && ports[..i].iter().any(|q| q.name == p.name) {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{field}[{i}]"),
                reason: format!("port name {:?} is declared twice", p.name),
            });
        }
    }
}

/// A tenant's trust domain: a SPIFFE trust domain (lowercase letters, digits, '.', '-', '_';
/// no wildcard), and not one reserved for another tenant's default (`<other>.meshplane.local`).
pub fn validate_trust_domain(
    trust_domain: &str,
    tenant: &str,
    field: &str,
) -> Result<(), ValidationError> {
    let invalid = |reason: String| ValidationError::Invalid {
        field: field.into(),
        reason,
    };
    let spiffe = !trust_domain.is_empty()
        && trust_domain.len() <= 253
        && trust_domain.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
        && !trust_domain.starts_with('.')
        && !trust_domain.ends_with('.')
        && !trust_domain.contains("..");
    if !spiffe {
        return Err(invalid(format!(
            "{trust_domain:?} is not a SPIFFE trust domain (lowercase letters, digits, '.', '-' and '_', at most 253 characters)"
        )));
    }
    let suffix = crate::names::TRUST_DOMAIN_SUFFIX;
    let reserved = trust_domain == suffix || trust_domain.ends_with(&format!(".{suffix}"));
    if reserved && trust_domain != crate::names::default_trust_domain(tenant) {
        return Err(invalid(format!(
            "{trust_domain:?} is reserved: trust domains under {suffix:?} are the tenants' defaults, and this one is not tenant {tenant:?}'s; leave trustDomain unset or name one of your organisation's"
        )));
    }
    Ok(())
}

/// Semantic checks of a `MeshControlPlane`.
pub fn validate_mesh_control_plane(mcp: &MeshControlPlane) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    errs.check(validate_dns1035_label(
        &mcp.spec.tenant,
        "spec.tenant",
        MAX_TENANT_LEN,
    ));
    let revision_field = if mcp.spec.revision.is_some() {
        "spec.revision"
    } else {
        "metadata.name"
    };
    errs.check(validate_dns1035_label(
        &mcp.revision(),
        revision_field,
        MAX_REVISION_LEN,
    ));
    if let Some(ns) = &mcp.spec.namespace {
        errs.check(validate_dns1123_label(ns, "spec.namespace"));
    }
    if let Some(sel) = &mcp.spec.namespace_selector {
        errs.check(validate_label_selector(sel, "spec.namespaceSelector"));
    }
    if !(1..=10).contains(&mcp.spec.replicas) {
        errs.0.push(ValidationError::InvalidPort {
            field: "spec.replicas".into(),
            reason: "replicas must be between 1 and 10".into(),
        });
    }
    let mc = &mcp.spec.mesh_config;
    if let Some(td) = &mc.trust_domain {
        errs.check(validate_trust_domain(
            td,
            &mcp.spec.tenant,
            "spec.meshConfig.trustDomain",
        ));
    }
    errs.check(validate_export_to(
        &mc.default_export_to,
        "spec.meshConfig.defaultExportTo",
    ));
    if let Err(e) = crate::providers::validate_extension_providers(
        &mc.extension_providers,
        mc.default_providers.as_ref(),
        "spec.meshConfig",
    ) {
        errs.0.extend(e.0);
    }
    for (i, net) in mc.pod_networks.iter().enumerate() {
        if net.parse::<ipnet::IpNet>().is_err() {
            errs.0.push(ValidationError::InvalidAddress {
                field: format!("spec.meshConfig.podNetworks[{i}]"),
                value: net.clone(),
                reason: "not a CIDR (address/prefix length, e.g. 198.18.0.0/16)".into(),
            });
        }
    }
    errs.into_result()
}

/// Semantic checks of a `MeshRevisionTag`.
pub fn validate_revision_tag(tag: &MeshRevisionTag) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let name = tag.metadata.name.clone().unwrap_or_default();
    errs.check(validate_dns1035_label(
        &name,
        "metadata.name",
        MAX_REVISION_LEN,
    ));
    errs.check(validate_dns1035_label(
        &tag.spec.revision,
        "spec.revision",
        MAX_REVISION_LEN,
    ));
    errs.into_result()
}

/// Semantic checks of a `ServiceEntry` spec.
pub fn validate_service_entry(spec: &ServiceEntrySpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if spec.hosts.is_empty() {
        errs.0.push(ValidationError::Empty {
            field: "spec.hosts".into(),
        });
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        errs.check(validate_host(h, &format!("spec.hosts[{i}]"), false));
    }
    for (i, a) in spec.addresses.iter().enumerate() {
        errs.check(validate_ip_or_cidr(a, &format!("spec.addresses[{i}]")));
    }
    validate_unique_ports(&spec.ports, "spec.ports", &mut errs);
    errs.check(validate_export_to(&spec.export_to, "spec.exportTo"));
    for (i, ep) in spec.endpoints.iter().enumerate() {
        let field = format!("spec.endpoints[{i}].address");
        match spec.resolution {
            Resolution::Static => errs.check(validate_ip(&ep.address, &field)),
            Resolution::Dns | Resolution::DnsRoundRobin => {
                if ep.address.parse::<IpAddr>().is_err() {
                    errs.check(validate_host(&ep.address, &field, false));
                }
            }
            Resolution::None => {}
        }
        for (name, port) in &ep.ports {
            if *port == 0 || *port > 65535 {
                errs.0.push(ValidationError::InvalidPort {
                    field: format!("spec.endpoints[{i}].ports[{name}]"),
                    reason: format!("{port} is outside 1-65535"),
                });
            }
        }
    }
    if spec.resolution == Resolution::Static
        && spec.endpoints.is_empty()
        && spec.workload_selector.is_none()
    {
        errs.0.push(ValidationError::Empty {
            field: "spec.endpoints (resolution STATIC needs endpoints or a workloadSelector)"
                .into(),
        });
    }
    if spec.resolution == Resolution::DnsRoundRobin && spec.endpoints.len() > 1 {
        errs.0.push(ValidationError::InvalidAddress {
            field: "spec.endpoints".into(),
            value: format!("{} endpoints", spec.endpoints.len()),
            reason: "resolution DNS_ROUND_ROBIN takes at most one endpoint".into(),
        });
    }
    if spec.resolution != Resolution::None && spec.hosts.iter().any(|h| h.starts_with("*.")) {
        errs.0.push(ValidationError::InvalidHost {
            field: "spec.hosts".into(),
            value: spec.hosts.join(","),
            reason: "wildcard hosts need resolution NONE".into(),
        });
    }
    errs.into_result()
}

/// Semantic checks of a `Sidecar` spec.
pub fn validate_sidecar(spec: &SidecarSpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    for (i, l) in spec.egress.iter().enumerate() {
        if l.hosts.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("spec.egress[{i}].hosts"),
            });
        }
        for (j, h) in l.hosts.iter().enumerate() {
            errs.check(validate_sidecar_host(
                h,
                &format!("spec.egress[{i}].hosts[{j}]"),
            ));
        }
        if let Some(p) = &l.port {
            errs.check(validate_port(p, &format!("spec.egress[{i}].port")));
        }
        if !l.bind.is_empty() {
            errs.check(validate_ip(&l.bind, &format!("spec.egress[{i}].bind")));
        }
    }
    let egress_ports: Vec<Port> = spec.egress.iter().filter_map(|l| l.port.clone()).collect();
    validate_unique_ports(&egress_ports, "spec.egress[].port", &mut errs);
    for (i, l) in spec.ingress.iter().enumerate() {
        errs.check(validate_port(&l.port, &format!("spec.ingress[{i}].port")));
        if !l.bind.is_empty() {
            errs.check(validate_ip(&l.bind, &format!("spec.ingress[{i}].bind")));
        }
        if !l.default_endpoint.is_empty() && !valid_default_endpoint(&l.default_endpoint) {
            errs.0.push(ValidationError::InvalidAddress {
                field: format!("spec.ingress[{i}].defaultEndpoint"),
                value: l.default_endpoint.clone(),
                reason: "must be 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT or unix://PATH".into(),
            });
        }
    }
    let ingress_ports: Vec<Port> = spec.ingress.iter().map(|l| l.port.clone()).collect();
    validate_unique_ports(&ingress_ports, "spec.ingress[].port", &mut errs);
    errs.into_result()
}

fn valid_default_endpoint(ep: &str) -> bool {
    if ep.starts_with("unix://") {
        return ep.len() > "unix://".len();
    }
    ep.parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.port() != 0 && (a.ip().is_loopback() || a.ip().is_unspecified()))
}

/// Semantic checks of an `EnvoyFilter` spec: each patch's operation fits its `applyTo`, and
/// values are present where the operation needs one.
pub fn validate_envoy_filter(spec: &EnvoyFilterSpec) -> Result<(), ValidationErrors> {
    use crate::networking::PatchOperation as Op;
    let mut errs = ValidationErrors::default();
    for (i, p) in spec.config_patches.iter().enumerate() {
        let field = format!("spec.configPatches[{i}]");
        let bad = |reason: String| ValidationError::InvalidPatch {
            field: field.clone(),
            reason,
        };
        if p.apply_to == ApplyTo::Invalid {
            errs.0.push(bad("applyTo must be set".into()));
            continue;
        }
        let op = p.patch.operation;
        let allowed: &[Op] = match p.apply_to {
            ApplyTo::Listener | ApplyTo::Cluster | ApplyTo::RouteConfiguration => {
                &[Op::Merge, Op::Add, Op::Remove, Op::Replace]
            }
            ApplyTo::FilterChain | ApplyTo::VirtualHost => {
                &[Op::Merge, Op::Add, Op::Remove, Op::Replace]
            }
            ApplyTo::HttpRoute => &[
                Op::Merge,
                Op::Add,
                Op::Remove,
                Op::InsertBefore,
                Op::InsertAfter,
                Op::InsertFirst,
                Op::Replace,
            ],
            ApplyTo::NetworkFilter | ApplyTo::HttpFilter => &[
                Op::Merge,
                Op::Add,
                Op::Remove,
                Op::InsertBefore,
                Op::InsertAfter,
                Op::InsertFirst,
                Op::Replace,
            ],
            ApplyTo::Invalid => &[],
        };
        if !allowed.contains(&op) {
            errs.0.push(bad(format!(
                "operation {op:?} is not supported for applyTo {:?}",
                p.apply_to
            )));
        }
        let needs_value = !matches!(op, Op::Remove | Op::Invalid);
        match &p.patch.value {
            None if needs_value => errs
                .0
                .push(bad(format!("operation {op:?} needs patch.value"))),
            Some(v) if needs_value && !v.is_object() => {
                errs.0.push(bad("patch.value must be an object".into()))
            }
            _ => {}
        }
        let m = p.match_.as_ref();
        let listener_level = matches!(
            p.apply_to,
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::NetworkFilter | ApplyTo::HttpFilter
        );
        if m.is_some_and(|m| m.cluster.is_some()) && p.apply_to != ApplyTo::Cluster {
            errs.0.push(bad(
                "match.cluster is only valid with applyTo CLUSTER".into()
            ));
        }
        if m.is_some_and(|m| m.listener.is_some()) && !listener_level {
            errs.0.push(bad("match.listener is only valid with applyTo LISTENER, FILTER_CHAIN, NETWORK_FILTER or HTTP_FILTER".into()));
        }
        if m.is_some_and(|m| m.route_configuration.is_some())
            && !matches!(
                p.apply_to,
                ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute
            )
        {
            errs.0.push(bad("match.routeConfiguration is only valid with applyTo ROUTE_CONFIGURATION, VIRTUAL_HOST or HTTP_ROUTE".into()));
        }
        if p.apply_to != ApplyTo::HttpRoute
            && m.and_then(|m| m.route_configuration.as_ref())
                .and_then(|r| r.vhost.as_ref())
                .is_some_and(|v| v.route.is_some())
        {
            errs.0.push(bad(
                "match.routeConfiguration.vhost.route is only valid with applyTo HTTP_ROUTE".into(),
            ));
        }
    }
    for (k, v) in spec.workload_selector.iter().flat_map(|s| s.labels.iter()) {
        errs.check(validate_label_key(k, "spec.workloadSelector.labels"));
        errs.check(validate_label_value(v, "spec.workloadSelector.labels"));
    }
    errs.into_result()
}

pub(crate) fn validate_ip(value: &str, field: &str) -> Result<(), ValidationError> {
    value
        .parse::<IpAddr>()
        .map(|_| ())
        .map_err(|_| ValidationError::InvalidAddress {
            field: field.into(),
            value: value.into(),
            reason: "not an IP address".into(),
        })
}

pub(crate) fn validate_ip_or_cidr(value: &str, field: &str) -> Result<(), ValidationError> {
    let invalid = |reason: &str| ValidationError::InvalidAddress {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    };
    match value.split_once('/') {
        None => validate_ip(value, field),
        Some((ip, len)) => {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| invalid("not an IP address or CIDR"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            match len.parse::<u8>() {
                Ok(l) if l <= max => Ok(()),
                _ => Err(invalid("CIDR prefix length out of range")),
            }
        }
    }
}
