//! What was offered to a proxy and how it answered, per type (xDS protocol, "ACK/NACK and
//! resource type instance version"): every response carries a nonce; a request answers the
//! latest nonce of its type or is stale; an ACK moves the acknowledged version on; a NACK
//! leaves the proxy on what it held before, and that very content is not offered again until
//! it changes. At most one response per type awaits its answer. A state-of-the-world client
//! that reconnects reports the version it holds in its first request ("When to send an
//! update"), and is not sent that content again.

use std::sync::Arc;
use std::time::SystemTime;

use super::RequestOutcome;
use crate::ads::map_diff::ResourceMap;

/// A rejected response, as reported by the proxy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Nack {
    pub version: String,
    pub message: String,
    #[serde(with = "unix_seconds")]
    pub at: SystemTime,
}

mod unix_seconds {
    use std::time::SystemTime;
    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        s.serialize_u64(secs)
    }
}

/// The response awaiting its answer.
#[derive(Clone, Debug)]
pub struct Pending {
    pub nonce: String,
    pub version: String,
    /// What the proxy held before it: held again on a NACK.
    pub prev_sent: Arc<ResourceMap>,
    pub prev_sent_version: Option<String>,
    /// Desired version of the type when sent: a NACK blocks exactly this content.
    pub desired_version: String,
}

/// The exchange of one type on one stream: what the proxy holds (or will, once the pending
/// response is ACKed) and the answers it gave.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// What the proxy holds (or will hold once the pending response is ACKed).
    pub sent: Arc<ResourceMap>,
    pub sent_version: Option<String>,
    pub acked_version: Option<String>,
    pub last_nonce: Option<String>,
    pub pending: Option<Pending>,
    /// The desired version the proxy rejected: not offered again.
    pub nack_block: Option<String>,
    pub last_nack: Option<Nack>,
    /// Whether a response of the type went on this stream.
    pub responded: bool,
    /// SotW reconnect: the version the proxy already holds.
    pub resume_version: Option<String>,
}

impl Exchange {
    /// Whether `nonce` answers something other than our latest response of the type.
    pub fn is_stale(&self, nonce: &str) -> bool {
        match &self.last_nonce {
            // Nothing sent on this stream yet: a nonce from a previous stream is just noise.
            None => false,
            Some(last) => !nonce.is_empty() && nonce != last,
        }
    }

    /// Settles the pending response named by `nonce`; returns the outcome if it was one.
    pub fn settle(
        &mut self,
        type_url: &'static str,
        nonce: &str,
        error: Option<&str>,
    ) -> Option<RequestOutcome> {
        if self.pending.as_ref().map(|p| p.nonce.as_str()) != Some(nonce) {
            return None;
        }
        let pending = self.pending.take()?;
        match error {
            Some(message) => {
                // The proxy keeps its previous config: so do we, and we do not offer the same
                // content again until it changes.
                self.sent = pending.prev_sent;
                self.sent_version = pending.prev_sent_version;
                self.nack_block = Some(pending.desired_version);
                let nack = Nack {
                    version: pending.version,
                    message: message.to_string(),
                    at: SystemTime::now(),
                };
                self.last_nack = Some(nack.clone());
                Some(RequestOutcome::Nack { type_url, nack })
            }
            None => {
                self.acked_version = Some(pending.version.clone());
                Some(RequestOutcome::Ack {
                    type_url,
                    version: pending.version,
                })
            }
        }
    }

    /// Whether a response may be planned for content of `desired_version`: none awaits its
    /// answer and the proxy did not reject this content (a rejection of older content is
    /// forgotten).
    pub fn may_offer(&mut self, desired_version: &str) -> bool {
        if self.pending.is_some() {
            return false;
        }
        match &self.nack_block {
            Some(blocked) if blocked == desired_version => false,
            Some(_) => {
                self.nack_block = None;
                true
            }
            None => true,
        }
    }

    /// Whether the proxy may not hold what content of `desired_version` names yet: a response
    /// awaits its answer, or the proxy rejected this very content.
    pub fn unsettled(&self, desired_version: &str) -> bool {
        self.pending.is_some() || self.nack_block.as_deref() == Some(desired_version)
    }

    /// SotW reconnect: whether the proxy reported holding `version`, the version of `target`.
    /// Then it holds `target` and nothing is sent; either way the report is used up.
    pub fn resumes(&mut self, target: &Arc<ResourceMap>, version: &str) -> bool {
        if self.resume_version.take().as_deref() != Some(version) {
            return false;
        }
        self.sent = Arc::clone(target);
        self.sent_version = Some(version.to_string());
        self.acked_version = Some(version.to_string());
        self.responded = true;
        true
    }

    /// Records a response offering `next_sent` at `version` under nonce `nonce`; it awaits its
    /// answer.
    pub fn offer(
        &mut self,
        nonce: String,
        version: String,
        next_sent: Arc<ResourceMap>,
        desired_version: String,
    ) {
        self.pending = Some(Pending {
            nonce: nonce.clone(),
            prev_sent: std::mem::replace(&mut self.sent, next_sent),
            prev_sent_version: self.sent_version.replace(version.clone()),
            version,
            desired_version,
        });
        self.last_nonce = Some(nonce);
        self.responded = true;
    }

    /// The proxy dropped these resources with what named them: they count as not sent (on a
    /// NACK of the pending response too). Whether anything changed (a reconnecting SotW
    /// proxy's report is used up: it no longer holds all of that version).
    pub fn forget(&mut self, names: &[&String]) -> bool {
        if names.is_empty() {
            return false;
        }
        let resumed = self.resume_version.take().is_some();
        if !names.iter().any(|n| self.sent.contains_key(*n)) {
            return resumed;
        }
        let sent = Arc::make_mut(&mut self.sent);
        for n in names {
            sent.remove(*n);
        }
        if let Some(p) = &mut self.pending {
            let prev = Arc::make_mut(&mut p.prev_sent);
            for n in names {
                prev.remove(*n);
            }
        }
        true
    }
}
