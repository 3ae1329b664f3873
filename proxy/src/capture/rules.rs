//! The pure half of capture: a [`CapturePlan`] to the `iptables-restore` input of one address
//! family.
//!
//! Rules are written exactly as `iptables-save` prints them back (option order, the implicit
//! `-m tcp`), so that the golden files show what the kernel holds and the command can compare
//! what it applied with what it reads back.
//!
//! The `nat` table gets four chains, all owned by meshplane (every chain named `MESHPLANE_*` is
//! ours):
//!
//! - `MESHPLANE_INBOUND` (from `PREROUTING`, and from `MESHPLANE_OUTPUT` for the proxy's
//!   connections to its own pod): the inbound port policy, the proxy's own ports first;
//! - `MESHPLANE_IN_REDIRECT`: to the virtual inbound listener (15006);
//! - `MESHPLANE_OUTPUT` (from `OUTPUT`): the outbound policy;
//! - `MESHPLANE_REDIRECT`: to the virtual outbound listener (15001).
//!
//! The outbound chain follows the order Istio's `istio-iptables` settled on, for the same
//! reasons:
//!
//! 1. excluded outbound ports return first;
//! 2. connections from the inbound passthrough source (`127.0.0.6`, `::6`) over `lo` return:
//!    the proxy forwarding an inbound connection to the application must not be captured again;
//! 3. the proxy's own connections over `lo` to a non-loopback address (its pod's own IP, e.g. an
//!    endpoint of a Service the pod itself backs) go through the inbound policy, so that a call
//!    to oneself through a Service passes both the outbound and the inbound side, as between
//!    two pods;
//! 4. anything else over `lo` that is not the proxy's (the application calling `localhost` or
//!    its own pod IP) returns, unless an included range is a loopback range;
//! 5. the proxy's own traffic (UID, then GID) returns: its xDS and SDS connections and every
//!    upstream connection it opens;
//! 6. loopback destinations return;
//! 7. excluded ranges return, included ports are redirected, then included ranges are.
//!
//! Applying the input is atomic (`iptables-restore` commits a table in one step) and
//! idempotent: declaring a chain empties it, and the jumps from the built-in chains that a
//! previous run left are deleted (`existing_jumps`) before they are added again.

use std::fmt::Write as _;

use ipnet::IpNet;
use meshplane_crds::capture::{CaptureScope, PortSelection, RangeSelection, PROXY_PORTS};
use meshplane_crds::names::{ports, PROXY_UID};

/// Chain holding the inbound port policy.
pub const INBOUND_CHAIN: &str = "MESHPLANE_INBOUND";
/// Chain redirecting to the virtual inbound listener.
pub const IN_REDIRECT_CHAIN: &str = "MESHPLANE_IN_REDIRECT";
/// Chain holding the outbound policy.
pub const OUTPUT_CHAIN: &str = "MESHPLANE_OUTPUT";
/// Chain redirecting to the virtual outbound listener.
pub const REDIRECT_CHAIN: &str = "MESHPLANE_REDIRECT";
/// Prefix of every chain meshplane owns.
pub const CHAIN_PREFIX: &str = "MESHPLANE_";

/// Built-in `nat` chains a previous run may have left a jump to our chains in.
const BUILTIN_NAT_CHAINS: &[&str] = &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"];

/// IP version whose table is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The loopback address excluded from capture.
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }

    /// Source address of the proxy's inbound passthrough connections to the application.
    fn passthrough_source(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.6/32",
            Family::V6 => "::6/128",
        }
    }

    fn contains(self, net: &IpNet) -> bool {
        matches!(
            (self, net),
            (Family::V4, IpNet::V4(_)) | (Family::V6, IpNet::V6(_))
        )
    }

    /// `iptables` or `ip6tables`.
    pub fn command_prefix(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}

/// Everything that decides the rules of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturePlan {
    /// UID whose traffic is never captured (the proxy's).
    pub proxy_uid: u32,
    /// GID whose traffic is never captured (the proxy's).
    pub proxy_gid: u32,
    /// Virtual outbound listener.
    pub outbound_port: u16,
    /// Virtual inbound listener.
    pub inbound_port: u16,
    /// What the pod's annotations select.
    pub scope: CaptureScope,
}

impl Default for CapturePlan {
    /// The proxy's identity and listeners as the injector renders them, capturing everything.
    fn default() -> Self {
        let uid = u32::try_from(PROXY_UID).unwrap_or(1337);
        CapturePlan {
            proxy_uid: uid,
            proxy_gid: uid,
            outbound_port: ports::VIRTUAL_OUTBOUND,
            inbound_port: ports::VIRTUAL_INBOUND,
            scope: CaptureScope::default(),
        }
    }
}

/// One rule as `iptables-save` prints it, without the leading `-A`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub spec: String,
}

impl Rule {
    fn new(chain: &str, spec: impl Into<String>) -> Self {
        Rule {
            chain: chain.to_owned(),
            spec: spec.into(),
        }
    }
}

/// The `nat` rules of `plan` for `family`, in the order they are appended: our chains' rules,
/// then the jumps from `PREROUTING` and `OUTPUT`.
pub fn rules(plan: &CapturePlan, family: Family) -> Vec<Rule> {
    let scope = &plan.scope;
    let mut r = Vec::new();
    r.push(Rule::new(
        IN_REDIRECT_CHAIN,
        format!("-p tcp -j REDIRECT --to-ports {}", plan.inbound_port),
    ));
    r.push(Rule::new(
        REDIRECT_CHAIN,
        format!("-p tcp -j REDIRECT --to-ports {}", plan.outbound_port),
    ));

    // Inbound: the proxy's own ports, exclusions, then the selection.
    let (low, high) = PROXY_PORTS;
    r.push(Rule::new(
        INBOUND_CHAIN,
        tcp_dport_range(low, high, "RETURN"),
    ));
    for port in &scope.exclude_inbound_ports {
        r.push(Rule::new(INBOUND_CHAIN, tcp_dport(*port, "RETURN")));
    }
    match &scope.include_inbound_ports {
        PortSelection::All => r.push(Rule::new(
            INBOUND_CHAIN,
            format!("-p tcp -j {IN_REDIRECT_CHAIN}"),
        )),
        PortSelection::Only(ports) => {
            for port in ports {
                r.push(Rule::new(
                    INBOUND_CHAIN,
                    tcp_dport(*port, IN_REDIRECT_CHAIN),
                ));
            }
        }
    }

    // Outbound.
    for port in &scope.exclude_outbound_ports {
        r.push(Rule::new(OUTPUT_CHAIN, tcp_dport(*port, "RETURN")));
    }
    r.push(Rule::new(
        OUTPUT_CHAIN,
        format!("-s {} -o lo -j RETURN", family.passthrough_source()),
    ));
    let includes_loopback = match &scope.include_outbound_ranges {
        RangeSelection::All => false,
        RangeSelection::Only(nets) => nets.iter().any(is_loopback),
    };
    let loopback = family.loopback();
    for (owner, id) in [("uid", plan.proxy_uid), ("gid", plan.proxy_gid)] {
        r.push(Rule::new(
            OUTPUT_CHAIN,
            format!(
                "! -d {loopback} -o lo -p tcp -m owner --{owner}-owner {id} -j {INBOUND_CHAIN}"
            ),
        ));
        if !includes_loopback {
            r.push(Rule::new(
                OUTPUT_CHAIN,
                format!("-o lo -m owner ! --{owner}-owner {id} -j RETURN"),
            ));
        }
        r.push(Rule::new(
            OUTPUT_CHAIN,
            format!("-m owner --{owner}-owner {id} -j RETURN"),
        ));
    }
    r.push(Rule::new(OUTPUT_CHAIN, format!("-d {loopback} -j RETURN")));
    for net in scope
        .exclude_outbound_ranges
        .iter()
        .filter(|n| family.contains(n))
    {
        r.push(Rule::new(OUTPUT_CHAIN, format!("-d {net} -j RETURN")));
    }
    for port in &scope.include_outbound_ports {
        r.push(Rule::new(OUTPUT_CHAIN, tcp_dport(*port, REDIRECT_CHAIN)));
    }
    match &scope.include_outbound_ranges {
        RangeSelection::All => r.push(Rule::new(OUTPUT_CHAIN, format!("-j {REDIRECT_CHAIN}"))),
        RangeSelection::Only(nets) => {
            for net in nets.iter().filter(|n| family.contains(n)) {
                r.push(Rule::new(
                    OUTPUT_CHAIN,
                    format!("-d {net} -j {REDIRECT_CHAIN}"),
                ));
            }
        }
    }

    r.push(Rule::new(
        "PREROUTING",
        format!("-p tcp -j {INBOUND_CHAIN}"),
    ));
    r.push(Rule::new("OUTPUT", format!("-p tcp -j {OUTPUT_CHAIN}")));
    r
}

/// The `iptables-restore --noflush` input that makes the `nat` table of `family` hold exactly
/// [`rules`]`(plan, family)` in our chains, given the jumps to our chains found in the current
/// table (see [`existing_jumps`]).
pub fn restore_input(plan: &CapturePlan, family: Family, existing: &[Rule]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# meshplane-proxy capture: {} nat rules",
        family.command_prefix()
    );
    out.push_str("*nat\n");
    // Declaring a chain in --noflush mode creates it, or empties it when it exists.
    for chain in [
        INBOUND_CHAIN,
        IN_REDIRECT_CHAIN,
        OUTPUT_CHAIN,
        REDIRECT_CHAIN,
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    for jump in existing {
        let _ = writeln!(out, "-D {} {}", jump.chain, jump.spec);
    }
    for rule in rules(plan, family) {
        let _ = writeln!(out, "-A {} {}", rule.chain, rule.spec);
    }
    out.push_str("COMMIT\n");
    out
}

/// Parses `iptables-save` output of the `nat` table: the rules in our chains and the jumps to
/// them from the built-in chains, in order.
pub fn owned_rules(save: &str) -> Vec<Rule> {
    let mut in_nat = false;
    let mut found = Vec::new();
    for line in save.lines() {
        let line = line.trim_end();
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let Some((chain, spec)) = rest.split_once(' ') else {
            continue;
        };
        let ours = chain.starts_with(CHAIN_PREFIX);
        let jumps_to_ours = BUILTIN_NAT_CHAINS.contains(&chain)
            && spec
                .split_once("-j ")
                .is_some_and(|(_, target)| target.starts_with(CHAIN_PREFIX));
        if ours || jumps_to_ours {
            found.push(Rule::new(chain, spec));
        }
    }
    found
}

/// The jumps to our chains from built-in chains in `iptables-save` output: what a re-run
/// deletes before adding its own.
pub fn existing_jumps(save: &str) -> Vec<Rule> {
    owned_rules(save)
        .into_iter()
        .filter(|r| !r.chain.starts_with(CHAIN_PREFIX))
        .collect()
}

/// Whether what `iptables-save` shows of our rules is exactly `expected`, chain by chain.
pub fn matches_applied(save: &str, expected: &[Rule]) -> bool {
    let mut applied = owned_rules(save);
    let mut expected = expected.to_vec();
    // iptables-save groups rules by chain; the order inside each chain is what matters.
    let key = |r: &Rule| r.chain.clone();
    applied.sort_by_key(key);
    expected.sort_by_key(key);
    applied == expected
}

fn is_loopback(net: &IpNet) -> bool {
    net.addr().is_loopback()
}

fn tcp_dport(port: u16, target: &str) -> String {
    format!("-p tcp -m tcp --dport {port} -j {target}")
}

fn tcp_dport_range(low: u16, high: u16, target: &str) -> String {
    format!("-p tcp -m tcp --dport {low}:{high} -j {target}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "\
# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
-A INPUT -j MESHPLANE_NOT_NAT
COMMIT
*nat
:PREROUTING ACCEPT [12:720]
:OUTPUT ACCEPT [0:0]
:MESHPLANE_INBOUND - [0:0]
:OTHER - [0:0]
-A PREROUTING -p tcp -j MESHPLANE_INBOUND
-A PREROUTING -p tcp -j MESHPLANE_INBOUND
-A PREROUTING -p udp -j OTHER
-A OUTPUT -p tcp -j MESHPLANE_OUTPUT
-A OTHER -j MESHPLANE_INBOUND
-A MESHPLANE_INBOUND -p tcp -j REDIRECT --to-ports 15006
COMMIT
";

    #[test]
    fn existing_jumps_are_every_builtin_nat_jump_to_our_chains() {
        assert_eq!(
            existing_jumps(SAVED),
            vec![
                Rule::new("PREROUTING", "-p tcp -j MESHPLANE_INBOUND"),
                Rule::new("PREROUTING", "-p tcp -j MESHPLANE_INBOUND"),
                Rule::new("OUTPUT", "-p tcp -j MESHPLANE_OUTPUT"),
            ]
        );
    }

    #[test]
    fn restore_input_deletes_the_jumps_it_finds_before_adding_its_own() {
        let input = restore_input(&CapturePlan::default(), Family::V4, &existing_jumps(SAVED));
        let deletes: Vec<&str> = input.lines().filter(|l| l.starts_with("-D ")).collect();
        assert_eq!(
            deletes,
            vec![
                "-D PREROUTING -p tcp -j MESHPLANE_INBOUND",
                "-D PREROUTING -p tcp -j MESHPLANE_INBOUND",
                "-D OUTPUT -p tcp -j MESHPLANE_OUTPUT",
            ]
        );
        let lines: Vec<&str> = input.lines().collect();
        let first_add = lines.iter().position(|l| l.starts_with("-A ")).unwrap();
        let last_delete = lines.iter().rposition(|l| l.starts_with("-D ")).unwrap();
        assert!(last_delete < first_add);
    }

    #[test]
    fn applied_rules_compare_per_chain() {
        let plan = CapturePlan::default();
        let expected = rules(&plan, Family::V4);
        // What iptables-save prints: built-in chains first, then ours, each in rule order.
        let mut save = String::from("*nat\n");
        for chain in [
            "PREROUTING",
            "OUTPUT",
            INBOUND_CHAIN,
            IN_REDIRECT_CHAIN,
            OUTPUT_CHAIN,
            REDIRECT_CHAIN,
        ] {
            for r in expected.iter().filter(|r| r.chain == chain) {
                save.push_str(&format!("-A {} {}\n", r.chain, r.spec));
            }
        }
        save.push_str("COMMIT\n");
        assert!(matches_applied(&save, &expected));
        let doubled = save.replace(
            "-A OUTPUT -p tcp -j MESHPLANE_OUTPUT\n",
            "-A OUTPUT -p tcp -j MESHPLANE_OUTPUT\n-A OUTPUT -p tcp -j MESHPLANE_OUTPUT\n",
        );
        assert!(!matches_applied(&doubled, &expected));
    }

    #[test]
    fn ranges_of_the_other_family_are_left_out() {
        let mut plan = CapturePlan::default();
        plan.scope.include_outbound_ranges = RangeSelection::Only(vec![
            "198.18.0.0/15".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ]);
        let v4 = restore_input(&plan, Family::V4, &[]);
        let v6 = restore_input(&plan, Family::V6, &[]);
        assert!(v4.contains("-d 198.18.0.0/15 -j MESHPLANE_REDIRECT"));
        assert!(!v4.contains("2001:db8"));
        assert!(v6.contains("-d 2001:db8::/32 -j MESHPLANE_REDIRECT"));
        assert!(!v6.contains("198.18"));
    }
}
