//! The API server's fixed routes, in one table matched by `matchit` (the router axum is built
//! on): health, the UI, the CA, metrics, discovery, OpenAPI, the agent API, the DRO-DS API and
//! the reviews. A path no route matches belongs to the resource tree (`/api/v1/...`,
//! `/apis/<group>/<version>/...`), which changes with the CRDs and is resolved by the registry.
//! Metrics are labelled by what matched here, never by a raw path.

use std::sync::LazyLock;

/// A fixed route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`, `/livez`, `/readyz` (public).
    Health,
    /// `/ui` (public: the page holds no data).
    Ui,
    /// `/cacerts` (public: agents check it against their token's hash).
    CaCerts,
    Metrics,
    Version,
    /// `/api`, `/apis`, `/api/v1`, `/apis/<group>`, `/apis/<group>/<version>`.
    Discovery,
    OpenApiV2,
    OpenApiV3,
    /// `/openapi/v3/<group-version path>`.
    OpenApiV3Doc,
    /// `/agent/v1/...`.
    Agent,
    /// `/api/v1/<DRO-DS segment>/...`.
    Dro,
    /// `/apis/<review group>/v1/<review plural>` (create only).
    Review,
}

/// The first path segments of the DRO-DS endpoints (under `/api/v1/`).
pub const DRO_SEGMENTS: &[&str] = &[
    "clusters",
    "propagationpolicies",
    "bindings",
    "metrics",
    "sync",
    "monitor",
    "history",
    "openapi.json",
];

static TABLE: LazyLock<matchit::Router<Route>> = LazyLock::new(|| {
    let mut r = matchit::Router::new();
    let mut add = |path: String, route: Route| {
        // The table is fixed and tested: a conflict is a bug found by the first test run.
        r.insert(path.clone(), route)
            .unwrap_or_else(|e| panic!("route {path}: {e}"));
    };
    for p in ["/healthz", "/livez", "/readyz"] {
        add(p.into(), Route::Health);
    }
    add("/ui".into(), Route::Ui);
    add("/cacerts".into(), Route::CaCerts);
    add("/metrics".into(), Route::Metrics);
    add("/version".into(), Route::Version);
    for p in [
        "/api",
        "/apis",
        "/api/v1",
        "/apis/{group}",
        "/apis/{group}/{version}",
    ] {
        add(p.into(), Route::Discovery);
    }
    add("/openapi/v2".into(), Route::OpenApiV2);
    add("/openapi/v3".into(), Route::OpenApiV3);
    add("/openapi/v3/{*rest}".into(), Route::OpenApiV3Doc);
    add("/agent/v1/{*rest}".into(), Route::Agent);
    for seg in DRO_SEGMENTS {
        add(format!("/api/v1/{seg}"), Route::Dro);
        add(format!("/api/v1/{seg}/{{*rest}}"), Route::Dro);
    }
    for k in crate::reviews::KINDS {
        add(
            format!("/apis/{}/{}/{}", k.group, k.version, k.plural),
            Route::Review,
        );
    }
    r
});

/// The fixed route `path` names (without a trailing slash), if any.
pub fn route(path: &str) -> Option<Route> {
    let path = match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    };
    TABLE.at(path).ok().map(|m| *m.value)
}

/// Whether a request path is one of the DRO-DS endpoints.
pub fn is_dro_path(path: &str) -> bool {
    route(path) == Some(Route::Dro)
}

/// The label of what is not one of the server's resources or routes.
pub(crate) const OTHER: &str = "other";

/// What a request is counted under in the metrics: a fixed route's name (the DRO-DS
/// endpoint's first segment, the review's plural, `discovery`...), the plural of a resource
/// the server serves (`served(group, version, plural)`), `root`, or `other` for anything else
/// (so a client making up paths makes no series of its own).
pub fn label(path: &str, served: impl Fn(&str, &str, &str) -> bool) -> String {
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(r) = route(path) {
        let name = match r {
            Route::Dro => s.get(2).copied().unwrap_or(OTHER),
            Route::Review => s.last().copied().unwrap_or(OTHER),
            Route::Discovery => "discovery",
            Route::OpenApiV2 | Route::OpenApiV3 | Route::OpenApiV3Doc => "openapi",
            Route::Agent => "agent",
            Route::Health | Route::Ui | Route::CaCerts | Route::Metrics | Route::Version => {
                s.first().copied().unwrap_or(OTHER)
            }
        };
        return name.to_string();
    }
    let resource_in = |group: &str, version: &str, rest: &[&str]| -> String {
        let plural = match rest {
            ["namespaces", _, plural, ..] => *plural,
            [plural, ..] => *plural,
            [] => return OTHER.to_string(),
        };
        if served(group, version, plural) {
            plural.to_string()
        } else {
            OTHER.to_string()
        }
    };
    match s.as_slice() {
        ["api", "v1", rest @ ..] => resource_in("", "v1", rest),
        ["apis", group, version, rest @ ..] => resource_in(group, version, rest),
        [] => "root".into(),
        _ => OTHER.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_routes_match_and_the_rest_is_the_resource_tree() {
        let cases = [
            ("/healthz", Some(Route::Health)),
            ("/ui/", Some(Route::Ui)),
            ("/metrics", Some(Route::Metrics)),
            ("/api", Some(Route::Discovery)),
            ("/api/v1", Some(Route::Discovery)),
            ("/apis/apps", Some(Route::Discovery)),
            ("/apis/apps/v1/", Some(Route::Discovery)),
            ("/openapi/v3/apis/apps/v1", Some(Route::OpenApiV3Doc)),
            ("/agent/v1/register", Some(Route::Agent)),
            ("/api/v1/clusters", Some(Route::Dro)),
            (
                "/api/v1/bindings/default.web-deployment/status",
                Some(Route::Dro),
            ),
            ("/api/v1/openapi.json", Some(Route::Dro)),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Some(Route::Review),
            ),
            // The resource tree.
            ("/api/v1/namespaces/default/configmaps", None),
            ("/api/v1/nodes", None),
            ("/apis/apps/v1/deployments", None),
            ("/apis/authorization.k8s.io/v1/madeup", None),
            ("/madeup", None),
        ];
        for (path, want) in cases {
            assert_eq!(route(path), want, "{path}");
        }
        assert!(is_dro_path("/api/v1/sync/batch"));
        assert!(!is_dro_path("/api/v1/namespaces/default/configmaps"));
        assert!(!is_dro_path("/apis/apps/v1/deployments"));
    }

    #[test]
    fn paths_reduce_to_resources() {
        let cases = [
            ("/api/v1/namespaces/default/configmaps/x", "configmaps"),
            ("/api/v1/namespaces", "namespaces"),
            ("/apis/apps/v1/namespaces/a/deployments", "deployments"),
            (
                "/apis/multicluster.io/v1alpha1/clusters/east/status",
                "clusters",
            ),
            ("/api/v1/clusters", "clusters"),
            ("/api/v1/history/schedules", "history"),
            ("/apis", "discovery"),
            ("/api/v1", "discovery"),
            ("/version", "version"),
            ("/openapi/v3/apis/apps/v1", "openapi"),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                "selfsubjectaccessreviews",
            ),
            ("/", "root"),
            // What a client makes up names no series of its own.
            ("/api/v1/namespaces/default/madeup1", "other"),
            ("/apis/apps/v1/madeup2", "other"),
            ("/apis/madeup.io/v1/things", "other"),
            ("/madeup3/x", "other"),
            ("/.env", "other"),
        ];
        // Served here: configmaps, namespaces, deployments, clusters.
        let served = |g: &str, v: &str, plural: &str| {
            matches!(
                (g, v, plural),
                ("", "v1", "configmaps" | "namespaces")
                    | ("apps", "v1", "deployments")
                    | ("multicluster.io", "v1alpha1", "clusters")
            )
        };
        for (p, want) in cases {
            assert_eq!(label(p, served), want, "{p}");
        }
    }
}
