//! Just enough of the Kubernetes protobuf encoding to accept the bodies typed `kubectl create
//! <kind>` commands send (client-go's typed clients write protobuf): Namespace, ConfigMap,
//! Secret and ServiceAccount, with name, generateName, namespace, labels, annotations and the
//! kind's data fields; the SelfSubjectAccessReview of `kubectl auth can-i` and the TokenRequest
//! of `kubectl create token`. Anything else is
//! refused with 415.

use base64::Engine;
use serde_json::{json, Map, Value};

use super::error::ApiError;

/// The `k8s\0` prefix of protobuf-encoded API objects.
const MAGIC: &[u8] = b"k8s\x00";

/// One protobuf field: number and payload (varints are kept as numbers).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Splits a message into its fields; None when malformed.
fn fields(buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(buf, &mut pos)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= buf.len())?;
                continue;
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                let bytes = &buf[pos..end];
                pos = end;
                Field::Bytes(bytes)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= buf.len())?;
                continue;
            }
            _ => return None,
        };
        out.push((key >> 3, field));
    }
    Some(out)
}

fn text(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.to_vec()).ok()
}

/// A `map<string, string|bytes>` entry (key 1, value 2).
fn map_entry(bytes: &[u8]) -> Option<(String, &[u8])> {
    let mut key = String::new();
    let mut value: &[u8] = &[];
    for (n, f) in fields(bytes)? {
        match (n, f) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) => value = b,
            _ => {}
        }
    }
    Some((key, value))
}

fn object_meta(bytes: &[u8]) -> Option<Value> {
    let mut meta = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    for (n, f) in fields(bytes)? {
        let Field::Bytes(b) = f else { continue };
        match n {
            1 => {
                meta.insert("name".into(), json!(text(b)?));
            }
            2 => {
                meta.insert("generateName".into(), json!(text(b)?));
            }
            3 => {
                meta.insert("namespace".into(), json!(text(b)?));
            }
            11 => {
                let (k, v) = map_entry(b)?;
                labels.insert(k, json!(text(v)?));
            }
            12 => {
                let (k, v) = map_entry(b)?;
                annotations.insert(k, json!(text(v)?));
            }
            _ => {}
        }
    }
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Some(Value::Object(meta))
}

fn decode_object(kind: &str, raw: &[u8]) -> Option<Value> {
    let mut obj = Map::new();
    let mut data = Map::new();
    let mut binary = Map::new();
    for (n, f) in fields(raw)? {
        match (kind, n, f) {
            (_, 1, Field::Bytes(b)) => {
                obj.insert("metadata".into(), object_meta(b)?);
            }
            ("ConfigMap", 2, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                data.insert(k, json!(text(v)?));
            }
            ("ConfigMap", 3, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                binary.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(v)),
                );
            }
            ("ConfigMap", 4, Field::Varint(v)) | ("Secret", 5, Field::Varint(v)) => {
                obj.insert("immutable".into(), json!(v != 0));
            }
            ("Secret", 2, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                data.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(v)),
                );
            }
            ("Secret", 3, Field::Bytes(b)) => {
                obj.insert("type".into(), json!(text(b)?));
            }
            ("Secret", 4, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                data.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(v)),
                );
            }
            ("Namespace" | "ServiceAccount" | "ConfigMap" | "Secret", _, _) => {}
            _ => return None,
        }
    }
    if !data.is_empty() {
        obj.insert("data".into(), Value::Object(data));
    }
    if !binary.is_empty() {
        obj.insert("binaryData".into(), Value::Object(binary));
    }
    Some(Value::Object(obj))
}

/// String fields of a message by field number, as JSON keys; None when malformed.
fn string_fields(bytes: &[u8], names: &[(u64, &str)]) -> Option<Value> {
    let mut out = Map::new();
    for (n, f) in fields(bytes)? {
        if let (Some((_, key)), Field::Bytes(b)) = (names.iter().find(|(num, _)| *num == n), f) {
            out.insert((*key).to_string(), json!(text(b)?));
        }
    }
    Some(Value::Object(out))
}

/// A `SelfSubjectAccessReview` (what `kubectl auth can-i` sends): its metadata and the spec's
/// resource or non-resource attributes (the selector attributes are dropped).
fn decode_self_subject_access_review(raw: &[u8]) -> Option<Value> {
    const RESOURCE: &[(u64, &str)] = &[
        (1, "namespace"),
        (2, "verb"),
        (3, "group"),
        (4, "version"),
        (5, "resource"),
        (6, "subresource"),
        (7, "name"),
    ];
    const NON_RESOURCE: &[(u64, &str)] = &[(1, "path"), (2, "verb")];
    let mut obj = Map::new();
    let mut spec = Map::new();
    for (n, f) in fields(raw)? {
        match (n, f) {
            (1, Field::Bytes(b)) => {
                obj.insert("metadata".into(), object_meta(b)?);
            }
            (2, Field::Bytes(b)) => {
                for (sn, sf) in fields(b)? {
                    match (sn, sf) {
                        (1, Field::Bytes(a)) => {
                            spec.insert("resourceAttributes".into(), string_fields(a, RESOURCE)?);
                        }
                        (2, Field::Bytes(a)) => {
                            spec.insert(
                                "nonResourceAttributes".into(),
                                string_fields(a, NON_RESOURCE)?,
                            );
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    obj.insert("spec".into(), Value::Object(spec));
    Some(Value::Object(obj))
}

/// A `TokenRequest` (what `kubectl create token` sends): metadata, audiences, expiry and the
/// bound object reference.
fn decode_token_request(raw: &[u8]) -> Option<Value> {
    const BOUND: &[(u64, &str)] = &[(1, "kind"), (2, "apiVersion"), (3, "name"), (4, "uid")];
    let mut obj = Map::new();
    let mut spec = Map::new();
    let mut audiences = Vec::new();
    for (n, f) in fields(raw)? {
        match (n, f) {
            (1, Field::Bytes(b)) => {
                obj.insert("metadata".into(), object_meta(b)?);
            }
            (2, Field::Bytes(b)) => {
                for (sn, sf) in fields(b)? {
                    match (sn, sf) {
                        (1, Field::Bytes(a)) => audiences.push(json!(text(a)?)),
                        (3, Field::Bytes(r)) => {
                            spec.insert("boundObjectRef".into(), string_fields(r, BOUND)?);
                        }
                        (4, Field::Varint(v)) => {
                            spec.insert("expirationSeconds".into(), json!(v as i64));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if !audiences.is_empty() {
        spec.insert("audiences".into(), Value::Array(audiences));
    }
    obj.insert("spec".into(), Value::Object(spec));
    Some(Value::Object(obj))
}

/// Decodes a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let unsupported = |what: &str| {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("kube-standin (test fixture) decodes protobuf only for Namespace, ConfigMap, Secret, ServiceAccount, SelfSubjectAccessReview and TokenRequest; {what}; send JSON instead"),
        )
    };
    let envelope = body
        .strip_prefix(MAGIC)
        .and_then(fields)
        .ok_or_else(|| unsupported("malformed body"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for (n, f) in envelope {
        match (n, f) {
            (1, Field::Bytes(type_meta)) => {
                for (tn, tf) in
                    fields(type_meta).ok_or_else(|| unsupported("malformed typeMeta"))?
                {
                    if let Field::Bytes(b) = tf {
                        match tn {
                            1 => api_version = text(b).unwrap_or_default(),
                            2 => kind = text(b).unwrap_or_default(),
                            _ => {}
                        }
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = Some(b),
            _ => {}
        }
    }
    let raw = raw.ok_or_else(|| unsupported("no object"))?;
    let decoded = match (api_version.as_str(), kind.as_str()) {
        ("v1", _) => decode_object(&kind, raw),
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            decode_self_subject_access_review(raw)
        }
        ("authentication.k8s.io/v1", "TokenRequest") => decode_token_request(raw),
        _ => return Err(unsupported(&format!("got {api_version} {kind}"))),
    };
    let mut obj = decoded.ok_or_else(|| unsupported(&format!("got {api_version} {kind}")))?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_self_subject_access_review() {
        let attrs = [
            field(1, b"green"),
            field(2, b"list"),
            field(5, b"pods"),
            field(7, b"p"),
        ]
        .concat();
        let raw = [field(1, &[]), field(2, &field(1, &attrs))].concat();
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "metadata": {}, "spec": {"resourceAttributes": {
                    "namespace": "green", "verb": "list", "resource": "pods", "name": "p"}}})
        );
        let path = [field(1, b"/apis"), field(2, b"get")].concat();
        let raw = field(2, &field(2, &path));
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap()["spec"],
            json!({"nonResourceAttributes": {"path": "/apis", "verb": "get"}})
        );
        let other = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &other), field(2, &raw)].concat();
        assert_eq!(decode(&body).unwrap_err().code, 415);
    }

    #[test]
    fn decodes_a_token_request() {
        let bound = [
            field(1, b"Pod"),
            field(2, b"v1"),
            field(3, b"p"),
            field(4, b"u"),
        ]
        .concat();
        // expirationSeconds = 600 as a varint (0xd8 0x04) in field 4.
        let spec = [
            field(1, b"a1"),
            field(1, b"a2"),
            field(3, &bound),
            vec![4 << 3, 0xd8, 0x04],
        ]
        .concat();
        let raw = [field(1, &field(1, b"sa")), field(2, &spec)].concat();
        let type_meta = [
            field(1, b"authentication.k8s.io/v1"),
            field(2, b"TokenRequest"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {"name": "sa"}, "spec": {"audiences": ["a1", "a2"], "expirationSeconds": 600,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u"}}})
        );
    }

    #[test]
    fn decodes_a_namespace_with_labels() {
        let label = [field(1, b"team"), field(2, b"blue")].concat();
        let meta = [field(1, b"shop"), field(11, &label)].concat();
        let raw = field(1, &meta);
        let type_meta = [field(1, b"v1"), field(2, b"Namespace")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "labels": {"team": "blue"}}})
        );
    }
}
