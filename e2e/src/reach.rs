//! Reaching pods from the test process. The test process runs in the host's network namespace,
//! where pod and Service addresses (198.18.0.0/15) do not exist: every connection a scenario
//! makes goes through the test network, opened inside a network namespace the pod runner made.
//!
//! - [`Cluster::in_pod`] acts as a process inside a pod: [`InPod::connect`] and
//!   [`InPod::http_get`] open their connection in the pod's namespace ([`InPod::listen`] a
//!   listener there, for a server the test plays), as the pod's
//!   application would (so the pod's capture rules send it through its sidecar), and resolve
//!   names with the pod's own `/etc/hosts` (`web`, `web.shop`, `web.shop.svc.cluster.local`);
//!   [`InPod::envoy_admin`] and [`InPod::envoy_stats`] read the sidecar's admin interface on
//!   the pod's `127.0.0.1:15000`; [`InPod::command`] runs any program inside the pod's namespace
//!   (a curl-like client, a Python gRPC client), with the pod's `/etc/hosts` and
//!   `/etc/resolv.conf`. [`InPod::netns`] names the namespace for `ip netns exec` too.
//! - [`Cluster::on_node`] acts as a process on the cluster's node (what the kubelet and the API
//!   server use): [`OnNode::connect`] and [`OnNode::http_get`] reach pod IPs and ClusterIPs from
//!   outside every pod, so no sidecar's outbound capture applies; [`OnNode::command`] runs a
//!   program there (a Prometheus that scrapes pods).
//!
//! Against a real cluster (`E2E_KUBECONFIG`) there is no local test network and these return
//! [`HarnessError::NoTestNetwork`].

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use meshplane_pod_runner::net::Placement;
use meshplane_pod_runner::{http_get, HttpReply, PodNet, TestNetwork};
use tokio::net::TcpStream;

use crate::harness::{Cluster, HarnessError};

/// How long one request into the test network may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The sidecar's admin port inside its pod (contract 6).
pub const ENVOY_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15000);

impl Cluster {
    /// Acts inside pod `namespace/name` (which must be running on the local pod runner).
    pub fn in_pod(&self, namespace: &str, name: &str) -> Result<InPod, HarnessError> {
        let network = self.network().ok_or(HarnessError::NoTestNetwork)?;
        let net = network
            .pod(namespace, name)
            .ok_or_else(|| HarnessError::NoSuchPod(format!("{namespace}/{name}")))?;
        Ok(InPod { net })
    }

    /// Acts on the cluster's node, outside every pod.
    pub fn on_node(&self) -> Result<OnNode, HarnessError> {
        let network = self.network().ok_or(HarnessError::NoTestNetwork)?;
        Ok(OnNode {
            network: network.clone(),
        })
    }
}

/// A process inside one pod (see the module docs).
#[derive(Debug, Clone)]
pub struct InPod {
    net: PodNet,
}

impl InPod {
    /// The pod's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.net.ip()
    }

    /// The pod's network namespace name (for `ip netns exec <name> …`).
    pub fn netns(&self) -> &str {
        self.net.netns().name()
    }

    /// Resolves a name as the pod's resolver does (its `/etc/hosts`).
    pub fn resolve(&self, host: &str) -> Option<Ipv4Addr> {
        self.net.resolve(host)
    }

    /// The processes running in the pod: `(pid, command name, effective uid)`.
    pub fn processes(&self) -> Vec<(u32, String, u32)> {
        self.net.processes()
    }

    /// A TCP connection from inside the pod, as the pod's application opens it.
    pub async fn connect(&self, address: SocketAddr) -> Result<TcpStream, HarnessError> {
        self.net.connect(address).await.map_err(|e| {
            HarnessError::Network(format!("connect {address} from {}: {e}", self.describe()))
        })
    }

    /// `GET url` (`http://host[:port]/path`) from inside the pod: the host is resolved with the
    /// pod's `/etc/hosts` and sent as the `Host` header, as any HTTP client in the pod does.
    pub async fn http_get(&self, url: &str) -> Result<HttpReply, HarnessError> {
        let target = HttpTarget::parse(url)?;
        let ip = self.resolve(&target.host).ok_or_else(|| {
            HarnessError::Network(format!(
                "{} does not resolve in {}",
                target.host,
                self.describe()
            ))
        })?;
        let address = SocketAddr::from((ip, target.port));
        http_get(
            self.net.connect(address),
            &address.to_string(),
            &target.authority,
            &target.path,
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| HarnessError::Network(format!("from {}: {e}", self.describe())))
    }

    /// `GET path` on `address` with `Host: host`, from inside the pod: for a host the pod's
    /// `/etc/hosts` does not know (a ServiceEntry's), routed by the sidecar on its `Host`.
    pub async fn http_get_at(
        &self,
        address: SocketAddr,
        host: &str,
        path: &str,
    ) -> Result<HttpReply, HarnessError> {
        http_get(
            self.net.connect(address),
            &address.to_string(),
            host,
            path,
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| HarnessError::Network(format!("from {}: {e}", self.describe())))
    }

    /// A TCP listener inside the pod (a server the test runs as if it were the pod's
    /// application; no sidecar captures it unless the pod has one).
    pub fn listen(&self, address: SocketAddr) -> Result<tokio::net::TcpListener, HarnessError> {
        self.net.listen(address).map_err(|e| {
            HarnessError::Network(format!("listen on {address} in {}: {e}", self.describe()))
        })
    }

    /// `GET path` on the pod's Envoy admin (`127.0.0.1:15000` inside the pod), e.g.
    /// `/config_dump`, `/clusters?format=json`, `/stats`; an answer other than 200 is an error.
    pub async fn envoy_admin(&self, path: &str) -> Result<String, HarnessError> {
        let reply = http_get(
            self.net.connect(ENVOY_ADMIN),
            &format!("{ENVOY_ADMIN} in {}", self.describe()),
            "127.0.0.1",
            path,
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(HarnessError::Network)?;
        if reply.status == 200 {
            Ok(reply.body)
        } else {
            Err(HarnessError::Network(format!(
                "Envoy admin {path} in {} answered {}: {}",
                self.describe(),
                reply.status,
                reply.body
            )))
        }
    }

    /// The sidecar's counters and gauges (`/stats`), by name.
    pub async fn envoy_stats(&self) -> Result<EnvoyStats, HarnessError> {
        Ok(EnvoyStats::parse(&self.envoy_admin("/stats").await?))
    }

    /// A command that runs inside the pod's network namespace, as root, with the pod's
    /// `/etc/hosts` and `/etc/resolv.conf`.
    pub fn command(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<tokio::process::Command, HarnessError> {
        self.net
            .command(program)
            .map_err(|e| HarnessError::Network(format!("entering {}: {e}", self.describe())))
    }

    fn describe(&self) -> String {
        format!(
            "pod {}/{} ({})",
            self.net.namespace(),
            self.net.name(),
            self.net.ip()
        )
    }
}

/// A process on the cluster's node (see the module docs).
#[derive(Debug, Clone)]
pub struct OnNode {
    network: TestNetwork,
}

impl OnNode {
    /// A TCP connection from the node (to a pod IP, or a ClusterIP through the Service rules).
    pub async fn connect(&self, address: SocketAddr) -> Result<TcpStream, HarnessError> {
        self.network
            .connect(address)
            .await
            .map_err(|e| HarnessError::Network(format!("connect {address} from the node: {e}")))
    }

    /// `GET path` on `address` with `Host: host`, from the node.
    pub async fn http_get(
        &self,
        address: SocketAddr,
        host: &str,
        path: &str,
    ) -> Result<HttpReply, HarnessError> {
        http_get(
            self.network.connect(address),
            &address.to_string(),
            host,
            path,
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| HarnessError::Network(format!("from the node: {e}")))
    }

    /// A command that runs on the node, in its network namespace, as root: a process that must
    /// reach pod addresses itself, as a Prometheus scraping pods does. Its listeners are
    /// reached with [`OnNode::connect`] and [`OnNode::http_get`] (on `127.0.0.1`, the node's own
    /// loopback, not the host's).
    pub fn command(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<tokio::process::Command, HarnessError> {
        let mut command = tokio::process::Command::new(program);
        Placement {
            netns: Some(self.network.node().path()),
            ..Placement::default()
        }
        .apply(&mut command)
        .map_err(|e| HarnessError::Network(format!("entering the node: {e}")))?;
        Ok(command)
    }

    /// A port of the node's loopback that nothing listens on (the kernel's pick), for a
    /// process started with [`OnNode::command`].
    pub fn free_port(&self) -> Result<u16, HarnessError> {
        self.network
            .node()
            .run_inside(|| {
                std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                    .local_addr()
                    .map(|a| a.port())
            })
            .map_err(|e| HarnessError::Network(format!("a free port on the node: {e}")))
    }
}

/// Envoy's `/stats` counters and gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyStats(pub BTreeMap<String, u64>);

impl EnvoyStats {
    /// Parses `name: value` lines (histogram lines, which are not numbers, are skipped).
    pub fn parse(text: &str) -> Self {
        EnvoyStats(
            text.lines()
                .filter_map(|line| {
                    let (name, value) = line.rsplit_once(": ")?;
                    Some((name.trim().to_string(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The value of stat `name` (0 when Envoy does not have it: counters appear on first use).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// The parts of an `http://` URL the harness needs.
struct HttpTarget {
    host: String,
    port: u16,
    authority: String,
    path: String,
}

impl HttpTarget {
    fn parse(url: &str) -> Result<Self, HarnessError> {
        let invalid = |why: &str| HarnessError::Network(format!("URL {url:?}: {why}"));
        let uri: http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid("only http:// URLs are supported"));
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        Ok(HttpTarget {
            host: authority.host().to_string(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.to_string(),
            path: uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_port_authority_and_path() {
        let target = HttpTarget::parse("http://web.shop.svc.cluster.local:8080/a?b=1").unwrap();
        assert_eq!(target.host, "web.shop.svc.cluster.local");
        assert_eq!(target.port, 8080);
        assert_eq!(target.authority, "web.shop.svc.cluster.local:8080");
        assert_eq!(target.path, "/a?b=1");
        let bare = HttpTarget::parse("http://web").unwrap();
        assert_eq!((bare.port, bare.path.as_str()), (80, "/"));
        assert!(HttpTarget::parse("https://web/").is_err());
    }

    #[test]
    fn envoy_stats_parse_counters_and_skip_histograms() {
        let stats = EnvoyStats::parse(
            "cluster.outbound|8080||web.shop.svc.cluster.local.upstream_rq_total: 3\n\
             listener.0.0.0.0_15001.downstream_cx_total: 4\n\
             cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)\n",
        );
        assert_eq!(
            stats.get("cluster.outbound|8080||web.shop.svc.cluster.local.upstream_rq_total"),
            3
        );
        assert_eq!(stats.get("listener.0.0.0.0_15001.downstream_cx_total"), 4);
        assert_eq!(stats.get("cluster.x.upstream_rq_time"), 0);
        assert_eq!(stats.get("absent"), 0);
    }
}
