//! Contract 3: the proxy count ConfigMap `meshplane-<revision>-proxies` in the control
//! namespace.
//!
//! The operator creates it without data. Each instance pod server-side-applies one key, its
//! pod name, whose value is its connected proxy count in decimal, under the field manager
//! [`field_manager`] (so pods never take each other's keys). The operator sums the keys of the
//! instance pods that exist into `status.connectedProxies`; keys of pods that are gone are
//! stale and do not count.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ContractError;
use crate::Data;

const CONTRACT: &str = "3 (proxy count ConfigMap)";

/// Name of the proxy count ConfigMap of `revision`.
pub fn configmap_name(revision: &str) -> String {
    format!("meshplane-{revision}-proxies")
}

/// The field manager instance pod `pod` applies its key with.
pub fn field_manager(pod: &str) -> String {
    format!("meshplane-xds/{pod}")
}

/// The one entry instance pod `pod` applies: its key and value.
pub fn entry(pod: &str, connected: u64) -> (String, String) {
    (pod.to_string(), connected.to_string())
}

/// The counts in the ConfigMap, by pod name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    pub by_pod: BTreeMap<String, u64>,
}

impl ProxyCounts {
    /// Reads the ConfigMap `data`; a value that is not a count is an error naming its key.
    pub fn from_data(data: &Data) -> Result<Self, ContractError> {
        let mut by_pod = BTreeMap::new();
        for (pod, value) in data {
            let count = value.trim().parse::<u64>().map_err(|_| {
                ContractError::invalid(
                    CONTRACT,
                    "count",
                    value,
                    format!("key {pod:?} is not a count"),
                )
            })?;
            by_pod.insert(pod.clone(), count);
        }
        Ok(Self { by_pod })
    }

    /// The sum over the pods in `live` (the instance pods that exist).
    pub fn total(&self, live: &BTreeSet<String>) -> u64 {
        self.by_pod
            .iter()
            .filter(|(pod, _)| live.contains(*pod))
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }

    /// Keys of pods not in `live`: left behind by instance pods that are gone.
    pub fn stale<'a>(&'a self, live: &'a BTreeSet<String>) -> impl Iterator<Item = &'a str> {
        self.by_pod
            .keys()
            .filter(|pod| !live.contains(*pod))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_counts_only_live_pods() {
        let data: Data = [entry("xds-a", 3), entry("xds-b", 4), entry("xds-gone", 9)]
            .into_iter()
            .collect();
        let counts = ProxyCounts::from_data(&data).expect("counts");
        let live: BTreeSet<String> = ["xds-a".to_string(), "xds-b".to_string()].into();
        assert_eq!(counts.total(&live), 7);
        assert_eq!(counts.stale(&live).collect::<Vec<_>>(), ["xds-gone"]);
        assert_eq!(field_manager("xds-a"), "meshplane-xds/xds-a");
        let err = ProxyCounts::from_data(&Data::from([("x".into(), "many".into())]))
            .expect_err("not a count");
        assert!(err.to_string().contains("\"x\""), "{err}");
    }
}
