//! The seam between the tenant's state and the push machinery: what a generator of proxy
//! configurations must do, and how far an applied event reaches.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::model::{ProxyConfig, ProxyNode, SourceEvent};
use crate::outputs::IndexWatch;
use crate::translate::cluster_id::HostPort;

/// What the push loop needs from the tenant's state: fold source events, render a proxy.
pub trait ConfigGenerator: Send + 'static {
    /// Folds one event and says how far it reaches.
    fn apply(&mut self, event: SourceEvent) -> Change;
    /// The full configuration of one proxy; the same `Arc` for proxies that get the same config
    /// until the next change (pushes then build one snapshot for all of them).
    fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig>;
    /// Receivers of what the generator publishes besides configurations (members, verdicts,
    /// the EnvoyFilter policy, credential names); they follow every applied event.
    fn watch(&self) -> IndexWatch;
}

/// How far a change reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// Nothing any proxy receives changed.
    #[default]
    None,
    /// Only endpoints of some EDS clusters changed (push EDS to the proxies that import them).
    Endpoints,
    /// Configuration changed (clusters, listeners, routes may differ).
    Config,
}

/// What an applied event changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    /// The hosts' ports whose endpoints changed (for [`ChangeKind::Endpoints`]): their EDS
    /// clusters and those of their subsets.
    pub clusters: BTreeSet<HostPort>,
    /// Namespaces whose objects changed.
    pub namespaces: BTreeSet<String>,
    /// Whether the member namespaces changed.
    pub members_changed: bool,
}

impl Change {
    /// A configuration change (every proxy may see something different).
    pub fn config() -> Self {
        Change {
            kind: ChangeKind::Config,
            ..Change::default()
        }
    }

    /// Whether any proxy may need a push.
    pub fn is_empty(&self) -> bool {
        self.kind == ChangeKind::None
    }

    /// Folds another change into this one (for debouncing).
    pub fn merge(&mut self, other: Change) {
        self.kind = self.kind.max(other.kind);
        self.clusters.extend(other.clusters);
        self.namespaces.extend(other.namespaces);
        self.members_changed |= other.members_changed;
    }
}
