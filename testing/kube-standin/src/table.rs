//! `kubectl get` Table output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`): CRD
//! printer columns, the Event printer's columns for Events (`event_views`), Kubernetes' own
//! printers for Pods, Services, workloads, Namespaces, ConfigMaps, Secrets and
//! ServiceAccounts (`printers`: READY, STATUS, RESTARTS, ...; the wide columns with priority
//! 1), or name and age for every other kind. Ages and `date` columns are Kubernetes' human
//! durations.

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::event_views;
use super::object;
use super::printers;
use super::resources::{PrinterColumn, ResourceType};

/// Whether the `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .any(|part| part.contains("as=Table") && part.contains("g=meta.k8s.io"))
}

fn columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    let name = PrinterColumn {
        name: "Name".into(),
        type_: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        json_path: ".metadata.name".into(),
    };
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    };
    let mut cols = vec![name];
    if rt.printer_columns.is_empty() {
        cols.push(age);
    } else {
        cols.extend(rt.printer_columns.iter().cloned());
    }
    cols
}

/// Evaluates the JSONPath subset printer columns use: `.a.b`, `[N]` and `[?(@.k=="v")]`.
pub fn eval_json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = obj;
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}');
    rest = rest.strip_prefix('$').unwrap_or(rest);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            current = current.get(&r[..end])?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            // A filter may contain ']' only inside quotes, which printer columns do not use.
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (field, value) = filter.split_once("==")?;
                let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
                current = current.as_array()?.iter().find(|item| {
                    item.get(field.trim()).is_some_and(|v| match v {
                        Value::String(s) => s == value,
                        other => serde_json::from_str::<Value>(value).ok().as_ref() == Some(other),
                    })
                })?;
            } else {
                current = current.get(inner.trim().parse::<usize>().ok()?)?;
            }
        } else {
            return None;
        }
    }
    Some(current)
}

fn cell(obj: &Value, col: &PrinterColumn) -> Value {
    let Some(v) = eval_json_path(obj, &col.json_path) else {
        return Value::Null;
    };
    match (col.type_.as_str(), v) {
        // As the API server converts `date` columns: Kubernetes' human duration since then.
        ("date", Value::String(s)) => match object::parse_time(s) {
            Some(t) => json!(printers::human_duration(t, Timestamp::now())),
            None => json!("<invalid>"),
        },
        (_, Value::String(_) | Value::Number(_) | Value::Bool(_)) => v.clone(),
        (_, Value::Null) => Value::Null,
        (_, other) => json!(other.to_string()),
    }
}

fn row_object(obj: &Value, include_object: Option<&str>) -> Option<Value> {
    match include_object {
        Some("None") => None,
        Some("Object") => Some(obj.clone()),
        _ => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        })),
    }
}

/// Builds a `meta.k8s.io/v1` Table of `items`.
pub fn to_table(
    rt: &ResourceType,
    items: &[Value],
    list_meta: Value,
    include_object: Option<&str>,
) -> Value {
    let events = event_views::is_event(rt);
    let printer = printers::printer(rt);
    let cols = match (&printer, events) {
        (Some(p), _) => (p.columns)(),
        (None, true) => event_views::columns(),
        (None, false) => columns(rt),
    };
    let now = Timestamp::now();
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.type_, "format": c.format,
                   "description": c.description, "priority": c.priority})
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|obj| {
            let (cells, conditions) = match (&printer, events) {
                (Some(p), _) => {
                    let row = (p.row)(obj, now);
                    (row.cells, row.conditions)
                }
                (None, true) => (event_views::cells(rt, obj), None),
                (None, false) => (cols.iter().map(|c| cell(obj, c)).collect(), None),
            };
            let mut row = json!({"cells": cells});
            if let Some(c) = conditions {
                row["conditions"] = c;
            }
            if let Some(o) = row_object(obj, include_object) {
                row["object"] = o;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_filters_conditions() {
        let obj = json!({"status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        let v = eval_json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#);
        assert_eq!(v, Some(&json!("True")));
        assert_eq!(
            eval_json_path(&obj, ".status.conditions[0].type"),
            Some(&json!("Other"))
        );
        assert_eq!(eval_json_path(&obj, ".status.missing"), None);
    }
}
