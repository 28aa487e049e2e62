//! Where objects live in the store. The API server and the controllers both address objects by
//! these keys, so the layout is defined once, here.
//!
//! `/registry/<group or "core">/<plural>/<namespace>/<name>` for namespaced kinds,
//! `/registry/<group or "core">/<plural>/<name>` for cluster-scoped ones.

fn group_segment(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

/// The key of one object (`namespace` is `None` for cluster-scoped kinds).
pub fn object(group: &str, plural: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("/registry/{}/{plural}/{ns}/{name}", group_segment(group)),
        None => format!("/registry/{}/{plural}/{name}", group_segment(group)),
    }
}

/// The prefix of a list: one namespace's objects, or all of the kind.
pub fn prefix(group: &str, plural: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("/registry/{}/{plural}/{ns}/", group_segment(group)),
        None => format!("/registry/{}/{plural}/", group_segment(group)),
    }
}

/// Keys of the kinds Orrery's own components read and write.
pub mod well_known {
    pub fn cluster(name: &str) -> String {
        super::object("multicluster.io", "clusters", None, name)
    }
    pub fn clusters() -> String {
        super::prefix("multicluster.io", "clusters", None)
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
        super::object("multicluster.io", "works", Some(namespace), name)
    }
    pub fn works(namespace: Option<&str>) -> String {
        super::prefix("multicluster.io", "works", namespace)
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
        super::object(
            "multicluster.x-k8s.io",
            "clusterprofiles",
            Some(namespace),
            name,
        )
    }
    pub fn cluster_profiles(namespace: Option<&str>) -> String {
        super::prefix("multicluster.x-k8s.io", "clusterprofiles", namespace)
    }
    pub fn binding(namespace: &str, name: &str) -> String {
        super::object("multicluster.io", "resourcebindings", Some(namespace), name)
    }
    pub fn bindings(namespace: Option<&str>) -> String {
        super::prefix("multicluster.io", "resourcebindings", namespace)
    }
    pub fn interpreters() -> String {
        super::prefix("multicluster.io", "resourceinterpreters", None)
    }
    pub fn migration(namespace: &str, name: &str) -> String {
        super::object("multicluster.io", "migrations", Some(namespace), name)
    }
    pub fn migrations(namespace: Option<&str>) -> String {
        super::prefix("multicluster.io", "migrations", namespace)
    }
    pub fn dataset(namespace: &str, name: &str) -> String {
        super::object("multicluster.io", "datasets", Some(namespace), name)
    }
    pub fn datasets(namespace: Option<&str>) -> String {
        super::prefix("multicluster.io", "datasets", namespace)
    }
    pub fn datatransfer(namespace: &str, name: &str) -> String {
        super::object("multicluster.io", "datatransfers", Some(namespace), name)
    }
    pub fn datatransfers(namespace: Option<&str>) -> String {
        super::prefix("multicluster.io", "datatransfers", namespace)
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
