//! Kubernetes label-selector semantics, shared by membership, webhooks and the API stand-in.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::validation::{
    validate_label_key, validate_label_selector, validate_label_value, ValidationError,
};

/// One parsed requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `key in (values)`; `matchLabels` entries are `In` with one value.
    In(String, Vec<String>),
    /// `key notin (values)`: matches when the label is absent or has another value.
    NotIn(String, Vec<String>),
    /// The label is present.
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A validated label selector. The empty selector matches everything, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Parses a `LabelSelector` that [`validate_label_selector`] accepts; `field` names it in
    /// errors.
    pub fn from_label_selector(sel: &LabelSelector, field: &str) -> Result<Self, ValidationError> {
        validate_label_selector(sel, field)?;
        let labels = sel
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]));
        let expressions = sel.match_expressions.iter().flatten().map(|expr| {
            let key = expr.key.clone();
            let values = expr.values.clone().unwrap_or_default();
            match expr.operator.as_str() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                // The only operator validate_label_selector admits besides these.
                _ => Requirement::DoesNotExist(key),
            }
        });
        Ok(Self {
            requirements: labels.chain(expressions).collect(),
        })
    }

    /// Parses the `key=value,key!=value,key,!key,key in (a,b),key notin (a)` form used in
    /// `?labelSelector=` query parameters.
    pub fn parse_query(query: &str) -> Result<Self, ValidationError> {
        let invalid = |reason: String| ValidationError::InvalidSelector {
            field: "labelSelector".to_string(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(query) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some((k, rest)) = split_set_op(part, " notin ") {
                Requirement::NotIn(k, parse_set(rest).ok_or_else(|| invalid(part.into()))?)
            } else if let Some((k, rest)) = split_set_op(part, " in ") {
                Requirement::In(k, parse_set(rest).ok_or_else(|| invalid(part.into()))?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotIn(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::In(k.trim().into(), vec![v.trim().into()])
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(k.trim().into())
            } else {
                Requirement::Exists(part.into())
            };
            check_query_requirement(&req).map_err(|e| invalid(format!("{part:?}: {e}")))?;
            requirements.push(req);
        }
        Ok(Self { requirements })
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector has no requirement (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// What the API server checks in a `?labelSelector=` requirement: a valid key, valid values,
/// and at least one value for a set.
fn check_query_requirement(req: &Requirement) -> Result<(), ValidationError> {
    let (key, values) = match req {
        Requirement::In(k, vs) | Requirement::NotIn(k, vs) => (k, vs.as_slice()),
        Requirement::Exists(k) | Requirement::DoesNotExist(k) => (k, &[][..]),
    };
    validate_label_key(key, "key")?;
    if matches!(req, Requirement::In(_, vs) | Requirement::NotIn(_, vs) if vs.is_empty()) {
        return Err(ValidationError::InvalidSelector {
            field: "values".into(),
            reason: "in and notin need at least one value".into(),
        });
    }
    values
        .iter()
        .try_for_each(|v| validate_label_value(v, "value"))
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn split_set_op<'a>(part: &'a str, op: &str) -> Option<(String, &'a str)> {
    part.split_once(op)
        .map(|(k, rest)| (k.trim().to_string(), rest.trim()))
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

/// Matches `labels` against a `LabelSelector`; an invalid selector matches nothing.
pub fn label_selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::from_label_selector(sel, "selector").is_ok_and(|s| s.matches(labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("team", "blue")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: "NotIn".into(),
                values: Some(vec!["prod".into()]),
            }]),
        };
        let s = Selector::from_label_selector(&sel, "spec.namespaceSelector").expect("valid");
        assert!(s.matches(&labels(&[("team", "blue")])));
        assert!(s.matches(&labels(&[("team", "blue"), ("env", "dev")])));
        assert!(!s.matches(&labels(&[("team", "blue"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("team", "green")])));
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = Selector::from_label_selector(&LabelSelector::default(), "s").expect("valid");
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn invalid_operator_and_values_are_typed_errors() {
        for (op, values) in [
            ("Like", None),
            ("In", None),
            ("Exists", Some(vec!["x".to_string()])),
        ] {
            let sel = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "team".into(),
                    operator: op.into(),
                    values,
                }]),
            };
            let err = Selector::from_label_selector(&sel, "spec.namespaceSelector").unwrap_err();
            assert!(
                matches!(err, ValidationError::InvalidSelector { .. }),
                "{op}: {err}"
            );
        }
    }

    #[test]
    fn query_form() {
        let s = Selector::parse_query("a=1,b!=2,c in (x, y),!d,e").expect("valid");
        assert!(s.matches(&labels(&[("a", "1"), ("c", "y"), ("e", "")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("b", "2"), ("c", "y"), ("e", "")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("c", "z"), ("e", "")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("c", "x"), ("d", "1"), ("e", "")])));
        let s = Selector::parse_query("rev notin (blue)").expect("valid");
        assert!(s.matches(&labels(&[])));
        assert!(!s.matches(&labels(&[("rev", "blue")])));
    }
}
