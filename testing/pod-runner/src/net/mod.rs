//! The runner's pod network: real Linux network namespaces, routed point to point.
//!
//! ```text
//!  host netns (tests, kubectl, the stand-in on 127.0.0.1)   ── nothing added here ──
//!       │ sockets opened inside the node netns (setns on a short-lived thread)
//!  node netns  mprun-<pid>-<n>-node   lo: 198.18.0.1 (node address), 198.19.0.0/16 → lo
//!       │  nat: MP-SERVICES (ClusterIP DNAT, hairpin masquerade), ip_forward=1
//!       │  API relay 198.18.0.1:6443 → the stand-in on the host's 127.0.0.1
//!       ├── v0 ══ veth ══ eth0  pod netns mprun-<pid>-<n>-0-…  198.18.0.10/32, default via 198.18.0.1
//!       └── v1 ══ veth ══ eth0  pod netns mprun-<pid>-<n>-1-…  198.18.0.11/32
//! ```
//!
//! Every pod has its own namespace and address from 198.18.0.0/16; Service ClusterIPs are
//! 198.19.0.0/16. The node reaches each pod through a /32 route over the pod's veth (no bridge,
//! so no `br_netfilter` question); pods route everything to the node. Nothing is added to the
//! host: the veths are created inside the node namespace and die with the namespaces. Every
//! namespace name carries the owning process id, and [`TestNetwork::create`] first removes
//! what dead owners left (a killed test run), never what a live process owns.

mod dns;
mod kube_proxy;
mod netns;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use dns::{hosts_file, lookup, resolv_conf, ServiceName, CLUSTER_DOMAIN};
pub use kube_proxy::{render_nat_table, ServiceRoute};
pub use netns::{remove_leftovers, run_tool, NetNs, Placement, NAME_PREFIX};

use crate::addresses::AddressPool;

/// The node's own address (on the node namespace's loopback): the pods' gateway, the source of
/// connections the node opens, and where the API relay listens.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Pods get addresses from 198.18.0.0/16.
pub const POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 16);
/// Service ClusterIPs (allocated by the stand-in) are in 198.19.0.0/16.
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 19, 0, 0), 16);
/// Port of the API relay on [`NODE_IP`] (the `kubernetes` Service's endpoint).
pub const API_RELAY_PORT: u16 = 6443;

/// Why the pod network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}{}", if input.is_empty() { String::new() } else { format!("\ninput:\n{input}") })]
    Tool {
        command: String,
        input: String,
        stderr: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no free pod address left in 198.18.0.0/16")]
    AddressesExhausted,
    #[error(
        "the pod network needs root (network namespaces, veths, netfilter); running as uid {0}"
    )]
    NotRoot(u32),
    #[error("`{0}` not found on PATH: the pod network needs it (Debian: apt-get install -y iproute2 iptables; `make test` installs iptables)")]
    MissingTool(&'static str),
}

impl NetError {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        NetError::Io {
            what: what.into(),
            source,
        }
    }
}

/// One pod's network: its namespace, address and name-resolution files.
#[derive(Debug, Clone)]
pub struct PodNet {
    inner: Arc<PodNetInner>,
}

#[derive(Debug)]
struct PodNetInner {
    namespace: String,
    name: String,
    uid: String,
    ip: Ipv4Addr,
    netns: NetNs,
}

impl PodNet {
    /// The pod's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.inner.ip
    }

    /// The pod's Kubernetes namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The pod's network namespace (`ip netns exec <name> …` works too).
    pub fn netns(&self) -> &NetNs {
        &self.inner.netns
    }

    /// Opens a TCP connection from inside the pod, as the pod's application would (root, so
    /// the pod's capture rules apply to it).
    pub async fn connect(&self, address: SocketAddr) -> std::io::Result<TcpStream> {
        self.inner.netns.tcp_socket()?.connect(address).await
    }

    /// A listener inside the pod (must be called within a tokio runtime).
    pub fn listen(&self, address: SocketAddr) -> std::io::Result<TcpListener> {
        let socket = self.inner.netns.run_inside(|| {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.set_reuseaddr(true)?;
            socket.bind(address)?;
            Ok(socket)
        })?;
        socket.listen(1024)
    }

    /// Resolves `host` as the pod's resolver does (its `/etc/hosts`); IP literals pass through.
    pub fn resolve(&self, host: &str) -> Option<Ipv4Addr> {
        if let Ok(ip) = host.parse() {
            return Some(ip);
        }
        let hosts = std::fs::read_to_string(self.hosts_path()).ok()?;
        lookup(&hosts, host)
    }

    /// Where the pod's processes are placed: its network namespace, with its own `/etc/hosts`
    /// and `/etc/resolv.conf`, as `user` (None: root).
    pub fn placement(&self, user: Option<(u32, u32)>) -> Placement {
        Placement {
            netns: Some(self.inner.netns.path()),
            etc_files: vec![
                (self.hosts_path(), PathBuf::from("/etc/hosts")),
                (self.resolv_path(), PathBuf::from("/etc/resolv.conf")),
            ],
            user,
        }
    }

    /// A command that runs inside the pod's network namespace (as root, with the pod's name
    /// resolution), e.g. a curl-like client or a Python gRPC client.
    pub fn command(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> std::io::Result<tokio::process::Command> {
        let mut command = tokio::process::Command::new(program);
        self.placement(None).apply(&mut command)?;
        Ok(command)
    }

    /// The processes inside the pod's network namespace: `(pid, command name, uid)`.
    pub fn processes(&self) -> Vec<(u32, String, u32)> {
        use std::os::unix::fs::MetadataExt;
        let Ok(target) = std::fs::metadata(self.inner.netns.path()) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let same = std::fs::metadata(dir.join("ns/net"))
                .is_ok_and(|m| m.ino() == target.ino() && m.dev() == target.dev());
            if !same {
                continue;
            }
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let uid = std::fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|ids| ids.split_whitespace().nth(1)?.parse().ok())
                });
            if let Some(uid) = uid {
                found.push((pid, comm.trim().to_string(), uid));
            }
        }
        found
    }

    /// A pod network that was never created (tests of code that only reads its fields).
    #[cfg(test)]
    pub(crate) fn unplugged(namespace: &str, name: &str, ip: Ipv4Addr) -> Self {
        PodNet {
            inner: Arc::new(PodNetInner {
                namespace: namespace.into(),
                name: name.into(),
                uid: String::new(),
                ip,
                netns: NetNs::unplugged(&format!("{NAME_PREFIX}unplugged-{name}")),
            }),
        }
    }

    fn hosts_path(&self) -> PathBuf {
        self.inner.netns.etc_dir().join("hosts")
    }

    fn resolv_path(&self) -> PathBuf {
        self.inner.netns.etc_dir().join("resolv.conf")
    }
}

/// Opens connections from the node namespace; given to the API stand-in so that it reaches
/// admission webhooks served by pods, as a real API server reaches them over the pod network.
#[derive(Debug, Clone)]
pub struct NodeDialer {
    node: NetNs,
}

impl NodeDialer {
    pub async fn connect(&self, address: SocketAddr) -> std::io::Result<TcpStream> {
        self.node.tcp_socket()?.connect(address).await
    }
}

/// A pod network of one runner. Cloning shares it; [`TestNetwork::shutdown`] (or dropping the
/// last clone) kills what still runs inside and deletes every namespace.
#[derive(Debug, Clone)]
pub struct TestNetwork {
    inner: Arc<NetworkInner>,
}

#[derive(Debug)]
struct NetworkInner {
    id: String,
    node: NetNs,
    state: Mutex<NetworkState>,
}

#[derive(Debug)]
struct NetworkState {
    /// Pods by uid.
    pods: BTreeMap<String, PodNet>,
    addresses: AddressPool,
    next_index: u32,
    services: Vec<ServiceName>,
    nat_rules: Option<String>,
    relay: Option<JoinHandle<()>>,
    closed: bool,
}

impl TestNetwork {
    /// Removes leftovers of dead test processes, then creates the node namespace.
    pub fn create() -> Result<Self, NetError> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(NetError::NotRoot(uid));
        }
        for tool in ["ip", "iptables-restore"] {
            if !on_path(tool) {
                return Err(NetError::MissingTool(tool));
            }
        }
        let removed = remove_leftovers();
        if !removed.is_empty() {
            tracing::info!(
                ?removed,
                "removed network namespaces of dead test processes"
            );
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{NAME_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let node = NetNs::add(&format!("{id}-node"))?;
        let network = TestNetwork {
            inner: Arc::new(NetworkInner {
                id,
                node: node.clone(),
                state: Mutex::new(NetworkState {
                    pods: BTreeMap::new(),
                    addresses: AddressPool::new(),
                    next_index: 0,
                    services: Vec::new(),
                    nat_rules: None,
                    relay: None,
                    closed: false,
                }),
            }),
        };
        let (service_net, service_bits) = SERVICE_CIDR;
        node.ip_batch(&[
            "link set lo up".into(),
            format!("addr add {NODE_IP}/32 dev lo"),
            // Connections the node opens to a ClusterIP need a route before nat OUTPUT
            // rewrites them (kube-proxy's nodes have their default route for that).
            format!("route add {service_net}/{service_bits} dev lo src {NODE_IP}"),
        ])?;
        node.run_inside(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1"))
            .map_err(|e| NetError::io("enabling forwarding in the node namespace", e))?;
        network.apply_nat(&[])?;
        tracing::info!(network = %network.inner.id, "pod network created");
        Ok(network)
    }

    /// `mprun-<pid>-<n>`: the prefix of every namespace of this network.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The node namespace.
    pub fn node(&self) -> &NetNs {
        &self.inner.node
    }

    /// Connections from the node namespace (for the API stand-in's webhook calls).
    pub fn dialer(&self) -> NodeDialer {
        NodeDialer {
            node: self.inner.node.clone(),
        }
    }

    /// Opens a TCP connection from the node namespace: reaches pod addresses and ClusterIPs
    /// (through the Service rules) as a process on a cluster node would.
    pub async fn connect(&self, address: SocketAddr) -> std::io::Result<TcpStream> {
        self.inner.node.tcp_socket()?.connect(address).await
    }

    /// The kubelet's part of `pods/portforward`, for the API stand-in: connections to a pod's
    /// `localhost:<port>` ([`TestNetwork::connect_in_pod`]).
    pub fn pod_connector(&self) -> meshplane_kube_standin::PodConnector {
        let network = self.clone();
        meshplane_kube_standin::PodConnector::new(move |pod, port| {
            let network = network.clone();
            async move { network.connect_in_pod(&pod.uid, port).await }
        })
    }

    /// Where pods reach the API server (the `kubernetes` Service's endpoint).
    pub fn api_address(&self) -> SocketAddr {
        SocketAddr::from((NODE_IP, API_RELAY_PORT))
    }

    /// Relays connections to [`TestNetwork::api_address`] to `upstream` (the stand-in on the
    /// host's loopback), byte for byte (TLS passes through). Must be called within a tokio
    /// runtime; the relay stops at shutdown.
    pub fn serve_api_relay(&self, upstream: SocketAddr) -> Result<(), NetError> {
        let address = self.api_address();
        let socket = self
            .inner
            .node
            .run_inside(|| {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.set_reuseaddr(true)?;
                socket.bind(address)?;
                Ok(socket)
            })
            .map_err(|e| NetError::io(format!("binding the API relay on {address}"), e))?;
        let listener = socket
            .listen(1024)
            .map_err(|e| NetError::io(format!("listening on {address}"), e))?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    match TcpStream::connect(upstream).await {
                        Ok(mut outbound) => {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(error) => {
                            tracing::warn!(%upstream, %error, "API relay cannot reach the API")
                        }
                    }
                });
            }
        });
        if let Some(previous) = lock(&self.inner.state).relay.replace(task) {
            previous.abort();
        }
        Ok(())
    }

    /// Creates the namespace, veth pair, address, routes and name-resolution files of a pod.
    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<PodNet, NetError> {
        let (ip, index, services) = {
            let mut state = lock(&self.inner.state);
            let ip = state
                .addresses
                .allocate()
                .ok_or(NetError::AddressesExhausted)?;
            let index = state.next_index;
            state.next_index += 1;
            (ip, index, state.services.clone())
        };
        let created = self.create_pod(namespace, name, uid, ip, index, &services);
        let mut state = lock(&self.inner.state);
        match created {
            Ok(pod) => {
                state.pods.insert(uid.to_string(), pod.clone());
                Ok(pod)
            }
            Err(error) => {
                state.addresses.release(ip);
                Err(error)
            }
        }
    }

    fn create_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        ip: Ipv4Addr,
        index: u32,
        services: &[ServiceName],
    ) -> Result<PodNet, NetError> {
        let label: String = format!("{namespace}.{name}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .take(48)
            .collect();
        let netns = NetNs::add(&format!("{}-{index}-{label}", self.inner.id))?;
        let pod = PodNet {
            inner: Arc::new(PodNetInner {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
                ip,
                netns: netns.clone(),
            }),
        };
        let setup = || -> Result<(), NetError> {
            let veth = format!("v{index}");
            self.inner.node.ip_batch(&[
                format!(
                    "link add {veth} type veth peer name eth0 netns {}",
                    netns.name()
                ),
                format!("link set {veth} up"),
                format!("route add {ip}/32 dev {veth} scope link src {NODE_IP}"),
            ])?;
            netns.ip_batch(&[
                "link set lo up".into(),
                format!("addr add {ip}/32 dev eth0"),
                "link set eth0 up".into(),
                format!("route add {NODE_IP} dev eth0 scope link"),
                format!("route add default via {NODE_IP} dev eth0 src {ip}"),
            ])?;
            let etc = netns.etc_dir();
            std::fs::create_dir_all(&etc)
                .map_err(|e| NetError::io(format!("creating {}", etc.display()), e))?;
            write_pod_files(&pod, services)?;
            Ok(())
        };
        match setup() {
            Ok(()) => Ok(pod),
            Err(error) => {
                netns.delete();
                Err(error)
            }
        }
    }

    /// The running pod `namespace/name`, if this network has it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodNet> {
        lock(&self.inner.state)
            .pods
            .values()
            .find(|p| p.namespace() == namespace && p.name() == name)
            .cloned()
    }

    /// Opens a TCP connection to `localhost:<port>` inside the running pod `uid`, as a container
    /// runtime does for port forwarding: a port the pod binds on loopback only is reachable.
    pub async fn connect_in_pod(&self, uid: &str, port: u16) -> std::io::Result<TcpStream> {
        let pod = lock(&self.inner.state).pods.get(uid).cloned();
        let pod = pod.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no pod with uid {uid:?} runs on this node"),
            )
        })?;
        pod.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }

    /// Deletes a pod's namespace (kill its processes first; any left are killed) and frees its
    /// address.
    pub fn remove_pod(&self, pod: &PodNet) {
        pod.netns().delete();
        let mut state = lock(&self.inner.state);
        if state.pods.remove(&pod.inner.uid).is_some() {
            state.addresses.release(pod.ip());
        }
    }

    /// Makes Services work: ClusterIP rules from `routes` and, in every pod, names from `names`.
    pub fn set_services(
        &self,
        routes: &[ServiceRoute],
        names: &[ServiceName],
    ) -> Result<(), NetError> {
        let mut names = names.to_vec();
        names.sort();
        let pods: Vec<PodNet> = {
            let mut state = lock(&self.inner.state);
            if state.services == names {
                Vec::new()
            } else {
                state.services = names.clone();
                state.pods.values().cloned().collect()
            }
        };
        for pod in pods {
            write_pod_files(&pod, &names)?;
        }
        self.apply_nat(routes)
    }

    fn apply_nat(&self, routes: &[ServiceRoute]) -> Result<(), NetError> {
        let rules = render_nat_table(routes);
        let mut state = lock(&self.inner.state);
        if state.closed || state.nat_rules.as_deref() == Some(rules.as_str()) {
            return Ok(());
        }
        let placement = Placement {
            netns: Some(self.inner.node.path()),
            ..Placement::default()
        };
        restore_in(&placement, &rules)?;
        state.nat_rules = Some(rules);
        Ok(())
    }

    /// Kills what still runs in the pods and deletes every namespace of this network.
    /// Idempotent; dropping the last clone does the same.
    pub fn shutdown(&self) {
        self.inner.close();
    }
}

impl NetworkInner {
    fn close(&self) {
        let (pods, relay) = {
            let mut state = lock(&self.state);
            if state.closed {
                return;
            }
            state.closed = true;
            (std::mem::take(&mut state.pods), state.relay.take())
        };
        if let Some(relay) = relay {
            relay.abort();
        }
        for pod in pods.values() {
            pod.netns().delete();
        }
        self.node.delete();
        tracing::info!(network = %self.id, "pod network deleted");
    }
}

impl Drop for NetworkInner {
    fn drop(&mut self) {
        self.close();
    }
}

/// `iptables-restore` of `rules` inside `placement`'s namespace.
fn restore_in(placement: &Placement, rules: &str) -> Result<(), NetError> {
    use std::io::Write;
    let command_line = "iptables-restore (node namespace)".to_string();
    let mut command = std::process::Command::new("iptables-restore");
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    placement
        .apply_std(&mut command)
        .map_err(|e| NetError::io("opening the node namespace", e))?;
    let spawn_error = |source| NetError::Spawn {
        command: command_line.clone(),
        source,
    };
    let mut child = command.spawn().map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes()).map_err(spawn_error)?;
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NetError::Tool {
            command: command_line,
            input: rules.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

fn write_pod_files(pod: &PodNet, services: &[ServiceName]) -> Result<(), NetError> {
    let hosts = hosts_file(pod.namespace(), pod.name(), pod.ip(), services);
    for (path, content) in [
        (pod.hosts_path(), hosts),
        (pod.resolv_path(), resolv_conf(pod.namespace())),
    ] {
        dns::write_in_place(&path, &content)
            .map_err(|e| NetError::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|dir| dir.join(tool).is_file())
}

// A poisoned lock only means a panic elsewhere; the state is still consistent enough to tear
// down.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
