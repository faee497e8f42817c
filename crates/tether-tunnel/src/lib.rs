//! Member access through the leader, as one contract both ends compile against: where the
//! leader's aggregated API lives and how its paths read (`route`), which headers carry the
//! caller's identity across the tunnel and which are never trusted (`headers`), how a leader
//! identity becomes a member impersonation (`identity`), how the agent proves the member's key
//! at attach (`proof`), how a member credential crosses the leader sealed (`passthrough`), the bounds on what a caller can make an end hold (`limits`), the
//! one-byte pings a tunnel carries until its first request starts HTTP/2 on it (`idle`), the
//! byte plumbing of the tunnel (`pipe`) and what both ends do with an answer they relay (`relay`): HTTP/2 with the leader as client and the agent as server, over a connection the
//! agent opened through the leader's API server.

pub mod cert;
pub mod headers;
pub mod identity;
pub mod idle;
pub mod limits;
pub mod passthrough;
pub mod pipe;
pub mod proof;
pub mod relay;
pub mod route;

/// The aggregated API group the leader serves (registered with an APIService).
pub const GROUP: &str = "proxy.multicluster.tether.dev";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// The APIService that registers it (`<version>.<group>`).
pub const API_SERVICE: &str = "v1alpha1.proxy.multicluster.tether.dev";
/// The resource a member is addressed as: its ManagedCluster, in its dedicated namespace.
pub const RESOURCE: &str = "managedclusters";
/// The subresource users call: `.../managedclusters/<name>/proxy/<member path>`.
pub const PROXY: &str = "proxy";
/// The subresource the agent attaches its tunnel to: `.../managedclusters/<name>/attach`.
/// NB: `attach` (like `proxy`) is one of the API server's long-running subresources, so the
/// tunnel outlives `--request-timeout` and is exempt from priority-and-fairness seats.
pub const ATTACH: &str = "attach";
/// The subresource an agent whose credential expired gets a new one at, with no token at all:
/// `.../managedclusters/<name>/rejoin` answers a challenge sealed to the member's registered
/// key, and a proof read out of it with a new credential sealed to that key (`proof`).
pub const REJOIN: &str = "rejoin";
/// The HTTP/1.1 upgrade token of the tunnel.
pub const UPGRADE_PROTOCOL: &str = "tether-tunnel.v1";
/// The prefix of every identity the agent impersonates on the member.
pub const IMPERSONATION_PREFIX: &str = "tether";

/// A Kubernetes `Status` failure answer: `code`, its reason word and `message`.
pub fn status(code: http::StatusCode, message: &str) -> http::Response<pipe::Body> {
    let reason: String = code
        .canonical_reason()
        .unwrap_or("Error")
        .split_whitespace()
        .collect();
    status_because(code, &reason, message)
}

/// As [`status`], with the Status `reason` given (for example [`proof::PROOF_REFUSED`]).
pub fn status_because(code: http::StatusCode, reason: &str, message: &str) -> http::Response<pipe::Body> {
    let s = k8s_openapi::apimachinery::pkg::apis::meta::v1::Status {
        code: Some(i32::from(code.as_u16())),
        message: Some(message.to_string()),
        reason: Some(reason.to_string()),
        status: Some("Failure".into()),
        ..Default::default()
    };
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), "Status".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    let mut r = http::Response::new(pipe::full(v.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The path the agent dials to attach its tunnel for member `name` in `namespace`.
pub fn attach_path(namespace: &str, name: &str) -> String {
    format!("/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RESOURCE}/{name}/{ATTACH}")
}

/// The path an agent whose credential expired rejoins member `name` in `namespace` at.
pub fn rejoin_path(namespace: &str, name: &str) -> String {
    format!("/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RESOURCE}/{name}/{REJOIN}")
}

/// The URL prefix users reach member `name` at (append the member path, e.g. `/api/v1/pods`).
pub fn proxy_path(namespace: &str, name: &str) -> String {
    format!("/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RESOURCE}/{name}/{PROXY}")
}
