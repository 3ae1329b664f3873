//! Generated inputs for the EnvoyFilter policy from Envoy's descriptor set (the one patch values
//! are read with): every message type as a typed config, and every `google.protobuf.Any` field
//! of every message, reached the way a patch reaches it, holding a type the policy does not
//! allow. The policy reads patch values as JSON, so this checks that no place where Envoy takes
//! a typed extension escapes it. Deterministic: the pool's order, types assigned round-robin.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::Instant;

use meshplane_crds::envoyfilter_policy::{
    check, EnvoyFilterPolicy, PolicyViolation, DEFAULT_EXTENSION_TYPES, DEFAULT_FILTER_TYPES,
};
use meshplane_crds::networking::EnvoyFilterSpec;
use meshplane_xds::translate::protojson;
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{json, Value};

const ANY: &str = "google.protobuf.Any";
const HTTP_FILTER: &str = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter";

/// What a patch of each `applyTo` carries.
const ROOTS: &[(&str, &str)] = &[
    ("CLUSTER", "envoy.config.cluster.v3.Cluster"),
    ("LISTENER", "envoy.config.listener.v3.Listener"),
    ("FILTER_CHAIN", "envoy.config.listener.v3.FilterChain"),
    ("NETWORK_FILTER", "envoy.config.listener.v3.Filter"),
    ("HTTP_FILTER", HTTP_FILTER),
    (
        "ROUTE_CONFIGURATION",
        "envoy.config.route.v3.RouteConfiguration",
    ),
    ("VIRTUAL_HOST", "envoy.config.route.v3.VirtualHost"),
];

fn url(type_name: &str) -> String {
    format!("{}{type_name}", protojson::TYPE_URL_PREFIX)
}

fn by_default(type_name: &str) -> bool {
    DEFAULT_FILTER_TYPES.contains(&type_name) || DEFAULT_EXTENSION_TYPES.contains(&type_name)
}

/// Messages whose proto-JSON is not an object (`Duration`, wrappers, `Struct`, ...): an `Any`
/// of one needs a `value`, so they are left out of the generated `@type`s.
fn special_json(m: &MessageDescriptor) -> bool {
    m.package_name() == "google.protobuf"
}

fn violations(policy: &EnvoyFilterPolicy, apply_to: &str, value: Value) -> Vec<PolicyViolation> {
    let op = match apply_to {
        "HTTP_FILTER" | "NETWORK_FILTER" => "INSERT_FIRST",
        _ => "MERGE",
    };
    let spec: EnvoyFilterSpec = serde_json::from_value(json!({"configPatches": [
        {"applyTo": apply_to, "patch": {"operation": op, "value": value}}
    ]}))
    .expect("spec");
    check(policy, "shop", "meshplane-blue", &spec)
}

/// The value `inner` takes at field `f`: an element of a list, an entry of a map.
fn at_field(f: &FieldDescriptor, inner: Value) -> (String, Value) {
    let key = f.json_name().to_string();
    if f.is_map() {
        (format!("{key}.k"), json!({ "k": inner }))
    } else if f.is_list() {
        (format!("{key}[0]"), json!([inner]))
    } else {
        (key, inner)
    }
}

/// The message type a field holds (a map's value type), if a message.
fn message_of(f: &FieldDescriptor) -> Option<MessageDescriptor> {
    let kind = if f.is_map() {
        match f.kind() {
            Kind::Message(entry) => entry.map_entry_value_field().kind(),
            _ => return None,
        }
    } else {
        f.kind()
    };
    match kind {
        Kind::Message(m) => Some(m),
        _ => None,
    }
}

/// The messages' `Any` fields: (message, field).
fn any_fields(messages: &[MessageDescriptor]) -> Vec<(MessageDescriptor, FieldDescriptor)> {
    messages
        .iter()
        .flat_map(|m| m.fields().map(move |f| (m.clone(), f)))
        .filter(|(_, f)| message_of(f).is_some_and(|t| t.full_name() == ANY))
        .collect()
}

/// Every message type of the descriptor set as an HTTP filter's typed config: refused by the
/// default policy unless it is on the allow-lists, whatever its package.
#[test]
fn every_message_type_is_refused_as_a_typed_config_unless_allow_listed() {
    let pool = protojson::pool().expect("descriptors load");
    let names: HashSet<String> = pool.all_messages().map(|m| m.full_name().into()).collect();
    for allowed in DEFAULT_FILTER_TYPES.iter().chain(DEFAULT_EXTENSION_TYPES) {
        assert!(
            names.contains(*allowed),
            "{allowed} is not an Envoy message"
        );
    }
    let policy = EnvoyFilterPolicy::default();
    let started = Instant::now();
    let (mut refused, mut allowed) = (0, 0);
    for m in pool.all_messages().filter(|m| !m.is_map_entry()) {
        let name = m.full_name();
        let value = json!({"name": "f", "typedConfig": {"@type": url(name)}});
        if !special_json(&m) {
            protojson::parse(HTTP_FILTER, &value)
                .unwrap_or_else(|e| panic!("{name}: the patch is not a valid value: {e}"));
        }
        let v = violations(&policy, "HTTP_FILTER", value);
        if by_default(name) {
            assert!(v.is_empty(), "{name} is allowed by default: {v:?}");
            allowed += 1;
        } else {
            assert_eq!(v.len(), 1, "{name}: {v:?}");
            assert_eq!(v[0].field, "spec.configPatches[0].patch.value.typedConfig");
            assert!(v[0].reason.contains(name), "{name}: {v:?}");
            refused += 1;
        }
    }
    assert_eq!(
        allowed,
        DEFAULT_FILTER_TYPES.len() + DEFAULT_EXTENSION_TYPES.len()
    );
    assert!(refused > 1000, "only {refused} message types");
    eprintln!(
        "{refused} message types refused, {allowed} allowed, in {:?}",
        started.elapsed()
    );
}

/// Types no policy under test allows, assigned round-robin to the places tried.
fn refused_types(pool: &prost_reflect::DescriptorPool) -> Vec<String> {
    pool.all_messages()
        .filter(|m| !m.is_map_entry() && !special_json(m) && !by_default(m.full_name()))
        .map(|m| m.full_name().to_string())
        .collect()
}

/// Every `Any` field of every message type: the message allowed (as a filter's typed config),
/// the `Any` holding a type that is not is refused, naming the field; holding an allowed type,
/// it passes.
#[test]
fn every_any_field_of_every_message_is_held_to_the_allow_list() {
    let pool = protojson::pool().expect("descriptors load");
    let messages: Vec<MessageDescriptor> = pool
        .all_messages()
        .filter(|m| !m.is_map_entry() && !special_json(m))
        .collect();
    let refused = refused_types(pool);
    let started = Instant::now();
    let fields = any_fields(&messages);
    for (i, (m, f)) in fields.iter().enumerate() {
        let bad = &refused[i % refused.len()];
        let place = |type_name: &str| {
            let (path, inner) = at_field(f, json!({"@type": url(type_name)}));
            let mut config = json!({"@type": url(m.full_name())});
            config[f.json_name()] = inner;
            (path, json!({"name": "f", "typedConfig": config}))
        };
        let policy = EnvoyFilterPolicy {
            allowed_filter_types: vec![m.full_name().to_string()],
            allowed_extension_types: vec![m.full_name().to_string()],
            allow_lua: true,
            ..EnvoyFilterPolicy::default()
        };
        let (path, value) = place(bad);
        protojson::parse(HTTP_FILTER, &value)
            .unwrap_or_else(|e| panic!("{}.{}: not a valid value: {e}", m.full_name(), f.name()));
        let v = violations(&policy, "HTTP_FILTER", value);
        let field = format!("spec.configPatches[0].patch.value.typedConfig.{path}");
        assert!(
            v.iter()
                .any(|v| v.field == field && v.reason.contains(bad.as_str())),
            "{}.{} holding {bad}: {v:?}",
            m.full_name(),
            f.name()
        );
        let (_, value) = place(m.full_name());
        let v = violations(&policy, "HTTP_FILTER", value);
        assert!(
            v.iter().all(|v| v.field != field),
            "{}.{} holding an allowed type: {v:?}",
            m.full_name(),
            f.name()
        );
    }
    assert!(fields.len() > 80, "only {} Any fields", fields.len());
    eprintln!(
        "{} Any fields of {} message types checked in {:?}",
        fields.len(),
        messages.len(),
        started.elapsed()
    );
}

/// Under the default policy, unwidened: every `Any` field reachable from what each `applyTo`
/// patches, through messages alone (no typed config on the way), holding a type the default
/// policy does not allow, is refused at that path.
#[test]
fn every_any_field_reachable_from_a_patch_target_is_refused_by_default() {
    let pool = protojson::pool().expect("descriptors load");
    let refused = refused_types(pool);
    let policy = EnvoyFilterPolicy::default();
    let started = Instant::now();
    let mut checked = 0usize;
    for (apply_to, root) in ROOTS {
        let root = pool.get_message_by_name(root).expect("root");
        // Shortest path from the root to each message, by field.
        let mut paths: Vec<(MessageDescriptor, Vec<FieldDescriptor>)> = Vec::new();
        let mut seen = BTreeSet::from([root.full_name().to_string()]);
        let mut queue = VecDeque::from([(root.clone(), Vec::new())]);
        while let Some((m, path)) = queue.pop_front() {
            for f in m.fields() {
                let Some(t) = message_of(&f) else { continue };
                if special_json(&t) || !seen.insert(t.full_name().to_string()) {
                    continue;
                }
                let mut next = path.clone();
                next.push(f);
                queue.push_back((t, next));
            }
            paths.push((m, path));
        }
        for (m, path) in &paths {
            for f in m.fields() {
                if message_of(&f).is_none_or(|t| t.full_name() != ANY) {
                    continue;
                }
                let bad = &refused[checked % refused.len()];
                let build = |type_name: &str| {
                    let (mut at, any) = at_field(&f, json!({"@type": url(type_name)}));
                    let mut value = json!({});
                    value[f.json_name()] = any;
                    for step in path.iter().rev() {
                        let (key, wrapped) = at_field(step, value);
                        let mut inner = serde_json::Map::new();
                        inner.insert(step.json_name().to_string(), wrapped);
                        value = Value::Object(inner);
                        at = format!("{key}.{at}");
                    }
                    (at, value)
                };
                let (at, value) = build(bad);
                protojson::parse(root.full_name(), &value)
                    .unwrap_or_else(|e| panic!("{apply_to} {at}: not a valid value: {e}"));
                let field = format!("spec.configPatches[0].patch.value.{at}");
                let v = violations(&policy, apply_to, value);
                assert!(
                    v.iter()
                        .any(|v| v.field == field && v.reason.contains(bad.as_str())),
                    "{apply_to} {at} holding {bad}: {v:?}"
                );
                let (_, value) = build(DEFAULT_EXTENSION_TYPES[0]);
                let v = violations(&policy, apply_to, value);
                assert!(
                    v.iter().all(|v| v.field != field),
                    "{apply_to} {at} holding an allowed type: {v:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "only {checked} reachable Any fields");
    eprintln!(
        "{checked} reachable Any fields checked in {:?}",
        started.elapsed()
    );
}
