//! The proxy image's entrypoint, `meshplane-proxy`.
//!
//! The injector starts it with the node identity (contract 7); it reads the bootstrap
//! ConfigMap's `envoy.yaml` (contract 6) and the projected ServiceAccount token, writes the final
//! bootstrap and execs Envoy, so that Envoy is the container's main process and receives its
//! signals directly.
//!
//! - [`bootstrap`]: the pure bootstrap transformation.
//! - [`capture`]: the `capture` subcommand, run by the capture init container: the pod's
//!   netfilter rules, a pure plan-to-rules function behind a thin `iptables-restore` shell.
//! - [`cli`]: the command line.
//!
//! `MESHPLANE_LOOPBACK_ADDR` is set only by the e2e suite's local pod runner: there every "pod"
//! is a process on the host and shares the host's loopback interface, so each pod is given its
//! own loopback address (e.g. `127.0.0.12`) and the proxy's admin and static listeners must bind
//! it instead of `127.0.0.1`/`0.0.0.0` (and static upstreams on `127.0.0.1`, such as a
//! readiness route to the admin port, follow), or the proxies of different pods would collide (Envoy
//! binds with `SO_REUSEPORT`, so collisions are silent). In Kubernetes it is never set: a pod
//! has its own network namespace.
//!
//! With `--root-cert` (what the injector renders) the launcher does not exec Envoy but runs
//! the node agent ([`agent`]) with Envoy as its child: the workload certificate over SDS, and
//! ADS carried to the instance over TLS with the token re-read from its file at every connect,
//! so a proxy outlives its first token. Without it (development setups with plaintext ADS) the
//! token is written into the bootstrap once and Envoy is exec'd.

pub mod agent;
pub mod bootstrap;
pub mod capture;
pub mod cli;

pub use bootstrap::{
    build_bootstrap, route_through_agent, AgentSockets, BootstrapError, BootstrapOptions, Upstream,
};
