//! The tenant CA: what it issues, what it refuses, and how its chains verify with rustls.

use meshplane_ca::authority::{csr_for, generate_csr, CaFiles};
use meshplane_ca::pem::{certificates, dns_sans, uri_sans, validity};
use meshplane_ca::root::{
    generate_intermediate, generate_root, plugged_in_files, self_signed_files, CaCert,
    DEFAULT_ROOT_VALIDITY,
};
use meshplane_ca::verify::{verify_server_chain, verify_workload_chain};
use meshplane_ca::{Authority, CaError, SpiffeId, DEFAULT_WORKLOAD_TTL, MAX_WORKLOAD_TTL};
use time::{Duration, OffsetDateTime};

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

fn blue_root() -> CaCert {
    generate_root("blue", "cluster.local", t0(), DEFAULT_ROOT_VALIDITY).unwrap()
}

fn id(td: &str, ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new(td, ns, sa).unwrap()
}

fn leaf_uris(issued: &meshplane_ca::IssuedCert) -> Vec<String> {
    let leaf = &certificates(&issued.chain[0]).unwrap()[0];
    uri_sans(&leaf.parse().unwrap())
}

#[test]
fn a_workload_certificate_carries_the_callers_identity_not_the_csrs() {
    let root = blue_root();
    let ca = Authority::load(&self_signed_files(&root), t0()).unwrap();
    // The CSR asks for the identity of another namespace's ServiceAccount.
    let (_key, csr) = generate_csr(Some("spiffe://cluster.local/ns/bank/sa/admin")).unwrap();
    let caller = id("cluster.local", "shop", "web");
    let issued = ca
        .issue_workload(&csr, &caller, Duration::ZERO, t0())
        .unwrap();

    assert_eq!(leaf_uris(&issued), vec![caller.uri()]);
    // Full chain, root last; for a self-signed root that is leaf then root.
    assert_eq!(issued.chain.len(), 2);
    assert_eq!(issued.root_pem(), root.cert_pem);
    let got = verify_workload_chain(&issued.presented_chain_pem(), &root.cert_pem, t0()).unwrap();
    assert_eq!(got, caller);
    // Default lifetime.
    assert_eq!(issued.not_after - t0(), DEFAULT_WORKLOAD_TTL);
}

#[test]
fn lifetimes_are_bounded_by_the_maximum_and_by_the_signing_certificate() {
    let root = blue_root();
    let ca = Authority::load(&self_signed_files(&root), t0()).unwrap();
    let (_key, csr) = generate_csr(None).unwrap();
    let caller = id("cluster.local", "shop", "web");
    let short = ca
        .issue_workload(&csr, &caller, Duration::minutes(2), t0())
        .unwrap();
    assert_eq!(short.not_after - t0(), Duration::minutes(2));
    let long = ca
        .issue_workload(&csr, &caller, Duration::days(10_000), t0())
        .unwrap();
    assert_eq!(long.not_after - t0(), MAX_WORKLOAD_TTL);
    // Near the end of the CA's life, nothing outlives it.
    let late = t0() + DEFAULT_ROOT_VALIDITY - Duration::hours(1);
    let capped = ca
        .issue_workload(&csr, &caller, Duration::hours(24), late)
        .unwrap();
    assert_eq!(capped.not_after, ca.not_after());
    // The issued certificate's own validity says the same.
    let leaf = &certificates(&capped.chain[0]).unwrap()[0];
    assert_eq!(validity(&leaf.parse().unwrap()).unwrap().1, ca.not_after());
}

#[test]
fn a_csr_whose_signature_does_not_verify_is_refused() {
    let ca = Authority::load(&self_signed_files(&blue_root()), t0()).unwrap();
    let (_key, csr) = generate_csr(None).unwrap();
    // Flip one byte of the DER inside the PEM (in the signature, near the end).
    let block = pem::parse(&csr).unwrap();
    let mut der = block.contents().to_vec();
    let n = der.len();
    der[n - 3] ^= 0x55;
    let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
    let err = ca
        .issue_workload(
            &tampered,
            &id("cluster.local", "shop", "web"),
            Duration::ZERO,
            t0(),
        )
        .unwrap_err();
    assert!(matches!(err, CaError::BadCsr(_)), "{err}");
    let err = ca
        .issue_workload(
            "not a csr",
            &id("cluster.local", "shop", "web"),
            Duration::ZERO,
            t0(),
        )
        .unwrap_err();
    assert!(matches!(err, CaError::BadCsr(_)), "{err}");
}

#[test]
fn an_intermediate_of_an_organisation_root_issues_the_full_chain() {
    let org = generate_root("org", "example.org", t0(), DEFAULT_ROOT_VALIDITY).unwrap();
    let blue_int =
        generate_intermediate(&org, "blue intermediate", t0(), Duration::days(365)).unwrap();
    let files = plugged_in_files(&blue_int, &org.cert_pem);
    let ca = Authority::load(&files, t0()).unwrap();
    assert_eq!(ca.trust_bundle_pem(), org.cert_pem);

    let (_key, csr) = generate_csr(None).unwrap();
    let caller = id("blue.example.org", "shop", "web");
    let issued = ca
        .issue_workload(&csr, &caller, Duration::ZERO, t0())
        .unwrap();
    // Leaf, intermediate, root.
    assert_eq!(issued.chain.len(), 3);
    assert_eq!(issued.chain[1], blue_int.cert_pem);
    assert_eq!(issued.chain[2], org.cert_pem);
    assert_eq!(
        verify_workload_chain(&issued.presented_chain_pem(), &org.cert_pem, t0()).unwrap(),
        caller
    );
    // Without the intermediate the leaf does not verify.
    assert!(verify_workload_chain(&issued.chain[0], &org.cert_pem, t0()).is_err());
    // cert-chain.pem may also leave out the intermediate itself or the root.
    let terse = CaFiles {
        cert_chain: String::new(),
        ..files
    };
    let again = Authority::load(&terse, t0())
        .unwrap()
        .issue_workload(&csr, &caller, Duration::ZERO, t0())
        .unwrap();
    assert_eq!(again.chain.len(), 3);

    // Green shares the organisation root with its own intermediate and trust domain: its
    // chain verifies under the shared root, so only the trust domain tells them apart, which is
    // why every SAN match of the mesh includes the trust domain.
    let green_int =
        generate_intermediate(&org, "green intermediate", t0(), Duration::days(365)).unwrap();
    let green = Authority::load(&plugged_in_files(&green_int, &org.cert_pem), t0()).unwrap();
    let green_leaf = green
        .issue_workload(
            &csr,
            &id("green.example.org", "shop", "web"),
            Duration::ZERO,
            t0(),
        )
        .unwrap();
    let got =
        verify_workload_chain(&green_leaf.presented_chain_pem(), &org.cert_pem, t0()).unwrap();
    assert_eq!(got.trust_domain(), "green.example.org");
    assert_ne!(got, caller);
}

#[test]
fn separate_tenant_roots_do_not_trust_each_other() {
    let blue = blue_root();
    let green = generate_root("green", "cluster.local", t0(), DEFAULT_ROOT_VALIDITY).unwrap();
    let green_ca = Authority::load(&self_signed_files(&green), t0()).unwrap();
    let (_key, csr) = generate_csr(None).unwrap();
    let issued = green_ca
        .issue_workload(
            &csr,
            &id("cluster.local", "shop", "web"),
            Duration::ZERO,
            t0(),
        )
        .unwrap();
    let err =
        verify_workload_chain(&issued.presented_chain_pem(), &blue.cert_pem, t0()).unwrap_err();
    assert!(matches!(err, CaError::Untrusted(_)), "{err}");
}

#[test]
fn a_serving_certificate_names_the_instance_service() {
    let root = blue_root();
    let ca = Authority::load(&self_signed_files(&root), t0()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let host = "meshplane-blue-v1.meshplane-blue.svc".to_string();
    let instance = id("cluster.local", "meshplane-blue", "meshplane-blue-v1");
    let issued = ca
        .issue_serving(
            &key,
            std::slice::from_ref(&host),
            Some(&instance),
            Duration::hours(24),
            t0(),
        )
        .unwrap();
    let leaf = &certificates(&issued.chain[0]).unwrap()[0];
    assert_eq!(dns_sans(&leaf.parse().unwrap()), vec![host.clone()]);
    assert_eq!(uri_sans(&leaf.parse().unwrap()), vec![instance.uri()]);
    verify_server_chain(&issued.presented_chain_pem(), &host, &root.cert_pem, t0()).unwrap();
    assert!(verify_server_chain(
        &issued.presented_chain_pem(),
        "meshplane-green-v1.meshplane-green.svc",
        &root.cert_pem,
        t0()
    )
    .is_err());
    let green = generate_root("green", "cluster.local", t0(), DEFAULT_ROOT_VALIDITY).unwrap();
    assert!(
        verify_server_chain(&issued.presented_chain_pem(), &host, &green.cert_pem, t0()).is_err()
    );
    // Expired by the time it is checked.
    assert!(verify_server_chain(
        &issued.presented_chain_pem(),
        &host,
        &root.cert_pem,
        t0() + Duration::hours(25)
    )
    .is_err());
}

#[test]
fn bad_ca_material_is_refused_with_a_reason() {
    let root = blue_root();
    let other = generate_root("green", "cluster.local", t0(), DEFAULT_ROOT_VALIDITY).unwrap();
    let good = self_signed_files(&root);

    let mismatched = CaFiles {
        ca_key: other.key_pem.clone(),
        ..good.clone()
    };
    assert_eq!(
        Authority::load(&mismatched, t0()).unwrap_err(),
        CaError::KeyMismatch
    );

    let unanchored = CaFiles {
        root_cert: other.cert_pem.clone(),
        ..good.clone()
    };
    assert_eq!(
        Authority::load(&unanchored, t0()).unwrap_err(),
        CaError::Unanchored
    );

    assert!(matches!(
        Authority::load(&good, t0() + DEFAULT_ROOT_VALIDITY + Duration::days(1)).unwrap_err(),
        CaError::NotValidNow { .. }
    ));

    // A leaf certificate is no CA.
    let ca = Authority::load(&good, t0()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = ca
        .issue_serving(&key, &["x.svc".into()], None, Duration::hours(1), t0())
        .unwrap();
    let not_ca = CaFiles {
        ca_cert: leaf.chain[0].clone(),
        ca_key: key.serialize_pem(),
        ..good.clone()
    };
    assert_eq!(
        Authority::load(&not_ca, t0()).unwrap_err(),
        CaError::NotACa("ca-cert.pem")
    );

    let garbage_key = CaFiles {
        ca_key: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
        ..good.clone()
    };
    assert!(matches!(
        Authority::load(&garbage_key, t0()).unwrap_err(),
        CaError::BadKey(_)
    ));
    let empty_bundle = CaFiles {
        root_cert: String::new(),
        ..good.clone()
    };
    assert_eq!(
        Authority::load(&empty_bundle, t0()).unwrap_err(),
        CaError::Empty("root-cert.pem")
    );
    let missing = CaFiles::from_lookup(|k| (k != "ca-key.pem").then(String::new)).unwrap_err();
    assert_eq!(missing, CaError::MissingKey("ca-key.pem"));
}

#[test]
fn a_csr_for_a_key_proves_possession_of_that_key() {
    // The issued leaf carries the CSR's public key, so only the key's holder can use it.
    let ca = Authority::load(&self_signed_files(&blue_root()), t0()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = csr_for(&key, None).unwrap();
    let issued = ca
        .issue_workload(
            &csr,
            &id("cluster.local", "shop", "web"),
            Duration::ZERO,
            t0(),
        )
        .unwrap();
    let leaf = &certificates(&issued.chain[0]).unwrap()[0];
    let parsed = leaf.parse().unwrap();
    assert_eq!(
        parsed.public_key().subject_public_key.data.as_ref(),
        key.public_key_raw()
    );
}
