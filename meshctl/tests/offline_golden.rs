//! `meshctl translate`, `analyze` and `describe pod` offline, run as the binary against the
//! directories of `tests/golden/<case>/manifests`. The analyzer's findings (code, severity,
//! object, file) are compared with `analyze.codes` beside them (rewritten with
//! `UPDATE_GOLDEN=1`): they are meshctl's own contract. Translation output is asserted by what it
//! must and must not contain, not byte for byte, so that translation work elsewhere does not
//! break these tests for reasons that are not meshctl's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case)
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs meshctl from the case directory (so paths in the output are relative and stable).
fn meshctl(case: &str, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_meshctl"))
        .args(args)
        .current_dir(golden_dir(case))
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "error")
        .output()
        .expect("meshctl runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn check_golden(case: &str, file: &str, actual: &str) {
    let path = golden_dir(case).join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert!(
        expected == actual,
        "{} differs from the output (UPDATE_GOLDEN=1 rewrites it):\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

#[test]
fn translate_gives_the_pods_configuration_scoped_to_its_tenant() {
    let run = meshctl(
        "tenants",
        &[
            "translate",
            "-f",
            "manifests",
            "--pod",
            "shop/web-1",
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(report["proxy"]["tenant"], "blue");
    assert_eq!(report["proxy"]["revision"], "blue-v1");
    assert_eq!(report["proxy"]["tag"], "blue-stable");
    let clusters: Vec<&str> = report["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    // The Sidecar imports shop and pay; green's garden never appears.
    assert!(
        clusters.contains(&"outbound|8080||web.shop.svc.cluster.local"),
        "{clusters:?}"
    );
    assert!(
        clusters.contains(&"outbound|9090||api.pay.svc.cluster.local"),
        "{clusters:?}"
    );
    assert!(
        !run.stdout.contains("garden"),
        "green's service leaked into blue's config"
    );
    // The tenant-wide EnvoyFilter in meshplane-blue added its header to the outbound routes.
    assert!(run.stdout.contains("x-meshplane-tenant"));
}

#[test]
fn translate_table_lists_resources_and_a_type_filter_narrows_it() {
    let run = meshctl(
        "tenants",
        &[
            "translate",
            "-f",
            "manifests",
            "--pod",
            "shop/web-1",
            "--type",
            "cds",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("workload shop/web-1 of tenant blue, served by revision blue-v1")
    );
    assert!(
        lines.get(1).is_some_and(|l| l.starts_with("TYPE ")),
        "{}",
        run.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cluster ")
                && l.contains("outbound|9090||api.pay.svc.cluster.local")),
        "{}",
        run.stdout
    );
    assert!(
        lines[2..].iter().all(|l| l.starts_with("cluster ")),
        "--type cds shows clusters only:\n{}",
        run.stdout
    );
}

#[test]
fn translate_of_a_workload_in_a_namespace_of_no_tenant_says_how_to_join() {
    let run = meshctl(
        "broken",
        &[
            "translate",
            "-f",
            "manifests",
            "--namespace",
            "lonely",
            "--labels",
            "app=x",
        ],
    );
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("namespace \"lonely\" belongs to no tenant")
            && run.stderr.contains("meshplane.io/rev="),
        "{}",
        run.stderr
    );
    let run = meshctl(
        "broken",
        &["translate", "-f", "manifests", "--pod", "outsider/nope"],
    );
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("no Pod outsider/nope"),
        "{}",
        run.stderr
    );
}

#[test]
fn analyze_of_a_consistent_directory_finds_nothing() {
    let run = meshctl("tenants", &["analyze", "-f", "manifests"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    check_golden("tenants", "analyze.txt", &run.stdout);
}

/// `CODE SEVERITY OBJECT (FILE)` of each finding of an `analyze -o json` report.
fn finding_lines(report: &serde_json::Value) -> String {
    let mut out = String::new();
    for f in report["findings"].as_array().expect("findings") {
        let s = |k: &str| f[k].as_str().unwrap_or("-").to_string();
        out.push_str(&format!(
            "{} {} {} ({})\n",
            s("code"),
            s("severity"),
            s("object"),
            s("origin")
        ));
    }
    out
}

#[test]
fn analyze_reports_every_problem_with_its_code_and_fails() {
    let run = meshctl("broken", &["analyze", "-f", "manifests"]);
    assert_eq!(run.code, Some(3), "{}{}", run.stdout, run.stderr);
    let mut lines = run.stdout.lines();
    assert!(lines
        .next()
        .is_some_and(|h| h.starts_with("CODE ") && h.contains("MESSAGE")));
    assert!(
        run.stdout
            .contains("\n19 errors, 5 warnings, 2 info in manifests\n"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("MP0302   Error      Namespace typo ")
            && run
                .stdout
                .contains("meshplane.io/rev=bleu, which names no revision or tag"),
        "{}",
        run.stdout
    );
    let json = meshctl("broken", &["analyze", "-f", "manifests", "-o", "json"]);
    assert_eq!(json.code, Some(3));
    let report: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    check_golden("broken", "analyze.codes", &finding_lines(&report));
    let codes: std::collections::BTreeSet<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["code"].as_str())
        .collect();
    // Each manifest of the case plants one problem of these kinds.
    for code in [
        "MP0101", "MP0104", "MP0105", "MP0201", "MP0202", "MP0203", "MP0204", "MP0301", "MP0302",
        "MP0303", "MP0304", "MP0401", "MP0402", "MP0403", "MP0404", "MP0405", "MP0406", "MP0501",
        "MP0601", "MP0602", "MP0603", "MP0604",
    ] {
        assert!(codes.contains(code), "{code} missing from {codes:?}");
    }
    // Opted-out and finished pods are fine.
    assert!(!json.stdout.contains("Pod shop/batch") && !json.stdout.contains("Pod shop/done"));
    // The YAML form carries the same findings.
    let yaml = meshctl("broken", &["analyze", "-f", "manifests", "-o", "yaml"]);
    assert_eq!(yaml.code, Some(3));
    assert!(yaml.stdout.contains("code: MP0604"), "{}", yaml.stdout);
}

#[test]
fn analyze_fail_on_decides_the_exit_code() {
    let never = meshctl(
        "broken",
        &["analyze", "-f", "manifests", "--fail-on", "never"],
    );
    assert_eq!(never.code, Some(0));
    let info = meshctl(
        "tenants",
        &["analyze", "-f", "manifests", "--fail-on", "info"],
    );
    assert_eq!(
        info.code,
        Some(0),
        "the consistent case has no finding at all"
    );
}

#[test]
fn list_codes_names_every_code_once() {
    let run = meshctl("tenants", &["analyze", "--list-codes", "-o", "json"]);
    assert_eq!(run.code, Some(0));
    let codes: Vec<serde_json::Value> = serde_json::from_str(&run.stdout).expect("JSON");
    assert!(codes.len() >= 20);
    let ids: std::collections::BTreeSet<&str> =
        codes.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids.len(), codes.len());
}

#[test]
fn describe_pod_offline_shows_tenant_sidecar_filters_and_routes() {
    let run = meshctl(
        "tenants",
        &["describe", "pod", "web-1", "-n", "shop", "-f", "manifests"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for line in [
        "Pod:              shop/web-1",
        "Tenant:           blue",
        "Revision:         blue-v1",
        "Namespace joins:  blue-v1 (through tag blue-stable)",
        "Sidecar:          shop/default (the namespace's default)",
        "  egress          every port: ./*, pay/*",
        "  meshplane-blue/add-tenant-header (tenant-wide)",
        "  web.shop.svc.cluster.local (http 8080)",
        "    prefix / → outbound|9090||api.pay.svc.cluster.local",
    ] {
        assert!(
            run.stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{}",
            run.stdout
        );
    }
    assert!(!run.stdout.contains("garden"), "{}", run.stdout);
    let run = meshctl(
        "broken",
        &[
            "describe",
            "pod",
            "pay/api-old",
            "-f",
            "manifests",
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
    // Served by the revision that injected it, while new pods of pay get blue-v2.
    assert_eq!(report["revision"], "blue-v1");
    assert_eq!(report["namespaceRevision"], "blue-v2");
    assert_eq!(report["findings"][0]["code"], "MP0601");
}

#[test]
fn completion_scripts_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let run = meshctl("tenants", &["completion", shell]);
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(
            run.stdout.contains("proxy-status") || run.stdout.contains("analyze"),
            "{shell}"
        );
    }
}

#[test]
fn version_client_needs_no_cluster() {
    let run = meshctl("tenants", &["version", "--client", "-o", "json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(v["client"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_user_guide_lists_every_analyzer_code() {
    let run = meshctl("tenants", &["analyze", "--list-codes", "-o", "json"]);
    let codes: Vec<serde_json::Value> = serde_json::from_str(&run.stdout).expect("JSON");
    let guide_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/meshctl.md");
    let guide = std::fs::read_to_string(&guide_path).expect("docs/guide/meshctl.md");
    for c in &codes {
        let row = format!(
            "| `{}` | {} | {} | {} |",
            c["id"].as_str().unwrap_or_default(),
            c["name"].as_str().unwrap_or_default(),
            c["severity"].as_str().unwrap_or_default(),
            c["summary"].as_str().unwrap_or_default()
        );
        assert!(
            guide.lines().any(|l| l == row),
            "docs/guide/meshctl.md lacks (or has another text for) {row}"
        );
    }
}
