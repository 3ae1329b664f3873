//! Proto-JSON → protobuf wire encoding for the Envoy messages an EnvoyFilter patch may carry.
//!
//! envoy-types has no serde support and ships no runtime descriptors, so patch values are
//! encoded from field tables generated once from its descriptor set
//! (`protojson_schema.rs`, by `gen_protojson_schema.py`). The tables cover these messages and
//! everything they reference: `Cluster`, `ClusterLoadAssignment`, `Listener` (with
//! `FilterChain`, `Filter`), `RouteConfiguration` (with `VirtualHost`, `Route`), the HTTP
//! connection manager, TCP proxy, the HTTP filters router, Lua, buffer, fault, local rate
//! limit, CORS and header mutation, the file access logger, upstream HTTP protocol options and
//! the upstream TLS context. Well-known types supported: `Any` (with `@type`), `Duration`,
//! `Struct`/`Value`/`ListValue`, `Empty` and the wrappers. Anything else is a typed error that
//! names the field, never a guess.
//!
//! Both the proto field name (`connect_timeout`) and the JSON name (`connectTimeout`) are
//! accepted, as proto-JSON parsers do.

use prost::encoding::{encode_key, encode_varint, WireType};
use serde_json::Value;

use super::protojson_schema::{ENUMS, MESSAGES};

/// Type URL prefix of `google.protobuf.Any` values.
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// Field table of one message.
#[derive(Debug)]
pub struct MessageSchema {
    pub name: &'static str,
    pub fields: &'static [FieldSchema],
}

/// One field of a message.
#[derive(Debug)]
pub struct FieldSchema {
    pub name: &'static str,
    pub json: &'static str,
    pub number: u32,
    pub ty: FieldType,
    pub repeated: bool,
}

/// Values of an enum.
#[derive(Debug)]
pub struct EnumSchema {
    pub name: &'static str,
    pub values: &'static [(&'static str, i32)],
}

/// Protobuf field type.
#[derive(Debug, Clone, Copy)]
pub enum FieldType {
    Double,
    Float,
    Int64,
    UInt64,
    Int32,
    Fixed64,
    Fixed32,
    Bool,
    String,
    Bytes,
    UInt32,
    SFixed32,
    SFixed64,
    SInt32,
    SInt64,
    Enum(&'static str),
    Message(&'static str),
    Map(&'static str),
}

/// Why a proto-JSON value could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoJsonError {
    /// The message type is not in the supported set.
    #[error("message type {0} is not supported in patch values")]
    UnsupportedType(String),
    /// The message has no such field.
    #[error("{message} has no field {field:?}")]
    UnknownField { message: String, field: String },
    /// A value has the wrong JSON shape or is out of range.
    #[error("{path}: {reason}")]
    InvalidValue { path: String, reason: String },
    /// The encoded bytes do not decode as the target message.
    #[error("{message}: encoded value does not decode: {reason}")]
    Decode { message: String, reason: String },
}

fn invalid(path: &str, reason: impl Into<String>) -> ProtoJsonError {
    ProtoJsonError::InvalidValue {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn find_message(name: &str) -> Option<&'static MessageSchema> {
    MESSAGES
        .binary_search_by(|m| m.name.cmp(name))
        .ok()
        .map(|i| &MESSAGES[i])
}

fn find_enum(name: &str) -> Option<&'static EnumSchema> {
    ENUMS.iter().find(|e| e.name == name)
}

/// Whether patch values of this message type can be encoded.
pub fn is_supported(type_name: &str) -> bool {
    find_message(type_name).is_some() || is_well_known(type_name)
}

/// Encodes the proto-JSON `json` as message `type_name` (a fully qualified proto name).
pub fn encode_message(type_name: &str, json: &Value) -> Result<Vec<u8>, ProtoJsonError> {
    let mut buf = Vec::new();
    encode_message_into(type_name, json, type_name, &mut buf)?;
    Ok(buf)
}

/// Encodes `json` and decodes it as the prost message `M` (`type_name` is its proto name).
pub fn decode_message<M: prost::Message + Default>(
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
pub fn encode_any(json: &Value) -> Result<envoy_types::pb::google::protobuf::Any, ProtoJsonError> {
    let (type_url, value) = any_parts(json, "typed_config")?;
    Ok(envoy_types::pb::google::protobuf::Any { type_url, value })
}

fn any_parts(json: &Value, path: &str) -> Result<(String, Vec<u8>), ProtoJsonError> {
    let obj = json
        .as_object()
        .ok_or_else(|| invalid(path, "an Any must be an object with \"@type\""))?;
    let type_url = obj
        .get("@type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(path, "an Any needs \"@type\""))?;
    let type_name = type_url.rsplit('/').next().unwrap_or(type_url);
    if !is_supported(type_name) {
        return Err(ProtoJsonError::UnsupportedType(type_name.to_string()));
    }
    let mut buf = Vec::new();
    if is_well_known(type_name)
        && type_name != "google.protobuf.Empty"
        && type_name != "google.protobuf.Struct"
    {
        // Well-known types other than Struct carry their JSON form under "value".
        let inner = obj.get("value").unwrap_or(&Value::Null);
        encode_message_into(type_name, inner, path, &mut buf)?;
    } else {
        let mut rest = obj.clone();
        rest.remove("@type");
        encode_message_into(type_name, &Value::Object(rest), path, &mut buf)?;
    }
    Ok((format!("{TYPE_URL_PREFIX}{type_name}"), buf))
}

fn is_well_known(name: &str) -> bool {
    name.starts_with("google.protobuf.")
        && matches!(
            &name["google.protobuf.".len()..],
            "Any"
                | "Duration"
                | "Struct"
                | "Value"
                | "ListValue"
                | "Empty"
                | "BoolValue"
                | "StringValue"
                | "BytesValue"
                | "UInt32Value"
                | "Int32Value"
                | "UInt64Value"
                | "Int64Value"
                | "DoubleValue"
                | "FloatValue"
        )
}

fn encode_message_into(
    type_name: &str,
    json: &Value,
    path: &str,
    buf: &mut Vec<u8>,
) -> Result<(), ProtoJsonError> {
    if is_well_known(type_name) {
        return encode_well_known(type_name, json, path, buf);
    }
    let schema = find_message(type_name)
        .ok_or_else(|| ProtoJsonError::UnsupportedType(type_name.to_string()))?;
    let obj = json
        .as_object()
        .ok_or_else(|| invalid(path, format!("{type_name} must be a JSON object")))?;
    for (key, value) in obj {
        let field = schema
            .fields
            .iter()
            .find(|f| f.json == key || f.name == key)
            .ok_or_else(|| ProtoJsonError::UnknownField {
                message: type_name.to_string(),
                field: key.clone(),
            })?;
        if value.is_null() {
            continue;
        }
        let fpath = format!("{path}.{key}");
        match field.ty {
            FieldType::Map(entry) => {
                let map = value
                    .as_object()
                    .ok_or_else(|| invalid(&fpath, "a map must be a JSON object"))?;
                let entry_schema = find_message(entry)
                    .ok_or_else(|| ProtoJsonError::UnsupportedType(entry.to_string()))?;
                for (k, v) in map {
                    let mut entry_buf = Vec::new();
                    for f in entry_schema.fields {
                        let item = if f.number == 1 {
                            Value::String(k.clone())
                        } else {
                            v.clone()
                        };
                        encode_field(f, &item, &fpath, &mut entry_buf)?;
                    }
                    encode_key(field.number, WireType::LengthDelimited, buf);
                    encode_varint(entry_buf.len() as u64, buf);
                    buf.extend_from_slice(&entry_buf);
                }
            }
            _ if field.repeated => {
                let items = value
                    .as_array()
                    .ok_or_else(|| invalid(&fpath, "a repeated field must be a JSON array"))?;
                for item in items {
                    encode_field(field, item, &fpath, buf)?;
                }
            }
            _ => encode_field(field, value, &fpath, buf)?,
        }
    }
    Ok(())
}

/// Encodes one (non-repeated occurrence of a) field with its key.
fn encode_field(
    field: &FieldSchema,
    value: &Value,
    path: &str,
    buf: &mut Vec<u8>,
) -> Result<(), ProtoJsonError> {
    let n = field.number;
    match field.ty {
        FieldType::Message(name) | FieldType::Map(name) => {
            let mut inner = Vec::new();
            encode_message_into(name, value, path, &mut inner)?;
            encode_len_delimited(n, &inner, buf);
        }
        FieldType::String => encode_len_delimited(n, as_str(value, path)?.as_bytes(), buf),
        FieldType::Bytes => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(as_str(value, path)?)
                .map_err(|e| invalid(path, format!("bytes must be base64: {e}")))?;
            encode_len_delimited(n, &bytes, buf);
        }
        FieldType::Bool => {
            let b = value
                .as_bool()
                .ok_or_else(|| invalid(path, "expected true or false"))?;
            encode_key(n, WireType::Varint, buf);
            encode_varint(u64::from(b), buf);
        }
        FieldType::Enum(name) => {
            let number = enum_number(name, value, path)?;
            encode_key(n, WireType::Varint, buf);
            // Negative enum values are sign-extended to 64 bits, as protobuf requires.
            encode_varint(i64::from(number) as u64, buf);
        }
        FieldType::Int32 | FieldType::Int64 => {
            let v = as_i64(value, path, field.ty)?;
            encode_key(n, WireType::Varint, buf);
            encode_varint(v as u64, buf);
        }
        FieldType::UInt32 | FieldType::UInt64 => {
            let v = as_u64(value, path, field.ty)?;
            encode_key(n, WireType::Varint, buf);
            encode_varint(v, buf);
        }
        FieldType::SInt32 | FieldType::SInt64 => {
            let v = as_i64(value, path, field.ty)?;
            encode_key(n, WireType::Varint, buf);
            encode_varint(((v << 1) ^ (v >> 63)) as u64, buf);
        }
        FieldType::Fixed32 => {
            let v = as_u64(value, path, field.ty)?;
            encode_key(n, WireType::ThirtyTwoBit, buf);
            buf.extend_from_slice(&(v as u32).to_le_bytes());
        }
        FieldType::SFixed32 => {
            let v = as_i64(value, path, field.ty)?;
            encode_key(n, WireType::ThirtyTwoBit, buf);
            buf.extend_from_slice(&(v as i32).to_le_bytes());
        }
        FieldType::Fixed64 => {
            let v = as_u64(value, path, field.ty)?;
            encode_key(n, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        FieldType::SFixed64 => {
            let v = as_i64(value, path, field.ty)?;
            encode_key(n, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        FieldType::Double => {
            let v = as_f64(value, path)?;
            encode_key(n, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        FieldType::Float => {
            let v = as_f64(value, path)? as f32;
            encode_key(n, WireType::ThirtyTwoBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

fn encode_len_delimited(number: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

fn as_str<'a>(value: &'a Value, path: &str) -> Result<&'a str, ProtoJsonError> {
    value
        .as_str()
        .ok_or_else(|| invalid(path, "expected a string"))
}

fn range_check(ty: FieldType, v: i128, path: &str) -> Result<(), ProtoJsonError> {
    let (lo, hi) = match ty {
        FieldType::Int32 | FieldType::SInt32 | FieldType::SFixed32 => {
            (i32::MIN as i128, i32::MAX as i128)
        }
        FieldType::UInt32 | FieldType::Fixed32 => (0, u32::MAX as i128),
        FieldType::UInt64 | FieldType::Fixed64 => (0, u64::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    };
    if v < lo || v > hi {
        return Err(invalid(path, format!("{v} is out of range")));
    }
    Ok(())
}

fn as_integer(value: &Value, path: &str) -> Result<i128, ProtoJsonError> {
    // proto-JSON writes 64-bit integers as strings; accept both forms.
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i128))
            .ok_or_else(|| invalid(path, "expected an integer")),
        Value::String(s) => s
            .trim()
            .parse::<i128>()
            .map_err(|_| invalid(path, "expected an integer")),
        _ => Err(invalid(path, "expected an integer")),
    }
}

fn as_i64(value: &Value, path: &str, ty: FieldType) -> Result<i64, ProtoJsonError> {
    let v = as_integer(value, path)?;
    range_check(ty, v, path)?;
    Ok(v as i64)
}

fn as_u64(value: &Value, path: &str, ty: FieldType) -> Result<u64, ProtoJsonError> {
    let v = as_integer(value, path)?;
    range_check(ty, v, path)?;
    Ok(v as u64)
}

fn as_f64(value: &Value, path: &str) -> Result<f64, ProtoJsonError> {
    match value {
        Value::Number(n) => n.as_f64().ok_or_else(|| invalid(path, "expected a number")),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => other
                .parse()
                .map_err(|_| invalid(path, "expected a number")),
        },
        _ => Err(invalid(path, "expected a number")),
    }
}

fn enum_number(name: &str, value: &Value, path: &str) -> Result<i32, ProtoJsonError> {
    let schema =
        find_enum(name).ok_or_else(|| ProtoJsonError::UnsupportedType(name.to_string()))?;
    match value {
        Value::String(s) => schema
            .values
            .iter()
            .find(|(n, _)| n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let known: Vec<&str> = schema.values.iter().map(|(n, _)| *n).collect();
                invalid(
                    path,
                    format!("unknown {name} value {s:?}; known: {}", known.join(", ")),
                )
            }),
        Value::Number(_) => {
            let v = as_integer(value, path)?;
            range_check(FieldType::Int32, v, path)?;
            Ok(v as i32)
        }
        _ => Err(invalid(path, "expected an enum name or number")),
    }
}

/// Parses a proto-JSON duration such as `"1.5s"` into (seconds, nanos).
fn parse_duration(s: &str, path: &str) -> Result<(i64, i32), ProtoJsonError> {
    let bad = || invalid(path, format!("{s:?} is not a duration such as \"1.5s\""));
    let body = s.strip_suffix('s').ok_or_else(bad)?;
    let (neg, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (secs, frac) = body.split_once('.').unwrap_or((body, ""));
    if secs.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let seconds: i64 = secs.parse().map_err(|_| bad())?;
    let nanos: i32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().map_err(|_| bad())?
    };
    Ok(if neg {
        (-seconds, -nanos)
    } else {
        (seconds, nanos)
    })
}

fn encode_well_known(
    type_name: &str,
    json: &Value,
    path: &str,
    buf: &mut Vec<u8>,
) -> Result<(), ProtoJsonError> {
    let scalar = |ty: FieldType, buf: &mut Vec<u8>| {
        let f = FieldSchema {
            name: "value",
            json: "value",
            number: 1,
            ty,
            repeated: false,
        };
        encode_field(&f, json, path, buf)
    };
    match &type_name["google.protobuf.".len()..] {
        "Any" => {
            let (type_url, value) = any_parts(json, path)?;
            encode_len_delimited(1, type_url.as_bytes(), buf);
            encode_len_delimited(2, &value, buf);
            Ok(())
        }
        "Duration" => {
            let (seconds, nanos) = parse_duration(as_str(json, path)?, path)?;
            if seconds != 0 {
                encode_key(1, WireType::Varint, buf);
                encode_varint(seconds as u64, buf);
            }
            if nanos != 0 {
                encode_key(2, WireType::Varint, buf);
                encode_varint(i64::from(nanos) as u64, buf);
            }
            Ok(())
        }
        "Empty" => Ok(()),
        "BoolValue" => scalar(FieldType::Bool, buf),
        "StringValue" => scalar(FieldType::String, buf),
        "BytesValue" => scalar(FieldType::Bytes, buf),
        "UInt32Value" => scalar(FieldType::UInt32, buf),
        "Int32Value" => scalar(FieldType::Int32, buf),
        "UInt64Value" => scalar(FieldType::UInt64, buf),
        "Int64Value" => scalar(FieldType::Int64, buf),
        "DoubleValue" => scalar(FieldType::Double, buf),
        "FloatValue" => scalar(FieldType::Float, buf),
        "Struct" => {
            let obj = json
                .as_object()
                .ok_or_else(|| invalid(path, "a Struct must be an object"))?;
            for (k, v) in obj {
                let mut entry = Vec::new();
                encode_len_delimited(1, k.as_bytes(), &mut entry);
                let mut value = Vec::new();
                encode_well_known("google.protobuf.Value", v, path, &mut value)?;
                encode_len_delimited(2, &value, &mut entry);
                encode_len_delimited(1, &entry, buf);
            }
            Ok(())
        }
        "ListValue" => {
            let items = json
                .as_array()
                .ok_or_else(|| invalid(path, "a ListValue must be an array"))?;
            for item in items {
                let mut value = Vec::new();
                encode_well_known("google.protobuf.Value", item, path, &mut value)?;
                encode_len_delimited(1, &value, buf);
            }
            Ok(())
        }
        "Value" => {
            match json {
                Value::Null => {
                    encode_key(1, WireType::Varint, buf);
                    encode_varint(0, buf);
                }
                Value::Number(n) => {
                    encode_key(2, WireType::SixtyFourBit, buf);
                    buf.extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
                }
                Value::String(s) => encode_len_delimited(3, s.as_bytes(), buf),
                Value::Bool(b) => {
                    encode_key(4, WireType::Varint, buf);
                    encode_varint(u64::from(*b), buf);
                }
                Value::Object(_) => {
                    let mut inner = Vec::new();
                    encode_well_known("google.protobuf.Struct", json, path, &mut inner)?;
                    encode_len_delimited(5, &inner, buf);
                }
                Value::Array(_) => {
                    let mut inner = Vec::new();
                    encode_well_known("google.protobuf.ListValue", json, path, &mut inner)?;
                    encode_len_delimited(6, &inner, buf);
                }
            }
            Ok(())
        }
        _ => Err(ProtoJsonError::UnsupportedType(type_name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use serde_json::json;

    #[test]
    fn tables_are_sorted_for_binary_search() {
        assert!(MESSAGES.windows(2).all(|w| w[0].name < w[1].name));
    }

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
    }

    #[test]
    fn unknown_fields_and_types_are_named_errors() {
        let err =
            encode_message("envoy.config.cluster.v3.Cluster", &json!({"nmae": "x"})).unwrap_err();
        assert_eq!(
            err,
            ProtoJsonError::UnknownField {
                message: "envoy.config.cluster.v3.Cluster".into(),
                field: "nmae".into()
            }
        );
        let err = encode_any(&json!({"@type": "type.googleapis.com/acme.Unknown"})).unwrap_err();
        assert_eq!(err, ProtoJsonError::UnsupportedType("acme.Unknown".into()));
        let err = encode_message("envoy.config.cluster.v3.Cluster", &json!({"type": "NOPE"}))
            .unwrap_err();
        assert!(err.to_string().contains("STRICT_DNS"), "{err}");
    }

    #[test]
    fn durations_parse_like_proto_json() {
        assert_eq!(parse_duration("0.25s", "d"), Ok((0, 250_000_000)));
        assert_eq!(parse_duration("-2s", "d"), Ok((-2, 0)));
        assert!(parse_duration("5m", "d").is_err());
    }
}
