#!/usr/bin/env bash
# meshplane demo (install manifests). Renders what `kubectl apply -k config/default` installs and
# the samples a platform admin applies, and explains the user story the full demo walks through.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBECTL=${KUBECTL:-.venv/bin/kubectl}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }

step "1. The operator install (CRDs, least-privilege RBAC, the operator Deployment, its admission webhook)"
printf '$ %s\n' "$KUBECTL kustomize config/default"
"$KUBECTL" kustomize config/default | awk '/^kind:/{k=$2} /^metadata:/{m=1; next} m && /^  name:/{print "    " k "/" $2; m=0}'

step "2. Two tenants: blue (revisions blue-v1, blue-v2 and the tag blue-stable) and green"
show "$KUBECTL" kustomize config/samples

step "What happens next in a cluster"
cat <<'TXT'
  kubectl apply -f config/samples/blue.yaml      # blue-v1 instance + tag blue-stable
  kubectl apply -f config/samples/green.yaml     # green instance
  kubectl label namespace shop meshplane.io/rev=blue-stable
      -> the bootstrap ConfigMap meshplane-blue-v1-bootstrap appears in shop,
         blue-v1's instance may read shop (a RoleBinding), new pods in shop get blue's sidecar,
         and blue's proxies route to shop's services; green sees none of it.
  kubectl apply -f config/samples/blue-v2.yaml   # canary revision beside blue-v1
  kubectl label namespace shop meshplane.io/rev=blue-v2 --overwrite
  kubectl patch mrt blue-stable --type merge -p '{"spec":{"revision":"blue-v2"}}'
  kubectl get meshcontrolplanes                  # tenant, revision, ready, members, proxies
TXT
