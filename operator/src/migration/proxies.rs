//! What a revision's instance says about its connected proxies (`/debug/proxies` on its
//! monitoring port): which pods are connected, and per resource type whether the proxy holds
//! what was last sent or rejected it. Only the fields the gates read are decoded.

use serde::Deserialize;

/// A NACK as the instance reports it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Nack {
    /// The version the proxy rejected.
    pub version: String,
    /// The proxy's error message.
    pub message: String,
}

/// Sync state of one resource type of one proxy.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TypeSync {
    #[serde(rename = "type")]
    pub type_name: String,
    pub subscribed: bool,
    pub sent_version: Option<String>,
    pub acked_version: Option<String>,
    pub awaiting_ack: bool,
    pub last_nack: Option<Nack>,
    /// The proxy rejected the latest content it was offered and runs on older config (or
    /// none); `last_nack` alone may be history.
    pub rejected: bool,
}

impl TypeSync {
    /// The NACK the proxy stands on: it rejected the latest content offered (the instance
    /// rolls `sent_version` back to what the proxy still holds, so the rejected version is only
    /// in the NACK). A NACK since superseded by newer content is history.
    pub fn current_nack(&self) -> Option<&Nack> {
        self.last_nack
            .as_ref()
            .filter(|_| self.subscribed && self.rejected)
    }

    /// Whether the proxy holds what was last sent, and did not reject the latest content (or
    /// does not subscribe to the type).
    pub fn synced(&self) -> bool {
        !self.subscribed
            || (self.sent_version.is_some()
                && !self.awaiting_ack
                && !self.rejected
                && self.sent_version == self.acked_version)
    }
}

/// One proxy connected to an instance.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ConnectedProxy {
    pub namespace: String,
    pub pod_name: Option<String>,
    pub types: Vec<TypeSync>,
}

/// Decodes the instance's `/debug/proxies` answer.
pub fn parse_debug_proxies(text: &str) -> Result<Vec<ConnectedProxy>, serde_json::Error> {
    serde_json::from_str(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instances_answer_decodes_and_states_follow_the_tracker() {
        let body = r#"[{"id":"sidecar~198.18.0.11~web-1.shop~shop.svc.cluster.local","namespace":"shop",
            "pod_name":"web-1","protocol":"delta","config_bytes":2800,
            "types":[{"type":"cds","subscribed":true,"sent_version":"v1","acked_version":"v1",
                      "awaiting_ack":false,"last_nack":null,"resources":[]},
                     {"type":"lds","subscribed":true,"sent_version":"v1","acked_version":"v1",
                      "awaiting_ack":false,"last_nack":{"version":"v2","message":"bad filter","at":1},
                      "rejected":true},
                     {"type":"rds","subscribed":true,"sent_version":null,"acked_version":null,
                      "awaiting_ack":false,"last_nack":{"version":"r1","message":"bad route","at":1},
                      "rejected":true}]}]"#;
        let proxies = parse_debug_proxies(body).expect("decodes");
        assert_eq!(proxies[0].pod_name.as_deref(), Some("web-1"));
        let [cds, lds, rds] = proxies[0].types.as_slice() else {
            panic!("three types")
        };
        assert!(cds.synced() && cds.current_nack().is_none());
        // Rejected v2 while holding the acknowledged v1: not synced, NACKed.
        assert!(!lds.synced());
        assert_eq!(
            lds.current_nack().map(|n| n.message.as_str()),
            Some("bad filter")
        );
        // Rejected its very first response: nothing held, NACKed.
        assert!(!rds.synced());
        assert_eq!(rds.current_nack().map(|n| n.version.as_str()), Some("r1"));
        // Superseded by newer, acknowledged content: history, not a current NACK.
        let healed = TypeSync {
            sent_version: Some("v3".into()),
            acked_version: Some("v3".into()),
            rejected: false,
            ..lds.clone()
        };
        assert!(healed.synced() && healed.current_nack().is_none());
    }
}
