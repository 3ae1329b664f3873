//! Route configurations for Virtual Host Discovery (VHDS), as pure functions.
//!
//! A delta Envoy gets each route configuration as a stub that points to VHDS over ADS and its
//! virtual hosts as resources of their own: a new service then costs it one virtual host, not
//! the whole configuration again (with 10,000 services, megabytes). Envoy's VHDS client
//! (`source/common/router/vhds.cc`):
//!
//! - subscribes with the route configuration's name and matches resources by namespace: a
//!   virtual host belongs to the configuration named by its resource name up to the last `/`,
//!   so the part after it must not contain one ([`resource_name`] escapes it);
//! - keys the virtual hosts it holds by `VirtualHost.name` and removes them by resource name, so
//!   the two must be equal;
//! - merges them with the stub's inline virtual hosts, which must not repeat a domain.
//!
//! Every virtual host goes over VHDS, the catch-all included: a configuration with virtual
//! hosts never has an empty namespace, whose answer Envoy would not see (its watch gets no
//! update), and a configuration without any stays inline (no VHDS at all).

use std::borrow::Cow;

use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, AggregatedConfigSource, ApiVersion, ConfigSource,
};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, Vhds, VirtualHost};

/// A route configuration split for VHDS.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The configuration without its virtual hosts, pointing to VHDS over ADS.
    pub stub: RouteConfiguration,
    /// Its virtual hosts, each named by [`resource_name`].
    pub virtual_hosts: Vec<VirtualHost>,
}

/// The VHDS resource name of a virtual host of `route_config`: `<route config>/<vhost>`, with
/// `%` and `/` in the virtual host's name escaped (`%25`, `%2F`), so that the namespace Envoy
/// derives (everything before the last `/`) is the route configuration and two virtual hosts
/// never share a name.
pub fn resource_name(route_config: &str, virtual_host: &str) -> String {
    let escaped = virtual_host.replace('%', "%25").replace('/', "%2F");
    format!("{route_config}/{escaped}")
}

/// The name of the virtual host whose VHDS resource is `resource` in `route_config`: the
/// inverse of [`resource_name`]; none for a resource of another configuration.
pub fn inline_name<'a>(route_config: &str, resource: &'a str) -> Option<Cow<'a, str>> {
    let escaped = resource.strip_prefix(route_config)?.strip_prefix('/')?;
    if !escaped.contains('%') {
        return Some(Cow::Borrowed(escaped));
    }
    // Every `%` of the escaped name starts `%25` or `%2F`: undoing `%2F` first cannot match
    // across two escapes.
    Some(Cow::Owned(escaped.replace("%2F", "/").replace("%25", "%")))
}

/// The VHDS form of `rc`, or `None` when it has no virtual hosts (it then stays inline).
/// Takes the configuration, so its virtual hosts move rather than being copied.
pub fn split(mut rc: RouteConfiguration) -> Option<Split> {
    if rc.virtual_hosts.is_empty() {
        return None;
    }
    let mut virtual_hosts = std::mem::take(&mut rc.virtual_hosts);
    for vh in &mut virtual_hosts {
        vh.name = resource_name(&rc.name, &vh.name);
    }
    Some(Split {
        stub: stub(rc),
        virtual_hosts,
    })
}

/// `rc` without its virtual hosts, pointing to VHDS over ADS for them.
pub fn stub(rc: RouteConfiguration) -> RouteConfiguration {
    RouteConfiguration {
        virtual_hosts: Vec::new(),
        vhds: Some(Vhds {
            config_source: Some(ConfigSource {
                config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource::default(),
                )),
                resource_api_version: ApiVersion::V3 as i32,
                ..Default::default()
            }),
        }),
        ..rc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vhost(name: &str, domain: &str) -> VirtualHost {
        VirtualHost {
            name: name.to_string(),
            domains: vec![domain.to_string()],
            ..Default::default()
        }
    }

    fn namespace(resource: &str) -> &str {
        resource.rsplit_once('/').map(|(ns, _)| ns).unwrap_or("")
    }

    #[test]
    fn virtual_hosts_leave_the_configuration_named_into_its_namespace() {
        let rc = RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![
                vhost("reviews.bookinfo.svc.cluster.local:80", "reviews"),
                vhost("allow_any", "*"),
            ],
            validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            ..Default::default()
        };
        let split = split(rc.clone()).expect("has virtual hosts");
        assert!(split.stub.virtual_hosts.is_empty());
        assert_eq!(split.stub.name, "80");
        assert_eq!(split.stub.validate_clusters, rc.validate_clusters);
        let source = split
            .stub
            .vhds
            .and_then(|v| v.config_source)
            .expect("vhds config source");
        assert!(matches!(
            source.config_source_specifier,
            Some(ConfigSourceSpecifier::Ads(_))
        ));
        let names: Vec<&str> = split
            .virtual_hosts
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["80/reviews.bookinfo.svc.cluster.local:80", "80/allow_any"]
        );
        assert!(names.iter().all(|n| namespace(n) == "80"));
        // Only the name changed.
        assert_eq!(split.virtual_hosts[0].domains, ["reviews"]);
    }

    #[test]
    fn slashes_in_names_keep_the_namespace_and_names_distinct() {
        let rc = RouteConfiguration {
            name: "gw/https.443".into(),
            virtual_hosts: vec![
                vhost("ns/host", "a"),
                vhost("ns%2Fhost", "b"),
                vhost("ns_host", "c"),
            ],
            ..Default::default()
        };
        let split = split(rc).expect("has virtual hosts");
        let names: Vec<&str> = split
            .virtual_hosts
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert!(
            names.iter().all(|n| namespace(n) == "gw/https.443"),
            "{names:?}"
        );
        let distinct: std::collections::BTreeSet<&&str> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }

    #[test]
    fn virtual_host_names_come_back_from_resource_names() {
        for name in ["reviews:80", "ns/host", "ns%2Fhost", "%25/%", "a%2F%25b/"] {
            let resource = resource_name("gw/https.443", name);
            assert_eq!(
                inline_name("gw/https.443", &resource).as_deref(),
                Some(name)
            );
        }
        assert_eq!(inline_name("80", "8080/reviews:80"), None);
    }

    #[test]
    fn a_configuration_without_virtual_hosts_stays_inline() {
        let rc = RouteConfiguration {
            name: "inbound|8080||".into(),
            ..Default::default()
        };
        assert_eq!(split(rc), None);
    }
}
