//! Query parameters of API requests: selectors, pagination, watch and write options.

use std::collections::HashMap;

use meshplane_crds::selector::Selector;
use serde_json::Value;

use super::error::ApiError;
use super::object;
use super::resources::ResourceType;

/// All query parameters of one request, parsed.
#[derive(Debug, Default)]
pub struct QueryParams {
    raw: HashMap<String, String>,
}

impl QueryParams {
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let raw = match query {
            Some(q) if !q.is_empty() => {
                let uri: http::Uri = format!("/?{q}")
                    .parse()
                    .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
                axum::extract::Query::<HashMap<String, String>>::try_from_uri(&uri)
                    .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
                    .0
            }
            _ => HashMap::new(),
        };
        Ok(Self { raw })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.raw
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("1" | "true" | "True"))
    }

    pub fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("{key}: invalid value {v:?}")))
            })
            .transpose()
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun").is_some()
    }

    pub fn label_selector(&self) -> Result<Selector, ApiError> {
        Selector::parse_query(self.get("labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))
    }

    pub fn field_selector(&self, rt: &ResourceType) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.get("fieldSelector").unwrap_or_default(), rt)
    }
}

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone)]
struct FieldTerm {
    path: String,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`, limited to the fields the real API supports for the kinds here.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

fn supported_fields(rt: &ResourceType) -> &'static [&'static str] {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ],
        ("events.k8s.io", "events") => super::event_views::EVENTS_VIEW_FIELDS,
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        _ => &[],
    }
}

impl FieldSelector {
    pub fn parse(s: &str, rt: &ResourceType) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, value, equal) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let path = path.trim();
            if !(path == "metadata.name"
                || path == "metadata.namespace"
                || supported_fields(rt).contains(&path))
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {path}"
                )));
            }
            terms.push(FieldTerm {
                path: path.to_string(),
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(Self { terms })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let actual = match object::get_path(obj, &t.path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == t.value) == t.equal
        })
    }

    /// The name an exact `metadata.name=` term pins, if any (a cheap pre-filter).
    pub fn exact_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.equal && t.path == "metadata.name")
            .map(|t| t.value.as_str())
    }
}

/// Label and field selectors together.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub labels: Selector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn from_query(q: &QueryParams, rt: &ResourceType) -> Result<Self, ApiError> {
        Ok(Self {
            labels: q.label_selector()?,
            fields: q.field_selector(rt)?,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        // Without a label selector, skip copying the object's labels.
        (self.labels.is_empty() || self.labels.matches(&object::labels(obj)))
            && self.fields.matches(obj)
    }
}
