//! The listeners of a Kubernetes Gateway API `Gateway` and the routes that attach to them
//! (docs/architecture.md, "Gateway API gateways"), judged as the specification says: which
//! listeners are accepted, conflicted, resolved and programmed, which route kinds each takes
//! from which namespaces, and, for one `parentRef` of a route, the listeners it attaches to and
//! the hostnames it serves on each, or the reason it attaches to none.
//!
//! Pure and independent of the API types: [`ListenerSpec`] and [`RouteAttachment`] are what
//! the Gateway API objects are read into, and the facts the instance knows (Secrets,
//! ReferenceGrants, the labels of the tenant's namespaces) are asked through [`ListenerFacts`].
//! Whatever is outside the tenant is unknown here, so a certificate or a route namespace of
//! another tenant never resolves: a Secret there is "not found", a namespace has no labels.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use meshplane_crds::selector::label_selector_matches;

use super::traffic::host_matches;

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";
pub const HTTP_ROUTE: &str = "HTTPRoute";
pub const GRPC_ROUTE: &str = "GRPCRoute";
pub const TLS_ROUTE: &str = "TLSRoute";
pub const TCP_ROUTE: &str = "TCPRoute";

/// Ports a gateway proxy keeps for itself (admin, readiness and the other `150xx` ports of
/// contract 6): a listener there cannot be bound.
pub const RESERVED_PORTS: std::ops::RangeInclusive<i32> = 15000..=15099;

/// A route kind: group and kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKind {
    pub group: String,
    pub kind: String,
}

impl RouteKind {
    pub fn gateway_api(kind: &str) -> Self {
        Self {
            group: GROUP.to_string(),
            kind: kind.to_string(),
        }
    }
}

/// A listener's TLS mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Terminate,
    Passthrough,
}

/// A reference from a listener to a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateRef {
    /// `""` (core) for a Secret.
    pub group: String,
    /// `Secret` unless set otherwise.
    pub kind: String,
    /// The Gateway's namespace unless set.
    pub namespace: Option<String>,
    pub name: String,
}

/// Where routes may attach from (`allowedRoutes.namespaces.from`).
#[derive(Clone, Debug, PartialEq, Default)]
pub enum RouteNamespaces {
    /// The Gateway's namespace (the default).
    #[default]
    Same,
    /// Every namespace (of the tenant: nothing outside it is read).
    All,
    /// Namespaces whose labels match.
    Selector(LabelSelector),
}

/// A listener as the Gateway declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerSpec {
    pub name: String,
    pub hostname: Option<String>,
    pub port: i32,
    /// As written: `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed protocol.
    pub protocol: String,
    /// `tls.mode` when `tls` is set (`Terminate` by default).
    pub tls_mode: Option<TlsMode>,
    pub certificate_refs: Vec<CertificateRef>,
    pub allowed_namespaces: RouteNamespaces,
    /// `allowedRoutes.kinds`; empty: the protocol's kinds.
    pub allowed_kinds: Vec<RouteKind>,
}

/// What a Secret named by a listener turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretState {
    /// A TLS Secret with a certificate and a key.
    Usable,
    /// Present but not a usable certificate and key.
    Invalid,
    /// Not found (or in a namespace outside the tenant).
    Missing,
}

/// What the instance knows that listeners and attachments depend on.
pub trait ListenerFacts {
    /// The state of Secret `namespace/name`.
    fn secret(&self, namespace: &str, name: &str) -> SecretState;
    /// Whether a ReferenceGrant in `to_namespace` lets Gateways of `from_namespace` refer to
    /// Secret `name` there.
    fn secret_granted(&self, from_namespace: &str, to_namespace: &str, name: &str) -> bool;
    /// The labels of a namespace of the tenant; `None` for any other.
    fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>>;
}

/// One condition as the specification names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    fn new(type_: &'static str, status: bool, reason: &'static str, message: String) -> Self {
        Self {
            type_,
            status,
            reason,
            message,
        }
    }
}

/// The verdict on one listener: its status entry and what it serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerVerdict {
    pub name: String,
    /// The route kinds it takes (`status.listeners[].supportedKinds`).
    pub supported_kinds: Vec<RouteKind>,
    /// `Accepted`, `ResolvedRefs`, `Conflicted`, `Programmed`, in that order.
    pub conditions: Vec<Condition>,
    /// The certificates it serves (`namespace`, `name`), when it terminates TLS.
    pub certificates: Vec<(String, String)>,
}

impl ListenerVerdict {
    fn condition(&self, type_: &str) -> bool {
        self.conditions.iter().any(|c| c.type_ == type_ && c.status)
    }

    /// Accepted and not conflicted: routes may attach.
    pub fn accepted(&self) -> bool {
        self.condition("Accepted") && !self.condition("Conflicted")
    }

    /// Accepted, not conflicted, and every reference it needs resolved well enough to serve.
    pub fn programmed(&self) -> bool {
        self.condition("Programmed")
    }
}

/// The protocols one port can serve together: HTTP alone, TLS-based (HTTPS and TLS, told
/// apart by SNI), TCP alone, UDP alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortFamily {
    Http,
    Tls,
    Tcp,
    Udp,
    Unsupported,
}

fn family(protocol: &str) -> PortFamily {
    match protocol {
        "HTTP" => PortFamily::Http,
        "HTTPS" | "TLS" => PortFamily::Tls,
        "TCP" => PortFamily::Tcp,
        "UDP" => PortFamily::Udp,
        _ => PortFamily::Unsupported,
    }
}

/// The route kinds a listener of this protocol and TLS mode can take.
pub fn protocol_kinds(protocol: &str, tls_mode: Option<TlsMode>) -> Vec<RouteKind> {
    let kinds: &[&str] = match (protocol, tls_mode) {
        ("HTTP", _) | ("HTTPS", _) => &[HTTP_ROUTE, GRPC_ROUTE],
        ("TLS", Some(TlsMode::Passthrough)) => &[TLS_ROUTE],
        ("TLS", _) => &[TCP_ROUTE],
        ("TCP", _) => &[TCP_ROUTE],
        _ => &[],
    };
    kinds.iter().map(|k| RouteKind::gateway_api(k)).collect()
}

/// Judges every listener of a Gateway in `gateway_namespace`.
pub fn judge_listeners(
    listeners: &[ListenerSpec],
    gateway_namespace: &str,
    facts: &dyn ListenerFacts,
) -> Vec<ListenerVerdict> {
    let conflicts = conflicts(listeners);
    listeners
        .iter()
        .zip(conflicts)
        .map(|(l, conflict)| judge_listener(l, conflict, gateway_namespace, facts))
        .collect()
}

/// Per listener: `Some((reason, message))` when it conflicts with another on its port.
fn conflicts(listeners: &[ListenerSpec]) -> Vec<Option<(&'static str, String)>> {
    listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let same_port = || {
                listeners
                    .iter()
                    .enumerate()
                    .filter(move |(j, o)| *j != i && o.port == l.port)
                    .map(|(_, o)| o)
            };
            if let Some(o) = same_port().find(|o| family(&o.protocol) != family(&l.protocol)) {
                return Some((
                    "ProtocolConflict",
                    format!(
                        "port {} is also used by listener {:?} with protocol {}",
                        l.port, o.name, o.protocol
                    ),
                ));
            }
            // Same family: TCP and UDP listeners cannot be told apart at all, the others by
            // hostname.
            let by_hostname = matches!(family(&l.protocol), PortFamily::Http | PortFamily::Tls);
            let clash = same_port().find(|o| {
                !by_hostname
                    || o.hostname.as_deref().map(str::to_ascii_lowercase)
                        == l.hostname.as_deref().map(str::to_ascii_lowercase)
            });
            clash.map(|o| {
                (
                    "HostnameConflict",
                    format!(
                        "listener {:?} serves the same hostname on port {}",
                        o.name, l.port
                    ),
                )
            })
        })
        .collect()
}

fn judge_listener(
    l: &ListenerSpec,
    conflict: Option<(&'static str, String)>,
    gateway_namespace: &str,
    facts: &dyn ListenerFacts,
) -> ListenerVerdict {
    let mut refs_problem: Option<(&'static str, String)> = None;
    let protocol_kinds = protocol_kinds(&l.protocol, l.tls_mode);
    // Accepted: the protocol, the TLS mode and the port.
    let accepted: Result<(), (&'static str, String)> = if protocol_kinds.is_empty() {
        Err((
            "UnsupportedProtocol",
            format!("protocol {} is not supported", l.protocol),
        ))
    } else if l.protocol == "HTTPS" && l.tls_mode == Some(TlsMode::Passthrough) {
        Err((
            "UnsupportedProtocol",
            "an HTTPS listener terminates TLS; use protocol TLS for passthrough".to_string(),
        ))
    } else if matches!(l.protocol.as_str(), "HTTPS" | "TLS") && l.tls_mode.is_none() {
        Err((
            "UnsupportedProtocol",
            format!("a {} listener needs tls", l.protocol),
        ))
    } else if !(1..=65535).contains(&l.port) || RESERVED_PORTS.contains(&l.port) {
        Err((
            "PortUnavailable",
            format!(
                "port {} is reserved by the gateway proxy ({}-{})",
                l.port,
                RESERVED_PORTS.start(),
                RESERVED_PORTS.end()
            ),
        ))
    } else {
        Ok(())
    };
    // Route kinds: the allowed ones this protocol can take.
    let supported_kinds: Vec<RouteKind> = if l.allowed_kinds.is_empty() {
        protocol_kinds.clone()
    } else {
        let mut kinds: Vec<RouteKind> = Vec::new();
        for k in &l.allowed_kinds {
            if protocol_kinds.contains(k) {
                if !kinds.contains(k) {
                    kinds.push(k.clone());
                }
            } else if refs_problem.is_none() {
                refs_problem = Some((
                    "InvalidRouteKinds",
                    format!(
                        "route kind {}/{} is not supported on a {} listener",
                        k.group, k.kind, l.protocol
                    ),
                ));
            }
        }
        kinds
    };
    // Certificates of a terminating listener.
    let mut certificates = Vec::new();
    let terminates = l.tls_mode == Some(TlsMode::Terminate);
    if terminates {
        for r in &l.certificate_refs {
            let ns = r.namespace.as_deref().unwrap_or(gateway_namespace);
            let problem = if !(r.group.is_empty() && r.kind == "Secret") {
                Some((
                    "InvalidCertificateRef",
                    format!(
                        "certificateRef {}/{} {:?}: only core Secrets are supported",
                        r.group, r.kind, r.name
                    ),
                ))
            } else if ns != gateway_namespace
                && !facts.secret_granted(gateway_namespace, ns, &r.name)
            {
                Some((
                    "RefNotPermitted",
                    format!(
                        "Secret {ns}/{} is in another namespace and no ReferenceGrant there allows it",
                        r.name
                    ),
                ))
            } else {
                match facts.secret(ns, &r.name) {
                    SecretState::Usable => None,
                    SecretState::Invalid => Some((
                        "InvalidCertificateRef",
                        format!("Secret {ns}/{} holds no usable tls.crt and tls.key", r.name),
                    )),
                    SecretState::Missing => Some((
                        "InvalidCertificateRef",
                        format!("Secret {ns}/{} not found", r.name),
                    )),
                }
            };
            match problem {
                None => certificates.push((ns.to_string(), r.name.clone())),
                Some(p) => {
                    if refs_problem.is_none() {
                        refs_problem = Some(p);
                    }
                }
            }
        }
        if l.certificate_refs.is_empty() && refs_problem.is_none() {
            refs_problem = Some((
                "InvalidCertificateRef",
                "a listener that terminates TLS needs a certificateRef".to_string(),
            ));
        }
    }
    let mut conditions = Vec::with_capacity(4);
    conditions.push(match &accepted {
        Ok(()) => Condition::new("Accepted", true, "Accepted", "listener accepted".into()),
        Err((reason, msg)) => Condition::new("Accepted", false, reason, msg.clone()),
    });
    conditions.push(match &refs_problem {
        None => Condition::new(
            "ResolvedRefs",
            true,
            "ResolvedRefs",
            "references resolved".into(),
        ),
        Some((reason, msg)) => Condition::new("ResolvedRefs", false, reason, msg.clone()),
    });
    conditions.push(match &conflict {
        None => Condition::new("Conflicted", false, "NoConflicts", "no conflicts".into()),
        Some((reason, msg)) => Condition::new("Conflicted", true, reason, msg.clone()),
    });
    let programmed = if accepted.is_err() {
        Err("the listener is not accepted".to_string())
    } else if let Some((_, msg)) = &conflict {
        Err(format!("conflicted: {msg}"))
    } else if terminates && certificates.is_empty() {
        Err("no usable certificate".to_string())
    } else {
        Ok(())
    };
    conditions.push(match programmed {
        Ok(()) => Condition::new(
            "Programmed",
            true,
            "Programmed",
            "listener programmed".into(),
        ),
        Err(msg) => Condition::new("Programmed", false, "Invalid", msg),
    });
    ListenerVerdict {
        name: l.name.clone(),
        supported_kinds,
        conditions,
        certificates,
    }
}

/// Whether `hostname` is matched by listener or route pattern `pattern` (a leading `*.`
/// matches one or more labels, as the specification says).
pub fn hostname_matches(pattern: &str, hostname: &str) -> bool {
    pattern.eq_ignore_ascii_case(hostname)
        || (pattern.starts_with("*.") && host_matches(pattern, hostname))
}

/// The hostnames a route serves on a listener: the intersection of the listener's hostname
/// (any when unset) with the route's hostnames (any when none), each pair giving the narrower
/// side. Empty: they do not intersect. `"*"` stands for any hostname.
pub fn intersect_hostnames(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let listener = listener.filter(|h| !h.is_empty());
    if route.is_empty() {
        return vec![listener.unwrap_or("*").to_ascii_lowercase()];
    }
    let mut out: Vec<String> = Vec::new();
    for r in route {
        let r = r.to_ascii_lowercase();
        let narrower = match listener {
            None => Some(r),
            Some(l) => {
                let l = l.to_ascii_lowercase();
                if hostname_matches(&l, &r) {
                    Some(r)
                } else if hostname_matches(&r, &l) {
                    Some(l)
                } else {
                    None
                }
            }
        };
        if let Some(h) = narrower {
            if !out.contains(&h) {
                out.push(h);
            }
        }
    }
    out
}

/// One `parentRef` of a route to a Gateway, with what the listeners need of the route.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteAttachment<'a> {
    pub kind: RouteKind,
    pub namespace: &'a str,
    /// `spec.hostnames` (HTTPRoute, GRPCRoute, TLSRoute); empty for TCPRoute.
    pub hostnames: &'a [String],
    pub section_name: Option<&'a str>,
    pub port: Option<i32>,
}

/// The listeners a route attaches to, with its hostnames on each.
#[derive(Clone, Debug, PartialEq)]
pub struct Attached {
    /// (listener index, hostnames).
    pub listeners: Vec<(usize, Vec<String>)>,
}

/// Why a route attaches to no listener: the route parent's `Accepted=False` reason.
#[derive(Clone, Debug, PartialEq)]
pub struct NotAttached {
    pub reason: &'static str,
    pub message: String,
}

/// Whether listener `l` (judged `v`) lets a route of `kind` from `namespace` attach
/// (`allowedRoutes`): what `attachedRoutes` counts.
pub fn allows(
    l: &ListenerSpec,
    v: &ListenerVerdict,
    gateway_namespace: &str,
    kind: &RouteKind,
    namespace: &str,
    facts: &dyn ListenerFacts,
) -> bool {
    v.supported_kinds.contains(kind)
        && match &l.allowed_namespaces {
            RouteNamespaces::Same => namespace == gateway_namespace,
            // Every namespace the tenant has: another tenant's routes are never read.
            RouteNamespaces::All => facts.namespace_labels(namespace).is_some(),
            RouteNamespaces::Selector(sel) => facts
                .namespace_labels(namespace)
                .is_some_and(|labels| label_selector_matches(sel, labels)),
        }
}

/// The listeners named by a `parentRef` (its sectionName and port), by index.
fn selected_listeners<'l>(
    listeners: &'l [ListenerSpec],
    route: &RouteAttachment<'_>,
) -> Vec<(usize, &'l ListenerSpec)> {
    listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| route.section_name.is_none_or(|s| s == l.name))
        .filter(|(_, l)| route.port.is_none_or(|p| p == l.port))
        .collect()
}

/// The listeners a `parentRef` attaches through (the whole `allowedRoutes` and `parentRef`
/// test, hostnames aside): the ones whose `attachedRoutes` count it.
pub fn counted_by(
    listeners: &[ListenerSpec],
    verdicts: &[ListenerVerdict],
    gateway_namespace: &str,
    route: &RouteAttachment<'_>,
    facts: &dyn ListenerFacts,
) -> Vec<usize> {
    selected_listeners(listeners, route)
        .into_iter()
        .filter(|(i, l)| {
            verdicts.get(*i).is_some_and(|v| {
                allows(l, v, gateway_namespace, &route.kind, route.namespace, facts)
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// Attaches one `parentRef` of a route to a Gateway's listeners, as the specification orders
/// the checks: a listener the reference names, then one whose `allowedRoutes` takes the route,
/// then one whose hostname intersects the route's.
pub fn attach(
    listeners: &[ListenerSpec],
    verdicts: &[ListenerVerdict],
    gateway_namespace: &str,
    route: &RouteAttachment<'_>,
    facts: &dyn ListenerFacts,
) -> Result<Attached, NotAttached> {
    let named = selected_listeners(listeners, route);
    if named.is_empty() {
        return Err(NotAttached {
            reason: "NoMatchingParent",
            message: match (route.section_name, route.port) {
                (Some(s), Some(p)) => format!("the Gateway has no listener {s:?} on port {p}"),
                (Some(s), None) => format!("the Gateway has no listener {s:?}"),
                (None, Some(p)) => format!("the Gateway has no listener on port {p}"),
                (None, None) => "the Gateway has no listeners".to_string(),
            },
        });
    }
    let allowed: Vec<(usize, &ListenerSpec)> = named
        .into_iter()
        .filter(|(i, l)| {
            verdicts.get(*i).is_some_and(|v| {
                v.accepted() && allows(l, v, gateway_namespace, &route.kind, route.namespace, facts)
            })
        })
        .collect();
    if allowed.is_empty() {
        return Err(NotAttached {
            reason: "NotAllowedByListeners",
            message: format!(
                "no accepted listener allows a {} from namespace {:?}",
                route.kind.kind, route.namespace
            ),
        });
    }
    let matched: Vec<(usize, Vec<String>)> = allowed
        .into_iter()
        .filter_map(|(i, l)| {
            let hosts = if uses_hostnames(&l.protocol) {
                intersect_hostnames(l.hostname.as_deref(), route.hostnames)
            } else {
                vec!["*".to_string()]
            };
            (!hosts.is_empty()).then_some((i, hosts))
        })
        .collect();
    if matched.is_empty() {
        return Err(NotAttached {
            reason: "NoMatchingListenerHostname",
            message: format!(
                "no listener's hostname intersects the route's hostnames {:?}",
                route.hostnames
            ),
        });
    }
    Ok(Attached { listeners: matched })
}

/// Whether a listener of this protocol matches hostnames (TCP and UDP do not).
fn uses_hostnames(protocol: &str) -> bool {
    matches!(protocol, "HTTP" | "HTTPS" | "TLS")
}

/// The Gateway's own conditions from its listeners' verdicts: `Accepted` while any listener
/// is (reason `ListenersNotValid` when some are not), `Programmed` when the gateway's proxies
/// are ready and some listener is programmed.
pub fn gateway_conditions(verdicts: &[ListenerVerdict], proxies_ready: bool) -> Vec<Condition> {
    let accepted = verdicts.iter().filter(|v| v.accepted()).count();
    let programmed = verdicts.iter().filter(|v| v.programmed()).count();
    let invalid: Vec<&str> = verdicts
        .iter()
        .filter(|v| !v.programmed())
        .map(|v| v.name.as_str())
        .collect();
    let accepted_condition = if verdicts.is_empty() || accepted == 0 {
        Condition::new(
            "Accepted",
            false,
            "ListenersNotValid",
            "no listener is valid".into(),
        )
    } else if invalid.is_empty() {
        Condition::new("Accepted", true, "Accepted", "gateway accepted".into())
    } else {
        Condition::new(
            "Accepted",
            true,
            "ListenersNotValid",
            format!("listeners not valid: {}", invalid.join(", ")),
        )
    };
    let programmed_condition = if programmed == 0 {
        Condition::new(
            "Programmed",
            false,
            "Invalid",
            "no listener can be programmed".into(),
        )
    } else if !proxies_ready {
        Condition::new(
            "Programmed",
            false,
            "Pending",
            "waiting for the gateway's proxies".into(),
        )
    } else {
        Condition::new(
            "Programmed",
            true,
            "Programmed",
            "gateway programmed".into(),
        )
    };
    vec![accepted_condition, programmed_condition]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    #[derive(Default)]
    struct Facts {
        secrets: BTreeMap<(String, String), SecretState>,
        grants: Vec<(String, String, String)>,
        namespaces: BTreeMap<String, BTreeMap<String, String>>,
    }

    impl ListenerFacts for Facts {
        fn secret(&self, namespace: &str, name: &str) -> SecretState {
            self.secrets
                .get(&(namespace.to_string(), name.to_string()))
                .copied()
                .unwrap_or(SecretState::Missing)
        }
        fn secret_granted(&self, from: &str, to: &str, name: &str) -> bool {
            self.grants
                .iter()
                .any(|(f, t, n)| f == from && t == to && n == name)
        }
        fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
            self.namespaces.get(namespace)
        }
    }

    fn facts() -> Facts {
        let mut f = Facts::default();
        f.namespaces.insert("edge".into(), BTreeMap::new());
        f.namespaces.insert(
            "shop".into(),
            BTreeMap::from([("team".to_string(), "shop".to_string())]),
        );
        f.namespaces.insert("other".into(), BTreeMap::new());
        f.secrets
            .insert(("edge".into(), "cert".into()), SecretState::Usable);
        f.secrets
            .insert(("edge".into(), "broken".into()), SecretState::Invalid);
        f.secrets
            .insert(("certs".into(), "shared".into()), SecretState::Usable);
        f
    }

    fn http(name: &str, port: i32, hostname: Option<&str>) -> ListenerSpec {
        ListenerSpec {
            name: name.into(),
            hostname: hostname.map(str::to_string),
            port,
            protocol: "HTTP".into(),
            tls_mode: None,
            certificate_refs: Vec::new(),
            allowed_namespaces: RouteNamespaces::Same,
            allowed_kinds: Vec::new(),
        }
    }

    fn https(name: &str, port: i32, cert: CertificateRef) -> ListenerSpec {
        ListenerSpec {
            protocol: "HTTPS".into(),
            tls_mode: Some(TlsMode::Terminate),
            certificate_refs: vec![cert],
            ..http(name, port, None)
        }
    }

    fn secret(namespace: Option<&str>, name: &str) -> CertificateRef {
        CertificateRef {
            group: String::new(),
            kind: "Secret".into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    fn condition<'a>(v: &'a ListenerVerdict, type_: &str) -> &'a Condition {
        v.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition present")
    }

    fn http_route<'a>(namespace: &'a str, hostnames: &'a [String]) -> RouteAttachment<'a> {
        RouteAttachment {
            kind: RouteKind::gateway_api(HTTP_ROUTE),
            namespace,
            hostnames,
            section_name: None,
            port: None,
        }
    }

    #[test]
    fn wildcard_hostnames_match_one_or_more_labels_but_not_the_bare_domain() {
        assert!(hostname_matches("*.example.com", "foo.example.com"));
        assert!(hostname_matches("*.example.com", "foo.bar.example.com"));
        assert!(!hostname_matches("*.example.com", "example.com"));
        assert!(!hostname_matches("*.example.com", "foo.example.net"));
        assert!(hostname_matches("Shop.Example.com", "shop.example.com"));
        assert!(!hostname_matches("shop.example.com", "*.example.com"));
    }

    #[test]
    fn a_route_serves_the_narrower_side_of_each_intersecting_hostname() {
        let route = vec![
            "foo.example.com".to_string(),
            "*.bar.example.com".to_string(),
            "other.net".to_string(),
        ];
        assert_eq!(
            intersect_hostnames(Some("*.example.com"), &route),
            vec!["foo.example.com", "*.bar.example.com"]
        );
        // A wildcard route hostname narrows to an exact listener hostname it covers.
        assert_eq!(
            intersect_hostnames(Some("a.example.com"), &["*.example.com".to_string()]),
            vec!["a.example.com"]
        );
        assert_eq!(intersect_hostnames(None, &route).len(), 3);
        assert_eq!(
            intersect_hostnames(Some("x.example.com"), &[]),
            vec!["x.example.com"]
        );
        assert_eq!(intersect_hostnames(None, &[]), vec!["*"]);
        assert!(
            intersect_hostnames(Some("example.com"), &["*.example.com".to_string()]).is_empty()
        );
    }

    #[test]
    fn listeners_on_one_port_conflict_by_protocol_or_by_hostname() {
        let f = facts();
        let listeners = vec![
            http("a", 80, Some("a.example.com")),
            http("b", 80, Some("b.example.com")),
            http("c", 80, Some("a.example.com")),
            http("d", 8443, None),
            https("e", 8443, secret(None, "cert")),
            https("f", 443, secret(None, "cert")),
            ListenerSpec {
                protocol: "TLS".into(),
                tls_mode: Some(TlsMode::Passthrough),
                hostname: Some("db.example.com".into()),
                ..https("g", 443, secret(None, "cert"))
            },
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        let conflicted: Vec<(&str, &str)> = v
            .iter()
            .filter(|v| condition(v, "Conflicted").status)
            .map(|v| (v.name.as_str(), condition(v, "Conflicted").reason))
            .collect();
        assert_eq!(
            conflicted,
            vec![
                ("a", "HostnameConflict"),
                ("c", "HostnameConflict"),
                ("d", "ProtocolConflict"),
                ("e", "ProtocolConflict"),
            ]
        );
        // HTTPS and TLS share a port by SNI; the others are programmed.
        assert!(v[1].programmed() && v[5].programmed() && v[6].programmed());
        assert!(!v[0].programmed() && !v[0].accepted());
        assert_eq!(condition(&v[0], "Programmed").reason, "Invalid");
    }

    #[test]
    fn certificates_resolve_in_the_gateway_namespace_or_by_reference_grant() {
        let mut f = facts();
        let listeners = vec![
            https("own", 443, secret(None, "cert")),
            https("missing", 444, secret(None, "nope")),
            https("broken", 445, secret(None, "broken")),
            https("foreign", 446, secret(Some("certs"), "shared")),
            https(
                "kind",
                447,
                CertificateRef {
                    group: "example.com".into(),
                    kind: "Vault".into(),
                    namespace: None,
                    name: "x".into(),
                },
            ),
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        let reasons: Vec<&str> = v
            .iter()
            .map(|v| condition(v, "ResolvedRefs").reason)
            .collect();
        assert_eq!(
            reasons,
            vec![
                "ResolvedRefs",
                "InvalidCertificateRef",
                "InvalidCertificateRef",
                "RefNotPermitted",
                "InvalidCertificateRef"
            ]
        );
        assert_eq!(
            v[0].certificates,
            vec![("edge".to_string(), "cert".to_string())]
        );
        assert!(v[0].programmed());
        assert!(v[1..].iter().all(|v| !v.programmed() && v.accepted()));
        // A ReferenceGrant in the Secret's namespace lets the Gateway use it.
        f.grants
            .push(("edge".into(), "certs".into(), "shared".into()));
        let v = judge_listeners(&listeners, "edge", &f);
        assert!(v[3].programmed());
        assert_eq!(
            v[3].certificates,
            vec![("certs".to_string(), "shared".to_string())]
        );
    }

    #[test]
    fn protocols_ports_and_route_kinds_are_judged() {
        let f = facts();
        let listeners = vec![
            ListenerSpec {
                protocol: "UDP".into(),
                ..http("udp", 53, None)
            },
            http("admin", 15000, None),
            ListenerSpec {
                allowed_kinds: vec![
                    RouteKind::gateway_api(HTTP_ROUTE),
                    RouteKind::gateway_api(TCP_ROUTE),
                ],
                ..http("kinds", 80, None)
            },
            ListenerSpec {
                protocol: "TCP".into(),
                ..http("tcp", 5432, None)
            },
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        assert_eq!(condition(&v[0], "Accepted").reason, "UnsupportedProtocol");
        assert_eq!(condition(&v[1], "Accepted").reason, "PortUnavailable");
        assert_eq!(condition(&v[2], "ResolvedRefs").reason, "InvalidRouteKinds");
        assert_eq!(
            v[2].supported_kinds,
            vec![RouteKind::gateway_api(HTTP_ROUTE)]
        );
        assert!(v[2].programmed());
        assert_eq!(
            v[3].supported_kinds,
            vec![RouteKind::gateway_api(TCP_ROUTE)]
        );
    }

    #[test]
    fn allowed_routes_decide_which_namespaces_attach() {
        let f = facts();
        let listeners = vec![
            http("same", 80, None),
            ListenerSpec {
                allowed_namespaces: RouteNamespaces::Selector(LabelSelector {
                    match_labels: Some(BTreeMap::from([("team".into(), "shop".into())])),
                    ..Default::default()
                }),
                ..http("selected", 81, None)
            },
            ListenerSpec {
                allowed_namespaces: RouteNamespaces::All,
                ..http("all", 82, None)
            },
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        let attached = |ns: &str| -> Vec<usize> {
            attach(&listeners, &v, "edge", &http_route(ns, &[]), &f)
                .map(|a| a.listeners.into_iter().map(|(i, _)| i).collect())
                .unwrap_or_default()
        };
        assert_eq!(attached("edge"), vec![0, 2]);
        assert_eq!(attached("shop"), vec![1, 2]);
        assert_eq!(attached("other"), vec![2]);
        // A namespace outside the tenant has no labels the instance knows: never attached.
        let refused = attach(&listeners, &v, "edge", &http_route("green-ns", &[]), &f)
            .expect_err("not allowed");
        assert_eq!(refused.reason, "NotAllowedByListeners");
        // A kind the listener does not take is not allowed either.
        let tcp = RouteAttachment {
            kind: RouteKind::gateway_api(TCP_ROUTE),
            ..http_route("edge", &[])
        };
        assert_eq!(
            attach(&listeners, &v, "edge", &tcp, &f)
                .expect_err("kind")
                .reason,
            "NotAllowedByListeners"
        );
    }

    #[test]
    fn a_parent_ref_names_listeners_by_section_and_port_and_must_share_a_hostname() {
        let f = facts();
        let listeners = vec![
            http("shop", 80, Some("shop.example.com")),
            http("any", 80, Some("*.example.com")),
            http("alt", 8080, None),
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        let hosts = vec!["shop.example.com".to_string()];
        let attached =
            attach(&listeners, &v, "edge", &http_route("edge", &hosts), &f).expect("attached");
        assert_eq!(
            attached.listeners,
            vec![
                (0, vec!["shop.example.com".to_string()]),
                (1, vec!["shop.example.com".to_string()]),
                (2, vec!["shop.example.com".to_string()]),
            ]
        );
        let by_section = RouteAttachment {
            section_name: Some("alt"),
            ..http_route("edge", &hosts)
        };
        assert_eq!(
            attach(&listeners, &v, "edge", &by_section, &f)
                .expect("attached")
                .listeners
                .len(),
            1
        );
        let by_port = RouteAttachment {
            port: Some(80),
            ..http_route("edge", &hosts)
        };
        assert_eq!(counted_by(&listeners, &v, "edge", &by_port, &f), vec![0, 1]);
        let missing = RouteAttachment {
            section_name: Some("nope"),
            ..http_route("edge", &hosts)
        };
        assert_eq!(
            attach(&listeners, &v, "edge", &missing, &f)
                .expect_err("no such listener")
                .reason,
            "NoMatchingParent"
        );
        let elsewhere = vec!["shop.example.net".to_string()];
        let on_80 = RouteAttachment {
            port: Some(80),
            ..http_route("edge", &elsewhere)
        };
        assert_eq!(
            attach(&listeners, &v, "edge", &on_80, &f)
                .expect_err("no hostname")
                .reason,
            "NoMatchingListenerHostname"
        );
        // attachedRoutes counts it all the same: hostnames are not part of attachment.
        assert_eq!(counted_by(&listeners, &v, "edge", &on_80, &f), vec![0, 1]);
    }

    #[test]
    fn the_gateway_is_accepted_while_any_listener_is_and_programmed_once_proxies_are_ready() {
        let f = facts();
        let listeners = vec![
            http("ok", 80, None),
            https("bad", 443, secret(None, "nope")),
        ];
        let v = judge_listeners(&listeners, "edge", &f);
        let c = gateway_conditions(&v, true);
        assert_eq!((c[0].status, c[0].reason), (true, "ListenersNotValid"));
        assert_eq!((c[1].status, c[1].reason), (true, "Programmed"));
        let c = gateway_conditions(&v, false);
        assert_eq!((c[1].status, c[1].reason), (false, "Pending"));
        let v = judge_listeners(&listeners[1..], "edge", &f);
        let c = gateway_conditions(&v, true);
        assert_eq!((c[0].status, c[1].status), (true, false));
        assert_eq!(c[1].reason, "Invalid");
        let c = gateway_conditions(&[], true);
        assert_eq!((c[0].status, c[1].status), (false, false));
    }
}
