//! Route configurations encoded from their virtual hosts' encodings.
//!
//! Each virtual host is encoded once, as its VHDS resource (named `<route config>/<vhost>`,
//! [`translate::vhds`]); the inline configuration is assembled from those bytes. Protobuf
//! fields may be concatenated, and prost writes `RouteConfiguration.name` (field 1) and
//! `virtual_hosts` (2) before the others and `VirtualHost.name` (1) first, so the assembly is
//! byte for byte what `encode_to_vec` of the whole configuration gives (tested below). It
//! saves encoding every virtual host twice, and lets a Service change replace one virtual host
//! and reassemble the configuration without translating or encoding the others again
//! (`super::splice`).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use sha2::{Digest, Sha256};

use super::interner::Interner;
use crate::hash::PairHasher;
use crate::model::{type_url, Resource};
use crate::translate;

/// `RouteConfiguration.name` and `VirtualHost.name`.
const NAME: u32 = 1;
/// `RouteConfiguration.virtual_hosts`.
const VIRTUAL_HOSTS: u32 = 2;

/// What a route configuration was assembled from.
#[derive(Clone, Debug)]
pub(super) struct RouteParts {
    /// The configuration's name.
    pub name: String,
    /// Encoding of its fields other than the name and the virtual hosts.
    pub tail: Bytes,
    /// Its virtual hosts' VHDS resources, in the configuration's order.
    pub virtual_hosts: Vec<Arc<Resource>>,
}

/// A route configuration, encoded.
pub(super) struct EncodedRoute {
    /// With its virtual hosts inline.
    pub inline: Arc<Resource>,
    /// For VHDS clients, when asked for: the stub pointing to VHDS (the inline one when it
    /// has no virtual hosts).
    pub stub: Option<Arc<Resource>>,
    pub parts: RouteParts,
}

fn string_field_len(value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        key_len(NAME) + encoded_len_varint(value.len() as u64) + value.len()
    }
}

/// Writes a string field as prost does (nothing for the default, the empty string).
fn put_string_field(tag: u32, value: &str, buf: &mut Vec<u8>) {
    if value.is_empty() {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value.as_bytes());
}

/// The encoding of `msg` after `name` as field 1 (a message whose field 1 is its name).
fn encode_named(name: &str, msg: &impl Message) -> Vec<u8> {
    let mut buf = Vec::with_capacity(string_field_len(name) + msg.encoded_len());
    put_string_field(NAME, name, &mut buf);
    // Infallible: a Vec grows as needed.
    msg.encode(&mut buf).expect("a Vec grows as needed");
    buf
}

/// Encodes `rc` and, with `vhds`, its VHDS stub; each virtual host is encoded once, as its
/// VHDS resource, which the inline form shares.
pub(super) fn encode_route(
    interner: &mut Interner,
    mut rc: RouteConfiguration,
    vhds: bool,
) -> EncodedRoute {
    let virtual_hosts = std::mem::take(&mut rc.virtual_hosts);
    let name = std::mem::take(&mut rc.name);
    let tail = Bytes::from(rc.encode_to_vec());
    rc.name = name;
    let virtual_hosts: Vec<Arc<Resource>> = virtual_hosts
        .into_iter()
        .map(|vh| encode_virtual_host(interner, &rc.name, vh))
        .collect();
    let parts = RouteParts {
        name: rc.name.clone(),
        tail,
        virtual_hosts,
    };
    let inline = assemble(interner, &parts);
    let stub = vhds.then(|| {
        if parts.virtual_hosts.is_empty() {
            Arc::clone(&inline)
        } else {
            let stub = translate::vhds::stub(rc);
            interner.intern(type_url::ROUTE, stub.name.clone(), &stub)
        }
    });
    EncodedRoute {
        inline,
        stub,
        parts,
    }
}

/// The VHDS resource of virtual host `vh` of `route_config`.
pub(super) fn encode_virtual_host(
    interner: &mut Interner,
    route_config: &str,
    mut vh: VirtualHost,
) -> Arc<Resource> {
    let name = translate::vhds::resource_name(route_config, &vh.name);
    vh.name.clear();
    let encoded = encode_named(&name, &vh);
    interner.intern_encoded(type_url::VIRTUAL_HOST, name, encoded)
}

/// The inline configuration of `parts`: each virtual host under its own name, followed by
/// the bytes of its VHDS encoding after the name field. Its version hashes the parts' (the
/// name, the tail and the virtual hosts' names and versions) rather than megabytes of bytes:
/// as stable across restarts, and the same for the same configuration.
pub(super) fn assemble(interner: &mut Interner, parts: &RouteParts) -> Arc<Resource> {
    let inline: Vec<(Cow<'_, str>, &[u8])> = parts
        .virtual_hosts
        .iter()
        .map(|vh| {
            let name = translate::vhds::inline_name(&parts.name, &vh.name)
                .unwrap_or(Cow::Borrowed(vh.name.as_str()));
            let at = string_field_len(&vh.name).min(vh.encoded.len());
            (name, &vh.encoded[at..])
        })
        .collect();
    let body_len = |name: &str, rest: &[u8]| string_field_len(name) + rest.len();
    let len = string_field_len(&parts.name)
        + inline
            .iter()
            .map(|(name, rest)| {
                let body = body_len(name, rest);
                key_len(VIRTUAL_HOSTS) + encoded_len_varint(body as u64) + body
            })
            .sum::<usize>()
        + parts.tail.len();
    let mut buf = Vec::with_capacity(len);
    put_string_field(NAME, &parts.name, &mut buf);
    for (name, rest) in &inline {
        encode_key(VIRTUAL_HOSTS, WireType::LengthDelimited, &mut buf);
        encode_varint(body_len(name, rest) as u64, &mut buf);
        put_string_field(NAME, name, &mut buf);
        buf.put_slice(rest);
    }
    buf.put_slice(&parts.tail);
    interner.intern_versioned(
        type_url::ROUTE,
        parts.name.clone(),
        buf,
        parts_version(parts),
    )
}

/// The version of a configuration assembled from `parts`.
fn parts_version(parts: &RouteParts) -> String {
    let mut hasher = PairHasher::default();
    hasher.update(b"assembled\0");
    hasher.update(parts.name.as_bytes());
    hasher.update(&[0]);
    hasher.update(&Sha256::digest(&parts.tail));
    for vh in &parts.virtual_hosts {
        hasher.pair(&vh.name, &vh.version);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteMatch};
    use envoy_types::pb::google::protobuf::BoolValue;

    fn vhost(name: &str, domains: &[&str]) -> VirtualHost {
        VirtualHost {
            name: name.to_string(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes: vec![Route {
                r#match: Some(RouteMatch::default()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn route_config(name: &str) -> RouteConfiguration {
        RouteConfiguration {
            name: name.to_string(),
            virtual_hosts: vec![
                vhost(
                    "reviews.bookinfo.svc.cluster.local:80",
                    &["reviews", "198.19.0.1"],
                ),
                vhost("a/b%c", &["x"]),
                vhost("allow_any", &["*"]),
            ],
            validate_clusters: Some(BoolValue { value: false }),
            internal_only_headers: vec!["x-internal".into()],
            ..Default::default()
        }
    }

    #[test]
    fn the_assembled_configuration_is_prosts_encoding() {
        let mut interner = Interner::default();
        for rc in [
            route_config("80"),
            route_config("gw/https.443"),
            RouteConfiguration {
                name: "inbound|8080||".into(),
                ..Default::default()
            },
            RouteConfiguration::default(),
        ] {
            let encoded = encode_route(&mut interner, rc.clone(), true);
            assert_eq!(encoded.inline.encoded, rc.encode_to_vec(), "{}", rc.name);
            assert_eq!(encoded.inline.name, rc.name);
            assert_eq!(
                RouteConfiguration::decode(encoded.inline.encoded.clone()).ok(),
                Some(rc)
            );
        }
    }

    #[test]
    fn virtual_hosts_are_the_vhds_form() {
        let mut interner = Interner::default();
        let rc = route_config("80");
        let encoded = encode_route(&mut interner, rc.clone(), true);
        let split = translate::vhds::split(rc).expect("has virtual hosts");
        let stub = encoded.stub.expect("asked for");
        assert_eq!(stub.encoded, split.stub.encode_to_vec());
        assert_eq!(encoded.parts.virtual_hosts.len(), split.virtual_hosts.len());
        for (resource, vh) in encoded.parts.virtual_hosts.iter().zip(&split.virtual_hosts) {
            assert_eq!(resource.name, vh.name);
            assert_eq!(resource.encoded, vh.encode_to_vec());
            assert_eq!(resource.type_url, type_url::VIRTUAL_HOST);
        }
    }

    #[test]
    fn a_configuration_without_virtual_hosts_is_its_own_stub() {
        let mut interner = Interner::default();
        let encoded = encode_route(
            &mut interner,
            RouteConfiguration {
                name: "inbound|8080||".into(),
                ..Default::default()
            },
            true,
        );
        assert!(encoded
            .stub
            .is_some_and(|stub| Arc::ptr_eq(&encoded.inline, &stub)));
        assert!(encoded.parts.virtual_hosts.is_empty());
    }

    #[test]
    fn reassembling_after_replacing_a_virtual_host_equals_encoding_anew() {
        let mut interner = Interner::default();
        let mut rc = route_config("80");
        let original = encode_route(&mut interner, rc.clone(), false);
        let mut parts = original.parts.clone();
        let replacement = vhost("a/b%c", &["y", "z"]);
        parts.virtual_hosts[1] = encode_virtual_host(&mut interner, "80", replacement.clone());
        rc.virtual_hosts[1] = replacement;
        let reassembled = assemble(&mut interner, &parts);
        assert_eq!(reassembled.encoded, rc.encode_to_vec());
        assert_ne!(reassembled.version, original.inline.version);
        // The version follows the content, in any process (a fresh interner: a restart).
        let fresh = encode_route(&mut Interner::default(), rc, false);
        assert_eq!(reassembled.version, fresh.inline.version);
        assert!(Arc::ptr_eq(&reassembled, &assemble(&mut interner, &parts)));
    }
}
