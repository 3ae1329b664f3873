//! The members ConfigMap (contract 2) as the Kubernetes source reads it: decoded once per
//! watch event, followed fail-safe ([`MembersFollower`]), and the revision's other settings in
//! it delivered as they change ([`RevisionSettings`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::{self, Event};
use meshplane_contracts::members::MembersData;
use meshplane_contracts::proxies::MembersStale;
use meshplane_contracts::ContractError;
use meshplane_crds::controlplane::GatewayDeployment;

use crate::model::SourceEvent;

/// The members ConfigMap's content (contract 2), or why it breaks the contract.
pub fn read_members(cm: &ConfigMap) -> Result<MembersData, ContractError> {
    MembersData::from_data(cm.data.as_ref().unwrap_or(&BTreeMap::new()))
}

/// A members ConfigMap as the source reads it: decoded once per watch event.
pub type Decoded = Result<MembersData, ContractError>;

/// The watch event with its ConfigMap decoded through the contract type.
pub fn decode_event(event: Event<ConfigMap>) -> Event<Decoded> {
    match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(cm) => Event::InitApply(read_members(&cm)),
        Event::Apply(cm) => Event::Apply(read_members(&cm)),
        Event::Delete(cm) => Event::Delete(read_members(&cm)),
    }
}

/// Follows the members ConfigMap (contract 2) and fails safe. Once members are known, a
/// deleted, missing or unreadable ConfigMap (or a relist that fails) keeps them (nobody is
/// evicted and no connected proxy loses its config) and marks them stale, with since when and
/// why, which the instance reports to the operator (contract 3, the `MembersStale` condition);
/// only a readable ConfigMap changes them. Before any is known, an absent one means no
/// members, so a new revision still becomes ready.
#[derive(Debug, Default)]
pub struct MembersFollower {
    /// During a relist: the readable content seen so far, or why none is.
    relist: Option<Result<BTreeSet<String>, String>>,
    known: Option<BTreeSet<String>>,
    /// Why the known members are kept although the ConfigMap says otherwise, and since when.
    stale: Option<MembersStale>,
}

impl MembersFollower {
    /// Folds one watch event; returns the members when they change.
    pub fn on_event(&mut self, event: Event<ConfigMap>) -> Option<BTreeSet<String>> {
        self.on_event_at(event, now_rfc3339())
    }

    /// [`Self::on_event`] at `now` (RFC 3339), the time a stale mark starts.
    pub fn on_event_at(
        &mut self,
        event: Event<ConfigMap>,
        now: String,
    ) -> Option<BTreeSet<String>> {
        self.on_decoded(&decode_event(event), now)
    }

    /// Folds one watch event whose ConfigMap is already decoded ([`decode_event`]).
    pub fn on_decoded(&mut self, event: &Event<Decoded>, now: String) -> Option<BTreeSet<String>> {
        let members = |d: &Decoded| {
            d.as_ref()
                .map(|m| m.members.clone())
                .map_err(|e| format!("the members ConfigMap is unreadable: {e}"))
        };
        match event {
            Event::Init => {
                self.relist = Some(Err("the members ConfigMap does not exist".into()));
                None
            }
            Event::InitApply(d) => {
                self.relist = Some(members(d));
                None
            }
            Event::InitDone => {
                let seen = self
                    .relist
                    .take()
                    .unwrap_or_else(|| Err("the members ConfigMap does not exist".into()));
                self.settle(seen, now)
            }
            Event::Apply(d) => self.settle(members(d), now),
            Event::Delete(_) => self.settle(Err("the members ConfigMap was deleted".into()), now),
        }
    }

    /// Folds a watch error. Only a failed relist makes the members stale: the watcher recovers
    /// from it with a fresh list (which settles them again), while a watch that merely
    /// restarts resumes where it stopped and misses nothing.
    pub fn on_error(&mut self, error: &watcher::Error, now: String) {
        if let (watcher::Error::InitialListFailed(e), Some(known)) = (error, &self.known) {
            let why = format!("the members ConfigMap cannot be listed: {e}");
            tracing::warn!(reason = %why, kept = known.len(), "keeping the last known members");
            self.mark_stale(why, now);
        }
    }

    /// The members in use, once known.
    pub fn known(&self) -> Option<&BTreeSet<String>> {
        self.known.as_ref()
    }

    /// Why, and since when, the members in use are kept from before, if they are.
    pub fn stale(&self) -> Option<&MembersStale> {
        self.stale.as_ref()
    }

    fn mark_stale(&mut self, why: String, now: String) {
        match &mut self.stale {
            // Still stale: the mark keeps its start and takes the latest reason.
            Some(mark) => mark.reason = why,
            None => {
                self.stale = Some(MembersStale {
                    since: now,
                    reason: why,
                })
            }
        }
    }

    fn settle(
        &mut self,
        seen: Result<BTreeSet<String>, String>,
        now: String,
    ) -> Option<BTreeSet<String>> {
        match (seen, &self.known) {
            (Ok(members), _) => {
                self.stale = None;
                (self.known.as_ref() != Some(&members)).then(|| {
                    self.known = Some(members.clone());
                    members
                })
            }
            (Err(why), Some(known)) => {
                tracing::warn!(reason = %why, kept = known.len(), "members ConfigMap unusable: keeping the last known members");
                self.mark_stale(why, now);
                None
            }
            (Err(why), None) => {
                tracing::warn!(reason = %why, "no members ConfigMap yet: no members");
                self.stale = None;
                self.known = Some(BTreeSet::new());
                Some(BTreeSet::new())
            }
        }
    }
}

/// Now as RFC 3339 UTC, to the second.
pub(super) fn now_rfc3339() -> String {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// Member namespaces listed in the members ConfigMap (`data.members`, one per line); none when
/// it breaks contract 2 (logged).
pub fn parse_members(cm: &ConfigMap) -> BTreeSet<String> {
    read_members(cm)
        .map_err(|e| tracing::warn!(error = %e, "the members ConfigMap is unreadable"))
        .map(|m| m.members)
        .unwrap_or_default()
}

/// The revision's mesh config from the members ConfigMap (key `meshConfig`, JSON written by the
/// operator); `None` when absent or unreadable, so the instance keeps what it has.
pub fn parse_mesh_config(data: &MembersData) -> Option<meshplane_crds::MeshConfig> {
    let text = data.mesh_config.as_ref()?;
    serde_json::from_str(text)
        .map_err(
            |e| tracing::warn!(error = %e, "meshConfig in the members ConfigMap is unreadable"),
        )
        .ok()
}

/// The tenant's operator-run gateways from the members ConfigMap (key `gateways`, JSON written
/// by the operator); `None` when unreadable, so the instance keeps what it has.
pub fn parse_gateways(data: &MembersData) -> Option<Vec<GatewayDeployment>> {
    let Some(text) = data.gateways.as_ref() else {
        return Some(Vec::new());
    };
    serde_json::from_str(text)
        .map_err(|e| tracing::warn!(error = %e, "gateways in the members ConfigMap are unreadable"))
        .ok()
}

/// What the members ConfigMap says about the revision besides its members: its gateways, mesh
/// config and tags, each delivered when it changes.
#[derive(Debug, Default)]
pub struct RevisionSettings {
    gateways: Option<Vec<GatewayDeployment>>,
    mesh_config: Option<meshplane_crds::MeshConfig>,
    tags: Option<BTreeSet<String>>,
}

impl RevisionSettings {
    /// The events for what changed in a readable ConfigMap's content; an unreadable one keeps
    /// what the instance has.
    pub fn update(&mut self, data: &MembersData) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        if let Some(gws) = parse_gateways(data).filter(|g| self.gateways.as_ref() != Some(g)) {
            tracing::info!(gateways = gws.len(), "tenant gateways changed");
            self.gateways = Some(gws.clone());
            out.push(SourceEvent::GatewayDeployments(gws));
        }
        if let Some(mc) = parse_mesh_config(data).filter(|mc| self.mesh_config.as_ref() != Some(mc))
        {
            tracing::info!("revision mesh config changed");
            self.mesh_config = Some(mc.clone());
            out.push(SourceEvent::MeshConfig(Box::new(mc)));
        }
        if self.tags.as_ref() != Some(&data.tags) {
            tracing::info!(tags = ?data.tags, "tags of the revision changed");
            self.tags = Some(data.tags.clone());
            out.push(SourceEvent::Tags(data.tags.clone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_contracts::{members, proxies};

    #[test]
    fn mesh_config_is_read_from_the_members_configmap_and_bad_json_is_ignored() {
        let parse_mesh_config = |cm: &ConfigMap| parse_mesh_config(&read_members(cm).ok()?);
        let cm = |text: &str| ConfigMap {
            data: Some(
                [
                    (members::MEMBERS.to_string(), String::new()),
                    (members::MESH_CONFIG.to_string(), text.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let mc = parse_mesh_config(&cm(r#"{"trustDomain":"green.mesh.local","outboundTrafficPolicy":{"mode":"REGISTRY_ONLY"}}"#))
            .expect("valid meshConfig");
        assert_eq!(mc.trust_domain.as_deref(), Some("green.mesh.local"));
        assert_eq!(
            mc.outbound_traffic_policy.mode,
            meshplane_crds::controlplane::OutboundTrafficMode::RegistryOnly
        );
        // Extension providers reach the instance's translation with the rest.
        let mc = parse_mesh_config(&cm(
            r#"{"extensionProviders":[{"name":"authz","envoyExtAuthzGrpc":{"service":"shop/authz","port":9000,"failOpen":true}}]}"#,
        ))
        .expect("valid meshConfig");
        let authz = mc.extension_provider("authz").expect("provider read");
        assert_eq!(
            authz
                .envoy_ext_authz_grpc
                .as_ref()
                .map(|g| (g.port, g.fail_open)),
            Some((9000, true))
        );
        assert!(parse_mesh_config(&cm("{not json")).is_none());
        assert!(parse_mesh_config(&ConfigMap::default()).is_none());
    }

    #[test]
    fn members_are_read_line_by_line() {
        let cm = ConfigMap {
            data: Some([(members::MEMBERS.to_string(), "bank\n\n shop \n".to_string())].into()),
            ..Default::default()
        };
        assert_eq!(
            parse_members(&cm),
            BTreeSet::from(["bank".to_string(), "shop".to_string()])
        );
        assert!(parse_members(&ConfigMap::default()).is_empty());
    }

    fn members_cm(text: &str) -> ConfigMap {
        ConfigMap {
            data: Some([(members::MEMBERS.to_string(), text.to_string())].into()),
            ..Default::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// A deleted, missing or unreadable members ConfigMap does not empty
    /// the tenant; the last known members stay, marked stale, until a readable one arrives.
    #[test]
    fn a_deleted_or_unreadable_members_configmap_keeps_the_last_known_members() {
        let mut f = MembersFollower::default();
        f.on_event(Event::Init);
        f.on_event(Event::InitApply(members_cm("bank\nshop\n")));
        assert_eq!(f.on_event(Event::InitDone), Some(set(&["bank", "shop"])));
        assert_eq!(f.stale(), None);

        assert_eq!(f.on_event(Event::Delete(members_cm(""))), None, "kept");
        assert!(f.stale().is_some_and(|w| w.reason.contains("deleted")));
        // A relist that finds no ConfigMap keeps them too.
        f.on_event(Event::Init);
        assert_eq!(f.on_event(Event::InitDone), None);
        assert!(f
            .stale()
            .is_some_and(|w| w.reason.contains("does not exist")));
        // So does one that breaks the contract (no `members` key, a bad name).
        assert_eq!(f.on_event(Event::Apply(ConfigMap::default())), None);
        assert_eq!(
            f.on_event(Event::Apply(members_cm("Not A Namespace\n"))),
            None
        );
        assert!(f.stale().is_some_and(|w| w.reason.contains("unreadable")));

        // A readable one decides again, including "fewer members".
        assert_eq!(
            f.on_event(Event::Apply(members_cm("shop\n"))),
            Some(set(&["shop"]))
        );
        assert_eq!(f.stale(), None);
        assert_eq!(f.on_event(Event::Apply(members_cm(""))), Some(set(&[])));
    }

    #[test]
    fn without_any_members_configmap_a_new_revision_starts_with_no_members() {
        let mut f = MembersFollower::default();
        f.on_event(Event::Init);
        assert_eq!(f.on_event(Event::InitDone), Some(BTreeSet::new()));
        assert_eq!(f.stale(), None);
        assert_eq!(
            f.on_event(Event::Apply(members_cm("shop\n"))),
            Some(set(&["shop"]))
        );
    }

    /// The stale mark (contract 3) keeps the time it started while the members stay stale,
    /// takes the latest reason, and goes once a readable ConfigMap arrives; a relist that
    /// fails makes known members stale too, while a watch that merely restarts does not.
    #[test]
    fn a_stale_mark_keeps_its_start_and_a_failed_relist_marks_known_members() {
        let at = |s: &str| s.to_string();
        let mut f = MembersFollower::default();
        let forbidden = || {
            watcher::Error::InitialListFailed(kube::Error::Api(
                kube::core::Status::failure("configmaps is forbidden", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ))
        };
        f.on_error(&forbidden(), at("2026-12-02T03:00:00Z"));
        assert_eq!(f.stale(), None, "nothing known, nothing kept");
        f.on_event_at(
            Event::Apply(members_cm("shop\n")),
            at("2026-12-02T03:01:00Z"),
        );
        f.on_event_at(Event::Delete(members_cm("")), at("2026-12-02T03:02:00Z"));
        f.on_event_at(
            Event::Apply(members_cm("Not A Namespace\n")),
            at("2026-12-02T03:03:00Z"),
        );
        let mark = f.stale().cloned().expect("stale");
        assert_eq!(mark.since, "2026-12-02T03:02:00Z");
        assert!(mark.reason.contains("unreadable"), "{mark:?}");
        f.on_event_at(
            Event::Apply(members_cm("shop\n")),
            at("2026-12-02T03:04:00Z"),
        );
        assert_eq!(f.stale(), None);

        f.on_error(
            &watcher::Error::WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded),
            at("2026-12-02T03:05:00Z"),
        );
        assert_eq!(f.stale(), None, "a restarted watch misses nothing");
        f.on_error(&forbidden(), at("2026-12-02T03:06:00Z"));
        let mark = f.stale().cloned().expect("stale after a failed relist");
        assert_eq!(mark.since, "2026-12-02T03:06:00Z");
        assert!(mark.reason.contains("cannot be listed"), "{mark:?}");
        assert_eq!(f.known(), Some(&set(&["shop"])), "kept");
        // The relist that succeeds settles them.
        f.on_event_at(Event::Init, at("2026-12-02T03:07:00Z"));
        f.on_event_at(
            Event::InitApply(members_cm("shop\n")),
            at("2026-12-02T03:07:00Z"),
        );
        f.on_event_at(Event::InitDone, at("2026-12-02T03:07:00Z"));
        assert_eq!(f.stale(), None);
        // What the reporter applies parses on the operator's side.
        let data = proxies::entries("xds-0", 2, Some(&mark), None);
        let counts = proxies::ProxyCounts::from_data(&data).expect("contract 3");
        assert_eq!(counts.members_stale.get("xds-0"), Some(&mark));
        assert!(proxies::MembersStale::from_value(&now_rfc3339()).is_ok());
    }
}
