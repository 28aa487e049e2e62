use super::*;
use serde_json::json;

const KEY_A: &str = "c2VjcmV0IGlzIHNlY3VyZSwgaXMgaXQgbm90ID8hISE="; // 32 bytes
const KEY_B: &str = "MTIzNDU2Nzg5MDEyMzQ1Ng=="; // 16 bytes
const KEY_C: &str = "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4"; // 24 bytes

fn config(providers: &str) -> EncryptionConfig {
    EncryptionConfig::parse(&format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, '*.apps']\n  providers:\n{providers}"
    ))
    .unwrap()
}

fn gcm(name: &str, key: &str) -> String {
    format!("  - aesgcm: {{keys: [{{name: {name}, secret: {key}}}]}}\n")
}

fn secret(name: &str, value: &str) -> Object {
    Object::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "db"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                                     format!("{{\"data\":{{\"password\":\"{}\"}}}}", B64.encode(value))}},
        "type": "Opaque",
        "data": {"password": B64.encode(value)},
    }))
    .unwrap()
}

const SECRETS: &str = "/registry/core/secrets/default/db";

fn text_of(o: &Object) -> String {
    serde_json::to_string(o).unwrap()
}

#[test]
fn every_provider_seals_and_opens_and_keeps_what_selectors_read() {
    for providers in [
        gcm("k1", KEY_A),
        gcm("k1", KEY_B),
        gcm("k1", KEY_C),
        format!("  - aescbc: {{keys: [{{name: k1, secret: {KEY_A}}}]}}\n"),
        format!("  - aescbc: {{keys: [{{name: k1, secret: {KEY_C}}}]}}\n"),
        format!("  - secretbox: {{keys: [{{name: k1, secret: {KEY_A}}}]}}\n"),
    ] {
        let c = config(&providers);
        let plain = secret("db", "hunter2-known");
        let sealed = c.seal(SECRETS, plain.clone()).unwrap();
        let text = text_of(&sealed);
        assert!(
            !text.contains(&B64.encode("hunter2-known")),
            "{providers}: {text}"
        );
        assert!(!text.contains("password"), "{providers}: {text}");
        assert!(EncryptionConfig::is_sealed(&sealed));
        // Metadata but annotations, and type, stay readable (selectors, the store's
        // bookkeeping).
        assert_eq!(sealed.metadata.labels, plain.metadata.labels);
        assert_eq!(sealed.metadata.name, plain.metadata.name);
        assert!(sealed.metadata.annotations.is_empty());
        assert_eq!(sealed.other.get("type"), Some(&json!("Opaque")));
        assert_eq!(c.open(sealed.clone()).unwrap(), plain, "{providers}");
        // Two sealings of one object differ (a fresh nonce each time).
        let again = c.seal(SECRETS, plain.clone()).unwrap();
        assert_ne!(text_of(&again), text, "{providers}");
    }
}

#[test]
fn what_no_rule_covers_and_identity_first_are_stored_as_they_are() {
    let c = config(&gcm("k1", KEY_A));
    let cm = Object::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"}, "data": {"a": "b"}}))
    .unwrap();
    assert_eq!(
        c.seal("/registry/core/configmaps/default/x", cm.clone())
            .unwrap(),
        cm
    );
    // A wildcard group covers its kinds.
    let d = Object::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": 3}}))
    .unwrap();
    let sealed = c
        .seal("/registry/apps/deployments/default/web", d.clone())
        .unwrap();
    assert!(EncryptionConfig::is_sealed(&sealed) && sealed.spec.is_none());
    assert_eq!(c.open(sealed).unwrap(), d);
    // Everything, but never a Lease (the store checks the leader's in its transactions).
    let all = EncryptionConfig::parse(&format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: ['*.*']\n  providers:\n{}",
        gcm("k1", KEY_A)
    ))
    .unwrap();
    let lease = Object::from_value(
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "orrery-controllers", "namespace": "orrery-system"},
        "spec": {"holderIdentity": "a"}}),
    )
    .unwrap();
    let key = "/registry/coordination.k8s.io/leases/orrery-system/orrery-controllers";
    assert_eq!(all.seal(key, lease.clone()).unwrap(), lease);
    assert!(EncryptionConfig::is_sealed(
        &all.seal("/registry/core/configmaps/default/x", cm.clone())
            .unwrap()
    ));
    // identity first: written in the clear, what was sealed still opens.
    let sealed = c.seal(SECRETS, secret("db", "v")).unwrap();
    let clear_first = config(&format!("  - identity: {{}}\n{}", gcm("k1", KEY_A)));
    assert_eq!(
        clear_first.seal(SECRETS, secret("db", "v")).unwrap(),
        secret("db", "v")
    );
    assert_eq!(clear_first.open(sealed).unwrap(), secret("db", "v"));
    // An object written before encryption was configured stays readable.
    assert_eq!(c.open(secret("db", "v")).unwrap(), secret("db", "v"));
}

#[test]
fn keys_rotate_as_in_kubernetes() {
    let old = config(&gcm("k1", KEY_A));
    let written = old.seal(SECRETS, secret("db", "v")).unwrap();
    // The new key first, the old one kept: the old data opens, new writes use the new key.
    let both = config(&format!(
        "  - aesgcm: {{keys: [{{name: k2, secret: {KEY_B}}}, {{name: k1, secret: {KEY_A}}}]}}\n"
    ));
    let opened = both.open(written.clone()).unwrap();
    let rewritten = both.seal(SECRETS, opened).unwrap();
    assert!(text_of(&rewritten).contains("k8s:enc:aesgcm:v1:k2:"));
    // The old key gone: rewritten data opens, data never rewritten says which key it needs.
    let new = config(&gcm("k2", KEY_B));
    assert_eq!(new.open(rewritten).unwrap(), secret("db", "v"));
    let e = new.open(written).unwrap_err().to_string();
    assert!(
        e.contains("aesgcm key \"k1\"") && e.contains("no longer holds"),
        "{e}"
    );
    // A provider moved to another place in the list still opens its data.
    let sb = config(&format!(
        "  - secretbox: {{keys: [{{name: s1, secret: {KEY_A}}}]}}\n"
    ));
    let by_sb = sb.seal(SECRETS, secret("db", "v")).unwrap();
    let gcm_then_sb = config(&format!(
        "{}  - secretbox: {{keys: [{{name: s1, secret: {KEY_A}}}]}}\n",
        gcm("k2", KEY_B)
    ));
    assert_eq!(gcm_then_sb.open(by_sb).unwrap(), secret("db", "v"));
}

#[test]
fn a_sealed_part_opens_only_as_its_own_object_and_unaltered() {
    let c = config(&gcm("k1", KEY_A));
    let a = c.seal(SECRETS, secret("a", "va")).unwrap();
    let mut b = c.seal(SECRETS, secret("b", "vb")).unwrap();
    b.other.insert(SEALED.into(), a.other[SEALED].clone());
    let e = c.open(b).unwrap_err().to_string();
    assert!(e.contains("does not open it"), "{e}");
    let mut altered = a.clone();
    let s = altered.other[SEALED].as_str().unwrap().to_string();
    let mut bytes = B64.decode(s.rsplit(':').next().unwrap()).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let head = &s[..s.rfind(':').unwrap() + 1];
    altered
        .other
        .insert(SEALED.into(), json!(format!("{head}{}", B64.encode(bytes))));
    assert!(c.open(altered).is_err());
    // Another key under the same name does not open it either.
    let other = config(&gcm("k1", KEY_B));
    assert!(other.open(a).is_err());
}

#[test]
fn bad_configurations_say_what_is_wrong() {
    let head = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n";
    let cases: Vec<(String, &str)> = vec![
        (
            "  - aesgcm: {keys: [{name: k1, secret: 'not base64!'}]}\n".into(),
            "not base64",
        ),
        (
            "  - aesgcm: {keys: [{name: k1, secret: c2hvcnQ=}]}\n".into(),
            "5 bytes",
        ),
        (
            format!("  - secretbox: {{keys: [{{name: k1, secret: {KEY_B}}}]}}\n"),
            "secretbox takes keys of [32] bytes",
        ),
        ("  - aesgcm: {keys: []}\n".into(), "at least one key"),
        (
            format!(
                "  - aesgcm: {{keys: [{{name: k1, secret: {KEY_A}}}, {{name: k1, secret: {KEY_B}}}]}}\n"
            ),
            "\"k1\" twice",
        ),
        ("  - kms: {name: vault}\n".into(), "not supported"),
        (
            format!("  - aesgcm: {{keys: [{{name: k1, secret: {KEY_A}}}]}}\n    identity: {{}}\n"),
            "exactly one of",
        ),
        ("  - rot13: {}\n".into(), "unknown field"),
    ];
    for (providers, want) in cases {
        let e = EncryptionConfig::parse(&format!("{head}{providers}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{providers}: {e}");
    }
    let e = EncryptionConfig::parse("apiVersion: v1\nkind: ConfigMap\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("EncryptionConfiguration"), "{e}");
    let e = EncryptionConfig::parse(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: ['Secrets!']\n  providers: [{identity: {}}]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("resources[0].resources[0]"), "{e}");
    // Keys are never printed.
    let c = config(&gcm("k1", KEY_A));
    assert!(!format!("{c:?}").contains(KEY_A));
}

#[test]
fn a_work_carrying_a_secret_is_sealed_as_secrets_are() {
    let c = config(&gcm("k1", KEY_A));
    let work = |kind: &str| {
        Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
            "metadata": {"name": "default.db", "namespace": "orrery-cluster-m1"},
            "spec": {"workload": {"manifests": [
                {"apiVersion": "v1", "kind": kind, "metadata": {"name": "db"},
                 "data": {"password": B64.encode("in-a-work")}}]}},
        }))
        .unwrap()
    };
    let key = "/registry/multicluster.io/works/orrery-cluster-m1/default.db";
    let sealed = c.seal(key, work("Secret")).unwrap();
    assert!(EncryptionConfig::is_sealed(&sealed));
    assert!(!text_of(&sealed).contains(&B64.encode("in-a-work")));
    assert_eq!(c.open(sealed).unwrap(), work("Secret"));
    assert_eq!(c.seal(key, work("ConfigMap")).unwrap(), work("ConfigMap"));
}
