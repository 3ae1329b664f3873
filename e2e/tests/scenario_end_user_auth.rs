//! End-user authentication with JWTs on real sidecars: in blue's namespace `shop`, web accepts
//! tokens of two issuers on the same `Authorization` header, their key sets served by a small
//! identity provider (the test plays it inside pod `idp/idp`, outside the mesh, on the pod
//! network) and fetched by blue's instance, never by the sidecars. Tokens are signed in the
//! test (ES256).
//!
//! - A valid token of either issuer gets 200; a token signed with another key, or garbage, 401;
//!   no token 200 under the RequestAuthentication alone, and 403 once an ALLOW policy requires
//!   `requestPrincipals: ["*"]` (a token then still gets 200).
//! - The RequestAuthentication's status shows each key set's last fetch and key ids; a key set
//!   URL on a link-local address is refused and its status says why.
//! - At the edge: blue's ingress gateway, called from the node (outside every tenant), under a
//!   RequestAuthentication and an ALLOW policy requiring a request principal that select the
//!   gateway's pods: a valid token 200 (web answers, without the token), a forged one or
//!   garbage 401, none 403.
//! - The identity provider of issuer A goes away: A's tokens are refused (401), B's and
//!   requests without a token still get 200 (the listener keeps serving), and the status
//!   names the failed fetch.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use meshplane_e2e::harness::{wait_for, Cluster};
use meshplane_e2e::reach::{InPod, OnNode};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(120);
const ISSUER_A: &str = "https://a.idp.example";
const ISSUER_B: &str = "https://b.idp.example";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An ES256 signing key with its key id.
struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    fn generate(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("key generated");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("key parsed");
        Self {
            kid: kid.to_string(),
            pair,
        }
    }

    /// The public key as a JSON Web Key Set.
    fn key_set(&self) -> String {
        let point = self.pair.public_key().as_ref();
        assert_eq!(point.len(), 65, "uncompressed P-256 point");
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": self.kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]})
        .to_string()
    }

    /// A token of `issuer` for `subject`, signed with this key (claiming key id `kid`).
    fn token(&self, issuer: &str, subject: &str, kid: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": kid});
        let claims = serde_json::json!({
            "iss": issuer, "sub": subject, "aud": "shop", "iat": now, "exp": now + 3600,
        });
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), input.as_bytes())
            .expect("signed");
        format!("{input}.{}", b64(signature.as_ref()))
    }
}

/// Serves `body` as `application/json` on every request, until the task is aborted (then the
/// listener closes and connections are refused).
fn serve_key_set(listener: tokio::net::TcpListener, body: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut read = 0;
                while !buf[..read].windows(4).any(|w| w == b"\r\n\r\n") && read < buf.len() {
                    match stream.read(&mut buf[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    })
}

/// `GET /` on web from `pod`, with `Authorization: Bearer <token>` when given: the status.
async fn call_web(pod: &InPod, token: Option<&str>) -> Result<(u16, String), String> {
    let ip = pod
        .resolve("web.shop.svc.cluster.local")
        .ok_or("web does not resolve")?;
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        pod.connect(SocketAddr::from((ip, 8080))),
    )
    .await
    .map_err(|_| "connect timed out".to_string())?
    .map_err(|e| e.to_string())?;
    get_root(stream, "web.shop.svc.cluster.local:8080", token).await
}

/// `GET /` on blue's ingress gateway from the node (outside every tenant), for
/// `shop.example.com`, with `Authorization: Bearer <token>` when given: the status.
async fn call_gateway(
    node: &OnNode,
    gateway: SocketAddr,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let stream = tokio::time::timeout(Duration::from_secs(5), node.connect(gateway))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    get_root(stream, GATEWAY_HOST, token).await
}

/// `GET /` with `Host: host` over `stream`, with the token when given: the status and the
/// whole answer.
async fn get_root(
    mut stream: tokio::net::TcpStream,
    host: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| "read timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text:?}"))?;
    Ok((status, text))
}

/// Waits until `pod`'s call with `token` gets `want`.
async fn expect_status(pod: &InPod, what: &str, token: Option<&str>, want: u16) {
    wait_for(what, DEADLINE, || async {
        let (status, text) = call_web(pod, token).await?;
        (status == want)
            .then_some(Some(()))
            .ok_or_else(|| format!("{status}: {}", text.lines().last().unwrap_or_default()))
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Waits until `pod`'s call with `token` passes web's sidecar as a validated token: 200, and
/// the token no longer reaches the application (the sidecar removes a token it validated,
/// unless the rule says `forwardOriginalToken`).
async fn expect_validated(pod: &InPod, what: &str, token: &str) {
    wait_for(what, DEADLINE, || async {
        let (status, text) = call_web(pod, Some(token)).await?;
        (status == 200 && !text.contains("\"authorization\""))
            .then_some(Some(()))
            .ok_or_else(|| format!("{status}: {}", text.lines().last().unwrap_or_default()))
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

const WORKLOADS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 8080, targetPort: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: example.com/echo:1, ports: [{containerPort: 8080}]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: cart, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: cart}}
  template:
    metadata: {labels: {app: cart}}
    spec:
      containers: [{name: app, image: example.com/echo:1, ports: [{containerPort: 9090}]}]
---
apiVersion: v1
kind: Namespace
metadata: {name: idp}
---
apiVersion: v1
kind: Pod
metadata: {name: idp, namespace: idp, labels: {app: idp}}
spec:
  containers: [{name: app, image: example.com/echo:1, ports: [{containerPort: 8080}]}]
"#;

fn request_authentication(idp: std::net::Ipv4Addr) -> String {
    format!(
        r#"
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {{name: web-jwt, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  jwtRules:
    - issuer: {ISSUER_A}
      jwksUri: http://{idp}:8081/keys
      timeout: 2s
    - issuer: {ISSUER_B}
      jwksUri: http://{idp}:8082/keys
      audiences: [shop]
---
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {{name: metadata-probe, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: nothing}}}}
  jwtRules:
    - issuer: https://probe.example
      jwksUri: http://169.254.169.254/latest/meta-data/
"#
    )
}

/// Blue's ingress gateway: a ClusterIP Service, port 80 to the proxy's 8080.
const INGRESS_GATEWAY: &str = r#"{"spec":{"ingressGateway":{"name":"ingress","service":{"type":"ClusterIP","ports":[{"name":"http","port":80,"targetPort":8080}]}}}}"#;

/// The host blue's ingress gateway serves, routed to web.
const GATEWAY_HOST: &str = "shop.example.com";

const INGRESS_ROUTES: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: Gateway
metadata: {name: shop, namespace: meshplane-blue}
spec:
  selector: {meshplane.io/gateway: ingress}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: [shop.example.com]}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: shop-ingress, namespace: meshplane-blue}
spec:
  hosts: [shop.example.com]
  gateways: [shop]
  http: [{route: [{destination: {host: web.shop.svc.cluster.local, port: {number: 8080}}}]}]
"#;

/// End-user authentication at the edge: a RequestAuthentication and an ALLOW policy requiring
/// a request principal, both selecting the ingress gateway's pods (from the control namespace).
fn gateway_policies(idp: std::net::Ipv4Addr) -> String {
    format!(
        r#"
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {{name: edge-jwt, namespace: meshplane-blue}}
spec:
  selector: {{matchLabels: {{meshplane.io/gateway: ingress}}}}
  jwtRules:
    - issuer: {ISSUER_A}
      jwksUri: http://{idp}:8081/keys
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: edge-token, namespace: meshplane-blue}}
spec:
  selector: {{matchLabels: {{meshplane.io/gateway: ingress}}}}
  rules:
    - from: [{{source: {{requestPrincipals: ["*"]}}}}]
"#
    )
}

const REQUIRE_TOKEN: &str = r#"
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: require-token, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules:
    - from: [{source: {requestPrincipals: ["*"]}}]
"#;

/// The entries of `status.jwks` of RequestAuthentication `name` once `ready` holds for them.
async fn wait_for_jwks_status(
    cluster: &Cluster,
    name: &str,
    what: &str,
    ready: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    wait_for(what, DEADLINE, || async {
        let text = cluster
            .kubectl(&[
                "get",
                "requestauthentication",
                name,
                "-n",
                "shop",
                "-o",
                "json",
            ])
            .map_err(|e| e.to_string())?;
        let object: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let entries = object["status"]["jwks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if ready(&entries) {
            Ok(Some(entries))
        } else {
            Err(format!("status: {}", object["status"]))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn entry<'a>(entries: &'a [serde_json::Value], issuer: &str) -> Option<&'a serde_json::Value> {
    entries.iter().find(|e| e["issuer"] == issuer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_two_issuers_keys_fetched_by_the_instance() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("jwt", DEADLINE)
        .await
        .expect("two tenants Ready");
    // Refresh key sets every 2 s, so that the provider going away is noticed at once.
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"meshConfig":{"jwksFetch":{"refreshInterval":"2s"}}}}"#,
        ])
        .expect("refresh interval");
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "-p",
            INGRESS_GATEWAY,
        ])
        .expect("blue asks for an ingress gateway");
    cluster.apply_manifest(WORKLOADS).expect("workloads");
    cluster
        .apply_manifest(INGRESS_ROUTES)
        .expect("ingress routes");
    let mut pods = Vec::new();
    for (ns, selector) in [
        ("shop", "app=web"),
        ("shop", "app=cart"),
        ("idp", "app=idp"),
        ("meshplane-blue", "meshplane.io/gateway=ingress"),
    ] {
        let ready = cluster
            .wait_for_ready_pods(ns, selector, 1, DEADLINE)
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
    let cart = cluster.in_pod("shop", &pods[1]).expect("cart pod");
    let idp = cluster.in_pod("idp", &pods[2]).expect("idp pod");

    // The identity providers: issuer A's key set on 8081, B's on 8082, inside pod idp.
    let key_a = SigningKey::generate("a1");
    let key_b = SigningKey::generate("b1");
    let forger = SigningKey::generate("a1");
    let server_a = serve_key_set(
        idp.listen(SocketAddr::from(([0, 0, 0, 0], 8081)))
            .expect("listen 8081"),
        key_a.key_set(),
    );
    let _server_b = serve_key_set(
        idp.listen(SocketAddr::from(([0, 0, 0, 0], 8082)))
            .expect("listen 8082"),
        key_b.key_set(),
    );

    expect_status(&cart, "cart reaches web before any policy", None, 200).await;
    cluster
        .apply_manifest(&request_authentication(idp.ip()))
        .expect("RequestAuthentications");

    let token_a = key_a.token(ISSUER_A, "alice", "a1");
    let token_b = key_b.token(ISSUER_B, "bob", "b1");
    let forged = forger.token(ISSUER_A, "mallory", "a1");
    // The filter reaches web's sidecar (a forged token is refused from then on), and the keys
    // once the instance fetched them: then both issuers' tokens pass on the one Authorization
    // header, validated (the sidecar strips them).
    expect_status(
        &cart,
        "a token signed with another key refused",
        Some(&forged),
        401,
    )
    .await;
    expect_validated(&cart, "issuer A's token validated", &token_a).await;
    expect_validated(&cart, "issuer B's token validated", &token_b).await;
    let (status, text) = call_web(&cart, Some(&forged)).await.expect("forged call");
    assert_eq!(status, 401, "a token signed with another key: {text}");
    let (status, text) = call_web(&cart, Some("not.a.token"))
        .await
        .expect("garbage call");
    assert_eq!(status, 401, "garbage: {text}");
    let (status, text) = call_web(&cart, None).await.expect("no token");
    assert_eq!(status, 200, "no token passes without identity: {text}");

    let entries = wait_for_jwks_status(&cluster, "web-jwt", "key ids in the status", |e| {
        [(ISSUER_A, "a1"), (ISSUER_B, "b1")]
            .iter()
            .all(|(iss, kid)| {
                entry(e, iss).is_some_and(|x| {
                    x["keyIds"] == serde_json::json!([kid])
                        && x.get("error").is_none()
                        && x["lastFetchTime"].is_string()
                })
            })
    })
    .await;
    eprintln!("key fetches: {entries:?}");
    let probe = wait_for_jwks_status(&cluster, "metadata-probe", "the probe refused", |e| {
        entry(e, "https://probe.example")
            .and_then(|x| x["error"].as_str())
            .is_some_and(|m| m.contains("refused") && m.contains("link-local"))
    })
    .await;
    eprintln!("metadata probe: {probe:?}");

    // An ALLOW policy requiring a request principal: no token is now 403, a token 200.
    cluster.apply_manifest(REQUIRE_TOKEN).expect("policy");
    expect_status(&cart, "no token refused by the policy", None, 403).await;
    expect_validated(&cart, "a token passes the policy", &token_a).await;
    cluster
        .kubectl(&[
            "delete",
            "authorizationpolicy",
            "require-token",
            "-n",
            "shop",
        ])
        .expect("policy deleted");
    expect_status(&cart, "no token passes again", None, 200).await;

    // At the edge: blue's ingress gateway, called from the node (outside every tenant).
    // Before any policy selects it, it serves without a token; then its own
    // RequestAuthentication and ALLOW policy: a valid token 200 (validated at the gateway,
    // which strips it), a forged one 401, none 403.
    let node = cluster.on_node().expect("node");
    let ip = cluster
        .kubectl(&[
            "get",
            "service",
            "ingress",
            "-n",
            "meshplane-blue",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .expect("the gateway's Service");
    let gateway = SocketAddr::from((
        ip.trim()
            .parse::<std::net::Ipv4Addr>()
            .expect("a ClusterIP"),
        80,
    ));
    let at_gateway = |what: &'static str, token: Option<String>, want: u16| {
        let node = &node;
        async move {
            wait_for(what, DEADLINE, || async {
                let (status, text) = call_gateway(node, gateway, token.as_deref()).await?;
                (status == want)
                    .then_some(Some(text.clone()))
                    .ok_or_else(|| format!("{status}: {}", text.lines().last().unwrap_or_default()))
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
        }
    };
    at_gateway("the gateway serving shop.example.com", None, 200).await;
    cluster
        .apply_manifest(&gateway_policies(idp.ip()))
        .expect("the gateway's policies");
    at_gateway("no token refused at the gateway", None, 403).await;
    at_gateway(
        "a forged token refused at the gateway",
        Some(forged.clone()),
        401,
    )
    .await;
    let text = at_gateway(
        "a valid token through the gateway",
        Some(token_a.clone()),
        200,
    )
    .await;
    assert!(
        text.contains("\"namespace\"") && !text.contains("\"authorization\""),
        "web answered, without the token the gateway validated: {text}"
    );
    let (status, text) = call_gateway(&node, gateway, Some("not.a.token"))
        .await
        .expect("garbage at the gateway");
    assert_eq!(status, 401, "garbage at the gateway: {text}");
    let (status, text) = call_gateway(&node, gateway, None)
        .await
        .expect("no token at the gateway");
    assert_eq!(status, 403, "no token at the gateway: {text}");
    assert!(
        text.contains("RBAC: access denied"),
        "the denial is the gateway policy's: {text}"
    );

    // Issuer A's identity provider goes away: its tokens are refused, B's still pass, and the
    // listener keeps serving requests without a token.
    server_a.abort();
    let _ = server_a.await;
    expect_status(&cart, "issuer A's token refused", Some(&token_a), 401).await;
    let (status, text) = call_web(&cart, Some(&token_b)).await.expect("call");
    assert!(
        status == 200 && !text.contains("\"authorization\""),
        "issuer B still validated: {text}"
    );
    let (status, text) = call_web(&cart, None).await.expect("call");
    assert_eq!(status, 200, "no token still served: {text}");
    let entries =
        wait_for_jwks_status(&cluster, "web-jwt", "the failed fetch in the status", |e| {
            entry(e, ISSUER_A)
                .and_then(|x| x["error"].as_str())
                .is_some_and(|m| m.contains("8081"))
                && entry(e, ISSUER_B).is_some_and(|x| x.get("error").is_none())
        })
        .await;
    eprintln!("after A went away: {entries:?}");
    eprintln!("scenario end-user auth took {:?}", started.elapsed());
}
