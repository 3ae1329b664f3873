//! The names the node agent and the instance's translation share: contract 11
//! ([`meshplane_contracts::tenant_ca`]).

pub use meshplane_contracts::tenant_ca::{
    SDS_CLUSTER, SDS_METADATA, TRUST_BUNDLE_SECRET, WORKLOAD_CERT_SECRET,
};
