//! What the API server decodes from request bodies by hand: strategic merge patches (with
//! every directive) and protobuf bodies. For any input: an answer or an error, never a
//! panic; and a protobuf body decodes the same way every time it is sent.

#![allow(clippy::unwrap_used)]

use orrery_apiserver::patch::{Meta, strategic_merge};
use orrery_apiserver::protobuf;
use orrery_apiserver::schema::Schemas;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1_000,
        // A failure prints its smallest input; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Keys a Deployment or Pod has, the patch directives, and names that merge lists by key.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("spec".to_string()),
        Just("template".to_string()),
        Just("containers".to_string()),
        Just("name".to_string()),
        Just("image".to_string()),
        Just("ports".to_string()),
        Just("containerPort".to_string()),
        Just("env".to_string()),
        Just("volumes".to_string()),
        Just("finalizers".to_string()),
        Just("metadata".to_string()),
        Just("labels".to_string()),
        Just("$patch".to_string()),
        Just("$retainKeys".to_string()),
        Just("$setElementOrder/containers".to_string()),
        Just("$setElementOrder/finalizers".to_string()),
        Just("$deleteFromPrimitiveList/finalizers".to_string()),
        "[a-z]{1,3}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        prop_oneof![
            Just("replace".to_string()),
            Just("merge".to_string()),
            Just("delete".to_string()),
            Just("web".to_string()),
            "[a-z]{0,3}",
        ]
        .prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn object() -> impl Strategy<Value = Value> {
    proptest::collection::vec((key(), value()), 0..5)
        .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>()))
}

/// A protobuf body: the magic, then fields (well formed or not) of every wire type.
fn proto_body() -> impl Strategy<Value = Vec<u8>> {
    let field = (
        1u8..6,
        0u8..8,
        proptest::collection::vec(any::<u8>(), 0..12),
    )
        .prop_map(|(num, wire, payload)| {
            let mut out = vec![(num << 3) | wire];
            if wire == 2 {
                out.push(payload.len() as u8);
            }
            out.extend(payload);
            out
        });
    proptest::collection::vec(field, 0..6)
        .prop_map(|fs| [b"k8s\x00".to_vec(), fs.concat()].concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_strategic_merge_patch_never_panics(original in object(), patch in value()) {
        let set = Schemas::new().set();
        for kind in ["io.k8s.api.apps.v1.Deployment", "io.k8s.api.core.v1.Pod"] {
            let schema = set.get(kind).cloned();
            let _ = strategic_merge(&original, &patch, Meta::new(&set, schema.as_ref()));
        }
        let _ = strategic_merge(&original, &patch, Meta::new(&set, None));
    }

    #[test]
    fn a_protobuf_body_never_panics(
        body in proto_body(),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let first = protobuf::decode(&body, "io.k8s.api.core.v1.Namespace");
        let again = protobuf::decode(&body, "io.k8s.api.core.v1.Namespace");
        prop_assert_eq!(format!("{first:?}"), format!("{again:?}"));
        let magic_then_noise = [b"k8s\x00".as_slice(), &noise].concat();
        let _ = protobuf::decode(&magic_then_noise, "io.k8s.api.apps.v1.Deployment");
        let _ = protobuf::decode(&noise, "io.k8s.api.core.v1.ConfigMap");
    }
}
