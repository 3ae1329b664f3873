#!/usr/bin/env bash
# Builds the operator, xds-server and proxy images from docker/*.Dockerfile.
#   TAG=0.1.0 (the MeshControlPlane spec.version the images serve), REGISTRY=ghcr.io/meshplane,
#   DOCKER=docker (any CLI with docker's build syntax, e.g. podman).
# Needs a running container engine; without one it says so and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${TAG:-0.1.0}
registry=${REGISTRY:-ghcr.io/meshplane}
docker=${DOCKER:-docker}

if ! command -v "$docker" >/dev/null 2>&1; then
  echo "make images: '$docker' not found; install Docker (or set DOCKER to a compatible CLI such as podman)" >&2
  exit 1
fi
if ! info=$("$docker" info 2>&1); then
  echo "make images: '$docker' cannot reach a container engine, so no image was built:" >&2
  printf '%s\n' "$info" | grep -i -m 3 -E 'error|cannot|denied' | sed 's/^/  /' >&2 || true
  echo "start the Docker engine (or point DOCKER_HOST at one) and run make images again" >&2
  exit 1
fi

for image in operator xds-server proxy; do
  dockerfile="docker/$image.Dockerfile"
  [ -f "$dockerfile" ] || { echo "make images: $dockerfile not found" >&2; exit 1; }
  echo "building $registry/$image:$tag from $dockerfile"
  "$docker" build -f "$dockerfile" -t "$registry/$image:$tag" .
done
echo "built: $(printf "$registry/%s:$tag " operator xds-server proxy)"
