//! What a pod asks of traffic capture, and the grammar of the annotations that say it.
//!
//! The injector reads a pod's `sidecar.meshplane.io/*` capture annotations (the equivalents of
//! Istio's `traffic.sidecar.istio.io/*`) into a [`CaptureScope`], denies the pod when one is
//! malformed, and renders the scope as the arguments of the capture init container
//! ([`init_container_args`]); `meshplane-proxy capture` parses those arguments back with the
//! same parsers ([`parse_port_selection`], [`parse_ports`], [`parse_range_selection`],
//! [`parse_ranges`]), so that what is admitted is exactly what the command accepts.
//!
//! Value grammar (entries are comma-separated; blanks around entries and empty entries are
//! ignored):
//!
//! | annotation | value | default |
//! |---|---|---|
//! | `includeInboundPorts` | `*` (every port) or ports; empty captures no inbound traffic | `*` |
//! | `excludeInboundPorts` | ports | none |
//! | `includeOutboundPorts` | ports captured whatever their destination address | none |
//! | `excludeOutboundPorts` | ports | none |
//! | `includeOutboundIPRanges` | `*` or CIDRs (IPv4 and IPv6); empty captures by port only | `*` |
//! | `excludeOutboundIPRanges` | CIDRs | none |
//!
//! A port is 1–65535; a CIDR is `address/prefix` (a bare address means one host). Exclusions
//! win over inclusions. The proxy's own ports (15000–15021) are never captured inbound, and the
//! proxy's own traffic (UID/GID 1337) never outbound, whatever the annotations say.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::names::{self, ports, PROXY_UID};

/// Flag names of `meshplane-proxy capture`, shared by the injector that renders them and the
/// command that parses them.
pub mod flags {
    /// UID whose traffic is never captured (the proxy's).
    pub const PROXY_UID: &str = "proxy-uid";
    /// GID whose traffic is never captured (the proxy's).
    pub const PROXY_GID: &str = "proxy-gid";
    /// Port of the proxy's virtual outbound listener.
    pub const OUTBOUND_PORT: &str = "outbound-port";
    /// Port of the proxy's virtual inbound listener.
    pub const INBOUND_PORT: &str = "inbound-port";
    /// [`super::CaptureScope::include_inbound_ports`].
    pub const INCLUDE_INBOUND_PORTS: &str = "include-inbound-ports";
    /// [`super::CaptureScope::exclude_inbound_ports`].
    pub const EXCLUDE_INBOUND_PORTS: &str = "exclude-inbound-ports";
    /// [`super::CaptureScope::include_outbound_ports`].
    pub const INCLUDE_OUTBOUND_PORTS: &str = "include-outbound-ports";
    /// [`super::CaptureScope::exclude_outbound_ports`].
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "exclude-outbound-ports";
    /// [`super::CaptureScope::include_outbound_ranges`].
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "include-outbound-ip-ranges";
    /// [`super::CaptureScope::exclude_outbound_ranges`].
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "exclude-outbound-ip-ranges";
}

/// The proxy's own ports (admin, virtual listeners, readiness and the rest of Istio's
/// 15000–15021 block): inbound connections to them always reach the proxy directly.
pub const PROXY_PORTS: (u16, u16) = (ports::PROXY_ADMIN, ports::PROXY_READY);

/// Ports selected for capture: every port, or a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSelection {
    /// `*`.
    All,
    /// The listed ports (sorted, deduplicated); empty selects none.
    Only(Vec<u16>),
}

/// Outbound destinations selected for capture: every address, or a list of CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSelection {
    /// `*`.
    All,
    /// The listed networks (deduplicated, in the order given); empty selects none.
    Only(Vec<IpNet>),
}

/// A pod's capture scope: which inbound ports and outbound destinations the proxy intercepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureScope {
    pub include_inbound_ports: PortSelection,
    pub exclude_inbound_ports: Vec<u16>,
    pub include_outbound_ports: Vec<u16>,
    pub exclude_outbound_ports: Vec<u16>,
    pub include_outbound_ranges: RangeSelection,
    pub exclude_outbound_ranges: Vec<IpNet>,
}

impl Default for CaptureScope {
    /// Everything captured, nothing excluded: what a pod without capture annotations gets.
    fn default() -> Self {
        CaptureScope {
            include_inbound_ports: PortSelection::All,
            exclude_inbound_ports: Vec::new(),
            include_outbound_ports: Vec::new(),
            exclude_outbound_ports: Vec::new(),
            include_outbound_ranges: RangeSelection::All,
            exclude_outbound_ranges: Vec::new(),
        }
    }
}

/// A capture annotation whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata.annotations[\"{annotation}\"]: {reason}")]
pub struct CaptureAnnotationError {
    /// The annotation's full name.
    pub annotation: &'static str,
    /// What is wrong, naming the offending entry.
    pub reason: ValueError,
}

/// Why a capture value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// An entry is not a port number in 1–65535.
    #[error(
        "{entry:?} is not a port (1-65535); use comma-separated port numbers like \"8080,9090\""
    )]
    Port { entry: String },
    /// An entry is not a CIDR or address.
    #[error(
        "{entry:?} is not a CIDR; use comma-separated CIDRs like \"198.18.0.0/15,2001:db8::/32\""
    )]
    Cidr { entry: String },
    /// `*` appears beside other entries.
    #[error("\"*\" selects everything and cannot be combined with other entries (got {value:?})")]
    WildcardWithEntries { value: String },
    /// `*` in an exclusion list.
    #[error("\"*\" is not allowed in an exclusion; to capture nothing, set {include} to \"\"")]
    WildcardExclusion { include: &'static str },
}

impl CaptureScope {
    /// Reads the capture annotations of a pod; absent annotations keep their defaults.
    pub fn from_annotations(
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Result<Self, CaptureAnnotationError> {
        let get = |name: &'static str| annotations.and_then(|a| a.get(name)).map(String::as_str);
        let at = |annotation: &'static str| {
            move |reason: ValueError| CaptureAnnotationError { annotation, reason }
        };
        let mut scope = CaptureScope::default();
        if let Some(v) = get(names::INCLUDE_INBOUND_PORTS_ANNOTATION) {
            scope.include_inbound_ports =
                parse_port_selection(v).map_err(at(names::INCLUDE_INBOUND_PORTS_ANNOTATION))?;
        }
        if let Some(v) = get(names::EXCLUDE_INBOUND_PORTS_ANNOTATION) {
            scope.exclude_inbound_ports =
                parse_exclusion(v, parse_ports, names::INCLUDE_INBOUND_PORTS_ANNOTATION)
                    .map_err(at(names::EXCLUDE_INBOUND_PORTS_ANNOTATION))?;
        }
        if let Some(v) = get(names::INCLUDE_OUTBOUND_PORTS_ANNOTATION) {
            scope.include_outbound_ports =
                parse_ports(v).map_err(at(names::INCLUDE_OUTBOUND_PORTS_ANNOTATION))?;
        }
        if let Some(v) = get(names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION) {
            scope.exclude_outbound_ports =
                parse_exclusion(v, parse_ports, names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION)
                    .map_err(at(names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION))?;
        }
        if let Some(v) = get(names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION) {
            scope.include_outbound_ranges = parse_range_selection(v)
                .map_err(at(names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION))?;
        }
        if let Some(v) = get(names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION) {
            scope.exclude_outbound_ranges = parse_exclusion(
                v,
                parse_ranges,
                names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            )
            .map_err(at(names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION))?;
        }
        Ok(scope)
    }
}

/// The arguments of the capture init container for `scope` (after the `capture` subcommand):
/// every setting spelled out, so that the pod spec shows what its capture does.
pub fn init_container_args(scope: &CaptureScope) -> Vec<String> {
    let flag = |name: &str, value: &dyn fmt::Display| format!("--{name}={value}");
    let list = |name: &str, items: Vec<String>| {
        (!items.is_empty()).then(|| format!("--{name}={}", items.join(",")))
    };
    let ports = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>();
    let nets = |n: &[IpNet]| n.iter().map(IpNet::to_string).collect::<Vec<_>>();
    [
        Some(flag(flags::PROXY_UID, &PROXY_UID)),
        Some(flag(flags::PROXY_GID, &PROXY_UID)),
        Some(flag(flags::OUTBOUND_PORT, &ports::VIRTUAL_OUTBOUND)),
        Some(flag(flags::INBOUND_PORT, &ports::VIRTUAL_INBOUND)),
        Some(flag(
            flags::INCLUDE_INBOUND_PORTS,
            &scope.include_inbound_ports,
        )),
        list(
            flags::EXCLUDE_INBOUND_PORTS,
            ports(&scope.exclude_inbound_ports),
        ),
        list(
            flags::INCLUDE_OUTBOUND_PORTS,
            ports(&scope.include_outbound_ports),
        ),
        list(
            flags::EXCLUDE_OUTBOUND_PORTS,
            ports(&scope.exclude_outbound_ports),
        ),
        Some(flag(
            flags::INCLUDE_OUTBOUND_IP_RANGES,
            &scope.include_outbound_ranges,
        )),
        list(
            flags::EXCLUDE_OUTBOUND_IP_RANGES,
            nets(&scope.exclude_outbound_ranges),
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

impl fmt::Display for PortSelection {
    /// The value as the annotation or flag spells it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSelection::All => f.write_str("*"),
            PortSelection::Only(ports) => {
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

impl fmt::Display for RangeSelection {
    /// The value as the annotation or flag spells it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeSelection::All => f.write_str("*"),
            RangeSelection::Only(nets) => {
                let list: Vec<String> = nets.iter().map(IpNet::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

fn entries(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|e| !e.is_empty())
}

fn is_wildcard(value: &str) -> Result<bool, ValueError> {
    let mut has_star = false;
    let mut others = false;
    for e in entries(value) {
        if e == "*" {
            has_star = true;
        } else {
            others = true;
        }
    }
    if has_star && others {
        return Err(ValueError::WildcardWithEntries {
            value: value.to_owned(),
        });
    }
    Ok(has_star)
}

/// Parses a list of ports (sorted, deduplicated; empty for an empty value).
pub fn parse_ports(value: &str) -> Result<Vec<u16>, ValueError> {
    let mut ports = entries(value)
        .map(|e| match e.parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(ValueError::Port {
                entry: e.to_owned(),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

/// Parses `*` or a list of ports.
pub fn parse_port_selection(value: &str) -> Result<PortSelection, ValueError> {
    if is_wildcard(value)? {
        return Ok(PortSelection::All);
    }
    parse_ports(value).map(PortSelection::Only)
}

/// Parses a list of CIDRs (a bare address is one host; host bits are cleared; duplicates are
/// dropped, the order kept).
pub fn parse_ranges(value: &str) -> Result<Vec<IpNet>, ValueError> {
    let mut nets: Vec<IpNet> = Vec::new();
    for e in entries(value) {
        let net = e
            .parse::<IpNet>()
            .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| ValueError::Cidr {
                entry: e.to_owned(),
            })?
            .trunc();
        if !nets.contains(&net) {
            nets.push(net);
        }
    }
    Ok(nets)
}

/// Parses `*` or a list of CIDRs.
pub fn parse_range_selection(value: &str) -> Result<RangeSelection, ValueError> {
    if is_wildcard(value)? {
        return Ok(RangeSelection::All);
    }
    parse_ranges(value).map(RangeSelection::Only)
}

/// Parses an exclusion list; `include` names the annotation that turns capture off instead.
fn parse_exclusion<T>(
    value: &str,
    parse: fn(&str) -> Result<Vec<T>, ValueError>,
    include: &'static str,
) -> Result<Vec<T>, ValueError> {
    if entries(value).any(|e| e == "*") {
        return Err(ValueError::WildcardExclusion { include });
    }
    parse(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn no_annotations_capture_everything() {
        assert_eq!(
            CaptureScope::from_annotations(None).unwrap(),
            CaptureScope::default()
        );
        let unrelated = annotations(&[("team", "books")]);
        assert_eq!(
            CaptureScope::from_annotations(Some(&unrelated)).unwrap(),
            CaptureScope::default()
        );
    }

    #[test]
    fn every_annotation_is_read() {
        let a = annotations(&[
            (names::INCLUDE_INBOUND_PORTS_ANNOTATION, "9090, 8080,8080"),
            (names::EXCLUDE_INBOUND_PORTS_ANNOTATION, "8081"),
            (names::INCLUDE_OUTBOUND_PORTS_ANNOTATION, "5432"),
            (names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION, "3306,"),
            (
                names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "198.18.0.0/16,2001:db8::/32",
            ),
            (
                names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "198.18.7.9/24, 198.19.0.1",
            ),
        ]);
        let scope = CaptureScope::from_annotations(Some(&a)).unwrap();
        assert_eq!(
            scope,
            CaptureScope {
                include_inbound_ports: PortSelection::Only(vec![8080, 9090]),
                exclude_inbound_ports: vec![8081],
                include_outbound_ports: vec![5432],
                exclude_outbound_ports: vec![3306],
                include_outbound_ranges: RangeSelection::Only(vec![
                    net("198.18.0.0/16"),
                    net("2001:db8::/32")
                ]),
                exclude_outbound_ranges: vec![net("198.18.7.0/24"), net("198.19.0.1/32")],
            }
        );
    }

    #[test]
    fn empty_inclusions_select_nothing_and_differ_from_absent() {
        let a = annotations(&[
            (names::INCLUDE_INBOUND_PORTS_ANNOTATION, ""),
            (names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION, " "),
        ]);
        let scope = CaptureScope::from_annotations(Some(&a)).unwrap();
        assert_eq!(scope.include_inbound_ports, PortSelection::Only(vec![]));
        assert_eq!(scope.include_outbound_ranges, RangeSelection::Only(vec![]));
    }

    #[test]
    fn malformed_values_name_the_annotation_and_the_entry() {
        let cases: &[(&str, &str, &str)] = &[
            (
                names::EXCLUDE_INBOUND_PORTS_ANNOTATION,
                "80,http",
                "\"http\"",
            ),
            (names::INCLUDE_OUTBOUND_PORTS_ANNOTATION, "0", "\"0\""),
            (
                names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION,
                "70000",
                "\"70000\"",
            ),
            (
                names::INCLUDE_INBOUND_PORTS_ANNOTATION,
                "*,80",
                "cannot be combined",
            ),
            (
                names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "198.18.0.0/33",
                "\"198.18.0.0/33\" is not a CIDR",
            ),
            (
                names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "example.com",
                "\"example.com\"",
            ),
            (
                names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "*",
                "set sidecar.meshplane.io/includeOutboundIPRanges to \"\"",
            ),
            (
                names::EXCLUDE_INBOUND_PORTS_ANNOTATION,
                "*",
                "set sidecar.meshplane.io/includeInboundPorts to \"\"",
            ),
        ];
        for (annotation, value, needle) in cases {
            let a = annotations(&[(annotation, value)]);
            let err = CaptureScope::from_annotations(Some(&a)).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("metadata.annotations[\"{annotation}\"]: ")),
                "{msg}"
            );
            assert!(msg.contains(needle), "{msg} should contain {needle}");
        }
    }

    #[test]
    fn init_container_args_spell_out_the_scope() {
        assert_eq!(
            init_container_args(&CaptureScope::default()),
            vec![
                "--proxy-uid=1337",
                "--proxy-gid=1337",
                "--outbound-port=15001",
                "--inbound-port=15006",
                "--include-inbound-ports=*",
                "--include-outbound-ip-ranges=*",
            ]
        );
        let scope = CaptureScope {
            include_inbound_ports: PortSelection::Only(vec![]),
            exclude_inbound_ports: vec![8081],
            include_outbound_ports: vec![443, 5432],
            exclude_outbound_ports: vec![3306],
            include_outbound_ranges: RangeSelection::Only(vec![net("198.18.0.0/15")]),
            exclude_outbound_ranges: vec![net("2001:db8::/32")],
        };
        assert_eq!(
            init_container_args(&scope)[4..],
            [
                "--include-inbound-ports=",
                "--exclude-inbound-ports=8081",
                "--include-outbound-ports=443,5432",
                "--exclude-outbound-ports=3306",
                "--include-outbound-ip-ranges=198.18.0.0/15",
                "--exclude-outbound-ip-ranges=2001:db8::/32",
            ]
        );
    }

    #[test]
    fn rendered_values_parse_back_to_the_same_scope() {
        let scope = CaptureScope {
            include_inbound_ports: PortSelection::Only(vec![80, 443]),
            exclude_inbound_ports: vec![],
            include_outbound_ports: vec![],
            exclude_outbound_ports: vec![],
            include_outbound_ranges: RangeSelection::Only(vec![
                net("198.18.0.0/15"),
                net("::1/128"),
            ]),
            exclude_outbound_ranges: vec![],
        };
        assert_eq!(
            parse_port_selection(&scope.include_inbound_ports.to_string()).unwrap(),
            scope.include_inbound_ports
        );
        assert_eq!(
            parse_range_selection(&scope.include_outbound_ranges.to_string()).unwrap(),
            scope.include_outbound_ranges
        );
        assert_eq!(parse_port_selection("*").unwrap(), PortSelection::All);
        assert_eq!(parse_range_selection(" * ").unwrap(), RangeSelection::All);
    }
}
