//! Where objects live in the store. The API server and the controllers both address objects by
//! these keys, so the layout is defined once, here.
//!
//! `/registry/<group or "core">/<plural>/<namespace>/<name>` for namespaced kinds,
//! `/registry/<group or "core">/<plural>/<name>` for cluster-scoped ones.

pub use crate::layout::{object, prefix};

/// Keys of the kinds Orrery's own components read and write (own kinds' from their
/// descriptors).
pub mod well_known {
    use crate::kinds as K;

    pub fn cluster(name: &str) -> String {
        K::CLUSTER.key("", name)
    }
    pub fn clusters() -> String {
        K::CLUSTER.prefix(None)
    }
    /// A member's heartbeat Lease.
    pub fn cluster_lease(name: &str) -> String {
        super::object(
            "coordination.k8s.io",
            "leases",
            Some(crate::cluster::LEASE_NAMESPACE),
            name,
        )
    }
    pub fn cluster_leases() -> String {
        super::prefix(
            "coordination.k8s.io",
            "leases",
            Some(crate::cluster::LEASE_NAMESPACE),
        )
    }
    pub fn work(namespace: &str, name: &str) -> String {
        K::WORK.key(namespace, name)
    }
    pub fn works(namespace: Option<&str>) -> String {
        K::WORK.prefix(namespace)
    }
    pub fn namespace(name: &str) -> String {
        super::object("", "namespaces", None, name)
    }
    pub fn secret(namespace: &str, name: &str) -> String {
        super::object("", "secrets", Some(namespace), name)
    }
    pub fn event(namespace: &str, name: &str) -> String {
        super::object("", "events", Some(namespace), name)
    }
    pub fn cluster_profile(namespace: &str, name: &str) -> String {
        K::CLUSTER_PROFILE.key(namespace, name)
    }
    pub fn cluster_profiles(namespace: Option<&str>) -> String {
        K::CLUSTER_PROFILE.prefix(namespace)
    }
    pub fn binding(namespace: &str, name: &str) -> String {
        K::RESOURCE_BINDING.key(namespace, name)
    }
    pub fn bindings(namespace: Option<&str>) -> String {
        K::RESOURCE_BINDING.prefix(namespace)
    }
    pub fn interpreters() -> String {
        K::RESOURCE_INTERPRETER.prefix(None)
    }
    pub fn migration(namespace: &str, name: &str) -> String {
        K::MIGRATION.key(namespace, name)
    }
    pub fn migrations(namespace: Option<&str>) -> String {
        K::MIGRATION.prefix(namespace)
    }
    pub fn dataset(namespace: &str, name: &str) -> String {
        K::DATA_SET.key(namespace, name)
    }
    pub fn datasets(namespace: Option<&str>) -> String {
        K::DATA_SET.prefix(namespace)
    }
    pub fn datatransfer(namespace: &str, name: &str) -> String {
        K::DATA_TRANSFER.key(namespace, name)
    }
    pub fn datatransfers(namespace: Option<&str>) -> String {
        K::DATA_TRANSFER.prefix(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(
            object("apps", "deployments", Some("ns"), "web"),
            "/registry/apps/deployments/ns/web"
        );
        assert_eq!(
            object("", "namespaces", None, "default"),
            "/registry/core/namespaces/default"
        );
        assert_eq!(
            prefix("apps", "deployments", None),
            "/registry/apps/deployments/"
        );
        assert_eq!(
            prefix("", "configmaps", Some("a")),
            "/registry/core/configmaps/a/"
        );
        assert_eq!(
            well_known::cluster("east"),
            "/registry/multicluster.io/clusters/east"
        );
        assert_eq!(
            well_known::works(Some("orrery-cluster-east")),
            "/registry/multicluster.io/works/orrery-cluster-east/"
        );
    }
}
