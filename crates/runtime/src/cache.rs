//! An indexed in-memory copy of one reflector's prefix: by name, by namespace, by owner uid,
//! and by the label keys a controller asks for. Only its reflector writes it, before the
//! event that reports the change is sent, so a controller reading it sees at least what its
//! events told it.

use parking_lot::RwLock;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use orrery_api::Object;
use orrery_store::Revision;

/// An object's place in the cache: namespace ("" for cluster-scoped) and name.
pub type ObjectKey = (String, String);

fn key_of(o: &Object) -> ObjectKey {
    (o.namespace().to_string(), o.name().to_string())
}

#[derive(Debug, Default)]
struct Inner {
    objects: HashMap<ObjectKey, Arc<Object>>,
    by_namespace: HashMap<String, BTreeSet<ObjectKey>>,
    by_owner: HashMap<String, BTreeSet<ObjectKey>>,
    by_label: HashMap<(String, String), BTreeSet<ObjectKey>>,
    revision: Revision,
    listed: bool,
}

/// The cache; see the module's documentation.
#[derive(Debug, Default)]
pub struct Cache {
    inner: RwLock<Inner>,
    label_keys: Vec<String>,
}

impl Cache {
    /// A cache indexing the values of `label_keys` (besides name, namespace and owner).
    pub fn new(label_keys: &[&str]) -> Self {
        Cache {
            inner: RwLock::default(),
            label_keys: label_keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Inner> {
        // Every mutation leaves the maps consistent before it can panic.
        self.inner.read()
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, Inner> {
        self.inner.write()
    }

    fn index(&self, inner: &mut Inner, k: &ObjectKey, o: &Object) {
        inner
            .by_namespace
            .entry(k.0.clone())
            .or_default()
            .insert(k.clone());
        for r in &o.metadata.owner_references {
            inner
                .by_owner
                .entry(r.uid.clone())
                .or_default()
                .insert(k.clone());
        }
        for l in &self.label_keys {
            if let Some(v) = o.metadata.labels.get(l) {
                inner
                    .by_label
                    .entry((l.clone(), v.clone()))
                    .or_default()
                    .insert(k.clone());
            }
        }
    }

    fn unindex(&self, inner: &mut Inner, k: &ObjectKey, o: &Object) {
        fn drop_from<K: std::hash::Hash + Eq>(
            m: &mut HashMap<K, BTreeSet<ObjectKey>>,
            at: K,
            k: &ObjectKey,
        ) {
            if let Some(set) = m.get_mut(&at) {
                set.remove(k);
                if set.is_empty() {
                    m.remove(&at);
                }
            }
        }
        drop_from(&mut inner.by_namespace, k.0.clone(), k);
        for r in &o.metadata.owner_references {
            drop_from(&mut inner.by_owner, r.uid.clone(), k);
        }
        for l in &self.label_keys {
            if let Some(v) = o.metadata.labels.get(l) {
                drop_from(&mut inner.by_label, (l.clone(), v.clone()), k);
            }
        }
    }

    /// Replaces everything with a listing at `revision`.
    pub fn replace(&self, items: &[Arc<Object>], revision: Revision) {
        let mut inner = Inner {
            revision,
            listed: true,
            ..Inner::default()
        };
        for o in items {
            let k = key_of(o);
            self.index(&mut inner, &k, o);
            inner.objects.insert(k, o.clone());
        }
        *self.write() = inner;
    }

    /// Takes in a new version of an object.
    pub fn upsert(&self, o: Arc<Object>, revision: Revision) {
        let k = key_of(&o);
        let mut inner = self.write();
        if let Some(old) = inner.objects.remove(&k) {
            self.unindex(&mut inner, &k, &old);
        }
        self.index(&mut inner, &k, &o);
        inner.objects.insert(k, o);
        inner.revision = inner.revision.max(revision);
    }

    /// Forgets a deleted object.
    pub fn remove(&self, o: &Object, revision: Revision) {
        let k = key_of(o);
        let mut inner = self.write();
        if let Some(old) = inner.objects.remove(&k) {
            self.unindex(&mut inner, &k, &old);
        }
        inner.revision = inner.revision.max(revision);
    }

    /// Whether the first listing has arrived.
    pub fn is_listed(&self) -> bool {
        self.read().listed
    }

    /// The revision the cache reflects.
    pub fn revision(&self) -> Revision {
        self.read().revision
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Object>> {
        self.read()
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<Object>> {
        self.read().objects.values().cloned().collect()
    }

    fn collect(&self, keys: Option<&BTreeSet<ObjectKey>>, inner: &Inner) -> Vec<Arc<Object>> {
        keys.into_iter()
            .flatten()
            .filter_map(|k| inner.objects.get(k).cloned())
            .collect()
    }

    /// The objects of one namespace, by name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<Object>> {
        let inner = self.read();
        self.collect(inner.by_namespace.get(namespace), &inner)
    }

    /// The objects with an owner reference to `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Arc<Object>> {
        let inner = self.read();
        self.collect(inner.by_owner.get(uid), &inner)
    }

    /// The objects whose label `key` is `value` (`key` must be one the cache indexes).
    pub fn with_label(&self, key: &str, value: &str) -> Vec<Arc<Object>> {
        debug_assert!(
            self.label_keys.iter().any(|k| k == key),
            "label {key} is not indexed"
        );
        let inner = self.read();
        self.collect(
            inner.by_label.get(&(key.to_string(), value.to_string())),
            &inner,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::OwnerReference;

    fn obj(ns: &str, name: &str, app: &str, owner: Option<&str>) -> Arc<Object> {
        let mut o = Object::new("v1", "ConfigMap")
            .with_name(name)
            .with_namespace(ns)
            .with_label("app", app);
        if let Some(uid) = owner {
            o.metadata.owner_references.push(OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: uid.into(),
                ..Default::default()
            });
        }
        Arc::new(o)
    }

    fn names(v: Vec<Arc<Object>>) -> Vec<String> {
        let mut n: Vec<String> = v.iter().map(|o| o.name().to_string()).collect();
        n.sort();
        n
    }

    #[test]
    fn indexes_follow_upserts_removals_and_listings() {
        let c = Cache::new(&["app"]);
        assert!(!c.is_listed());
        c.replace(
            &[obj("a", "x", "web", Some("u1")), obj("b", "y", "db", None)],
            10,
        );
        assert!(c.is_listed());
        assert_eq!(names(c.in_namespace("a")), ["x"]);
        assert_eq!(names(c.owned_by("u1")), ["x"]);
        assert_eq!(names(c.with_label("app", "web")), ["x"]);
        // A new version moves between label values and owners.
        c.upsert(obj("a", "x", "db", Some("u2")), 11);
        assert!(c.with_label("app", "web").is_empty());
        assert_eq!(names(c.with_label("app", "db")), ["x", "y"]);
        assert!(c.owned_by("u1").is_empty());
        assert_eq!(names(c.owned_by("u2")), ["x"]);
        c.remove(&obj("b", "y", "db", None), 12);
        assert_eq!(names(c.with_label("app", "db")), ["x"]);
        assert!(c.in_namespace("b").is_empty());
        assert_eq!(c.revision(), 12);
        assert_eq!(c.len(), 1);
        // A listing replaces everything, indexes included.
        c.replace(&[obj("c", "z", "web", None)], 20);
        assert_eq!(names(c.list()), ["z"]);
        assert!(c.owned_by("u2").is_empty());
        assert_eq!(names(c.with_label("app", "web")), ["z"]);
        assert!(c.get("a", "x").is_none() && c.get("c", "z").is_some());
    }
}
