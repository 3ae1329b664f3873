//! Deciding and performing writes: the pure comparison of desired with observed objects, and
//! the server-side-apply / delete calls under the one field manager.
//!
//! A steady-state reconcile writes nothing because every desired body is compared with the
//! observed object first ([`is_applied`]): server-side apply of an unchanged body would be a
//! no-op on the server, but it is still a write request and a new audit event.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use meshplane_crds::names;
use serde_json::Value;
use tracing::{debug, info};

use crate::metrics::Metrics;
use crate::render::{DesiredObject, Kind, ObjectKey};

/// A failed API call.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{action} {key}: {source}")]
    Api {
        action: &'static str,
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("decoding {key}: {source}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Whether `observed` already carries every field of `desired` with the same value. Fields the
/// server adds (defaults, status, managedFields) are ignored; lists must match element-wise.
pub fn is_applied(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().all(|(k, dv)| match o.get(k) {
            Some(ov) => is_applied(dv, ov),
            // An empty map or list we ask for is the same as an absent one.
            None => {
                dv.is_null()
                    || dv.as_object().is_some_and(|m| m.is_empty())
                    || dv.as_array().is_some_and(|a| a.is_empty())
            }
        }),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_applied(a, b))
        }
        (Value::Null, _) => true,
        (d, o) => d == o,
    }
}

/// Whether an observed object is ours to change: it carries our labels and, when it has an
/// owner, is owned by `owner_uid` (a duplicate revision's loser has the same labels but another
/// uid, and must never touch the winner's objects).
pub fn is_ours(observed: &Value, owner_uid: &str) -> bool {
    let labels = observed.pointer("/metadata/labels");
    let managed = labels
        .and_then(|l| l.get(names::MANAGED_BY_LABEL))
        .and_then(Value::as_str)
        == Some(names::MANAGED_BY_VALUE);
    let owners = observed
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let owned = owners.is_empty()
        || owners
            .iter()
            .any(|o| o.get("uid").and_then(Value::as_str) == Some(owner_uid));
    managed && owned
}

/// What a reconcile must do to reach the desired state.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Desired objects that are missing or differ.
    pub apply: Vec<ObjectKey>,
    /// Desired objects already in place.
    pub unchanged: Vec<ObjectKey>,
    /// Objects that exist but belong to someone else: left alone, reported.
    pub foreign: Vec<ObjectKey>,
    /// Our objects that are no longer desired, in safe deletion order.
    pub prune: Vec<ObjectKey>,
}

/// Compares desired objects with observed ones. `observed` holds every object carrying this
/// revision's labels plus any desired object found by name.
pub fn plan(
    desired: &[DesiredObject],
    observed: &BTreeMap<ObjectKey, Value>,
    owner_uid: &str,
) -> Plan {
    let mut out = Plan::default();
    for d in desired {
        match observed.get(&d.key) {
            Some(o) if d.key.kind != Kind::Namespace && !is_ours(o, owner_uid) => {
                out.foreign.push(d.key.clone())
            }
            Some(o) if is_applied(&d.body, o) => out.unchanged.push(d.key.clone()),
            _ => out.apply.push(d.key.clone()),
        }
    }
    let wanted: std::collections::BTreeSet<&ObjectKey> = desired.iter().map(|d| &d.key).collect();
    for kind in Kind::DELETE_ORDER {
        for (key, o) in observed.range(
            ObjectKey {
                kind,
                namespace: None,
                name: String::new(),
            }..,
        ) {
            if key.kind != kind {
                break;
            }
            if !wanted.contains(key) && is_ours(o, owner_uid) && has_owner(o, owner_uid) {
                out.prune.push(key.clone());
            }
        }
    }
    out
}

fn has_owner(observed: &Value, owner_uid: &str) -> bool {
    observed
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|os| {
            os.iter()
                .any(|o| o.get("uid").and_then(Value::as_str) == Some(owner_uid))
        })
}

/// An object the API returned, as the JSON the plans compare.
fn as_value(key: &ObjectKey, object: &DynamicObject) -> Result<Value, ApplyError> {
    serde_json::to_value(object).map_err(|source| ApplyError::Decode {
        key: key.to_string(),
        source,
    })
}

/// The API side: reads and writes of operator-managed objects, counted in metrics.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    metrics: std::sync::Arc<Metrics>,
}

impl Applier {
    pub fn new(client: Client, metrics: std::sync::Arc<Metrics>) -> Self {
        Self { client, metrics }
    }

    fn api(&self, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        match namespace {
            Some(ns) if kind.namespaced() => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// Every object of `kind`, cluster-wide, matching `label_selector`.
    pub async fn list(
        &self,
        kind: Kind,
        label_selector: &str,
    ) -> Result<Vec<(ObjectKey, Value)>, ApplyError> {
        self.list_in(kind, None, label_selector).await
    }

    /// Every object of `kind` matching `label_selector`, in `namespace` (cluster-wide when
    /// `None`).
    pub async fn list_in(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        label_selector: &str,
    ) -> Result<Vec<(ObjectKey, Value)>, ApplyError> {
        let list = self
            .api(kind, namespace)
            .list(&ListParams::default().labels(label_selector))
            .await
            .map_err(|source| ApplyError::Api {
                action: "list",
                key: kind.name().to_string(),
                source,
            })?;
        list.items
            .into_iter()
            .map(|o| {
                let key = ObjectKey {
                    kind,
                    namespace: o.metadata.namespace.clone().filter(|_| kind.namespaced()),
                    name: o.metadata.name.clone().unwrap_or_default(),
                };
                let value = as_value(&key, &o)?;
                Ok((key, value))
            })
            .collect()
    }

    /// One object by key, `None` when it does not exist.
    pub async fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ApplyError> {
        let found = self
            .api(key.kind, key.namespace.as_deref())
            .get_opt(&key.name)
            .await
            .map_err(|source| ApplyError::Api {
                action: "get",
                key: key.to_string(),
                source,
            })?;
        found.map(|o| as_value(key, &o)).transpose()
    }

    /// Server-side apply under the operator's field manager, forcing ownership of our fields.
    pub async fn apply(&self, object: &DesiredObject) -> Result<Value, ApplyError> {
        let key = &object.key;
        let params = PatchParams::apply(names::FIELD_MANAGER).force();
        let applied = self
            .api(key.kind, key.namespace.as_deref())
            .patch(&key.name, &params, &Patch::Apply(&object.body))
            .await
            .map_err(|source| ApplyError::Api {
                action: "apply",
                key: key.to_string(),
                source,
            })?;
        self.metrics.record_write(key.kind.name(), "apply");
        info!(object = %key, "applied");
        as_value(key, &applied)
    }

    /// Creates one object that must not exist yet (a conflict when it does), keeping the
    /// operator's field manager on what it wrote.
    pub async fn create(&self, object: &DesiredObject) -> Result<Value, ApplyError> {
        let key = &object.key;
        let body: DynamicObject =
            serde_json::from_value(object.body.clone()).map_err(|source| ApplyError::Decode {
                key: key.to_string(),
                source,
            })?;
        let params = PostParams {
            field_manager: Some(names::FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        let created = self
            .api(key.kind, key.namespace.as_deref())
            .create(&params, &body)
            .await
            .map_err(|source| ApplyError::Api {
                action: "create",
                key: key.to_string(),
                source,
            })?;
        self.metrics.record_write(key.kind.name(), "create");
        info!(object = %key, "created");
        as_value(key, &created)
    }

    /// Deletes one object; an object already gone is success.
    pub async fn delete(&self, key: &ObjectKey) -> Result<(), ApplyError> {
        match self
            .api(key.kind, key.namespace.as_deref())
            .delete(&key.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {
                self.metrics.record_write(key.kind.name(), "delete");
                info!(object = %key, "deleted");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!(object = %key, "already gone");
                Ok(())
            }
            Err(source) => Err(ApplyError::Api {
                action: "delete",
                key: key.to_string(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn applied_ignores_server_added_fields_but_not_changed_ones() {
        let desired = json!({"spec": {"replicas": 2, "ports": [{"port": 1}], "extra": {}}});
        let observed = json!({"spec": {"replicas": 2, "ports": [{"port": 1, "protocol": "TCP"}], "paused": false}, "status": {}});
        assert!(is_applied(&desired, &observed));
        assert!(!is_applied(&json!({"spec": {"replicas": 3}}), &observed));
        assert!(!is_applied(
            &json!({"spec": {"ports": [{"port": 1}, {"port": 2}]}}),
            &observed
        ));
        assert!(!is_applied(&json!({"spec": {"missing": 1}}), &observed));
    }

    fn obj(uid: Option<&str>, managed: bool) -> Value {
        let mut labels = json!({});
        if managed {
            labels = json!({names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE});
        }
        let owners: Vec<Value> = uid.iter().map(|u| json!({"uid": u})).collect();
        json!({"metadata": {"labels": labels, "ownerReferences": owners}, "data": {"a": "1"}})
    }

    fn key(kind: Kind, ns: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: ns.map(str::to_string),
            name: name.into(),
        }
    }

    #[test]
    fn plan_applies_changes_skips_foreign_objects_and_prunes_only_ours() {
        let desired = vec![
            DesiredObject {
                key: key(Kind::ConfigMap, Some("a"), "same"),
                body: json!({"data": {"a": "1"}}),
            },
            DesiredObject {
                key: key(Kind::ConfigMap, Some("a"), "changed"),
                body: json!({"data": {"a": "2"}}),
            },
            DesiredObject {
                key: key(Kind::ConfigMap, Some("a"), "new"),
                body: json!({"data": {}}),
            },
            DesiredObject {
                key: key(Kind::ConfigMap, Some("a"), "users"),
                body: json!({"data": {}}),
            },
        ];
        let observed = BTreeMap::from([
            (
                key(Kind::ConfigMap, Some("a"), "same"),
                obj(Some("me"), true),
            ),
            (
                key(Kind::ConfigMap, Some("a"), "changed"),
                obj(Some("me"), true),
            ),
            (key(Kind::ConfigMap, Some("a"), "users"), obj(None, false)),
            (
                key(Kind::ConfigMap, Some("left"), "stale"),
                obj(Some("me"), true),
            ),
            (
                key(Kind::ConfigMap, Some("b"), "twin"),
                obj(Some("other"), true),
            ),
            (
                key(Kind::MutatingWebhookConfiguration, None, "stale-hook"),
                obj(Some("me"), true),
            ),
        ]);
        let p = plan(&desired, &observed, "me");
        assert_eq!(p.unchanged, vec![key(Kind::ConfigMap, Some("a"), "same")]);
        assert_eq!(
            p.apply,
            vec![
                key(Kind::ConfigMap, Some("a"), "changed"),
                key(Kind::ConfigMap, Some("a"), "new")
            ]
        );
        assert_eq!(p.foreign, vec![key(Kind::ConfigMap, Some("a"), "users")]);
        // Webhooks are pruned before anything else.
        assert_eq!(
            p.prune,
            vec![
                key(Kind::MutatingWebhookConfiguration, None, "stale-hook"),
                key(Kind::ConfigMap, Some("left"), "stale")
            ]
        );
    }
}
