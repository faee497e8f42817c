//! Ensures no identity crosses the tunnel except the one the leader verified: the names of the
//! headers that carry it, and the one function both ends use to drop every header a caller
//! could forge (credentials, impersonation, front-proxy identity, hop-by-hop).

use http::HeaderMap;
use http::header::{self, HeaderName};

/// The leader-verified user name, from the aggregator's front-proxy identity.
pub const REMOTE_USER: HeaderName = HeaderName::from_static("tether-remote-user");
/// A leader-verified group of that user (repeated).
pub const REMOTE_GROUP: HeaderName = HeaderName::from_static("tether-remote-group");
/// Pass-through: a member credential the caller supplies (`Bearer <token>`). The leader forwards
/// it inside the tunnel and never stores or logs it; the agent sends it to the member as
/// `Authorization` and impersonates nobody.
pub const MEMBER_AUTHORIZATION: HeaderName = HeaderName::from_static("tether-member-authorization");
/// On a tunneled request: the caller asked to upgrade to this protocol (HTTP/2 has no Upgrade
/// header). On the agent's answer: the member switched to this protocol (its 101).
pub const UPGRADE: HeaderName = HeaderName::from_static("tether-upgrade");

/// Response headers of a member's 101 that the caller needs (the rest are hop-by-hop).
pub const UPGRADE_RESPONSE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("sec-websocket-accept"),
    HeaderName::from_static("sec-websocket-protocol"),
    HeaderName::from_static("x-stream-protocol-version"),
];

/// Headers that set the source address or the audit ID the member's API server records: the
/// caller must not choose what the member's audit log says (its API server sets them itself).
const AUDIT_FIELDS: [HeaderName; 5] = [
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("audit-id"),
    HeaderName::from_static("x-forwarded-host"),
];

/// Hop-by-hop headers (RFC 9110 7.6.1) and those HTTP/2 forbids.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes everything that names or proves an identity (`Authorization`, `Impersonate-*`,
/// front-proxy `X-Remote-*`, Tether's own identity headers), what sets the member's audit fields
/// (`X-Forwarded-For`, `X-Real-Ip`, `Forwarded`, `Audit-ID`), the hop-by-hop headers and `Host`.
/// `keep_member_credential` keeps the caller's pass-through credential (the leader forwards it;
/// the agent consumes it before calling this).
pub fn strip_untrusted(headers: &mut HeaderMap, keep_member_credential: bool) {
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            let n = name.as_str();
            n.starts_with("impersonate-")
                || n.starts_with("x-remote-")
                || (n.starts_with("tether-") && !(keep_member_credential && **name == MEMBER_AUTHORIZATION))
        })
        .cloned()
        .collect();
    for name in doomed.iter().chain(HOP_BY_HOP.iter()).chain(AUDIT_FIELDS.iter()) {
        headers.remove(name);
    }
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
}

/// Whether `headers` ask for an HTTP/1.1 upgrade (`Connection: upgrade` and an `Upgrade` token),
/// and to what.
pub fn upgrade_request(headers: &HeaderMap) -> Option<String> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let to = headers.get(header::UPGRADE)?.to_str().ok()?.trim();
    (asks && !to.is_empty()).then(|| to.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn forged_identity_headers_are_dropped_and_the_rest_kept() {
        let mut h = map(&[
            ("authorization", "Bearer leader-token"),
            ("impersonate-user", "admin"),
            ("impersonate-group", "system:masters"),
            ("impersonate-extra-scopes", "x"),
            ("impersonate-uid", "1"),
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
            ("tether-remote-user", "admin"),
            ("tether-remote-group", "system:masters"),
            ("tether-upgrade", "SPDY/3.1"),
            ("tether-member-authorization", "Bearer member"),
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("transfer-encoding", "chunked"),
            ("host", "leader"),
            ("x-forwarded-for", "10.9.9.9"),
            ("x-real-ip", "10.9.9.9"),
            ("forwarded", "for=10.9.9.9"),
            ("audit-id", "chosen-by-the-caller"),
            ("x-forwarded-host", "elsewhere"),
            ("accept", "application/json"),
            ("content-type", "application/json"),
            ("user-agent", "kubectl"),
        ]);
        let mut kept = h.clone();
        strip_untrusted(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept", "content-type", "user-agent"]);
        strip_untrusted(&mut kept, true);
        assert_eq!(
            kept.get(MEMBER_AUTHORIZATION).map(|v| v.to_str().unwrap()),
            Some("Bearer member")
        );
        assert!(kept.get("tether-remote-user").is_none() && kept.get("authorization").is_none());
    }

    #[test]
    fn upgrades_are_recognised_only_with_both_headers() {
        assert_eq!(
            upgrade_request(&map(&[
                ("connection", "keep-alive, Upgrade"),
                ("upgrade", "SPDY/3.1")
            ])),
            Some("SPDY/3.1".into())
        );
        assert_eq!(upgrade_request(&map(&[("upgrade", "websocket")])), None);
        assert_eq!(upgrade_request(&map(&[("connection", "upgrade")])), None);
        assert_eq!(
            upgrade_request(&map(&[("connection", "close"), ("upgrade", "h2c")])),
            None
        );
    }
}
