//! The contracts between meshplane's parts, as code both sides use (the numbered list in
//! `docs/architecture.md`, "Interfaces between the parts").
//!
//! Each module is one contract: the names it fixes, its data format as a type, and the
//! format/parse pair that turns the type into what travels (a ConfigMap's `data`, a command
//! line, an Envoy node id) and back. The operator formats what the instance, the injector and
//! the proxy launcher parse; round-trip tests on both sides keep them in step.
//!
//! | # | contract | module |
//! |---|---|---|
//! | 1 | instance command line | [`instance`] |
//! | 2 | members ConfigMap | [`members`] |
//! | 3 | proxy count ConfigMap | [`proxies`] |
//! | 4 | webhook TLS Secret | [`webhook_tls`] |
//! | 5 | webhook paths | [`webhooks`] |
//! | 6 | bootstrap ConfigMap | [`bootstrap`] |
//! | 7 | proxy identity: node id, node metadata, token audience | [`node`] |
//! | 8 | ownership labels | [`ownership`] |
//! | 9 | the operator's own admission certificate | [`operator_tls`] |
//! | 11 | tenant CA, SDS names | [`tenant_ca`] |
//! | 12 | who may read `/debug/*` | [`debug`] |
//! | 13 | proxyless gRPC clients' ADS through the node agent | [`grpc_agent`] |
//!
//! No dependency beyond `thiserror`: the proxy image's launcher links this crate too.

pub mod bootstrap;
pub mod debug;
pub mod grpc_agent;
pub mod instance;
pub mod members;
pub mod node;
pub mod operator_tls;
pub mod ownership;
pub mod ports;
pub mod proxies;
pub mod tenant_ca;
pub mod webhook_tls;
pub mod webhooks;

mod error;
mod kube_names;

pub use error::ContractError;
pub use kube_names::{is_dns1123_label, is_dns1123_subdomain};

/// A ConfigMap's (or decoded Secret's) `data`: key → text.
pub type Data = std::collections::BTreeMap<String, String>;
