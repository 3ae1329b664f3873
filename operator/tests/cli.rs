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
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}
