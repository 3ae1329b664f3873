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
        })
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
        };
        let written = data.to_data();
        assert_eq!(written[MEMBERS], "bank\nshop\n");
        assert_eq!(written[TAGS], "");
        assert_eq!(MembersData::from_data(&written), Ok(data));
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
}
