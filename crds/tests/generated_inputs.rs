//! Generated-input tests of two input surfaces of `meshplane-crds`: label
//! selectors (membership, workload selectors, the API stand-in's `?labelSelector=`) and
//! multi-document manifests (samples, the directory source). 10,000 inputs per property; no
//! input may panic, every refusal is an error that says what is wrong, and what is accepted
//! behaves as an independent model of Kubernetes' rules says.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use meshplane_crds::manifest::{parse_documents, parse_objects};
use meshplane_crds::selector::Selector;
use proptest::prelude::*;
use serde_json::{json, Value};

const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Label keys with whether Kubernetes accepts them (prefix a lowercase DNS subdomain, name at
/// most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
const KEYS: &[(&str, bool)] = &[
    ("app", true),
    ("team", true),
    ("meshplane.io/rev", true),
    ("a.b-c/d_e.f", true),
    ("x", true),
    ("", false),
    ("bad key", false),
    ("-app", false),
    ("app-", false),
    ("a/b/c", false),
    ("Example.COM/x", false),
    ("/x", false),
    ("x/", false),
    ("ümlaut", false),
];

/// Label values with whether Kubernetes accepts them (empty is a valid value).
const VALUES: &[(&str, bool)] = &[
    ("blue", true),
    ("green", true),
    ("v1.2_3-x", true),
    ("", true),
    ("bad value", false),
    ("-x", false),
    ("x.", false),
    ("a,b", false),
];

fn long(valid: bool) -> String {
    // 63 is the longest label name or value; 64 is one too many.
    "x".repeat(if valid { 63 } else { 64 })
}

fn key() -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        8 => prop::sample::select(KEYS).prop_map(|(k, ok)| (k.to_string(), ok)),
        1 => any::<bool>().prop_map(|ok| (long(ok), ok)),
    ]
}

fn value() -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        8 => prop::sample::select(VALUES).prop_map(|(v, ok)| (v.to_string(), ok)),
        1 => any::<bool>().prop_map(|ok| (long(ok), ok)),
    ]
}

#[derive(Clone, Debug)]
struct Expr {
    key: (String, bool),
    operator: String,
    values: Vec<(String, bool)>,
}

fn expr() -> impl Strategy<Value = Expr> {
    (
        key(),
        prop::sample::select(vec![
            "In",
            "NotIn",
            "Exists",
            "DoesNotExist",
            "in",
            "Equals",
            "",
        ]),
        prop::collection::vec(value(), 0..3),
    )
        .prop_map(|(key, operator, values)| Expr {
            key,
            operator: operator.to_string(),
            values,
        })
}

/// Label sets drawn from the same small key and value spaces, so that selectors often match.
fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["app", "team", "meshplane.io/rev", "x"]).prop_map(String::from),
        prop::sample::select(vec!["blue", "green", "", "v1.2_3-x"]).prop_map(String::from),
        0..4,
    )
}

/// Kubernetes' semantics, written from its documentation, not from `Selector`: `None` when the
/// selector is invalid, else whether it matches.
/// A generated string with whether Kubernetes accepts it.
type Checked = (String, bool);

fn model(
    match_labels: &[(Checked, Checked)],
    exprs: &[Expr],
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let mut matched = true;
    for ((k, k_ok), (v, v_ok)) in match_labels {
        if !k_ok || !v_ok {
            return None;
        }
        matched &= labels.get(k) == Some(v);
    }
    for e in exprs {
        if !e.key.1 || e.values.iter().any(|(_, ok)| !ok) {
            return None;
        }
        let values: Vec<&String> = e.values.iter().map(|(v, _)| v).collect();
        let label = labels.get(&e.key.0);
        matched &= match (e.operator.as_str(), values.is_empty()) {
            ("In", false) => label.is_some_and(|l| values.contains(&l)),
            ("NotIn", false) => label.is_none_or(|l| !values.contains(&l)),
            ("Exists", true) => label.is_some(),
            ("DoesNotExist", true) => label.is_none(),
            _ => return None,
        };
    }
    Some(matched)
}

proptest! {
    #![proptest_config(config())]

    /// Every generated `LabelSelector` is accepted exactly when Kubernetes accepts it, an
    /// accepted one matches exactly the label sets the model says, and a refusal names the
    /// field it is about.
    #[test]
    fn label_selectors_follow_kubernetes_rules(
        match_labels in prop::collection::vec((key(), value()), 0..3),
        exprs in prop::collection::vec(expr(), 0..3),
        labels in labels(),
    ) {
        // Duplicate matchLabels keys collapse in a map: the model sees the last one only.
        let mut map = BTreeMap::new();
        for (k, v) in &match_labels {
            map.insert(k.clone(), v.clone());
        }
        let dedup: Vec<_> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let sel = LabelSelector {
            match_labels: Some(dedup.iter().map(|((k, _), (v, _))| (k.clone(), v.clone())).collect()),
            match_expressions: Some(
                exprs
                    .iter()
                    .map(|e| LabelSelectorRequirement {
                        key: e.key.0.clone(),
                        operator: e.operator.clone(),
                        values: Some(e.values.iter().map(|(v, _)| v.clone()).collect()),
                    })
                    .collect(),
            ),
        };
        let expected = model(&dedup, &exprs, &labels);
        match Selector::from_label_selector(&sel, "spec.namespaceSelector") {
            Ok(s) => prop_assert_eq!(Some(s.matches(&labels)), expected, "{:?}", sel),
            Err(e) => {
                prop_assert_eq!(expected, None, "refused a valid selector {:?}: {}", sel, e);
                prop_assert!(e.to_string().contains("spec.namespaceSelector"), "{}", e);
            }
        }
    }

    /// `?labelSelector=` queries: any text is parsed or refused without panicking; a query
    /// written from valid requirements means what the model says.
    #[test]
    fn label_selector_queries_never_panic(query in "\\PC{0,40}") {
        if let Err(e) = Selector::parse_query(&query) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// A query written from generated requirements is accepted exactly when every key and
    /// value is valid (and a set keeps a value), as the API server decides, and then means
    /// what the model says.
    #[test]
    fn label_selector_queries_mean_what_they_say(
        reqs in prop::collection::vec(
            (
                key(),
                0..7usize,
                prop::collection::vec(value().prop_filter("no separators", |(v, _)| !v.contains(',')), 1..3),
            ),
            0..4,
        ),
        labels in labels(),
    ) {
        let mut parts = Vec::new();
        let mut valid = true;
        let mut expected = true;
        for ((k, k_ok), form, vs) in &reqs {
            let label = labels.get(k).map(String::as_str);
            let first = vs[0].0.as_str();
            // Sets drop empty members, as Kubernetes' parser does.
            let set: Vec<&str> = vs.iter().map(|(v, _)| v.as_str()).filter(|v| !v.is_empty()).collect();
            let values_ok = vs.iter().all(|(_, ok)| *ok);
            let (text, ok, holds) = match form {
                0 => (format!("{k}={first}"), *k_ok && vs[0].1, label == Some(first)),
                1 => (format!("{k}=={first}"), *k_ok && vs[0].1, label == Some(first)),
                2 => (format!("{k}!={first}"), *k_ok && vs[0].1, label != Some(first)),
                3 => (
                    format!("{k} in ({})", set.join(", ")),
                    *k_ok && values_ok && !set.is_empty(),
                    label.is_some_and(|l| set.contains(&l)),
                ),
                4 => (
                    format!("{k} notin ({})", set.join(",")),
                    *k_ok && values_ok && !set.is_empty(),
                    label.is_none_or(|l| !set.contains(&l)),
                ),
                5 => (format!("!{k}"), *k_ok, label.is_none()),
                // An empty part of a query is no requirement at all.
                _ if k.is_empty() => (String::new(), true, true),
                _ => (k.clone(), *k_ok, label.is_some()),
            };
            parts.push(text);
            valid &= ok;
            expected &= holds;
        }
        let query = parts.join(",");
        match Selector::parse_query(&query) {
            Ok(s) => {
                prop_assert!(valid, "accepted the invalid query {:?}", query);
                prop_assert_eq!(s.matches(&labels), expected, "{}", query);
            }
            Err(e) => {
                prop_assert!(!valid, "refused the valid query {:?}: {}", query, e);
                prop_assert!(e.to_string().contains("labelSelector"), "{}", e);
            }
        }
    }
}

/// JSON trees of the shapes manifests hold (no floats: YAML and JSON agree on them only up to
/// formatting).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z0-9 ./:-]{0,12}".prop_map(Value::String),
        // Strings YAML would otherwise read as something else.
        prop::sample::select(vec![
            "yes", "no", "null", "~", "1.0", "0x1F", "- a", "a: b", "#x", "'q'"
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z][a-zA-Z0-9]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn meshplane_kind() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select(vec![
        ("meshplane.io/v1alpha1", "MeshControlPlane"),
        ("meshplane.io/v1alpha1", "MeshRevisionTag"),
        ("networking.meshplane.io/v1alpha1", "ServiceEntry"),
        ("networking.meshplane.io/v1alpha1", "EnvoyFilter"),
        ("networking.meshplane.io/v1alpha1", "Sidecar"),
        ("networking.meshplane.io/v1alpha1", "VirtualService"),
        ("networking.meshplane.io/v1alpha1", "DestinationRule"),
        ("networking.meshplane.io/v1alpha1", "Gateway"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
    ])
}

proptest! {
    #![proptest_config(config())]

    /// Any text: parsed or refused, never a panic; a refusal says what is wrong.
    #[test]
    fn manifests_of_any_text_never_panic(text in "(\\PC|\n|---\n|  |- |: ){0,60}") {
        match parse_objects(&text) {
            Ok(_) => {}
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Documents written as YAML read back as the same JSON, one value per non-empty
    /// document; typed decoding of meshplane kinds refuses a bad spec naming the object.
    #[test]
    fn manifests_round_trip_and_name_what_they_refuse(
        docs in prop::collection::vec((meshplane_kind(), "[a-z][a-z0-9-]{0,10}", json_value()), 1..4),
    ) {
        let values: Vec<Value> = docs
            .iter()
            .map(|((api, kind), name, spec)| json!({
                "apiVersion": api, "kind": kind,
                "metadata": {"name": name, "namespace": "shop"},
                "spec": spec,
            }))
            .collect();
        let yaml = values
            .iter()
            .map(|v| serde_saphyr::to_string(v).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(TestCaseError::fail)?
            .join("---\n");
        let parsed = parse_documents(&yaml);
        prop_assert!(parsed.is_ok(), "{}: {:?}", yaml, parsed);
        prop_assert_eq!(parsed.ok(), Some(values.clone()), "{}", yaml);
        match parse_objects(&yaml) {
            Ok(objects) => prop_assert_eq!(objects.len(), values.len()),
            Err(e) => {
                let text = e.to_string();
                prop_assert!(
                    docs.iter().any(|((_, kind), name, _)| text.contains(kind) && text.contains(name.as_str())),
                    "the refusal names no object: {}", text
                );
            }
        }
    }
}
