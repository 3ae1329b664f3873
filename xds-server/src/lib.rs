//! meshplane xds-server: one revision of one tenant, serving Envoy over ADS.

pub mod model;
