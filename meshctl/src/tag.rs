//! `meshctl tag list|set|remove`: revision tags, the namespaces labelled with them and the
//! pods behind them. `set` checks a move the way the operator's admission does (the same
//! `meshplane_crds::membership` rules, the same message) before writing, and writes by
//! server-side apply, so the API server's own admission has the last word.

use std::collections::BTreeSet;

use anyhow::bail;
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use meshplane_crds::membership::{self, Conflict, ControlPlaneFacts, TagFacts};
use meshplane_crds::{names, MeshRevisionTag};
use serde::Serialize;

use crate::cluster::{self, ClusterArgs, Scope};
use crate::output::{self, Format, Report, Table};
use crate::state::MeshState;

/// The field manager of meshctl's writes.
pub const FIELD_MANAGER: &str = "meshctl";

/// `meshctl tag`.
#[derive(Debug, Subcommand)]
pub enum TagCommand {
    /// Every tag: the revision it points at, its tenant, the namespaces and pods behind it.
    List,
    /// Create a tag, or move it to another revision of its tenant.
    Set(TagSetArgs),
    /// Delete a tag (refused while namespaces carry it, unless --force).
    Remove(TagRemoveArgs),
}

/// `meshctl tag set`.
#[derive(Debug, Args)]
pub struct TagSetArgs {
    /// The tag (the value namespaces put in meshplane.io/rev).
    pub tag: String,
    /// The revision it points at.
    #[arg(long)]
    pub revision: String,
    /// Move an existing tag (without it, a tag that points elsewhere is left alone).
    #[arg(long)]
    pub overwrite: bool,
}

/// `meshctl tag remove`.
#[derive(Debug, Args)]
pub struct TagRemoveArgs {
    pub tag: String,
    /// Remove it even though namespaces carry it (they are then rejected: no revision).
    #[arg(long)]
    pub force: bool,
}

/// A pod behind a tag.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TagPod {
    pub namespace: String,
    pub name: String,
    /// The revision whose sidecar it runs (none: no sidecar).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected_by: Option<String>,
}

/// One tag.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRow {
    pub tag: String,
    /// `spec.revision`.
    pub revision: String,
    /// The revision namespaces labelled with it join (differs from `revision` while a move is
    /// refused); none when it resolves nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolves_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub in_use: bool,
    pub namespaces: Vec<String>,
    pub pods: Vec<TagPod>,
    /// Conflicts the operator reports for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// What `meshctl tag list` prints.
#[derive(Debug, Serialize)]
pub struct TagList {
    pub tags: Vec<TagRow>,
}

impl Report for TagList {
    fn human(&self, wide: bool) -> String {
        if self.tags.is_empty() {
            return "no MeshRevisionTags\n".to_string();
        }
        let mut headers = vec!["tag", "revision", "tenant", "in use", "namespaces", "pods"];
        if wide {
            headers.push("status");
        }
        let mut t = Table::new(headers);
        for r in &self.tags {
            let revision = match &r.resolves_to {
                Some(to) if *to != r.revision => format!("{to} (asked: {})", r.revision),
                _ => r.revision.clone(),
            };
            let namespaces = if wide || r.namespaces.len() <= 3 {
                output::or_dash(r.namespaces.join(","))
            } else {
                r.namespaces.len().to_string()
            };
            let stale = r
                .pods
                .iter()
                .filter(|p| p.injected_by.as_ref() != r.resolves_to.as_ref())
                .count();
            let pods = if stale > 0 {
                format!(
                    "{} ({stale} not on {})",
                    r.pods.len(),
                    r.resolves_to.as_deref().unwrap_or("any revision")
                )
            } else {
                r.pods.len().to_string()
            };
            let mut row = vec![
                r.tag.clone(),
                revision,
                output::or_dash(r.tenant.clone().unwrap_or_default()),
                if r.in_use { "True" } else { "False" }.to_string(),
                namespaces,
                pods,
            ];
            if wide {
                row.push(if r.problems.is_empty() {
                    "OK".to_string()
                } else {
                    r.problems.join("; ")
                });
            }
            t.row(row);
        }
        t.render()
    }
}

/// A change made.
#[derive(Debug, Serialize)]
pub struct TagChange {
    pub tag: String,
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Report for TagChange {
    fn human(&self, _wide: bool) -> String {
        let mut out = match &self.revision {
            Some(r) => format!(
                "meshrevisiontag/{} {} (revision {r})\n",
                self.tag, self.action
            ),
            None => format!("meshrevisiontag/{} {}\n", self.tag, self.action),
        };
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    }
}

/// The rows of `tag list` from a state; `pods` are those of the tags' namespaces.
pub fn list(state: &MeshState, pods: &[Pod]) -> TagList {
    let m = state.membership();
    let mut tags: Vec<TagRow> = state
        .tags()
        .into_iter()
        .map(|t| {
            let name = t.metadata.name.clone().unwrap_or_default();
            let resolution = m.tags.get(&name);
            let namespaces: BTreeSet<String> =
                resolution.map(|r| r.namespaces.clone()).unwrap_or_default();
            let mut tag_pods: Vec<TagPod> = pods
                .iter()
                .filter(|p| {
                    p.metadata
                        .namespace
                        .as_ref()
                        .is_some_and(|n| namespaces.contains(n))
                })
                .filter(|p| {
                    !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
                })
                .map(|p| TagPod {
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    name: p.metadata.name.clone().unwrap_or_default(),
                    injected_by: p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(names::INJECTED_REVISION_ANNOTATION))
                        .cloned(),
                })
                .collect();
            tag_pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            TagRow {
                tag: name.clone(),
                revision: t.spec.revision.clone(),
                resolves_to: resolution.and_then(|r| r.revision.clone()),
                tenant: resolution.and_then(|r| r.tenant.clone()),
                in_use: !namespaces.is_empty(),
                namespaces: namespaces.into_iter().collect(),
                pods: tag_pods,
                problems: m
                    .conflicts_of_tag(&name)
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
            }
        })
        .collect();
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    TagList { tags }
}

/// Why setting `tag` to `revision` is refused, as the operator's admission would say it:
/// the same membership rules over the same objects. Returns the warnings of an accepted set.
pub fn check_set(state: &MeshState, tag: &str, revision: &str) -> Result<Vec<String>, String> {
    let existing = state
        .tags()
        .into_iter()
        .find(|t| t.metadata.name.as_deref() == Some(tag));
    let mut candidate = TagFacts {
        name: tag.to_string(),
        target: revision.to_string(),
        recorded_tenant: None,
        recorded_revision: None,
    };
    if let Some(status) = existing.and_then(|t| t.status.as_ref()) {
        candidate.recorded_tenant = status.tenant.clone();
        candidate.recorded_revision = status.revision.clone();
    }
    let mut tags: Vec<TagFacts> = state
        .tags()
        .into_iter()
        .filter(|t| t.metadata.name.as_deref() != Some(tag))
        .map(TagFacts::from)
        .collect();
    tags.push(candidate);
    let cps: Vec<ControlPlaneFacts> = state
        .control_planes()
        .into_iter()
        .map(ControlPlaneFacts::from)
        .collect();
    let m = membership::compute(&[], &cps, &tags);
    let (refused, warnings): (Vec<&Conflict>, Vec<&Conflict>) = m
        .conflicts_of_tag(tag)
        .into_iter()
        .partition(|c| !matches!(c, Conflict::TagRevisionNotFound { .. }));
    if refused.is_empty() {
        Ok(warnings.iter().map(|c| c.to_string()).collect())
    } else {
        Err(refused
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("; "))
    }
}

fn api_error(e: kube::Error, what: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(s) => anyhow::anyhow!("{what}: {}", s.message),
        other => anyhow::Error::new(other).context(what.to_string()),
    }
}

/// Runs `meshctl tag`.
pub async fn run(
    command: &TagCommand,
    cluster_args: &ClusterArgs,
    format: Format,
) -> anyhow::Result<()> {
    let client = cluster_args.client().await?;
    let state = cluster::read_state(&client, &Scope::Namespaces(BTreeSet::new())).await?;
    let tags: Api<MeshRevisionTag> = Api::all(client.clone());
    match command {
        TagCommand::List => {
            let namespaces: BTreeSet<String> = state
                .membership()
                .tags
                .values()
                .flat_map(|r| r.namespaces.iter().cloned())
                .collect();
            let mut pods = Vec::new();
            for ns in &namespaces {
                let api: Api<Pod> = Api::namespaced(client.clone(), ns);
                let listed = api
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| api_error(e, &format!("listing pods in {ns}")))?;
                pods.extend(listed.items);
            }
            output::print(&list(&state, &pods), format)
        }
        TagCommand::Set(args) => {
            let existing = state
                .tags()
                .into_iter()
                .find(|t| t.metadata.name.as_deref() == Some(args.tag.as_str()))
                .map(|t| t.spec.revision.clone());
            if let Some(current) = &existing {
                if *current == args.revision {
                    return output::print(
                        &TagChange {
                            tag: args.tag.clone(),
                            action: "unchanged",
                            revision: Some(current.clone()),
                            warnings: Vec::new(),
                        },
                        format,
                    );
                }
                if !args.overwrite {
                    bail!(
                        "tag {:?} points at revision {current:?}; pass --overwrite to move it to {:?}",
                        args.tag,
                        args.revision
                    );
                }
            }
            let warnings = check_set(&state, &args.tag, &args.revision)
                .map_err(|reason| anyhow::anyhow!("refused: {reason}"))?;
            let body = serde_json::json!({
                "apiVersion": "meshplane.io/v1alpha1",
                "kind": "MeshRevisionTag",
                "metadata": {"name": args.tag},
                "spec": {"revision": args.revision},
            });
            tags.patch(
                &args.tag,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| api_error(e, &format!("setting tag {:?}", args.tag)))?;
            output::print(
                &TagChange {
                    tag: args.tag.clone(),
                    action: if existing.is_some() {
                        "moved"
                    } else {
                        "created"
                    },
                    revision: Some(args.revision.clone()),
                    warnings,
                },
                format,
            )
        }
        TagCommand::Remove(args) => {
            if !state
                .tags()
                .iter()
                .any(|t| t.metadata.name.as_deref() == Some(args.tag.as_str()))
            {
                bail!("no MeshRevisionTag {:?}", args.tag);
            }
            let users: Vec<String> = state
                .membership()
                .tags
                .get(&args.tag)
                .map(|r| r.namespaces.iter().cloned().collect())
                .unwrap_or_default();
            if !users.is_empty() && !args.force {
                bail!(
                    "namespaces {} are labelled {}={}; relabel them first, or pass --force (their new pods then get no sidecar)",
                    users.join(", "),
                    names::REV_LABEL,
                    args.tag
                );
            }
            tags.delete(&args.tag, &DeleteParams::default())
                .await
                .map_err(|e| api_error(e, &format!("removing tag {:?}", args.tag)))?;
            output::print(
                &TagChange {
                    tag: args.tag.clone(),
                    action: "removed",
                    revision: None,
                    warnings: Vec::new(),
                },
                format,
            )
        }
    }
}
