//! `meshplane-proxy capture`: the capture init container's command.
//!
//! Programs the pod's netfilter rules the way a sidecar mesh does: outbound TCP to the proxy's
//! virtual outbound listener (15001), inbound TCP to its virtual inbound listener (15006), with
//! the proxy's own traffic (UID/GID 1337, its xDS and SDS connections included) and its own ports
//! (15000–15021) left alone, and the pod's annotations narrowing what is captured
//! ([`meshplane_crds::capture`]).
//!
//! - [`rules`]: the pure function from a [`CapturePlan`] to the `iptables-restore` input.
//! - [`apply`]: the thin shell that applies it atomically and idempotently, with clear errors
//!   when `iptables-restore` is missing or the process lacks `CAP_NET_ADMIN`.
//!
//! IPv6: the proxy's listeners are IPv4 (`0.0.0.0`), so by default only the IPv4 table is
//! programmed and `ip6tables` is left untouched: a dual-stack pod keeps working, its IPv6
//! traffic bypassing the proxy (the command says so when the pod has a global IPv6 address).
//! `--ipv6 capture` programs the same rules into the IPv6 table (`::1`, `::6`, IPv6 ranges) for
//! proxies that listen on IPv6 too.

pub mod apply;
pub mod rules;

pub use apply::{apply, CaptureError};
pub use rules::{restore_input, CapturePlan, Family};

/// Whether the pod's network namespace has a global IPv6 address, from the text of
/// `/proc/net/if_inet6` (address, index, prefix length, scope, flags, interface).
pub fn has_global_ipv6(if_inet6: &str) -> bool {
    if_inet6.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Scope 00 is global; the loopback interface never counts.
        fields.len() == 6 && fields[3] == "00" && fields[5] != "lo"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_ipv6_ignores_loopback_and_link_local() {
        let lo_and_link_local = "\
00000000000000000000000000000001 01 80 10 80       lo
fe80000000000000a8c1abfffe000001 02 40 20 80     eth0
";
        assert!(!has_global_ipv6(lo_and_link_local));
        let global = "20010db8000000000000000000000005 02 40 00 00     eth0\n";
        assert!(has_global_ipv6(global));
        assert!(!has_global_ipv6(""));
    }
}
