//! The store's conformance suite and its model test, through [`EncryptingStore`] sealing
//! every object (AES-GCM): encryption at rest changes nothing a store promises.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use orrery_apiserver::encryption::{EncryptingStore, EncryptionConfig};
use orrery_store::Store;
use orrery_store_testkit::{Harness, SqliteHarness};

struct Encrypted(SqliteHarness);

fn config() -> Arc<EncryptionConfig> {
    let c = EncryptionConfig::parse(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: ['*.*']\n  providers:\n  - aesgcm: {keys: [{name: k1, secret: c2VjcmV0IGlzIHNlY3VyZSwgaXMgaXQgbm90ID8hISE=}]}\n",
    )
    .unwrap();
    // The suites' keys lie outside /registry/.
    Arc::new(c.also_covering("/"))
}

#[async_trait::async_trait]
impl Harness for Encrypted {
    async fn open(&self) -> Arc<dyn Store> {
        EncryptingStore::wrap(self.0.open().await, config())
    }

    async fn settle(&self) {
        self.0.settle().await
    }
}

orrery_store_testkit::store_conformance_tests!(Encrypted(SqliteHarness::new()));

#[test]
fn an_encrypting_store_follows_the_model() {
    orrery_store_testkit::model::check(
        orrery_store_testkit::model::ModelTest {
            name: "sqlite-encrypted",
            cases: 300,
            max_steps: 60,
            crash: false,
        },
        |n| Encrypted(SqliteHarness::in_memory_fs().with_compaction_step(1 + (n as usize % 9))),
    );
}

/// What the suites ran on was sealed underneath: the plain store holds no value in the clear.
#[tokio::test]
async fn the_store_underneath_holds_only_sealed_objects() {
    let h = SqliteHarness::new();
    let plain = h.open().await;
    let s = EncryptingStore::wrap(plain.clone(), config());
    let o = orrery_api::Object::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "ns"},
        "data": {"password": "a25vd24tdmFsdWU="},
    }))
    .unwrap();
    let made = s.create("/t/ns/db", o.clone()).await.unwrap();
    assert_eq!(made.other, o.other);
    let stored = plain.get("/t/ns/db").await.unwrap();
    assert!(EncryptionConfig::is_sealed(&stored), "{stored:?}");
    assert!(
        !serde_json::to_string(&stored)
            .unwrap()
            .contains("a25vd24tdmFsdWU=")
    );
    assert_eq!(s.get("/t/ns/db").await.unwrap().other, o.other);
}
