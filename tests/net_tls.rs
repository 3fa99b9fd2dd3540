//! `wss://` against a loopback TLS relay: a certificate from a configured
//! private CA works; an untrusted one is refused and backed off, never
//! downgraded.

mod support;

use std::time::Duration;

use grasp_sync::testing::relay::{RelayOptions, TestRelay, server_tls_config};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use support::running::*;
use support::*;

/// A CA and a `localhost` leaf it signed: (CA PEM, leaf PEM, leaf key PEM).
fn test_ca() -> (String, String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
}

fn tls_relay() -> (TestRelay, String) {
    let (ca, leaf, key) = test_ca();
    let tls = server_tls_config(leaf.as_bytes(), key.as_bytes()).unwrap();
    (
        TestRelay::start(RelayOptions {
            tls: Some(tls),
            ..RelayOptions::default()
        })
        .unwrap(),
        ca,
    )
}

#[test]
fn wss_with_a_configured_private_ca_syncs() {
    let (secure, ca) = tls_relay();
    assert!(secure.url().starts_with("wss://localhost:"));
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&secure.url()], T0));
    let comment = repo_comment(&keys(2), &coord(&owner, "repo"), T0, "over TLS");
    secure.publish(comment.clone());
    let ca_file = ScratchFile::new("tls-trusted", "ca.pem", &ca);
    let running = Running::start(&own, |_, o| o.extra_ca_files = vec![ca_file.path()]);
    assert!(wait_for(20, || own.has(&comment.id)), "synced over wss");
    running.stop();
}

#[test]
fn wss_with_an_untrusted_certificate_is_refused_and_backed_off() {
    let (secure, _ca) = tls_relay();
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&secure.url()], T0));
    let comment = repo_comment(&keys(2), &coord(&owner, "repo"), T0, "over TLS");
    secure.publish(comment.clone());
    let running = Running::start(&own, |_, _| {});
    let failed = "grasp_sync_connection_attempts_total{result=\"failed\"}";
    assert!(
        wait_for(20, || running.metric(failed) >= 2),
        "refused, then retried after a backoff"
    );
    assert!(
        !own.has(&comment.id),
        "nothing synced over an unverified connection"
    );
    assert_eq!(
        secure.req_count(),
        0,
        "no REQ ever reached the untrusted relay"
    );
    std::thread::sleep(Duration::from_millis(100));
    running.stop();
}
