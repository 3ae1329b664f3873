//! Contract 2: the members ConfigMap `meshplane-<revision>-members` in the control namespace.
//!
//! Written by the operator, read by the revision's instance (in Strict mode the only way it
//! learns its members without cluster-wide list rights). Lists are namespace names, sorted,
//! one per line, each line ending in `\n`. `meshConfig` is the revision's `spec.meshConfig` as
//! JSON; it stays text here (its type belongs to the API crate) and each side (de)serializes it
//! with that type.

use std::collections::BTreeSet;

use crate::error::ContractError;
use crate::{is_dns1123_label, Data};

const CONTRACT: &str = "2 (members ConfigMap)";

/// Key of the tenant's member namespaces (every revision's attached namespaces).
pub const MEMBERS: &str = "members";
/// Key of the namespaces attached to this revision, directly or through a tag.
pub const ATTACHED: &str = "attached";
/// Key of the tags pointing at this revision.
pub const TAGS: &str = "tags";
/// Key of the revision's mesh config (JSON).
pub const MESH_CONFIG: &str = "meshConfig";
/// Key of the ingress gateways the revision runs (JSON list: name, namespace, pod labels,
/// trusted namespaces); absent means none.
pub const GATEWAYS: &str = "gateways";
/// Key of the Gateway API GatewayClasses of the tenant (meshplane's controller, naming the
/// tenant; `meshplane_crds::gateway_tenancy`), one name per line; absent means none. The
/// instance cannot read cluster-scoped GatewayClasses: it programs a Gateway only when its class
/// is listed here.
pub const GATEWAY_CLASSES: &str = "gatewayClasses";
/// Key present, `"true"`, on exactly one revision of a tenant (its oldest active revision): the
/// one that writes the status of config in the control namespace (tenant-wide config). Config
/// in a member namespace has its status written by the revision the namespace is attached to,
/// so every object has one status writer and two revisions never take turns on it.
pub const STATUS_WRITER: &str = "statusWriter";

/// Name of the members ConfigMap of `revision`.
pub fn configmap_name(revision: &str) -> String {
    format!("meshplane-{revision}-members")
}

/// The content of the members ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembersData {
    /// The tenant's member namespaces.
    pub members: BTreeSet<String>,
    /// Namespaces attached to this revision.
    pub attached: BTreeSet<String>,
    /// Tags resolving to this revision.
    pub tags: BTreeSet<String>,
    /// `spec.meshConfig` as JSON, when the operator wrote one.
    pub mesh_config: Option<String>,
    /// The revision's gateways as JSON, when it runs any (its type belongs to the API crate).
    pub gateways: Option<String>,
    /// Whether this revision writes the status of the control namespace's config.
    pub status_writer: bool,
    /// The tenant's GatewayClasses.
    pub gateway_classes: BTreeSet<String>,
}

fn lines(set: &BTreeSet<String>) -> String {
    set.iter().map(|s| format!("{s}\n")).collect()
}

fn parse_lines(data: &Data, key: &'static str) -> Result<Option<BTreeSet<String>>, ContractError> {
    let Some(text) = data.get(key) else {
        return Ok(None);
    };
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !is_dns1123_label(line) {
            return Err(ContractError::invalid(
                CONTRACT,
                key,
                line,
                "not a namespace name (DNS-1123 label)",
            ));
        }
        out.insert(line.to_string());
    }
    Ok(Some(out))
}

/// The `gatewayClasses` lines: names of cluster-scoped objects (DNS-1123 subdomains).
fn parse_class_names(data: &Data) -> Result<BTreeSet<String>, ContractError> {
    let mut out = BTreeSet::new();
    for line in data
        .get(GATEWAY_CLASSES)
        .map(String::as_str)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        if !crate::is_dns1123_subdomain(line) {
            return Err(ContractError::invalid(
                CONTRACT,
                GATEWAY_CLASSES,
                line,
                "not a GatewayClass name (DNS-1123 subdomain)",
            ));
        }
        out.insert(line.to_string());
    }
    Ok(out)
}

impl MembersData {
    /// The ConfigMap `data`.
    pub fn to_data(&self) -> Data {
        let mut data = Data::from([
            (MEMBERS.to_string(), lines(&self.members)),
            (ATTACHED.to_string(), lines(&self.attached)),
            (TAGS.to_string(), lines(&self.tags)),
        ]);
        if let Some(mc) = &self.mesh_config {
            data.insert(MESH_CONFIG.to_string(), mc.clone());
        }
        if let Some(gw) = &self.gateways {
            data.insert(GATEWAYS.to_string(), gw.clone());
        }
        if self.status_writer {
            data.insert(STATUS_WRITER.to_string(), "true".to_string());
        }
        if !self.gateway_classes.is_empty() {
            data.insert(GATEWAY_CLASSES.to_string(), lines(&self.gateway_classes));
        }
        data
    }

    /// Reads the ConfigMap `data`. `members` is required (the operator always writes it, empty
    /// or not): a ConfigMap without it is not one the operator wrote, and an instance must not
    /// take it for "no members". A line that is not a namespace name fails the whole read, for
    /// the same reason. `attached` and `tags` default to empty.
    pub fn from_data(data: &Data) -> Result<Self, ContractError> {
        let members = parse_lines(data, MEMBERS)?.ok_or(ContractError::MissingKey {
            contract: CONTRACT,
            key: MEMBERS,
        })?;
        Ok(Self {
            members,
            attached: parse_lines(data, ATTACHED)?.unwrap_or_default(),
            tags: parse_lines(data, TAGS)?.unwrap_or_default(),
            mesh_config: data.get(MESH_CONFIG).cloned(),
            gateways: data.get(GATEWAYS).cloned(),
            status_writer: data.get(STATUS_WRITER).is_some_and(|v| v.trim() == "true"),
            gateway_classes: parse_class_names(data)?,
        })
    }

    /// Whether this revision writes the status (conditions, key fetch status) of config in
    /// `namespace`: a namespace attached to it, or the control namespace when it is the
    /// tenant's status writer. Exactly one revision of a tenant answers yes for each namespace.
    pub fn writes_status_of(&self, namespace: &str, control_namespace: &str) -> bool {
        if namespace == control_namespace {
            self.status_writer
        } else {
            self.attached.contains(namespace)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn round_trips_and_has_the_documented_shape() {
        let data = MembersData {
            members: set(&["shop", "bank"]),
            attached: set(&["shop"]),
            tags: BTreeSet::new(),
            mesh_config: Some(r#"{"outboundTrafficPolicy":"REGISTRY_ONLY"}"#.into()),
            gateways: Some(r#"[{"name":"edge","namespace":"shop","labels":{}}]"#.into()),
            status_writer: true,
            gateway_classes: set(&["meshplane-blue"]),
        };
        let written = data.to_data();
        assert_eq!(written[MEMBERS], "bank\nshop\n");
        assert_eq!(written[STATUS_WRITER], "true");
        assert_eq!(written[TAGS], "");
        assert_eq!(written[GATEWAY_CLASSES], "meshplane-blue\n");
        assert_eq!(MembersData::from_data(&written), Ok(data));
        // No classes, no key (existing ConfigMaps stay as they are); a bad name is an error.
        assert!(!MembersData::default()
            .to_data()
            .contains_key(GATEWAY_CLASSES));
        let mut bad = written.clone();
        bad.insert(GATEWAY_CLASSES.into(), "Not/A/Class\n".into());
        assert!(MembersData::from_data(&bad).is_err());
    }

    #[test]
    fn missing_members_and_bad_names_are_errors_not_empty_tenants() {
        let err = MembersData::from_data(&Data::new()).expect_err("no members key");
        assert!(err.to_string().contains("\"members\" is missing"), "{err}");
        let data = Data::from([(MEMBERS.into(), "shop\nNot A Namespace\n".into())]);
        let err = MembersData::from_data(&data).expect_err("bad name");
        assert!(err.to_string().contains("Not A Namespace"), "{err}");
        // Blank lines and surrounding spaces are tolerated.
        let data = Data::from([(MEMBERS.into(), "bank\n\n shop \n".into())]);
        assert_eq!(
            MembersData::from_data(&data).map(|d| d.members),
            Ok(set(&["bank", "shop"]))
        );
    }

    #[test]
    fn status_of_each_namespace_has_one_writer() {
        let old = MembersData {
            members: set(&["shop", "cart"]),
            attached: set(&["shop"]),
            status_writer: true,
            ..Default::default()
        };
        let new = MembersData {
            members: set(&["shop", "cart"]),
            attached: set(&["cart"]),
            ..Default::default()
        };
        for (ns, want_old) in [("shop", true), ("cart", false), ("meshplane-blue", true)] {
            assert_eq!(old.writes_status_of(ns, "meshplane-blue"), want_old, "{ns}");
            assert_eq!(
                new.writes_status_of(ns, "meshplane-blue"),
                !want_old,
                "{ns}"
            );
        }
        // Not a writer unless the key says so; an absent key reads as not the writer.
        assert!(!new.to_data().contains_key(STATUS_WRITER));
        assert!(!MembersData::from_data(&new.to_data()).is_ok_and(|d| d.status_writer));
        assert_eq!(MembersData::from_data(&old.to_data()), Ok(old));
    }
}
