//! Ensures every path the leader's aggregated server receives maps to exactly one thing: API
//! discovery, the agent's attach, a user's proxied member path, or nothing (404). Names are
//! checked as DNS labels here, before anything looks them up.

use crate::{ATTACH, GROUP, PROXY, REJOIN, RESOURCE, VERSION};

/// What a request to the aggregated server is for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/apis`, `/apis/<group>` or `/apis/<group>/<version>`: discovery.
    Discovery(Discovery),
    /// `/openapi/v2` or `/openapi/v3[/...]`: the (empty) OpenAPI documents.
    OpenApi,
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// The agent of member `name` attaches its tunnel.
    Attach {
        /// The member's dedicated namespace.
        namespace: &'a str,
        /// The ManagedCluster name.
        name: &'a str,
    },
    /// The agent of member `name`, its credential expired, proves its key for a new one.
    Rejoin {
        /// The member's dedicated namespace.
        namespace: &'a str,
        /// The ManagedCluster name.
        name: &'a str,
    },
    /// A user's request for member `name`; `path` is the member path (starts with `/`).
    Proxy {
        /// The member's dedicated namespace.
        namespace: &'a str,
        /// The ManagedCluster name.
        name: &'a str,
        /// The path on the member API server.
        path: &'a str,
    },
    /// Anything else.
    NotFound,
}

/// Which discovery document.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Discovery {
    /// `/apis`.
    Groups,
    /// `/apis/<group>`.
    Group,
    /// `/apis/<group>/<version>`.
    Resources,
}

/// Maps a request path (without the query) to its route.
pub fn route(path: &str) -> Route<'_> {
    match path.trim_end_matches('/') {
        "/apis" => return Route::Discovery(Discovery::Groups),
        "/healthz" | "/livez" | "/readyz" => return Route::Health,
        "/openapi/v2" => return Route::OpenApi,
        p if p == "/openapi/v3" || p.starts_with("/openapi/v3/") => return Route::OpenApi,
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/apis/").and_then(|r| r.strip_prefix(GROUP)) else {
        return Route::NotFound;
    };
    if rest.is_empty() || rest == "/" {
        return Route::Discovery(Discovery::Group);
    }
    let Some(rest) = rest.strip_prefix('/').and_then(|r| r.strip_prefix(VERSION)) else {
        return Route::NotFound;
    };
    if rest.is_empty() || rest == "/" {
        return Route::Discovery(Discovery::Resources);
    }
    let mut parts = rest.splitn(6, '/');
    // rest = "/namespaces/<ns>/managedclusters/<name>/<subresource>[/<path>]"
    let (Some(""), Some("namespaces"), Some(namespace), Some(RESOURCE), Some(name)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Route::NotFound;
    };
    if !is_dns_label(namespace) || !is_dns_label(name) {
        return Route::NotFound;
    }
    let tail = parts.next().unwrap_or("");
    if tail == ATTACH {
        return Route::Attach { namespace, name };
    }
    if tail == REJOIN {
        return Route::Rejoin { namespace, name };
    }
    match tail.strip_prefix(PROXY) {
        Some("") => Route::Proxy {
            namespace,
            name,
            path: "/",
        },
        Some(p) if p.starts_with('/') => Route::Proxy {
            namespace,
            name,
            path: p,
        },
        _ => Route::NotFound,
    }
}

/// Whether `s` is a DNS-1123 label (what namespaces and ManagedCluster names are).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_maps_to_one_route() {
        let base =
            "/apis/proxy.multicluster.tether.dev/v1alpha1/namespaces/tether-prod-east/managedclusters/east";
        let cases: Vec<(String, Route<'static>)> = vec![
            ("/apis".into(), Route::Discovery(Discovery::Groups)),
            ("/apis/".into(), Route::Discovery(Discovery::Groups)),
            (
                "/apis/proxy.multicluster.tether.dev".into(),
                Route::Discovery(Discovery::Group),
            ),
            (
                "/apis/proxy.multicluster.tether.dev/v1alpha1".into(),
                Route::Discovery(Discovery::Resources),
            ),
            ("/openapi/v2".into(), Route::OpenApi),
            ("/openapi/v3/apis/x".into(), Route::OpenApi),
            ("/healthz".into(), Route::Health),
            (
                format!("{base}/attach"),
                Route::Attach {
                    namespace: "tether-prod-east",
                    name: "east",
                },
            ),
            (
                format!("{base}/proxy"),
                Route::Proxy {
                    namespace: "tether-prod-east",
                    name: "east",
                    path: "/",
                },
            ),
            (
                format!("{base}/proxy/api/v1/namespaces/default/pods"),
                Route::Proxy {
                    namespace: "tether-prod-east",
                    name: "east",
                    path: "/api/v1/namespaces/default/pods",
                },
            ),
            (
                format!("{base}/rejoin"),
                Route::Rejoin {
                    namespace: "tether-prod-east",
                    name: "east",
                },
            ),
            (format!("{base}/rejoin/x"), Route::NotFound),
            (format!("{base}/proxyx/api"), Route::NotFound),
            (format!("{base}/attach/more"), Route::NotFound),
            (base.to_string(), Route::NotFound),
            (
                "/apis/proxy.multicluster.tether.dev/v1alpha1/namespaces/Bad_NS/managedclusters/east/proxy/"
                    .into(),
                Route::NotFound,
            ),
            (
                "/apis/proxy.multicluster.tether.dev/v1alpha1/managedclusters/east/proxy/".into(),
                Route::NotFound,
            ),
            (
                "/apis/proxy.multicluster.tether.devx/v1alpha1".into(),
                Route::NotFound,
            ),
            ("/apis/other.group/v1".into(), Route::NotFound),
            ("/api/v1/pods".into(), Route::NotFound),
            ("".into(), Route::NotFound),
        ];
        for (path, want) in &cases {
            assert_eq!(&route(path), want, "{path}");
        }
    }

    #[test]
    fn dns_labels_are_checked() {
        for ok in ["a", "east", "tether-prod-east-1a2b", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", &"a".repeat(64), "..", "a b"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }
}
