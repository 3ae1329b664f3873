//! Structural-schema handling of custom resources, in the order of the real API: prune unknown
//! fields, apply `default`s, validate the OpenAPI v3 constraints, then evaluate the
//! `x-kubernetes-validations` CEL rules (with kube's client-side CEL engine).
//!
//! Checked: `type` (incl. `x-kubernetes-int-or-string`), `nullable`, `enum`, `pattern`,
//! `minLength`/`maxLength`, `minimum`/`maximum` (and their exclusive forms), `minItems`/`maxItems`,
//! `required`, `additionalProperties` maps, `x-kubernetes-preserve-unknown-fields`,
//! `x-kubernetes-embedded-resource`. Not checked: `format`, `multipleOf`, `uniqueItems`,
//! `min/maxProperties`, `allOf`/`anyOf`/`oneOf`/`not`, list-type `set`/`map` uniqueness, and
//! CEL cost limits; `metadata` is not pruned (the real API prunes it to ObjectMeta).

use kube::core::cel::{RootContext, ValidationError, Validator};
use serde_json::{json, Map, Value};

/// Applies defaults, prunes unknown fields and validates `obj` against the CRD's schema for
/// `version`; `old` is the stored object on update (for CEL transition rules). Err lists the
/// causes, each worded like the real API (`spec.tenant: Invalid value: "string": ...`).
pub fn validate_custom_resource(
    crd: &Value,
    version: &str,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), Vec<String>> {
    let Some(schema) = version_schema(crd, version) else {
        // A version without a schema keeps everything (what `preserve-unknown-fields` does).
        return Ok(());
    };
    let mut pruned = Vec::new();
    prune_and_default(schema, obj, true, "", &mut pruned);
    let mut errors = Vec::new();
    check(schema, obj, "", &mut errors);
    if errors.is_empty() {
        errors = cel_errors(crd, version, schema, obj, old);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        tracing::debug!(?errors, "custom resource rejected by its schema");
        Err(errors)
    }
}

/// Paths of the fields of `obj` that the CRD's schema for `version` does not declare (what
/// pruning would remove).
pub fn unknown_fields(crd: &Value, version: &str, obj: &Value) -> Vec<String> {
    let Some(schema) = version_schema(crd, version) else {
        return Vec::new();
    };
    let mut pruned = Vec::new();
    prune_and_default(schema, &mut obj.clone(), true, "", &mut pruned);
    pruned
}

/// The `openAPIV3Schema` of one served version of a CRD.
pub fn version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// `additionalProperties` as a schema (the structural form: a map's value schema).
fn additional_properties(schema: &Value) -> Option<&Value> {
    schema.get("additionalProperties").filter(|a| a.is_object())
}

/// Prunes fields the schema does not know (their paths go to `pruned`) and fills in defaults,
/// top-down (a default is itself pruned and defaulted, like a value the client sent). Null in a
/// non-nullable field is removed, or replaced by the field's default.
fn prune_and_default(
    schema: &Value,
    value: &mut Value,
    keeps_type_meta: bool,
    path: &str,
    pruned: &mut Vec<String>,
) {
    match value {
        Value::Object(fields) => {
            let props = properties(schema);
            let additional = additional_properties(schema);
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let keeps_type_meta = keeps_type_meta || flag(schema, "x-kubernetes-embedded-resource");
            fields.retain(|key, field| {
                let known = props.is_some_and(|p| p.contains_key(key))
                    || additional.is_some()
                    || preserve
                    || (keeps_type_meta
                        && matches!(key.as_str(), "apiVersion" | "kind" | "metadata"));
                let null_not_allowed = field.is_null()
                    && props
                        .and_then(|p| p.get(key))
                        .is_some_and(|s| !flag(s, "nullable") && s.get("default").is_none());
                if !known {
                    pruned.push(child_path(path, key));
                }
                known && !null_not_allowed
            });
            for (key, field_schema) in props.into_iter().flatten() {
                let Some(default) = field_schema.get("default") else {
                    continue;
                };
                let absent_or_null = fields
                    .get(key)
                    .is_none_or(|v| v.is_null() && !flag(field_schema, "nullable"));
                if absent_or_null {
                    fields.insert(key.clone(), default.clone());
                }
            }
            for (key, field) in fields.iter_mut() {
                let child = child_path(path, key);
                if let Some(field_schema) = props.and_then(|p| p.get(key)) {
                    prune_and_default(field_schema, field, false, &child, pruned);
                } else if let Some(value_schema) = additional {
                    prune_and_default(value_schema, field, false, &child, pruned);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter_mut().enumerate() {
                    let child = format!("{path}[{index}]");
                    prune_and_default(item_schema, item, false, &child, pruned);
                }
            }
        }
        _ => {}
    }
}

/// The JSON type name the real API reports in type errors.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "<nil>"
    } else {
        path
    }
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_matches(schema: &Value, value: &Value) -> bool {
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    let actual = type_name(value);
    match schema.get("type").and_then(Value::as_str) {
        _ if int_or_string => matches!(actual, "integer" | "string"),
        None => true,
        Some("number") => matches!(actual, "integer" | "number"),
        Some(expected) => expected == actual,
    }
}

/// Validates the OpenAPI constraints of `value` at `path`, appending one message per violation.
fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let shown = display_path(path);
    if value.is_null() {
        if !flag(schema, "nullable") && schema.get("type").is_some() {
            let expected = schema
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            errors.push(format!(
                "{shown}: Invalid value: \"null\": {shown} in body must be of type {expected}: \"null\""
            ));
        }
        return;
    }
    if !type_matches(schema, value) {
        let expected = schema
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("integer or string");
        let actual = type_name(value);
        errors.push(format!(
            "{shown}: Invalid value: \"{actual}\": {shown} in body must be of type {expected}: \"{actual}\""
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
            errors.push(format!(
                "{shown}: Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ));
        }
    }
    match value {
        Value::String(text) => check_string(schema, text, value, shown, errors),
        Value::Number(number) => check_number(schema, number, value, shown, errors),
        Value::Array(items) => {
            let count = items.len();
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (count as u64) < min {
                    errors.push(format!(
                        "{shown}: Invalid value: {count}: {shown} in body should have at least {min} items"
                    ));
                }
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if count as u64 > max {
                    errors.push(format!(
                        "{shown}: Too many: {count}: must have at most {max} items"
                    ));
                }
            }
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{index}]"), errors);
                }
            }
        }
        Value::Object(fields) => {
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(key) = required.as_str() {
                    if !fields.contains_key(key) {
                        errors.push(format!("{}: Required value", child_path(path, key)));
                    }
                }
            }
            let props = properties(schema);
            for (key, field) in fields {
                if let Some(field_schema) = props.and_then(|p| p.get(key)) {
                    check(field_schema, field, &child_path(path, key), errors);
                } else if let Some(value_schema) = additional_properties(schema) {
                    check(value_schema, field, &format!("{path}[{key}]"), errors);
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_string(schema: &Value, text: &str, value: &Value, shown: &str, errors: &mut Vec<String>) {
    // Go counts characters (runes), not bytes, for the length limits.
    let length = text.chars().count() as u64;
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
        if length < min {
            errors.push(format!(
                "{shown}: Invalid value: {value}: {shown} in body should be at least {min} chars long"
            ));
        }
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        if length > max {
            errors.push(format!(
                "{shown}: Too long: may not be more than {max} bytes"
            ));
        }
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(re) if re.is_match(text) => {}
            Ok(_) => errors.push(format!(
                "{shown}: Invalid value: {value}: {shown} in body should match '{pattern}'"
            )),
            Err(error) => errors.push(format!(
                "{shown}: Invalid value: {value}: pattern '{pattern}' of the schema does not compile: {error}"
            )),
        }
    }
}

fn check_number(
    schema: &Value,
    number: &serde_json::Number,
    value: &Value,
    shown: &str,
    errors: &mut Vec<String>,
) {
    let Some(actual) = number.as_f64() else {
        return;
    };
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let exclusive = flag(schema, "exclusiveMinimum");
        if actual < min || (exclusive && actual == min) {
            let relation = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errors.push(format!(
                "{shown}: Invalid value: {value}: {shown} in body should be {relation} {}",
                number_text(min)
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let exclusive = flag(schema, "exclusiveMaximum");
        if actual > max || (exclusive && actual == max) {
            let relation = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errors.push(format!(
                "{shown}: Invalid value: {value}: {shown} in body should be {relation} {}",
                number_text(max)
            ));
        }
    }
}

/// A bound as Go prints it: `10`, not `10.0`.
fn number_text(bound: f64) -> String {
    if bound.fract() == 0.0 && bound.abs() < 1e15 {
        format!("{}", bound as i64)
    } else {
        bound.to_string()
    }
}

/// Evaluates the `x-kubernetes-validations` rules. Root rules see `self.metadata.name` and
/// `self.metadata.generateName` only, as in the real API.
fn cel_errors(
    crd: &Value,
    version: &str,
    schema: &Value,
    obj: &Value,
    old: Option<&Value>,
) -> Vec<String> {
    let schema = with_cel_metadata(schema);
    let object = with_cel_metadata_values(obj);
    let old = old.map(with_cel_metadata_values);
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = crd
        .pointer("/spec/names/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let root = RootContext {
        api_version: format!("{group}/{version}"),
        api_group: group.to_string(),
        kind: kind.to_string(),
    };
    match Validator::new().validate_with_context(&schema, &object, old.as_ref(), Some(&root)) {
        Ok(()) => Vec::new(),
        Err(failures) => failures
            .iter()
            .map(|failure| cel_message(failure, &object))
            .collect(),
    }
}

/// The root schema with the `metadata` fields that CEL rules may read.
fn with_cel_metadata(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "metadata".to_string(),
            json!({"type": "object", "properties": {
                "name": {"type": "string"}, "generateName": {"type": "string"}}}),
        );
    }
    schema
}

fn with_cel_metadata_values(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get("metadata").and_then(Value::as_object) {
        let visible: Map<String, Value> = metadata
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "name" | "generateName"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        object["metadata"] = Value::Object(visible);
    }
    object
}

/// A CEL failure worded like the real API: the reason decides the error type, and
/// `Invalid value` shows the type of the value the rule is on.
fn cel_message(failure: &ValidationError, object: &Value) -> String {
    let path = display_path(&failure.field_path);
    match failure.reason.as_deref() {
        Some("FieldValueForbidden") => format!("{path}: Forbidden: {}", failure.message),
        Some("FieldValueRequired") => format!("{path}: Required value: {}", failure.message),
        Some("FieldValueDuplicate") => format!("{path}: Duplicate value: {}", failure.message),
        _ => {
            let value_type = value_at(object, &failure.field_path)
                .map(type_name)
                .unwrap_or("object");
            format!(
                "{path}: Invalid value: \"{value_type}\": {}",
                failure.message
            )
        }
    }
}

/// The value at a field path like `spec.items[2].name` (map keys as `[key]`).
fn value_at<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = object;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (field, indexes) = match segment.find('[') {
            Some(open) => (&segment[..open], &segment[open..]),
            None => (segment, ""),
        };
        if !field.is_empty() {
            current = current.get(field)?;
        }
        for index in indexes.split('[').filter(|s| !s.is_empty()) {
            let index = index.trim_end_matches(']');
            current = match current {
                Value::Array(items) => items.get(index.parse::<usize>().ok()?)?,
                Value::Object(fields) => fields.get(index)?,
                _ => return None,
            };
        }
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mcp_crd() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../config/crd/meshplane.io_meshcontrolplanes.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    fn mcp(name: &str, spec: Value) -> Value {
        json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name, "labels": {"team": "blue"}, "uid": "u1"}, "spec": spec})
    }

    #[test]
    fn defaults_are_applied_and_unknown_fields_pruned() {
        let crd = mcp_crd();
        let mut object = mcp(
            "blue-v1",
            json!({"tenant": "blue", "surprise": true, "meshConfig": {"accessLogging": {}}}),
        );
        object["status"] = json!({"members": {"count": 1, "extra": 1}});
        object["topLevelJunk"] = json!(1);
        let mut unknown = unknown_fields(&crd, "v1alpha1", &object);
        unknown.sort();
        assert_eq!(
            unknown,
            ["spec.surprise", "status.members.extra", "topLevelJunk"],
            "what fieldValidation reports"
        );
        validate_custom_resource(&crd, "v1alpha1", &mut object, None).unwrap();
        let spec = &object["spec"];
        assert_eq!(spec["isolation"], "Strict");
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["version"], "0.1.0");
        assert_eq!(
            spec["meshConfig"]["accessLogging"],
            json!({"enabled": false})
        );
        // The parent was given, so its other defaults apply as well; the trust domain has none
        // (the operator derives it from the tenant).
        assert!(spec["meshConfig"].get("trustDomain").is_none());
        assert_eq!(
            spec["meshConfig"]["outboundTrafficPolicy"],
            json!({"mode": "ALLOW_ANY"})
        );
        assert!(spec.get("surprise").is_none());
        assert!(object.get("topLevelJunk").is_none());
        assert!(object["status"]["members"].get("extra").is_none());
        // Type meta and metadata are never pruned at the root.
        assert_eq!(object["kind"], "MeshControlPlane");
        assert_eq!(object["metadata"]["labels"]["team"], "blue");
    }

    #[test]
    fn openapi_constraints_are_checked() {
        let crd = mcp_crd();
        let cases = [
            (json!({"tenant": "blue", "isolation": "Loose"}),
                r#"spec.isolation: Unsupported value: "Loose": supported values: "Strict", "Shared""#),
            (json!({"tenant": "Blue_Team"}),
                r#"spec.tenant: Invalid value: "Blue_Team": spec.tenant in body should match '^[a-z]([-a-z0-9]*[a-z0-9])?$'"#),
            (json!({"tenant": "blue", "images": {"proxy": ""}}), r#"spec.images.proxy: Invalid value: "": spec.images.proxy in body should be at least 1 chars long"#),
            (json!({"tenant": "a".repeat(33)}), "spec.tenant: Too long: may not be more than 32 bytes"),
            (json!({"tenant": "blue", "replicas": 11}),
                "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"),
            (json!({"tenant": "blue", "replicas": 0}),
                "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"),
            (json!({"tenant": "blue", "replicas": "two"}),
                r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#),
            (json!({"tenant": 7}), r#"spec.tenant: Invalid value: "integer": spec.tenant in body must be of type string: "integer""#),
            (json!({}), "spec.tenant: Required value"),
        ];
        for (spec, expected) in cases {
            let mut object = mcp("blue", spec.clone());
            let errors = validate_custom_resource(&crd, "v1alpha1", &mut object, None).unwrap_err();
            assert_eq!(errors, vec![expected.to_string()], "{spec}");
        }
        let mut without_spec = json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane", "metadata": {"name": "x"}});
        assert_eq!(
            validate_custom_resource(&crd, "v1alpha1", &mut without_spec, None),
            Err(vec!["spec: Required value".to_string()])
        );
    }

    #[test]
    fn nullable_fields_keep_null_others_drop_it() {
        let crd = mcp_crd();
        let mut object = mcp(
            "blue",
            json!({"tenant": "blue", "namespace": null, "isolation": null, "replicas": null}),
        );
        validate_custom_resource(&crd, "v1alpha1", &mut object, None).unwrap();
        assert_eq!(object["spec"]["namespace"], Value::Null);
        assert!(object["spec"]
            .as_object()
            .unwrap()
            .contains_key("namespace"));
        // Non-nullable nulls give way to their defaults.
        assert_eq!(object["spec"]["isolation"], "Strict");
        assert_eq!(object["spec"]["replicas"], 1);
    }

    #[test]
    fn tenant_is_immutable_on_update() {
        let crd = mcp_crd();
        let mut old = mcp("blue-v1", json!({"tenant": "blue"}));
        validate_custom_resource(&crd, "v1alpha1", &mut old, None).unwrap();
        let mut same = mcp("blue-v1", json!({"tenant": "blue", "replicas": 2}));
        assert_eq!(
            validate_custom_resource(&crd, "v1alpha1", &mut same, Some(&old)),
            Ok(())
        );

        let mut moved = mcp("blue-v1", json!({"tenant": "green"}));
        let errors =
            validate_custom_resource(&crd, "v1alpha1", &mut moved, Some(&old)).unwrap_err();
        assert_eq!(
            errors,
            vec![r#"spec.tenant: Invalid value: "string": spec.tenant is immutable"#.to_string()]
        );

        // Adding spec.revision after creation trips the object-level transition rule.
        let mut with_revision = mcp("blue-v1", json!({"tenant": "blue", "revision": "v1"}));
        let errors =
            validate_custom_resource(&crd, "v1alpha1", &mut with_revision, Some(&old)).unwrap_err();
        assert_eq!(errors, vec![
            r#"spec: Invalid value: "object": spec.revision is immutable: it cannot be added or removed after creation"#.to_string()
        ]);
    }

    #[test]
    fn extension_providers_are_checked_by_schema_and_cel() {
        let crd = mcp_crd();
        let with = |providers: Value| {
            let mut object = mcp(
                "blue-v1",
                json!({"tenant": "blue", "meshConfig": {"extensionProviders": providers}}),
            );
            validate_custom_resource(&crd, "v1alpha1", &mut object, None)
        };
        assert_eq!(
            with(json!([
                {"name": "authz", "envoyExtAuthzGrpc": {"service": "shop/authz", "port": 9000, "timeout": "1s"}},
                {"name": "prom", "prometheus": {}}
            ])),
            Ok(())
        );
        let two_kinds = with(json!([{"name": "x", "prometheus": {},
            "envoyFileAccessLog": {"path": "/dev/stdout"}}]))
        .unwrap_err();
        assert!(
            two_kinds[0].contains("each provider sets exactly one of"),
            "{two_kinds:?}"
        );
        let none = with(json!([{"name": "x"}])).unwrap_err();
        assert!(
            none[0].contains("each provider sets exactly one of"),
            "{none:?}"
        );
        let twice = with(json!([{"name": "x", "prometheus": {}}, {"name": "x", "prometheus": {}}]))
            .unwrap_err();
        assert!(
            twice[0].contains("provider names must be unique"),
            "{twice:?}"
        );
        let bad = with(
            json!([{"name": "x", "envoyExtAuthzHttp": {"service": "a/b", "port": 0,
            "statusOnError": "forbidden"}}]),
        )
        .unwrap_err();
        assert_eq!(bad.len(), 2, "{bad:?}");
    }

    #[test]
    fn pod_networks_are_cidrs_by_cel() {
        let crd = mcp_crd();
        let with = |nets: Value| {
            let mut object = mcp(
                "blue-v1",
                json!({"tenant": "blue", "meshConfig": {"podNetworks": nets}}),
            );
            validate_custom_resource(&crd, "v1alpha1", &mut object, None)
        };
        assert_eq!(with(json!(["198.18.0.0/16", "198.19.0.0/16"])), Ok(()));
        let bad = with(json!(["198.18.0.0/16", "198.18.0.9"])).unwrap_err();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].contains("spec.meshConfig.podNetworks")
                && bad[0].contains("podNetworks must be CIDRs"),
            "{bad:?}"
        );
    }

    #[test]
    fn root_rule_sees_metadata_name() {
        let crd = mcp_crd();
        let long_name = "a".repeat(33);
        let mut object = mcp(&long_name, json!({"tenant": "blue"}));
        let errors = validate_custom_resource(&crd, "v1alpha1", &mut object, None).unwrap_err();
        assert_eq!(errors, vec![
            "<nil>: Invalid value: \"object\": metadata.name must be a DNS-1035 label of at most 32 characters (it is the default revision)".to_string()
        ]);
        let mut ok = mcp(&"a".repeat(32), json!({"tenant": "blue"}));
        assert_eq!(
            validate_custom_resource(&crd, "v1alpha1", &mut ok, None),
            Ok(())
        );
        let mut uppercase = mcp("Blue", json!({"tenant": "blue"}));
        assert!(validate_custom_resource(&crd, "v1alpha1", &mut uppercase, None).is_err());
    }

    #[test]
    fn maps_arrays_and_preserved_fields() {
        let crd = json!({"spec": {"group": "x.io", "names": {"kind": "Thing"}, "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
                "ports": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "object", "required": ["port"],
                    "properties": {"port": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"}}}},
                "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "port": {"x-kubernetes-int-or-string": true},
            }}},
        }}}]}});
        let mut object = json!({"spec": {"labels": {"a": "b"}, "ports": [{"port": 80}], "raw": {"anything": [1]}, "port": "http"}});
        validate_custom_resource(&crd, "v1", &mut object, None).unwrap();
        assert_eq!(object["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(object["spec"]["raw"]["anything"], json!([1]));

        let mut bad = json!({"spec": {"labels": {"a": "long"}, "ports": [{}, {"port": 1}, {"port": 2}], "port": true}});
        let errors = validate_custom_resource(&crd, "v1", &mut bad, None).unwrap_err();
        assert!(
            errors.contains(&"spec.labels[a]: Too long: may not be more than 3 bytes".to_string()),
            "{errors:?}"
        );
        assert!(
            errors.contains(&"spec.ports: Too many: 3: must have at most 2 items".to_string()),
            "{errors:?}"
        );
        assert!(
            errors.contains(&"spec.ports[0].port: Required value".to_string()),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("spec.port: Invalid value: \"boolean\"")),
            "{errors:?}"
        );

        // A version without a schema accepts anything.
        let mut free = json!({"spec": {"x": 1}});
        assert_eq!(
            validate_custom_resource(&crd, "v2", &mut free, None),
            Ok(())
        );
    }

    #[test]
    fn value_lookup_by_field_path() {
        let object = json!({"spec": {"ports": [{"name": "a"}], "labels": {"k": "v"}}});
        assert_eq!(value_at(&object, "spec.ports[0].name"), Some(&json!("a")));
        assert_eq!(value_at(&object, "spec.labels[k]"), Some(&json!("v")));
        assert_eq!(value_at(&object, ""), Some(&object));
        assert_eq!(value_at(&object, "spec.missing"), None);
    }
}
