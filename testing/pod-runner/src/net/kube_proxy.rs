//! The kube-proxy part of the runner, as kube-proxy's iptables mode does it: in the node
//! namespace, `nat` PREROUTING (traffic from pods) and OUTPUT (connections opened in the node
//! namespace, e.g. by tests) jump to `MP-SERVICES`, which sends each `clusterIP:port` to a
//! chain that picks one ready endpoint at random and DNATs to it. A pod reaching itself through
//! its own Service (hairpin) is masqueraded to the node address, so that the reply comes back
//! through the node and is un-NATed.
//!
//! The node namespace belongs to the runner, so the whole `nat` table is rewritten at once
//! (`iptables-restore`, atomic) whenever the rules change.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;

/// Mark of connections to masquerade (as kube-proxy's `KUBE-MARK-MASQ`).
const MASQUERADE_MARK: &str = "0x4000/0x4000";

/// One Service port and the ready endpoints its traffic goes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceRoute {
    /// `clusterIP:port`.
    pub frontend: SocketAddr,
    /// Ready endpoints, `podIP:targetPort` (or any address the slice lists).
    pub backends: Vec<SocketAddr>,
}

/// The `iptables-restore` input for the node's `nat` table.
pub fn render_nat_table(routes: &[ServiceRoute]) -> String {
    let mut routes: Vec<&ServiceRoute> = routes.iter().filter(|r| !r.backends.is_empty()).collect();
    routes.sort();
    routes.dedup_by(|a, b| a.frontend == b.frontend);
    let mut chains = String::new();
    let mut rules = String::new();
    for chain in ["MP-SERVICES", "MP-POSTROUTING"] {
        let _ = writeln!(chains, ":{chain} - [0:0]");
    }
    rules.push_str(
        "-A PREROUTING -m comment --comment \"meshplane pod-runner services\" -j MP-SERVICES\n",
    );
    rules.push_str(
        "-A OUTPUT -m comment --comment \"meshplane pod-runner services\" -j MP-SERVICES\n",
    );
    rules.push_str("-A POSTROUTING -j MP-POSTROUTING\n");
    let _ = writeln!(
        rules,
        "-A MP-POSTROUTING -m mark --mark {MASQUERADE_MARK} -j MASQUERADE"
    );
    let mut endpoint_chains: BTreeMap<String, (SocketAddr, SocketAddr)> = BTreeMap::new();
    for route in &routes {
        let service_chain = chain_name("MP-SVC-", &route.frontend.to_string());
        let _ = writeln!(chains, ":{service_chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A MP-SERVICES -d {}/32 -p tcp -m tcp --dport {} -j {service_chain}",
            route.frontend.ip(),
            route.frontend.port()
        );
        let count = route.backends.len();
        for (index, backend) in route.backends.iter().enumerate() {
            let endpoint_chain = chain_name("MP-SEP-", &format!("{}>{}", route.frontend, backend));
            let remaining = count - index;
            if remaining > 1 {
                // Rule i of n takes 1/(n-i) of what reaches it: uniform over the endpoints.
                let _ = writeln!(
                    rules,
                    "-A {service_chain} -m statistic --mode random --probability {:.10} -j {endpoint_chain}",
                    1.0 / remaining as f64
                );
            } else {
                let _ = writeln!(rules, "-A {service_chain} -j {endpoint_chain}");
            }
            endpoint_chains.insert(endpoint_chain, (route.frontend, *backend));
        }
    }
    for (chain, (_, backend)) in &endpoint_chains {
        let _ = writeln!(chains, ":{chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A {chain} -s {}/32 -j MARK --set-xmark {MASQUERADE_MARK}",
            backend.ip()
        );
        let _ = writeln!(
            rules,
            "-A {chain} -p tcp -m tcp -j DNAT --to-destination {backend}"
        );
    }
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{chains}{rules}COMMIT\n"
    )
}

/// `<prefix><16 hex digits of a hash of key>`: stable, and within iptables' 28-character limit.
fn chain_name(prefix: &str, key: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{prefix}{hash:016X}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_frontend_picks_one_of_its_ready_endpoints_uniformly() {
        let rules = render_nat_table(&[ServiceRoute {
            frontend: addr("198.19.0.10:8080"),
            backends: vec![
                addr("198.18.0.10:9080"),
                addr("198.18.0.11:9080"),
                addr("198.18.0.12:9080"),
            ],
        }]);
        let service = chain_name("MP-SVC-", "198.19.0.10:8080");
        assert!(rules.contains(&format!(
            "-A MP-SERVICES -d 198.19.0.10/32 -p tcp -m tcp --dport 8080 -j {service}"
        )));
        let jumps: Vec<&str> = rules
            .lines()
            .filter(|l| l.starts_with(&format!("-A {service} ")))
            .collect();
        assert_eq!(jumps.len(), 3, "{rules}");
        assert!(jumps[0].contains("--probability 0.3333333333"));
        assert!(jumps[1].contains("--probability 0.5000000000"));
        assert!(
            !jumps[2].contains("statistic"),
            "the last endpoint takes the rest"
        );
        for backend in ["198.18.0.10", "198.18.0.11", "198.18.0.12"] {
            assert!(rules.contains(&format!("--to-destination {backend}:9080")));
            assert!(
                rules.contains(&format!(
                    "-s {backend}/32 -j MARK --set-xmark 0x4000/0x4000"
                )),
                "hairpin traffic of {backend} is masqueraded"
            );
        }
        assert!(rules.contains("-A PREROUTING") && rules.contains("-A OUTPUT"));
        assert!(rules.ends_with("COMMIT\n"));
    }

    #[test]
    fn a_service_without_ready_endpoints_gets_no_rule() {
        let rules = render_nat_table(&[ServiceRoute {
            frontend: addr("198.19.0.11:80"),
            backends: vec![],
        }]);
        assert!(!rules.contains("198.19.0.11"), "{rules}");
    }

    #[test]
    fn chain_names_fit_iptables() {
        let name = chain_name("MP-SEP-", "198.19.255.255:65535>198.18.255.255:65535");
        assert!(name.len() <= 28, "{name}");
        assert_eq!(
            name,
            chain_name("MP-SEP-", "198.19.255.255:65535>198.18.255.255:65535")
        );
    }
}
