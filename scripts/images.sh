#!/usr/bin/env bash
# Builds the operator, xds-server and proxy images from their Dockerfiles. Needs a Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${TAG:-0.1.0}
for image in operator xds-server proxy; do
  if [ -f "docker/$image.Dockerfile" ]; then
    docker build -f "docker/$image.Dockerfile" -t "ghcr.io/meshplane/$image:$tag" .
  else
    echo "docker/$image.Dockerfile not found" >&2; exit 1
  fi
done
