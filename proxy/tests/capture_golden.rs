//! Golden tests of the capture rules for the annotation combinations.
//!
//! Each case goes the whole way a pod's annotations go: parsed and validated as the injector
//! does, rendered as the init container's arguments, parsed back by `meshplane-proxy capture`'s
//! command line, and rendered as the `iptables-restore` input of both tables. The golden files
//! in `tests/golden/capture/` show the annotations, the arguments and the rules (the same text
//! that `iptables-save` prints back, checked by `capture_netns`). Rewrite them with
//! `UPDATE_GOLDEN=1 cargo test -p meshplane-proxy --test capture_golden`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use meshplane_crds::capture::{init_container_args, CaptureScope};
use meshplane_crds::names;
use meshplane_proxy::capture::{restore_input, Family};
use meshplane_proxy::cli::{Cli, Command};

/// Renders one case: what the golden file holds.
fn render(annotations: &[(&str, &str)]) -> String {
    let map: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let scope = CaptureScope::from_annotations(Some(&map)).expect("valid annotations");
    let args = init_container_args(&scope);
    let argv = ["meshplane-proxy".to_owned(), "capture".to_owned()]
        .into_iter()
        .chain(args.iter().cloned());
    let Some(Command::Capture(parsed)) = Cli::try_parse_from(argv).expect("args parse").command
    else {
        panic!("expected the capture subcommand");
    };
    let plan = parsed.plan();
    assert_eq!(plan.scope, scope, "the arguments lose nothing of the scope");

    let mut out = String::from("# annotations:\n");
    if annotations.is_empty() {
        out.push_str("#   (none)\n");
    }
    for (k, v) in annotations {
        out.push_str(&format!("#   {k}: {v:?}\n"));
    }
    out.push_str(&format!("# args: capture {}\n", args.join(" ")));
    out.push_str(&restore_input(&plan, Family::V4, &[]));
    out.push_str("# with --ipv6=capture:\n");
    out.push_str(&restore_input(&plan, Family::V6, &[]));
    out
}

fn assert_golden(name: &str, annotations: &[(&str, &str)]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/capture")
        .join(format!("{name}.rules"));
    let actual = render(annotations);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert_eq!(
        actual,
        expected,
        "{} differs; rerun with UPDATE_GOLDEN=1 if the change is intended",
        path.display()
    );
}

#[test]
fn no_annotations_capture_every_tcp_connection() {
    assert_golden("default", &[]);
}

#[test]
fn inbound_ports_listed() {
    assert_golden(
        "include_inbound_ports",
        &[(names::INCLUDE_INBOUND_PORTS_ANNOTATION, "9090,8080")],
    );
}

#[test]
fn inbound_capture_off() {
    assert_golden(
        "include_inbound_ports_empty",
        &[(names::INCLUDE_INBOUND_PORTS_ANNOTATION, "")],
    );
}

#[test]
fn inbound_ports_excluded() {
    assert_golden(
        "exclude_inbound_ports",
        &[(names::EXCLUDE_INBOUND_PORTS_ANNOTATION, "8081, 9090")],
    );
}

#[test]
fn inbound_exclusion_wins_over_inclusion() {
    assert_golden(
        "include_and_exclude_inbound_ports",
        &[
            (names::INCLUDE_INBOUND_PORTS_ANNOTATION, "8080,9090"),
            (names::EXCLUDE_INBOUND_PORTS_ANNOTATION, "9090"),
        ],
    );
}

#[test]
fn outbound_ports_excluded() {
    assert_golden(
        "exclude_outbound_ports",
        &[(names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION, "3306,5432")],
    );
}

#[test]
fn outbound_by_port_only() {
    assert_golden(
        "include_outbound_ports_only",
        &[
            (names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION, ""),
            (names::INCLUDE_OUTBOUND_PORTS_ANNOTATION, "443,80"),
        ],
    );
}

#[test]
fn outbound_ranges_listed_per_family() {
    assert_golden(
        "include_outbound_ranges",
        &[(
            names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            "198.18.0.0/16,2001:db8::/32",
        )],
    );
}

#[test]
fn outbound_ranges_excluded_per_family() {
    assert_golden(
        "exclude_outbound_ranges",
        &[(
            names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            "198.18.9.0/24,198.19.0.7,2001:db8:1::/48",
        )],
    );
}

#[test]
fn a_loopback_range_included_captures_the_apps_loopback_traffic() {
    assert_golden(
        "include_loopback_range",
        &[(
            names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            "127.0.0.0/8,198.18.0.0/15",
        )],
    );
}

#[test]
fn every_annotation_at_once() {
    assert_golden(
        "all_annotations",
        &[
            (names::INCLUDE_INBOUND_PORTS_ANNOTATION, "8080"),
            (names::EXCLUDE_INBOUND_PORTS_ANNOTATION, "8081"),
            (names::INCLUDE_OUTBOUND_PORTS_ANNOTATION, "443"),
            (names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION, "5432"),
            (
                names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "198.18.0.0/15",
            ),
            (
                names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
                "198.18.200.0/24",
            ),
        ],
    );
}
