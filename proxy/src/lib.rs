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
//! Known limit: Envoy sends the token only when it opens the ADS stream, from the bootstrap. The
//! kubelet rotates the projected token file, but a reconnect after the token's expiry (one hour)
//! presents the old token until the proxy restarts.

pub mod bootstrap;
pub mod capture;
pub mod cli;

pub use bootstrap::{build_bootstrap, BootstrapError, BootstrapOptions};
