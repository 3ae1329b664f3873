//! What the tenant index publishes besides rendered configurations: its member namespaces,
//! the verdict on its traffic config, the EnvoyFilter policy, the credential names of its
//! Gateways, the key sets its RequestAuthentications need fetched, the cluster's pod networks and
//! the addresses of the tenant's pods. The index owns the senders ([`Outputs`]) and sends when an applied event changed
//! a value; admission, the webhooks and the status writer hold receivers ([`IndexWatch`]) and
//! read the latest value without asking the index (which the push loop owns).
//!
//! Only `tokio::sync::watch` is used: channels, no runtime.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy;
use tokio::sync::watch;

use crate::translate::diagnostics::Diagnostics;
use crate::translate::jwt::JwksPlan;

/// The sending side, held by the index.
pub struct Outputs {
    members: watch::Sender<Arc<BTreeSet<String>>>,
    diagnostics: watch::Sender<Arc<Diagnostics>>,
    envoy_filter_policy: watch::Sender<Arc<EnvoyFilterPolicy>>,
    credential_names: watch::Sender<Arc<BTreeSet<String>>>,
    jwks_plan: watch::Sender<Arc<JwksPlan>>,
    pod_networks: watch::Sender<Arc<Vec<IpNet>>>,
    pod_addresses: watch::Sender<Arc<BTreeSet<IpAddr>>>,
}

impl Default for Outputs {
    fn default() -> Self {
        Outputs {
            members: watch::Sender::new(Arc::default()),
            diagnostics: watch::Sender::new(Arc::default()),
            envoy_filter_policy: watch::Sender::new(Arc::default()),
            credential_names: watch::Sender::new(Arc::default()),
            jwks_plan: watch::Sender::new(Arc::default()),
            pod_networks: watch::Sender::new(Arc::default()),
            pod_addresses: watch::Sender::new(Arc::default()),
        }
    }
}

/// Sends `value` unless the channel already holds an equal one (receivers wake only on a
/// real change).
fn send_changed<T: PartialEq>(tx: &watch::Sender<Arc<T>>, value: T) {
    tx.send_if_modified(|held| {
        let changed = **held != value;
        if changed {
            *held = Arc::new(value);
        }
        changed
    });
}

impl Outputs {
    pub fn publish_members(&self, members: BTreeSet<String>) {
        send_changed(&self.members, members);
    }

    pub fn publish_diagnostics(&self, diagnostics: Arc<Diagnostics>) {
        self.diagnostics.send_if_modified(|held| {
            let changed = **held != *diagnostics;
            if changed {
                *held = diagnostics;
            }
            changed
        });
    }

    pub fn publish_envoy_filter_policy(&self, policy: EnvoyFilterPolicy) {
        send_changed(&self.envoy_filter_policy, policy);
    }

    pub fn publish_credential_names(&self, names: BTreeSet<String>) {
        send_changed(&self.credential_names, names);
    }

    pub fn publish_jwks_plan(&self, plan: JwksPlan) {
        send_changed(&self.jwks_plan, plan);
    }

    pub fn publish_pod_networks(&self, networks: Vec<IpNet>) {
        send_changed(&self.pod_networks, networks);
    }

    pub fn publish_pod_addresses(&self, addresses: BTreeSet<IpAddr>) {
        send_changed(&self.pod_addresses, addresses);
    }

    /// Receivers of every output, holding the current values.
    pub fn watch(&self) -> IndexWatch {
        IndexWatch {
            members: self.members.subscribe(),
            diagnostics: self.diagnostics.subscribe(),
            envoy_filter_policy: self.envoy_filter_policy.subscribe(),
            credential_names: self.credential_names.subscribe(),
            jwks_plan: self.jwks_plan.subscribe(),
            pod_networks: self.pod_networks.subscribe(),
            pod_addresses: self.pod_addresses.subscribe(),
        }
    }
}

/// The receiving side: the index's outputs as they change.
#[derive(Clone)]
pub struct IndexWatch {
    /// The tenant's member namespaces (whose proxies are admitted).
    pub members: watch::Receiver<Arc<BTreeSet<String>>>,
    /// The verdict on the tenant's VirtualServices, DestinationRules and Gateways (what their
    /// `Accepted` conditions say).
    pub diagnostics: watch::Receiver<Arc<Diagnostics>>,
    /// What the tenant's EnvoyFilters may do (the validating webhook checks against it).
    pub envoy_filter_policy: watch::Receiver<Arc<EnvoyFilterPolicy>>,
    /// The `credentialName`s the tenant's Gateways name (a connecting gateway's access to
    /// them is asked before its first config).
    pub credential_names: watch::Receiver<Arc<BTreeSet<String>>>,
    /// The key sets the instance fetches for the tenant's RequestAuthentications.
    pub jwks_plan: watch::Receiver<Arc<JwksPlan>>,
    /// The cluster's pod address ranges (`meshConfig.podNetworks`; the validating webhook
    /// checks ServiceEntry endpoints against them).
    pub pod_networks: watch::Receiver<Arc<Vec<IpNet>>>,
    /// The addresses the tenant's pods hold now.
    pub pod_addresses: watch::Receiver<Arc<BTreeSet<IpAddr>>>,
}

impl IndexWatch {
    /// Fixed values, no index behind them: no members, no verdicts, the default policy.
    pub fn detached() -> Self {
        Outputs::default().watch()
    }

    /// Fixed values with these members (generators that keep no other state).
    pub fn with_members(members: BTreeSet<String>) -> Self {
        let outputs = Outputs::default();
        outputs.publish_members(members);
        outputs.watch()
    }
}
