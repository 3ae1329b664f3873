//! `meshctl analyze`: pure checks over a [`MeshState`] (a cluster's objects or a directory's),
//! each finding with a stable [`codes::Code`] and a message. The rules are the product's own:
//! membership from `meshplane_crds::membership`, config checks from the validating webhook
//! (`meshplane_webhooks::validate`), EnvoyFilter patches from the xds-server's index. Only the
//! proxy checks need a live cluster: they read the instances' sync state.

pub mod codes;
mod config;
mod membership;
mod pods;
pub mod proxies;

use meshplane_crds::membership::Membership;
use serde::Serialize;

use crate::output::{Report, Table};
use crate::state::MeshState;
pub use codes::{Code, Severity};

/// One problem found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// `MPnnnn`.
    pub code: &'static str,
    /// The code's name.
    pub name: &'static str,
    pub severity: Severity,
    /// `Kind namespace/name` of the object concerned.
    pub object: String,
    /// The file it was read from (offline), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    pub message: String,
}

impl Finding {
    pub fn new(code: Code, object: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            code: code.id,
            name: code.name,
            severity: code.severity,
            object: object.into(),
            origin: None,
            message: message.into(),
        }
    }

    pub fn at(mut self, origin: impl Into<String>) -> Self {
        let origin = origin.into();
        if origin != crate::cluster::ORIGIN {
            self.origin = Some(origin);
        }
        self
    }
}

/// What the checks read.
pub struct Context<'a> {
    pub state: &'a MeshState,
    pub membership: Membership,
}

/// Every finding of the state-only checks, sorted (severity, code, object).
pub fn analyze(state: &MeshState) -> Vec<Finding> {
    let cx = Context {
        state,
        membership: state.membership(),
    };
    let mut findings = Vec::new();
    membership::check(&cx, &mut findings);
    config::check(&cx, &mut findings);
    pods::check(&cx, &mut findings);
    sort(&mut findings);
    findings
}

/// Sorts findings: errors first, then by code and object.
pub fn sort(findings: &mut Vec<Finding>) {
    findings.sort_by(|a, b| {
        (a.severity, a.code, &a.object, &a.message)
            .cmp(&(b.severity, b.code, &b.object, &b.message))
    });
    findings.dedup();
}

/// What `meshctl analyze` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnalyzeReport {
    /// What was analyzed: a directory, or the cluster.
    pub source: String,
    pub findings: Vec<Finding>,
    /// Checks that could not run, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl AnalyzeReport {
    /// Whether a finding is at least as severe as `threshold`.
    pub fn fails(&self, threshold: Option<Severity>) -> bool {
        threshold.is_some_and(|t| self.findings.iter().any(|f| f.severity <= t))
    }
}

impl Report for AnalyzeReport {
    fn human(&self, wide: bool) -> String {
        let mut out = String::new();
        if self.findings.is_empty() {
            out.push_str(&format!("no problems found in {}\n", self.source));
        } else {
            let mut table = if wide {
                Table::new(["code", "severity", "name", "object", "origin", "message"])
            } else {
                Table::new(["code", "severity", "object", "message"])
            };
            for f in &self.findings {
                if wide {
                    table.row([
                        f.code.to_string(),
                        f.severity.as_str().to_string(),
                        f.name.to_string(),
                        f.object.clone(),
                        f.origin.clone().unwrap_or_default(),
                        f.message.clone(),
                    ]);
                } else {
                    table.row([
                        f.code.to_string(),
                        f.severity.as_str().to_string(),
                        f.object.clone(),
                        f.message.clone(),
                    ]);
                }
            }
            out.push_str(&table.render());
            let count = |s: Severity| self.findings.iter().filter(|f| f.severity == s).count();
            let plural = |n: usize, one: &str| {
                if n == 1 {
                    format!("1 {one}")
                } else {
                    format!("{n} {one}s")
                }
            };
            out.push_str(&format!(
                "{}, {}, {} info in {}\n",
                plural(count(Severity::Error), "error"),
                plural(count(Severity::Warning), "warning"),
                count(Severity::Info),
                self.source
            ));
        }
        for s in &self.skipped {
            out.push_str(&format!("not checked: {s}\n"));
        }
        out
    }
}

/// `meshctl analyze --list-codes`.
#[derive(Debug, Serialize)]
pub struct CodeList(pub Vec<Code>);

impl Report for CodeList {
    fn human(&self, _wide: bool) -> String {
        let mut table = Table::new(["code", "name", "severity", "meaning"]);
        for c in &self.0 {
            table.row([c.id, c.name, c.severity.as_str(), c.summary]);
        }
        table.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_each_severity_in_plain_english() {
        let report = |findings| AnalyzeReport {
            source: "the cluster".into(),
            findings,
            skipped: Vec::new(),
        };
        let one_each = report(vec![
            Finding::new(codes::NAMESPACE_OUTSIDE_SELECTOR, "Namespace a", "outside"),
            Finding::new(codes::POD_REVISION_MISMATCH, "Pod a/b", "old sidecar"),
        ]);
        assert!(one_each
            .human(false)
            .ends_with("\n1 error, 1 warning, 0 info in the cluster\n"));
        let two_errors = report(vec![
            Finding::new(codes::NAMESPACE_OUTSIDE_SELECTOR, "Namespace a", "outside"),
            Finding::new(codes::NAMESPACE_OUTSIDE_SELECTOR, "Namespace b", "outside"),
        ]);
        assert!(two_errors
            .human(false)
            .ends_with("\n2 errors, 0 warnings, 0 info in the cluster\n"));
        assert_eq!(
            report(Vec::new()).human(false),
            "no problems found in the cluster\n"
        );
    }
}
