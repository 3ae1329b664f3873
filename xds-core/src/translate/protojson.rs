//! Proto-JSON ↔ protobuf for every Envoy message, by reflection over the descriptor set that
//! envoy-types ships (`src/generated/types.bin` in its crate source, located at build time by
//! `build.rs` and embedded here).
//!
//! EnvoyFilter patch values are proto-JSON: `prost-reflect` maps them to and from dynamic
//! messages with the canonical proto-JSON rules (both `connect_timeout` and `connectTimeout`,
//! enums by name or number, 64-bit integers as strings or numbers, the well-known types, and
//! `google.protobuf.Any` by its `@type`, resolved in the same pool). So a patch may carry any
//! message envoy-types knows — ext_authz, wasm, rbac, jwt_authn, compressor, … — not a
//! hand-picked list. Errors name the JSON path of the offending value.

use std::sync::LazyLock;

use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, ReflectMessage};
use serde::de::DeserializeSeed;
use serde_json::Value;

/// Type URL prefix of `google.protobuf.Any` values.
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// The descriptor set of envoy-types: every Envoy, xDS, UDPA and well-known message.
static DESCRIPTOR_SET: &[u8] = include_bytes!(env!("ENVOY_TYPES_DESCRIPTOR_SET"));

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| e.to_string()));

/// Why a proto-JSON value could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoJsonError {
    /// No message of that name is known.
    #[error("message type {0} is not an Envoy message known to this server")]
    UnsupportedType(String),
    /// A value has the wrong JSON shape, names no field of its message, or is out of range.
    #[error("{path}: {reason}")]
    InvalidValue { path: String, reason: String },
    /// The encoded bytes do not decode as the target message.
    #[error("{message}: encoded value does not decode: {reason}")]
    Decode { message: String, reason: String },
    /// The embedded descriptor set does not load (a build problem, reported, never a panic).
    #[error("the Envoy descriptor set does not load: {0}")]
    Descriptors(String),
}

/// The pool of every message envoy-types generates.
pub fn pool() -> Result<&'static DescriptorPool, ProtoJsonError> {
    POOL.as_ref()
        .map_err(|e| ProtoJsonError::Descriptors(e.clone()))
}

/// The descriptor of a fully qualified message name.
pub fn message(type_name: &str) -> Result<MessageDescriptor, ProtoJsonError> {
    pool()?
        .get_message_by_name(type_name)
        .ok_or_else(|| ProtoJsonError::UnsupportedType(type_name.to_string()))
}

/// Whether patch values of this message type can be encoded.
pub fn is_supported(type_name: &str) -> bool {
    message(type_name).is_ok()
}

/// The message type named by a type URL (`type.googleapis.com/x.y.Z` → `x.y.Z`).
pub fn type_name_of(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// Parses the proto-JSON `json` as message `type_name` (a fully qualified proto name).
pub fn parse(type_name: &str, json: &Value) -> Result<DynamicMessage, ProtoJsonError> {
    let desc = message(type_name)?;
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(json, &mut track);
    desc.deserialize(de).map_err(|e| {
        let path = track.path().to_string();
        ProtoJsonError::InvalidValue {
            path: if path == "." {
                type_name.to_string()
            } else {
                format!("{type_name}: {path}")
            },
            reason: e.to_string(),
        }
    })
}

/// Encodes the proto-JSON `json` as message `type_name`.
pub fn encode_message(type_name: &str, json: &Value) -> Result<Vec<u8>, ProtoJsonError> {
    Ok(parse(type_name, json)?.encode_to_vec())
}

/// Encodes `json` and decodes it as the prost message `M` (`type_name` is its proto name).
pub fn decode_message<M: Message + Default>(
    type_name: &str,
    json: &Value,
) -> Result<M, ProtoJsonError> {
    let bytes = encode_message(type_name, json)?;
    M::decode(bytes.as_slice()).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })
}

/// Encodes a JSON object with `@type` as a `google.protobuf.Any`.
pub fn encode_any(json: &Value) -> Result<Any, ProtoJsonError> {
    decode_message("google.protobuf.Any", json)
}

/// The proto-JSON form of an encoded message (for reading typed configs back, e.g. to check
/// what an EnvoyFilter adds).
pub fn to_json(type_name: &str, encoded: &[u8]) -> Result<Value, ProtoJsonError> {
    let desc = message(type_name)?;
    let msg = DynamicMessage::decode(desc, encoded).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })?;
    serde_json::to_value(&msg).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })
}

/// A resource as Envoy's admin prints it in `/config_dump`: proto field names (not JSON
/// names), `@type` first, nested `Any`s expanded. What a proxy holds and what an instance
/// intends compare field by field in this form.
pub fn to_admin_json(type_url: &str, encoded: &[u8]) -> Result<Value, ProtoJsonError> {
    let type_name = type_name_of(type_url);
    let desc = message(type_name)?;
    let msg = DynamicMessage::decode(desc, encoded).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })?;
    let options = prost_reflect::SerializeOptions::new().use_proto_field_name(true);
    let fields = msg
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| ProtoJsonError::Decode {
            message: type_name.to_string(),
            reason: e.to_string(),
        })?;
    let mut out = serde_json::Map::new();
    out.insert("@type".to_string(), Value::from(type_url));
    if let Value::Object(fields) = fields {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

/// Merges the proto-JSON `patch` into the encoded message `existing` of type `type_name`
/// (EnvoyFilter `MERGE`): fields the patch names replace scalars — an explicit `false` or `0`
/// included, which a merge of encodings would drop —, merge into messages, append to lists and
/// add to maps; setting another member of a oneof clears the previous one; an `Any` of the same
/// `@type` merges field by field (as Istio does for typed configs), another type replaces it.
pub fn merge(type_name: &str, existing: &[u8], patch: &Value) -> Result<Vec<u8>, ProtoJsonError> {
    let desc = message(type_name)?;
    let mut dst = DynamicMessage::decode(desc, existing).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })?;
    let src = parse(type_name, patch)?;
    merge_dynamic(&mut dst, &src, patch, type_name)?;
    Ok(dst.encode_to_vec())
}

/// Encodes `patch` merged into `existing` and decodes the result as the prost message `M`.
pub fn merge_message<M: Message + Default>(
    existing: &M,
    type_name: &str,
    patch: &Value,
) -> Result<M, ProtoJsonError> {
    let bytes = merge(type_name, &existing.encode_to_vec(), patch)?;
    M::decode(bytes.as_slice()).map_err(|e| ProtoJsonError::Decode {
        message: type_name.to_string(),
        reason: e.to_string(),
    })
}

const ANY: &str = "google.protobuf.Any";

fn merge_dynamic(
    dst: &mut DynamicMessage,
    src: &DynamicMessage,
    json: &Value,
    path: &str,
) -> Result<(), ProtoJsonError> {
    let desc = dst.descriptor();
    if desc.full_name() == ANY {
        return merge_any(dst, src, json, path);
    }
    let Some(obj) = json.as_object() else {
        // Well-known types with a scalar JSON form (Duration, wrappers, ...) replace.
        *dst = src.clone();
        return Ok(());
    };
    for (key, value) in obj {
        let Some(field) = desc
            .get_field_by_json_name(key)
            .or_else(|| desc.get_field_by_name(key))
        else {
            continue; // `parse` already refused unknown fields.
        };
        if value.is_null() {
            continue;
        }
        let fpath = format!("{path}.{key}");
        let patched = src.get_field(&field).into_owned();
        if let Some(oneof) = field.containing_oneof() {
            for other in oneof.fields().filter(|f| f.number() != field.number()) {
                dst.clear_field(&other);
            }
        }
        match (dst.get_field_mut(&field), patched) {
            (prost_reflect::Value::List(have), prost_reflect::Value::List(add)) => have.extend(add),
            (prost_reflect::Value::Map(have), prost_reflect::Value::Map(add)) => have.extend(add),
            (prost_reflect::Value::Message(have), prost_reflect::Value::Message(add))
                if merges_into(&field, value) =>
            {
                merge_dynamic(have, &add, value, &fpath)?
            }
            (slot, patched) => *slot = patched,
        }
    }
    Ok(())
}

/// Whether a message field given as `value` merges into what is there (an object does; a
/// well-known type's scalar form replaces).
fn merges_into(field: &prost_reflect::FieldDescriptor, value: &Value) -> bool {
    !field.is_list() && !field.is_map() && value.is_object()
}

fn merge_any(
    dst: &mut DynamicMessage,
    src: &DynamicMessage,
    json: &Value,
    path: &str,
) -> Result<(), ProtoJsonError> {
    let url = |m: &DynamicMessage| {
        m.get_field_by_name("type_url")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let bytes = |m: &DynamicMessage| {
        m.get_field_by_name("value")
            .and_then(|v| v.as_bytes().cloned())
            .unwrap_or_default()
    };
    let (have_url, add_url) = (url(dst), url(src));
    if have_url.is_empty() || have_url != add_url {
        *dst = src.clone();
        return Ok(());
    }
    let inner_type = type_name_of(&add_url);
    let mut inner_json = json.clone();
    if let Some(o) = inner_json.as_object_mut() {
        o.remove("@type");
    }
    let merged = merge(inner_type, &bytes(dst), &inner_json).map_err(|e| match e {
        ProtoJsonError::InvalidValue { path: p, reason } => ProtoJsonError::InvalidValue {
            path: format!("{path} ({p})"),
            reason,
        },
        other => other,
    })?;
    dst.set_field_by_name("value", prost_reflect::Value::Bytes(merged.into()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use serde_json::json;

    #[test]
    fn cluster_fields_land_in_the_right_prost_fields() {
        let c: Cluster = decode_message(
            "envoy.config.cluster.v3.Cluster",
            &json!({"name": "x", "connectTimeout": "1.5s", "type": "STRICT_DNS",
                    "lb_policy": "RING_HASH", "perConnectionBufferLimitBytes": 1024,
                    "circuitBreakers": {"thresholds": [{"maxConnections": 7}]}}),
        )
        .expect("encodes");
        assert_eq!(c.name, "x");
        let t = c.connect_timeout.expect("timeout");
        assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
        assert_eq!(c.lb_policy, 2, "RING_HASH");
        assert_eq!(
            c.per_connection_buffer_limit_bytes.map(|v| v.value),
            Some(1024)
        );
        let th = &c.circuit_breakers.expect("cb").thresholds[0];
        assert_eq!(th.max_connections.map(|v| v.value), Some(7));
        assert!(matches!(
            c.cluster_discovery_type,
            Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(1)
            )
        ));
    }

    #[test]
    fn any_with_type_encodes_the_inner_message() {
        let any = encode_any(&json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "statPrefix": "p", "rds": {"routeConfigName": "80"}
        }))
        .expect("encodes");
        let hcm: HttpConnectionManager =
            prost::Message::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(hcm.stat_prefix, "p");
        let back = to_json(type_name_of(&any.type_url), &any.value).expect("to JSON");
        assert_eq!(back["statPrefix"], "p");
    }

    #[test]
    fn unknown_fields_and_types_are_errors_that_name_the_path() {
        let err =
            encode_message("envoy.config.cluster.v3.Cluster", &json!({"nmae": "x"})).unwrap_err();
        assert!(err.to_string().contains("nmae"), "{err}");
        let err = encode_any(&json!({"@type": "type.googleapis.com/acme.Unknown"})).unwrap_err();
        assert!(err.to_string().contains("acme.Unknown"), "{err}");
        let err = encode_message(
            "envoy.config.cluster.v3.Cluster",
            &json!({"circuitBreakers": {"thresholds": [{"maxConnections": "many"}]}}),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("circuitBreakers.thresholds[0].maxConnections"),
            "{text}"
        );
        assert_eq!(
            message("acme.Nope").unwrap_err(),
            ProtoJsonError::UnsupportedType("acme.Nope".into())
        );
    }

    #[test]
    fn every_http_and_network_filter_config_of_envoy_is_known() {
        // The hand-written tables this replaced covered 18 messages; the descriptor set covers
        // every extension envoy-types generates.
        let pool = pool().expect("descriptors load");
        for name in [
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "envoy.extensions.filters.http.wasm.v3.Wasm",
            "envoy.extensions.filters.http.rbac.v3.RBAC",
            "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "envoy.extensions.filters.http.compressor.v3.Compressor",
            "envoy.extensions.compression.gzip.compressor.v3.Gzip",
            "envoy.extensions.filters.network.rbac.v3.RBAC",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name}");
        }
        let configs = pool
            .all_messages()
            .filter(|m| m.full_name().starts_with("envoy.extensions.filters."))
            .count();
        assert!(configs > 150, "only {configs} filter messages");
    }

    #[test]
    fn durations_and_64_bit_integers_follow_proto_json() {
        let c: Cluster = decode_message(
            "envoy.config.cluster.v3.Cluster",
            &json!({"connectTimeout": "0.250s", "dnsRefreshRate": "2s"}),
        )
        .expect("encodes");
        let t = c.connect_timeout.expect("timeout");
        assert_eq!((t.seconds, t.nanos), (0, 250_000_000));
        assert!(encode_message(
            "envoy.config.cluster.v3.Cluster",
            &json!({"connectTimeout": "5m"})
        )
        .is_err());
    }

    #[test]
    fn merge_replaces_named_values_merges_messages_and_switches_oneofs() {
        let cluster = Cluster {
            name: "c".into(),
            cluster_discovery_type: Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(3),
            ),
            ignore_health_on_host_removal: true,
            ..Default::default()
        };
        let merged: Cluster = merge_message(
            &cluster,
            "envoy.config.cluster.v3.Cluster",
            &json!({"ignoreHealthOnHostRemoval": false, "clusterType": {"name": "envoy.clusters.aggregate"},
                    "circuitBreakers": {"thresholds": [{"maxRetries": 2}]}}),
        )
        .expect("merges");
        assert_eq!(merged.name, "c", "untouched fields stay");
        assert!(
            !merged.ignore_health_on_host_removal,
            "an explicit false replaces"
        );
        assert!(matches!(
            merged.cluster_discovery_type,
            Some(envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::ClusterType(_))
        ));
        let again: Cluster = merge_message(
            &merged,
            "envoy.config.cluster.v3.Cluster",
            &json!({"circuitBreakers": {"thresholds": [{"maxRetries": 3}]}}),
        )
        .expect("merges");
        let cb = again.circuit_breakers.expect("kept");
        assert_eq!(cb.thresholds.len(), 2, "lists append");
    }

    #[test]
    fn merge_of_a_typed_config_of_the_same_type_is_field_by_field() {
        let hcm = json!({"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                         "statPrefix": "in", "rds": {"routeConfigName": "80"}});
        let filter = decode_message::<envoy_types::pb::envoy::config::listener::v3::Filter>(
            "envoy.config.listener.v3.Filter",
            &json!({"name": "hcm", "typedConfig": hcm}),
        )
        .expect("filter");
        let merged = merge_message(
            &filter,
            "envoy.config.listener.v3.Filter",
            &json!({"typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                    "streamIdleTimeout": "7s"}}),
        )
        .expect("merges");
        let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
            any,
        )) = merged.config_type
        else {
            panic!("typed config kept");
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(hcm.stat_prefix, "in");
        assert_eq!(hcm.stream_idle_timeout.map(|d| d.seconds), Some(7));
    }
}
