//! Semantic rules of `Telemetry` that the schema cannot express: metric label names and the
//! values meshplane can give them in tag overrides, one source per custom tag,
//! sampling percentages, and no `targetRef`.

use super::{validate_label_key, validate_label_value, ValidationError, ValidationErrors};
use crate::telemetry::{tag_value_format, TagOperation, TelemetrySpec, TARGET_REF_UNSUPPORTED};

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Checks a Telemetry spec.
pub fn validate_telemetry(spec: &TelemetrySpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        errs.0
            .push(invalid("spec.targetRef", TARGET_REF_UNSUPPORTED));
    }
    if let Some(selector) = &spec.selector {
        for (key, value) in &selector.match_labels {
            let field = format!("spec.selector.matchLabels[{key}]");
            errs.check(validate_label_key(key, &field));
            errs.check(validate_label_value(value, &field));
        }
    }
    for (i, t) in spec.tracing.iter().enumerate() {
        if let Some(p) = t.random_sampling_percentage {
            if !(0.0..=100.0).contains(&p) || !p.is_finite() {
                errs.0.push(invalid(
                    format!("spec.tracing[{i}].randomSamplingPercentage"),
                    "must be between 0 and 100",
                ));
            }
        }
        for (name, tag) in &t.custom_tags {
            let field = format!("spec.tracing[{i}].customTags[{name}]");
            let sources = [
                tag.literal.is_some(),
                tag.environment.is_some(),
                tag.header.is_some(),
            ];
            if sources.iter().filter(|s| **s).count() != 1 {
                errs.0.push(invalid(
                    &field,
                    "a custom tag is exactly one of literal, environment, header",
                ));
            }
            if name.is_empty() {
                errs.0.push(invalid(&field, "a tag needs a name"));
            }
            if let Some(h) = &tag.header {
                let ok = !h.name.is_empty()
                    && h.name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    errs.0.push(invalid(
                        format!("{field}.header.name"),
                        "must be a header name (letters, digits, '-', '_')",
                    ));
                }
            }
            if let Some(e) = &tag.environment {
                if e.name.is_empty() {
                    errs.0.push(invalid(
                        format!("{field}.environment.name"),
                        "must name an environment variable",
                    ));
                }
            }
        }
    }
    for (i, a) in spec.access_logging.iter().enumerate() {
        if let Some(f) = &a.filter {
            if f.expression.trim().is_empty() {
                errs.0.push(invalid(
                    format!("spec.accessLogging[{i}].filter.expression"),
                    "must be a CEL expression",
                ));
            }
        }
    }
    for (i, m) in spec.metrics.iter().enumerate() {
        for (j, o) in m.overrides.iter().enumerate() {
            for (tag, change) in &o.tag_overrides {
                let field = format!("spec.metrics[{i}].overrides[{j}].tagOverrides[{tag}]");
                if tag.is_empty()
                    || !tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    || tag.starts_with(|c: char| c.is_ascii_digit())
                {
                    errs.0.push(invalid(
                        &field,
                        "a metric label name is letters, digits and '_', not starting with a digit",
                    ));
                }
                if change.operation == TagOperation::Upsert
                    && change.value.as_deref().and_then(tag_value_format).is_none()
                {
                    errs.0.push(invalid(
                        format!("{field}.value"),
                        "meshplane sets a label to a string literal (\"'canary'\"), a request attribute (request.host, request.method, request.path, request.url_path, request.scheme, request.protocol, request.id, request.referer, request.useragent, response.code, response.code_details, response.flags, response.grpc_status, source.address, source.port, destination.address, destination.port, connection.requested_server_name, upstream.address, upstream.port, xds.cluster_name, xds.route_name) or a header (request.headers['name'], response.headers['name']); other CEL expressions cannot be evaluated by Envoy's stats access logger",
                    ));
                }
            }
        }
    }
    errs.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> TelemetrySpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn istio_forms_pass_and_what_cannot_apply_is_refused() {
        assert!(validate_telemetry(&spec(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "accessLogging": [{"providers": [{"name": "envoy"}], "filter": {"expression": "response.code >= 400"}}],
            "tracing": [{"randomSamplingPercentage": 100.0, "customTags": {"env": {"literal": {"value": "prod"}}}}],
            "metrics": [{"overrides": [{"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"destination_service": {"operation": "REMOVE"}, "source_workload": {"value": "'batch'"}, "host": {"value": "request.host"}, "user": {"value": "request.headers['x-user']"}}}]}]
        })))
        .is_ok());
        let errs = validate_telemetry(&spec(json!({
            "targetRef": {"kind": "Gateway", "name": "gw"},
            "tracing": [{"randomSamplingPercentage": 120.0, "customTags": {"both": {"literal": {"value": "a"}, "header": {"name": "x"}}}}],
            "metrics": [{"overrides": [{"tagOverrides": {"request_host": {"value": "request.host + '/'"}, "bad-name": {"operation": "REMOVE"}}}]}]
        })))
        .expect_err("invalid")
        .to_string();
        for needle in [
            "targetRef",
            "between 0 and 100",
            "exactly one of",
            "letters, digits and '_'",
            "tagOverrides[request_host].value: meshplane sets a label to a string literal",
        ] {
            assert!(errs.contains(needle), "{needle}: {errs}");
        }
    }
}
