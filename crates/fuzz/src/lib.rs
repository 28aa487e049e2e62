//! The bodies of the fuzz targets: each takes arbitrary bytes to a parser a client or a member
//! reaches and checks what must hold whatever the input — no panic, bounded work, and where a
//! parser writes back what it reads, that the two agree. `fuzz/` (cargo fuzz, libFuzzer)
//! calls them, one target each ([`TARGETS`]); this crate's tests replay the checked-in corpus
//! and every crash found (`fuzz/regressions/<target>/`), so a fixed crash stays fixed without
//! a fuzzer.
//!
//! A property that fails panics with what broke: libFuzzer keeps the input as a crash.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use orrery_api::{Object, Quantity};
use orrery_apiserver::patch::{self, Meta};
use orrery_apiserver::registry::{Envelope, decode_body};
use orrery_apiserver::schema::{SchemaSet, Schemas};
use serde_json::{Value, json};

/// A target: its name (the file under `fuzz/fuzz_targets/` and the corpus folder) and body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("label_selector", label_selector),
    ("field_selector", field_selector),
    ("quantity", quantity),
    ("duration", duration),
    ("json_patch", json_patch),
    ("merge_patch", merge_patch),
    ("strategic_merge_patch", strategic_merge_patch),
    ("managed_fields", managed_fields),
    ("protobuf", protobuf),
    ("object_decode", object_decode),
    ("spdy", spdy),
    ("dns", dns),
    ("lua", lua),
];

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

fn labels() -> BTreeMap<String, String> {
    [("app", "web"), ("tier", "front"), ("replicas", "3")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Label selectors (`?labelSelector=`, placements' selectors): what is parsed prints as a
/// selector that parses to the same, and selects the same.
pub fn label_selector(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let Ok(sel) = orrery_api::labels::Selector::parse(s) else {
        return;
    };
    let printed = sel.to_string();
    let again = orrery_api::labels::Selector::parse(&printed)
        .unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}, which does not parse: {e:?}"));
    assert_eq!(again.to_string(), printed, "{s:?}: printed twice alike");
    let l = labels();
    assert_eq!(sel.matches(&l), again.matches(&l), "{s:?}: selects alike");
}

/// Field selectors (`?fieldSelector=`).
pub fn field_selector(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let Ok(sel) = orrery_api::fields::Selector::parse(s) else {
        return;
    };
    let obj: Object = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "default"},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running"},
    }))
    .unwrap_or_default();
    let _ = sel.matches(&obj);
    for t in sel.terms() {
        let _ = sel.required_value(&t.field);
    }
}

/// Quantities (requests, capacities, water levels): the canonical form parses back to the
/// same amount.
pub fn quantity(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let Ok(q) = s.parse::<Quantity>() else { return };
    let printed = q.to_string();
    let again: Quantity = printed
        .parse()
        .unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again.nanos(), q.nanos(), "{s:?} printed as {printed:?}");
    let _ = (
        q.milli_value(),
        q.value(),
        q.as_f64(),
        q.checked_add(&again),
    );
}

/// Durations (`progressDeadline`, `minSuccessTime`, command-line flags).
pub fn duration(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let _ = orrery_api::duration::parse(s);
    let _ = orrery_api::duration::parse_arg(s);
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx",
                                                       "ports": [{"containerPort": 80}],
                                                       "env": [{"name": "A", "value": "1"}]}]}}},
    })
}

/// `[document, patch]`, or a patch of [`deployment`].
fn doc_and_patch(data: &[u8]) -> Option<(Value, Value)> {
    match serde_json::from_slice::<Value>(data).ok()? {
        Value::Array(mut v) if v.len() == 2 => {
            let p = v.pop()?;
            Some((v.pop()?, p))
        }
        p => Some((deployment(), p)),
    }
}

/// JSON patch (RFC 6902) as `PATCH` applies it.
pub fn json_patch(data: &[u8]) {
    let Some((mut doc, p)) = doc_and_patch(data) else {
        return;
    };
    let _ = patch::json_patch(&mut doc, &p);
}

/// JSON merge patch (RFC 7386): applying it twice is applying it once.
pub fn merge_patch(data: &[u8]) {
    let Some((mut doc, p)) = doc_and_patch(data) else {
        return;
    };
    if patch::merge_patch(&mut doc, &p).is_err() {
        return;
    }
    let once = doc.clone();
    patch::merge_patch(&mut doc, &p).unwrap_or_else(|e| panic!("applied once, not twice: {e:?}"));
    assert_eq!(doc, once, "a merge patch is idempotent");
}

fn schemas() -> &'static SchemaSet {
    static SET: OnceLock<SchemaSet> = OnceLock::new();
    SET.get_or_init(|| Schemas::new().set())
}

fn with_meta<R>(f: impl FnOnce(Meta<'_>) -> R) -> R {
    let set = schemas();
    f(Meta::new(set, set.get("io.k8s.api.apps.v1.Deployment")))
}

/// Strategic merge patch with a Deployment's patch strategies (lists merged by key,
/// `$patch`, `$retainKeys`, `$setElementOrder`, `$deleteFromPrimitiveList`).
pub fn strategic_merge_patch(data: &[u8]) {
    let Some((doc, p)) = doc_and_patch(data) else {
        return;
    };
    with_meta(|meta| {
        let _ = patch::strategic_merge(&doc, &p, meta);
    });
}

/// Server-side apply: an object's `managedFields` (fieldsV1 sets, as a client may write
/// them) read back, and an apply over them.
pub fn managed_fields(data: &[u8]) {
    let Ok(fields) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut live = deployment();
    live["metadata"]["managedFields"] = match fields {
        Value::Array(_) => fields,
        one => json!([{"manager": "m", "operation": "Apply", "apiVersion": "apps/v1",
                       "fieldsType": "FieldsV1", "fieldsV1": one}]),
    };
    let Ok(obj) = serde_json::from_value::<Object>(live) else {
        return;
    };
    let _ = orrery_apiserver::managed::entries(&obj);
    let mut applied = deployment();
    applied["spec"]["replicas"] = json!(3);
    with_meta(|meta| {
        let _ =
            orrery_apiserver::managed::apply(Some(&obj), &applied, "m2", false, meta, |l, a| {
                with_meta(|m| patch::strategic_merge(l, a, m).map_err(|e| format!("{e:?}")))
            });
    });
}

/// The OpenAPI components a protobuf body may be of: the first byte chooses.
const COMPONENTS: &[&str] = &[
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.Service",
    "io.k8s.api.apps.v1.StatefulSet",
    "io.k8s.api.batch.v1.Job",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
];

/// Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`, the `k8s\0`
/// envelope and the messages of the built-in kinds).
pub fn protobuf(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let c = COMPONENTS[usize::from(which) % COMPONENTS.len()];
    let _ = orrery_apiserver::protobuf::decode(body, c);
}

/// A request body as the API server decodes it (JSON with its duplicate keys, YAML, or
/// protobuf, by the first byte), then read as an object.
pub fn object_decode(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let ct = [
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
    ][usize::from(which) % 3];
    let body = Bytes::copy_from_slice(body);
    if let Ok((v, _dups)) = decode_body(
        &Envelope::of_type(ct),
        &body,
        "io.k8s.api.apps.v1.Deployment",
    ) {
        let _ = serde_json::from_value::<Object>(v);
    }
}

/// SPDY/3.1 frames (kubectl's port-forward, as the simulated member serves it), whole and
/// a few bytes at a time (the first byte says how many; 0: at once).
pub fn spdy(data: &[u8]) {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let whole = orrery_sim::read_spdy_frames(body, 0);
    let pieces = orrery_sim::read_spdy_frames(body, usize::from(split % 17));
    // Bytes in pieces read as the same bytes at once: the same frames, or the same error
    // after the same frames.
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "frames read whole and in pieces"),
        (Err((a, _)), Err((b, _))) => assert_eq!(a, b, "frames before the error"),
        _ => panic!("read whole {whole:?}, in pieces {pieces:?}"),
    }
}

fn directory() -> &'static orrery_dns::directory::Directory {
    static DIR: OnceLock<orrery_dns::directory::Directory> = OnceLock::new();
    DIR.get_or_init(|| {
        let imports = [
            json!({"metadata": {"namespace": "default", "name": "web"},
                   "spec": {"type": "ClusterSetIP", "ips": ["10.0.0.1"],
                            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
            json!({"metadata": {"namespace": "db", "name": "pg"},
                   "spec": {"type": "Headless", "ports": [{"port": 5432}]}}),
        ];
        let slices = [json!({
            "metadata": {"namespace": "db", "name": "pg-east",
                         "labels": {"multicluster.kubernetes.io/service-name": "pg",
                                    "multicluster.kubernetes.io/source-cluster": "east"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"], "hostname": "pg-0"}],
            "ports": [{"port": 5432}],
        })];
        orrery_dns::directory::Directory::build(&imports, &slices)
    })
}

/// DNS queries to the clusterset responder, over UDP (within the size the client takes) and
/// TCP: every answer is a well-formed response to the request's id.
pub fn dns(data: &[u8]) {
    for udp in [true, false] {
        let Some(answer) = orrery_dns::server::answer(data, directory(), udp) else {
            continue;
        };
        let m = hickory_proto::op::Message::from_vec(&answer)
            .unwrap_or_else(|e| panic!("the answer does not parse: {e}"));
        assert_eq!(
            m.metadata.message_type,
            hickory_proto::op::MessageType::Response
        );
        assert_eq!(
            m.metadata.id,
            u16::from_be_bytes([data[0], data[1]]),
            "the request's id"
        );
    }
}

/// Lua customizations (ResourceInterpreterCustomization scripts), in the sandbox with its
/// time and memory bounds (shortened here so that a slow script costs the fuzzer little).
pub fn lua(data: &[u8]) {
    let Some(script) = text(data) else { return };
    let vm = orrery_interpreter::Vm {
        limits: orrery_interpreter::Limits {
            time: Duration::from_millis(200),
            memory: 16 << 20,
        },
    };
    if vm.check(script).is_err() {
        return;
    }
    let obj = deployment();
    let _ = vm.get_replicas(script, &obj);
    let _ = vm.interpret_health(script, &obj);
    let _ = vm.reflect_status(script, &obj);
}
