//! Root rotation of a self-signed tenant CA: two roots trusted during the overlap, and no
//! certificate issued at any step stops verifying before it expires.

use meshplane_ca::authority::generate_csr;
use meshplane_ca::pem::certificates;
use meshplane_ca::rotation::{
    plan, CaSecretState, RotationPolicy, RotationStep, NEXT_CA_CERT, PHASE_ANNOTATION,
    ROTATE_ANNOTATION,
};
use meshplane_ca::verify::verify_workload_chain;
use meshplane_ca::{Authority, SpiffeId};
use time::{Duration, OffsetDateTime};

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

fn step(
    state: Option<&CaSecretState>,
    policy: &RotationPolicy,
    now: OffsetDateTime,
) -> RotationStep {
    plan(state, "blue", "cluster.local", policy, now).unwrap()
}

fn written(s: RotationStep) -> CaSecretState {
    match s {
        RotationStep::Write(state) => state,
        RotationStep::Keep => panic!("expected a write"),
    }
}

fn bundle_len(state: &CaSecretState) -> usize {
    certificates(&state.data["root-cert.pem"]).unwrap().len()
}

fn issue(state: &CaSecretState, now: OffsetDateTime) -> String {
    let ca = Authority::load(&state.files().unwrap(), now).unwrap();
    let (_k, csr) = generate_csr(None).unwrap();
    ca.issue_workload(
        &csr,
        &SpiffeId::new("cluster.local", "shop", "web").unwrap(),
        Duration::hours(24),
        now,
    )
    .unwrap()
    .presented_chain_pem()
}

#[test]
fn a_requested_rotation_goes_through_both_roots_and_back_to_one() {
    let policy = RotationPolicy {
        propagation: Duration::minutes(30),
        overlap: Duration::hours(25),
        ..RotationPolicy::default()
    };
    let stable = written(step(None, &policy, t0()));
    assert_eq!(bundle_len(&stable), 1);
    assert_eq!(stable.annotations[PHASE_ANNOTATION], "Stable");
    // Steady state writes nothing.
    assert_eq!(
        step(Some(&stable), &policy, t0() + Duration::days(1)),
        RotationStep::Keep
    );
    let old_leaf = issue(&stable, t0());

    // The admin asks for a rotation.
    let mut asked = stable.clone();
    asked
        .annotations
        .insert(ROTATE_ANNOTATION.into(), "2027-01-01".into());
    let t1 = t0() + Duration::hours(1);
    let introduced = written(step(Some(&asked), &policy, t1));
    assert_eq!(introduced.annotations[PHASE_ANNOTATION], "Introduced");
    assert_eq!(bundle_len(&introduced), 2);
    // The old root still signs.
    assert_eq!(introduced.data["ca-cert.pem"], stable.data["ca-cert.pem"]);
    assert!(introduced.data.contains_key(NEXT_CA_CERT));
    let bundle = introduced.data["root-cert.pem"].clone();
    verify_workload_chain(&old_leaf, &bundle, t1).unwrap();

    // Not before the bundle had time to propagate.
    assert_eq!(
        step(Some(&introduced), &policy, t1 + Duration::minutes(29)),
        RotationStep::Keep
    );
    let t2 = t1 + Duration::minutes(31);
    let switched = written(step(Some(&introduced), &policy, t2));
    assert_eq!(switched.annotations[PHASE_ANNOTATION], "Switched");
    assert_eq!(switched.data["ca-cert.pem"], introduced.data[NEXT_CA_CERT]);
    assert!(!switched.data.contains_key(NEXT_CA_CERT));
    assert_eq!(bundle_len(&switched), 2);
    let new_leaf = issue(&switched, t2);
    // Both generations verify against the two-root bundle, and the new one also against
    // the bundle proxies had during `Introduced`.
    verify_workload_chain(&old_leaf, &switched.data["root-cert.pem"], t2).unwrap();
    verify_workload_chain(&new_leaf, &switched.data["root-cert.pem"], t2).unwrap();
    verify_workload_chain(&new_leaf, &bundle, t2).unwrap();

    // The handled request does not start another rotation.
    let t3 = t2 + Duration::hours(26);
    let done = written(step(Some(&switched), &policy, t3));
    assert_eq!(done.annotations[PHASE_ANNOTATION], "Stable");
    assert_eq!(bundle_len(&done), 1);
    assert_eq!(done.data["root-cert.pem"], switched.data["ca-cert.pem"]);
    assert_eq!(
        step(Some(&done), &policy, t3 + Duration::hours(1)),
        RotationStep::Keep
    );
    // By then the old leaf has expired anyway; the new one still verifies.
    verify_workload_chain(
        &new_leaf,
        &done.data["root-cert.pem"],
        t2 + Duration::hours(23),
    )
    .unwrap();
    assert!(verify_workload_chain(&old_leaf, &done.data["root-cert.pem"], t2).is_err());
}

#[test]
fn a_root_near_its_end_rotates_by_itself() {
    let policy = RotationPolicy {
        root_validity: Duration::days(30),
        renew_before: Duration::days(10),
        ..RotationPolicy::default()
    };
    let stable = written(step(None, &policy, t0()));
    assert_eq!(
        step(Some(&stable), &policy, t0() + Duration::days(19)),
        RotationStep::Keep
    );
    let due = written(step(Some(&stable), &policy, t0() + Duration::days(21)));
    assert_eq!(due.annotations[PHASE_ANNOTATION], "Introduced");
}

#[test]
fn an_unreadable_secret_gets_a_new_root() {
    let policy = RotationPolicy::default();
    let mut broken = CaSecretState::default();
    broken.data.insert("ca-cert.pem".into(), "garbage".into());
    broken.annotations.insert("kept".into(), "yes".into());
    let fixed = written(step(Some(&broken), &policy, t0()));
    assert!(Authority::load(&fixed.files().unwrap(), t0()).is_ok());
    assert_eq!(fixed.annotations["kept"], "yes");
}
