//! The binary's command line is a contract with the manager Deployment and the e2e suite.

use std::process::Command;

#[test]
fn help_documents_the_flags_the_deployment_and_e2e_use() {
    let out = Command::new(env!("CARGO_BIN_EXE_meshplane-operator"))
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--metrics-addr",
        "--webhook-addr",
        "--webhook-tls-dir",
        "--leader-election",
        "--lease-namespace",
        "--tls-validity-days",
        "--log-format",
        "--apiserver-client-ca",
        "--apiserver-client-name",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn an_unreadable_apiserver_client_ca_stops_the_operator_at_start() {
    let missing = std::env::temp_dir().join(format!(
        "meshplane-no-such-client-ca-{}.crt",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_meshplane-operator"))
        .arg(format!("--apiserver-client-ca={}", missing.display()))
        // The flag is checked before the cluster is dialled: no cluster needed to fail.
        .env("KUBECONFIG", missing.with_extension("kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--apiserver-client-ca"), "{stderr}");
}

#[test]
fn a_client_name_needs_the_client_ca() {
    let out = Command::new(env!("CARGO_BIN_EXE_meshplane-operator"))
        .arg("--apiserver-client-name=kube-apiserver-admission")
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--apiserver-client-ca"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
