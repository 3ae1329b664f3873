#!/usr/bin/env bash
# The address rule for test networks: every IPv4 address written in the repository —
# test fixtures, goldens, generated bench meshes, samples, docs — comes from 198.18.0.0/15 or
# loopback, never from the private ranges (10/8, 172.16/12, 192.168/16), so that nothing, a real
# Envoy included, can ever try to reach a real network. Fails listing every offending line.
set -euo pipefail
cd "$(dirname "$0")/.."
private='(^|[^0-9.])(10\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])|192\.168)\.[0-9]{1,3}\.[0-9]{1,3}([^0-9]|$)'
if hits=$(git ls-files -z | xargs -0 grep -nIE "$private" --); then
  echo "private-range IPv4 addresses found (use 198.18.0.0/15 or loopback):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "addresses: no private-range IPv4 address in $(git ls-files | wc -l) tracked files"
