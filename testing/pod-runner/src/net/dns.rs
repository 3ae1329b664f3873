//! Name resolution inside pods, the way cluster DNS answers for Services: each pod gets a
//! `hosts` file listing every Service's ClusterIP under `<svc>.<ns>.svc.cluster.local`,
//! `<svc>.<ns>.svc`, `<svc>.<ns>` and, for Services of the pod's own namespace, `<svc>`; and a
//! `resolv.conf` with the cluster search path. Processes of the pod see both at `/etc/hosts`
//! and `/etc/resolv.conf` (bind mounts, as `ip netns exec` does), so the runner rewrites the
//! files in place, never by rename: a bind mount keeps pointing at the old inode.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;

/// The cluster's DNS domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One Service name the pods can resolve.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: Ipv4Addr,
}

/// The `hosts` file of a pod named `hostname` at `pod_ip` in `namespace`.
pub fn hosts_file(
    namespace: &str,
    hostname: &str,
    pod_ip: Ipv4Addr,
    services: &[ServiceName],
) -> String {
    let mut out = String::from(
        "# Kept by the meshplane pod runner (test fixture): cluster Services by name.\n\
         127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    out.push_str(&format!("{pod_ip}\t{hostname}\n"));
    let mut sorted: Vec<&ServiceName> = services.iter().collect();
    sorted.sort();
    for service in sorted {
        let (name, ns) = (&service.name, &service.namespace);
        out.push_str(&format!(
            "{}\t{name}.{ns}.svc.{CLUSTER_DOMAIN} {name}.{ns}.svc {name}.{ns}",
            service.cluster_ip
        ));
        if ns == namespace {
            out.push_str(&format!(" {name}"));
        }
        out.push('\n');
    }
    out
}

/// The `resolv.conf` of a pod in `namespace`: the cluster search path. There is no cluster
/// DNS server; every Service name is in the `hosts` file.
pub fn resolv_conf(namespace: &str) -> String {
    format!(
        "# Kept by the meshplane pod runner (test fixture); Service names are in /etc/hosts.\n\
         search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n\
         options ndots:5\n"
    )
}

/// Looks `host` up in a `hosts` file's content as the resolver does (exact name, any alias).
pub fn lookup(hosts: &str, host: &str) -> Option<Ipv4Addr> {
    let host = host.trim_end_matches('.');
    hosts.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let address: Ipv4Addr = fields.next()?.parse().ok()?;
        fields
            .any(|name| name.eq_ignore_ascii_case(host))
            .then_some(address)
    })
}

/// Writes `content` into `path` in place (same inode), only when it differs.
pub fn write_in_place(path: &Path, content: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(content.as_bytes())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services() -> Vec<ServiceName> {
        vec![
            ServiceName {
                namespace: "shop".into(),
                name: "web".into(),
                cluster_ip: Ipv4Addr::new(198, 19, 0, 10),
            },
            ServiceName {
                namespace: "garden".into(),
                name: "web".into(),
                cluster_ip: Ipv4Addr::new(198, 19, 0, 11),
            },
        ]
    }

    #[test]
    fn services_resolve_by_every_cluster_dns_form_and_short_names_only_in_their_namespace() {
        let hosts = hosts_file(
            "shop",
            "client-1",
            Ipv4Addr::new(198, 18, 0, 12),
            &services(),
        );
        let web = Some(Ipv4Addr::new(198, 19, 0, 10));
        assert_eq!(lookup(&hosts, "web.shop.svc.cluster.local"), web);
        assert_eq!(lookup(&hosts, "web.shop.svc.cluster.local."), web);
        assert_eq!(lookup(&hosts, "web.shop.svc"), web);
        assert_eq!(lookup(&hosts, "web.shop"), web);
        assert_eq!(
            lookup(&hosts, "web"),
            web,
            "short name from the pod's own namespace"
        );
        assert_eq!(
            lookup(&hosts, "web.garden"),
            Some(Ipv4Addr::new(198, 19, 0, 11))
        );
        assert_eq!(
            lookup(&hosts, "client-1"),
            Some(Ipv4Addr::new(198, 18, 0, 12))
        );
        assert_eq!(lookup(&hosts, "db.shop"), None);
        let garden = hosts_file("garden", "g", Ipv4Addr::new(198, 18, 0, 13), &services());
        assert_eq!(lookup(&garden, "web"), Some(Ipv4Addr::new(198, 19, 0, 11)));
    }

    #[test]
    fn the_search_path_starts_with_the_pods_namespace() {
        assert!(resolv_conf("shop")
            .contains("search shop.svc.cluster.local svc.cluster.local cluster.local\n"));
    }

    #[test]
    fn files_are_rewritten_in_place() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("podrunner-dns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        assert!(write_in_place(&path, "a\n").unwrap());
        let inode = std::fs::metadata(&path).unwrap().ino();
        assert!(
            !write_in_place(&path, "a\n").unwrap(),
            "unchanged content is not rewritten"
        );
        assert!(write_in_place(&path, "b\n").unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
