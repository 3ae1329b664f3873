//! External authorization and dry-run policies on real sidecars: tenant blue declares an HTTP
//! external authorizer (a real HTTP server in a pod of `shop`) in its MeshControlPlane, and a
//! CUSTOM policy on web sends the requests its rules match to it.
//!
//! - A provider naming a Service of green's namespace is refused by the operator's webhook.
//! - `/private/ok...` is allowed by the authorizer (200), `/private/...` denied with the
//!   authorizer's own 403; `/public` never reaches the authorizer (it records every check).
//! - `/grpc/...` goes to a gRPC authorizer (`e2e/python/ext_authz_grpc.py`, Envoy's
//!   Authorization/Check service on Python grpcio): `/grpc/ok` is allowed and the header the
//!   authorizer adds reaches web's app, `/grpc/x` is denied with the authorizer's own 403,
//!   body and header.
//! - On vault's TCP ports a CUSTOM policy of the gRPC provider asks the authorizer about each
//!   connection (Envoy's network ext_authz filter): port 7000 allowed, 7001 closed before any
//!   byte reaches vault; the check carries the caller's SPIFFE ID.
//! - A provider whose Service has no endpoint answers with its `statusOnError` (502).
//! - A DENY policy annotated `istio.io/dry-run: "true"` denies nothing, and web's sidecar counts
//!   what it would have denied (`...rbac.istio_dry_run_deny_.shadow_denied`).

use std::time::{Duration, Instant};

use meshplane_e2e::harness::{wait_for, Cluster};

const DEADLINE: Duration = Duration::from_secs(120);

/// The authorizer: allows a check whose path contains `/ok`, denies the others with its own
/// body and header, and lists the paths it was asked about on `/calls`.
const AUTHORIZER: &str = r#"
import http.server
calls = []
class Check(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/calls":
            body = "\n".join(calls).encode()
            self.send_response(200)
        else:
            calls.append(self.path)
            if "/ok" in self.path:
                body = b""
                self.send_response(200)
                self.send_header("x-authz-user", "alice")
            else:
                body = b"denied by the test authorizer"
                self.send_response(403)
                self.send_header("x-authz-reason", "not ok")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Check).serve_forever()
"#;

fn workloads() -> String {
    let indented: String = AUTHORIZER
        .lines()
        .map(|l| format!("                {l}\n"))
        .collect();
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 8080, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
        - name: web
          image: example.com/echo:1
          ports: [{{containerPort: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: cart, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: cart}}}}
  template:
    metadata: {{labels: {{app: cart}}}}
    spec:
      containers:
        - name: app
          image: example.com/echo:1
          ports: [{{containerPort: 9090}}]
---
apiVersion: v1
kind: Service
metadata: {{name: authz, namespace: shop}}
spec:
  selector: {{app: authz}}
  ports: [{{name: http, port: 8000, targetPort: 8000}}]
---
apiVersion: v1
kind: Service
metadata: {{name: authz-down, namespace: shop}}
spec:
  selector: {{app: nobody}}
  ports: [{{name: http, port: 8000, targetPort: 8000}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: authz, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: authz}}}}
  template:
    metadata: {{labels: {{app: authz}}}}
    spec:
      containers:
        - name: authz
          image: example.com/authz:1
          command:
            - python3
            - -c
            - |
{indented}          ports: [{{containerPort: 8000}}]
"#
    )
}

/// The port the gRPC authorizer lists its checks on (`GET /calls`).
const GRPC_CALLS_PORT: u16 = 9001;

/// The gRPC authorizer (`e2e/python/ext_authz_grpc.py`: Envoy's Authorization/Check on Python
/// grpcio) in a pod of shop without a sidecar, and its Service, whose `grpc` port makes the
/// sidecars call it over HTTP/2.
fn grpc_authorizer() -> String {
    let e2e = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = e2e.join("../.venv/bin/python");
    let python = std::path::absolute(&python).unwrap_or(python);
    let script = e2e.join("python/ext_authz_grpc.py");
    let (python, script) = (python.display(), script.display());
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: authz-grpc, namespace: shop}}
spec:
  selector: {{app: authz-grpc}}
  ports:
    - {{name: grpc, port: 9000, targetPort: 9000}}
    - {{name: http-calls, port: {GRPC_CALLS_PORT}, targetPort: {GRPC_CALLS_PORT}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: authz-grpc, namespace: shop, labels: {{app: authz-grpc, sidecar.meshplane.io/inject: "false"}}}}
spec:
  containers:
    - name: authz
      image: example.com/authz-grpc:1
      command: ["{python}", "{script}", "--port", "9000", "--listen", "{GRPC_CALLS_PORT}", "--allow-ports", "7000"]
      ports: [{{name: grpc, containerPort: 9000}}, {{name: http, containerPort: {GRPC_CALLS_PORT}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: vault, namespace: shop}}
spec:
  selector: {{app: vault}}
  ports:
    - {{name: tcp-open, port: 7000, targetPort: 7000}}
    - {{name: tcp-closed, port: 7001, targetPort: 7001}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: vault, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: vault}}}}
  template:
    metadata: {{labels: {{app: vault}}}}
    spec:
      containers:
        - name: vault
          image: example.com/echo:1
          ports: [{{containerPort: 7000}}, {{containerPort: 7001}}]
"#
    )
}

const PROVIDERS: &str = r#"{"spec":{"meshConfig":{"extensionProviders":[
  {"name":"authz","envoyExtAuthzHttp":{"service":"authz.shop.svc.cluster.local","port":8000,
   "pathPrefix":"/check","headersToDownstreamOnDeny":["x-authz-reason"]}},
  {"name":"authz-grpc","envoyExtAuthzGrpc":{"service":"authz-grpc.shop.svc.cluster.local",
   "port":9000,"timeout":"5s"}},
  {"name":"authz-down","envoyExtAuthzHttp":{"service":"shop/authz-down","port":8000,
   "statusOnError":"502","timeout":"2s"}}]}}}"#;

const FOREIGN_PROVIDER: &str = r#"{"spec":{"meshConfig":{"extensionProviders":[
  {"name":"theirs","envoyExtAuthzHttp":{"service":"authz.garden.svc.cluster.local","port":8000}}]}}}"#;

const POLICIES: &str = r#"
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: CUSTOM
  provider: {name: authz}
  rules:
    - to: [{operation: {paths: [/private*]}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ext-grpc, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: CUSTOM
  provider: {name: authz-grpc}
  rules:
    - to: [{operation: {paths: [/grpc*]}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ext-tcp, namespace: shop}
spec:
  selector: {matchLabels: {app: vault}}
  action: CUSTOM
  provider: {name: authz-grpc}
  rules:
    - to: [{operation: {ports: ["7000", "7001"]}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ext-down, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: CUSTOM
  provider: {name: authz-down}
  rules:
    - to: [{operation: {paths: [/down*]}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata:
  name: dry-deny
  namespace: shop
  annotations: {istio.io/dry-run: "true"}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules:
    - to: [{operation: {paths: [/public*]}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_policy_asks_a_real_authorizer_and_a_dry_run_denies_nothing() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("ext-authz", DEADLINE)
        .await
        .expect("two tenants Ready");

    // A provider in green's namespace is refused, and blue's control plane is unchanged.
    let refused = cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "-p",
            FOREIGN_PROVIDER,
        ])
        .expect_err("a provider of another tenant is refused");
    let message = refused.to_string();
    assert!(
        message.contains("a provider outside the tenant is refused")
            && message.contains("a namespace of tenant \"green\""),
        "{message}"
    );
    let stored = cluster
        .kubectl(&[
            "get",
            "meshcontrolplane",
            "blue-v1",
            "-o",
            "jsonpath={.spec.meshConfig}",
        ])
        .expect("blue-v1");
    assert!(!stored.contains("theirs"), "nothing stored: {stored}");

    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "-p",
            PROVIDERS,
        ])
        .expect("blue's providers");
    cluster.apply_manifest(&workloads()).expect("workloads");
    cluster
        .apply_manifest(&grpc_authorizer())
        .expect("the gRPC authorizer");
    let mut pods = Vec::new();
    for app in ["web", "cart", "authz", "authz-grpc", "vault"] {
        let ready = cluster
            .wait_for_ready_pods("shop", &format!("app={app}"), 1, DEADLINE)
            .await
            .expect("pod Ready");
        pods.push(ready[0].metadata.name.clone().unwrap_or_default());
    }
    if cluster.network().is_none() {
        eprintln!(
            "the traffic checks reach pods through the local test network; E2E_KUBECONFIG is set"
        );
        return;
    }
    let web = cluster.in_pod("shop", &pods[0]).expect("web pod");
    let cart = cluster.in_pod("shop", &pods[1]).expect("cart pod");
    let web_url = "http://web.shop.svc.cluster.local:8080";
    let vault_open = "http://vault.shop.svc.cluster.local:7000/";
    let vault_closed = "http://vault.shop.svc.cluster.local:7001/";
    let calls_url = "http://authz.shop.svc.cluster.local:8000/calls";
    let grpc_calls_url =
        format!("http://authz-grpc.shop.svc.cluster.local:{GRPC_CALLS_PORT}/calls");
    for url in [
        format!("{web_url}/public"),
        calls_url.to_string(),
        grpc_calls_url.clone(),
        vault_open.to_string(),
        vault_closed.to_string(),
    ] {
        wait_for(&format!("cart reaching {url}"), DEADLINE, || async {
            let reply = cart.http_get(&url).await.map_err(|e| e.to_string())?;
            (reply.status == 200)
                .then_some(Some(()))
                .ok_or(format!("{reply:?}"))
        })
        .await
        .expect("baseline traffic");
    }

    cluster.apply_manifest(POLICIES).expect("policies");
    wait_for("the authorizer on web's sidecar", DEADLINE, || async {
        let dump = web
            .envoy_admin("/config_dump?resource=dynamic_listeners")
            .await
            .map_err(|e| e.to_string())?;
        (dump.contains("envoy.filters.http.ext_authz")
            && dump.contains("authz-down")
            && dump.contains("authz-grpc.shop.svc.cluster.local")
            && dump.contains("policy[dry-deny]"))
        .then_some(Some(()))
        .ok_or_else(|| "not yet".to_owned())
    })
    .await
    .expect("the CUSTOM and dry-run policies reach web's sidecar");

    // Denied by the authorizer, with its own status, body and header; then allowed. cart's
    // pooled connection may finish one request on the replaced chain.
    let denied = wait_for("the authorizer denies /private/x", DEADLINE, || async {
        let reply = cart
            .http_get(&format!("{web_url}/private/x"))
            .await
            .map_err(|e| e.to_string())?;
        (reply.status == 403)
            .then_some(Some(reply.clone()))
            .ok_or(format!("{reply:?}"))
    })
    .await
    .expect("denied by the authorizer");
    assert!(
        denied.body.contains("denied by the test authorizer"),
        "the authorizer's answer reaches the caller: {denied:?}"
    );
    // Allowed by the authorizer: every answer is a 200, and the authorizer was asked (a
    // request over a connection pooled before the policies is not checked).
    wait_for("the authorizer allows /private/ok", DEADLINE, || async {
        let allowed = cart
            .http_get(&format!("{web_url}/private/ok"))
            .await
            .map_err(|e| e.to_string())?;
        if allowed.status != 200 {
            return Ok(Some(Err(format!("not allowed: {allowed:?}"))));
        }
        let calls = cart.http_get(calls_url).await.map_err(|e| e.to_string())?;
        calls
            .body
            .contains("/check/private/ok")
            .then_some(Some(Ok(())))
            .ok_or(format!("not checked yet: {calls:?}"))
    })
    .await
    .expect("allowed by the authorizer")
    .unwrap_or_else(|e| panic!("{e}"));

    // Requests the rules do not match never reach the authorizer; the dry-run DENY matches
    // /public but denies nothing.
    let public = cart
        .http_get(&format!("{web_url}/public/page"))
        .await
        .expect("cart on /public");
    assert_eq!(
        public.status, 200,
        "a dry-run DENY denies nothing: {public:?}"
    );
    let calls = cart
        .http_get(calls_url)
        .await
        .expect("the authorizer's calls");
    assert!(
        calls.body.contains("/check/private/x") && calls.body.contains("/check/private/ok"),
        "the checks carry the path prefix and the request's path: {calls:?}"
    );
    assert!(
        !calls.body.contains("public"),
        "requests outside the rules are not checked: {calls:?}"
    );

    // The gRPC authorizer decides: denied with its status, body and header; allowed with the
    // header it adds reaching web's app (the echo answers the headers it got).
    let denied = wait_for("the gRPC authorizer denies /grpc/x", DEADLINE, || async {
        let reply = cart
            .http_get(&format!("{web_url}/grpc/x"))
            .await
            .map_err(|e| e.to_string())?;
        (reply.status == 403)
            .then_some(Some(reply.clone()))
            .ok_or(format!("{reply:?}"))
    })
    .await
    .expect("denied by the gRPC authorizer");
    assert!(
        denied.body.contains("denied by the grpc authorizer")
            && denied.headers.get("x-authz-reason").map(String::as_str) == Some("not ok"),
        "the gRPC authorizer's denial reaches the caller: {denied:?}"
    );
    let allowed = cart
        .http_get(&format!("{web_url}/grpc/ok"))
        .await
        .expect("cart on /grpc/ok");
    assert_eq!(
        allowed.status, 200,
        "allowed by the gRPC authorizer: {allowed:?}"
    );
    let echoed: serde_json::Value = serde_json::from_str(&allowed.body).expect("echo JSON");
    assert_eq!(
        echoed["headers"]["x-authz-user"], "alice",
        "the header the authorizer added reaches the app: {echoed}"
    );
    let grpc_calls = cart
        .http_get(&grpc_calls_url)
        .await
        .expect("the gRPC authorizer's calls");
    let checked: Vec<&str> = grpc_calls.body.lines().collect();
    assert!(
        checked.contains(&"/grpc/x") && checked.contains(&"/grpc/ok"),
        "the gRPC authorizer was asked about both: {grpc_calls:?}"
    );
    assert!(
        checked.iter().all(|p| p.starts_with("/grpc")),
        "requests outside the policy's rules never reach the gRPC authorizer: {grpc_calls:?}"
    );

    // On vault's TCP ports the gRPC authorizer decides each connection (network ext_authz):
    // 7000 is allowed, 7001 refused before any byte reaches vault; the check names cart's
    // identity, which came over mutual TLS.
    wait_for(
        "the gRPC authorizer refusing vault:7001",
        DEADLINE,
        || async {
            match cart.http_get(vault_closed).await {
                Ok(reply) => Err(format!("still served: {reply:?}")),
                Err(e) => Ok(Some(e.to_string())),
            }
        },
    )
    .await
    .expect("a TCP connection the authorizer denies is closed");
    let open = cart.http_get(vault_open).await.expect("vault:7000");
    assert_eq!(open.status, 200, "allowed by the gRPC authorizer: {open:?}");
    let grpc_calls = cart
        .http_get(&grpc_calls_url)
        .await
        .expect("the gRPC authorizer's calls");
    let tcp_checks: Vec<&str> = grpc_calls
        .body
        .lines()
        .filter(|l| l.starts_with("tcp "))
        .collect();
    assert!(
        tcp_checks
            .iter()
            .any(|l| l.starts_with("tcp 7000 spiffe://blue.mesh.local/ns/shop/sa/"))
            && tcp_checks
                .iter()
                .any(|l| l.starts_with("tcp 7001 spiffe://blue.mesh.local/ns/shop/sa/")),
        "each connection was checked, with the caller's identity: {grpc_calls:?}"
    );

    // An authorizer that cannot be reached: statusOnError.
    wait_for(
        "statusOnError of an unreachable authorizer",
        DEADLINE,
        || async {
            let down = cart
                .http_get(&format!("{web_url}/down/x"))
                .await
                .map_err(|e| e.to_string())?;
            match down.status {
                502 => Ok(Some(Ok(()))),
                // Over a connection pooled before the policies.
                200 => Err(format!("not checked yet: {down:?}")),
                _ => Ok(Some(Err(format!("expected statusOnError 502: {down:?}")))),
            }
        },
    )
    .await
    .expect("an unreachable authorizer answers statusOnError")
    .unwrap_or_else(|e| panic!("{e}"));

    // The dry-run denial is counted by web's sidecar. A request of cart's may still go over a
    // connection pooled before the policies (its chain ends after that request), so ask again
    // until the sidecar has evaluated one on the new chain; every answer is a 200.
    let dry_run_denied = |stats: &meshplane_e2e::reach::EnvoyStats| -> u64 {
        stats
            .0
            .iter()
            .filter(|(name, _)| name.ends_with("rbac.istio_dry_run_deny_.shadow_denied"))
            .map(|(_, v)| *v)
            .sum()
    };
    let counted = wait_for("the dry-run denial counted", DEADLINE, || async {
        let public = cart
            .http_get(&format!("{web_url}/public/again"))
            .await
            .map_err(|e| e.to_string())?;
        if public.status != 200 {
            return Ok(Some(Err(format!("a dry-run DENY denied: {public:?}"))));
        }
        let stats = web.envoy_stats().await.map_err(|e| e.to_string())?;
        let n = dry_run_denied(&stats);
        (n >= 1)
            .then_some(Some(Ok(n)))
            .ok_or_else(|| "not counted yet".to_string())
    })
    .await
    .expect("the dry-run DENY is observable in web's stats");
    let counted = counted.unwrap_or_else(|e| panic!("{e}"));
    eprintln!("dry-run denials counted by web's sidecar: {counted}");

    // Every policy is accepted.
    for name in ["ext", "ext-grpc", "ext-tcp", "ext-down", "dry-deny"] {
        wait_for(&format!("{name} Accepted"), DEADLINE, || async {
            let status = cluster
                .kubectl(&[
                    "get",
                    "authorizationpolicy",
                    name,
                    "-n",
                    "shop",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Accepted\")].status}",
                ])
                .map_err(|e| e.to_string())?;
            (status.trim() == "True")
                .then_some(Some(()))
                .ok_or(format!("Accepted={status}"))
        })
        .await
        .expect("accepted");
    }
    eprintln!("scenario ext-authz took {:?}", started.elapsed());
}
