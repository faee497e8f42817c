//! Ensures the API server can find and trust the active leader replica: a serving certificate
//! for `<service>.<namespace>.svc` kept in one Secret that every replica shares, its CA in the
//! APIService's `caBundle`, and an EndpointSlice of the selector-less proxy Service that names
//! only the replica that leads. The CA (10 years) signs a short-lived leaf that the serving
//! leader renews at two thirds of its life from the same CA, so the `caBundle` a running
//! aggregator trusts never changes under it. Pure builders; `mod.rs` applies them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort as CoreEndpointPort, EndpointSubset, Endpoints,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::ObjectMeta;
use tether_tunnel::cert::Authority;

/// Label that ties an EndpointSlice to its Service (what the aggregator selects by).
pub const SLICE_SERVICE_LABEL: &str = "kubernetes.io/service-name";
/// Label that keeps the EndpointSlice controllers away from the slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The port name shared by the proxy Service and its EndpointSlice.
pub const PORT_NAME: &str = "https";
/// How long the CA that signs the serving certificates is valid.
const CA_VALID_DAYS: i64 = 3650;

pub use tether_tunnel::cert::Serving;

/// What the shared Secret holds: the serving certificate and, when this version made it, the
/// CA's key to renew it with (a Secret of an earlier version has none: it is replaced whole).
/// Its `Debug` never prints a private key.
#[derive(Clone, PartialEq, Eq)]
pub struct Stored {
    /// The certificate served, its key and CA.
    pub serving: Serving,
    /// The CA's private key.
    pub ca_key: Option<String>,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stored")
            .field("serving", &self.serving)
            .field(
                "ca_key",
                &self.ca_key.as_ref().map(|_| tether_tunnel::cert::REDACTED),
            )
            .finish()
    }
}

impl Stored {
    /// The CA, when its key is kept.
    pub fn authority(&self) -> Option<Authority> {
        Some(Authority {
            cert: self.serving.ca.clone(),
            key: self.ca_key.clone()?,
        })
    }
}

/// The DNS name the aggregator verifies: `<service>.<namespace>.svc`.
pub fn service_dns(namespace: &str, service: &str) -> String {
    format!("{service}.{namespace}.svc")
}

fn to_duration(d: std::time::Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

/// The next serving certificate for `dns`: from the stored CA when there is one (the leaf only
/// changes), else from a new CA.
pub fn next(stored: Option<&Stored>, dns: &str, valid: std::time::Duration) -> Result<Stored, rcgen::Error> {
    let authority = match stored.and_then(Stored::authority) {
        Some(a) => a,
        None => Authority::generate("tether-proxy-ca", time::Duration::days(CA_VALID_DAYS))?,
    };
    Ok(Stored {
        serving: authority.issue(dns, to_duration(valid))?,
        ca_key: Some(authority.key),
    })
}

/// The validity of the certificate `cert_pem` as Unix seconds (not before, not after); `None`
/// when it cannot be read.
fn validity(cert_pem: &str) -> Option<(i64, i64)> {
    let der = pem::parse(cert_pem).ok()?.into_contents();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// When the certificate `cert_pem` is due for renewal: at two thirds of its validity. `None`
/// when it cannot be read (renew it now).
pub fn renew_at(cert_pem: &str) -> Option<time::OffsetDateTime> {
    let (from, to) = validity(cert_pem)?;
    time::OffsetDateTime::from_unix_timestamp(from + (to - from) * 2 / 3).ok()
}

/// When the certificate `cert_pem` expires, in Unix seconds (what the expiry metric reports).
pub fn expires_at(cert_pem: &str) -> Option<i64> {
    validity(cert_pem).map(|(_, to)| to)
}

/// Whether `stored` must be replaced at `now`: its leaf is due for renewal, or it has no CA key
/// to renew with (made by an earlier version, with a 10-year leaf).
pub fn is_due(stored: &Stored, now: time::OffsetDateTime) -> bool {
    stored.ca_key.is_none() || renew_at(&stored.serving.cert).is_none_or(|at| at <= now)
}

/// The Secret that holds `stored` (type `kubernetes.io/tls`, plus `ca.crt` and `ca.key`).
pub fn secret(namespace: &str, name: &str, stored: &Stored) -> Secret {
    let serving = &stored.serving;
    let mut data = BTreeMap::from([
        (
            "tls.crt".to_string(),
            ByteString(serving.cert.clone().into_bytes()),
        ),
        (
            "tls.key".to_string(),
            ByteString(serving.key.clone().into_bytes()),
        ),
        ("ca.crt".to_string(), ByteString(serving.ca.clone().into_bytes())),
    ]);
    if let Some(key) = &stored.ca_key {
        data.insert("ca.key".to_string(), ByteString(key.clone().into_bytes()));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                tether_api::labels::MANAGED_BY.to_string(),
                crate::provision::FIELD_MANAGER.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Reads what the Secret holds back.
pub fn from_secret(s: &Secret) -> Option<Stored> {
    let get = |k: &str| {
        s.data
            .as_ref()?
            .get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|t| !t.trim().is_empty())
    };
    Some(Stored {
        serving: Serving {
            cert: get("tls.crt")?,
            key: get("tls.key")?,
            ca: get("ca.crt")?,
        },
        ca_key: get("ca.key"),
    })
}

/// On the APIService: which serving term of which replica registered it, so that a replica
/// withdraws only its own registration, never one a successor made.
pub const SERVED_BY: &str = "proxy.multicluster.tether.dev/served-by";

/// The APIService of member access as the replica serving term `served_by` registers it: the
/// proxy group, trusted through `ca_pem`, served behind `service` in `namespace`.
pub fn api_service(ca_pem: &str, namespace: &str, service: &str, served_by: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": tether_tunnel::API_SERVICE,
            "labels": {tether_api::labels::MANAGED_BY: crate::provision::FIELD_MANAGER},
            "annotations": {SERVED_BY: served_by},
        },
        "spec": {
            "group": tether_tunnel::GROUP,
            "version": tether_tunnel::VERSION,
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "service": {"name": service, "namespace": namespace, "port": 443},
            "caBundle": B64.encode(ca_pem),
        },
    })
}

/// The EndpointSlice of `service` naming only `ip:port`, the replica that leads.
pub fn endpoint_slice(namespace: &str, service: &str, ip: IpAddr, port: u16) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(service.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (SLICE_SERVICE_LABEL.to_string(), service.to_string()),
                (
                    MANAGED_BY_LABEL.to_string(),
                    crate::provision::FIELD_MANAGER.to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        address_type: if ip.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
        endpoints: vec![Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        }],
        ports: Some(vec![EndpointPort {
            name: Some(PORT_NAME.into()),
            port: Some(i32::from(port)),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

/// The newest Kubernetes minor whose aggregator routes to an APIService's Service through its
/// Endpoints rather than its EndpointSlices (1.32 is; 1.34 and later are not): the serving
/// replica writes both there.
pub const LAST_MINOR_ROUTING_BY_ENDPOINTS: u32 = 33;

/// Whether an API server of `minor` (its `/version` minor, e.g. "32" or "33+") routes aggregated
/// APIs by Endpoints; an unreadable minor is taken as new.
pub fn routes_by_endpoints(minor: &str) -> bool {
    minor
        .trim_end_matches('+')
        .parse::<u32>()
        .is_ok_and(|m| m <= LAST_MINOR_ROUTING_BY_ENDPOINTS)
}

/// The Endpoints of `service` naming only `ip:port`, for aggregators that still route by them
/// (`routes_by_endpoints`); marked so that no controller mirrors them into another slice.
pub fn endpoints(namespace: &str, service: &str, ip: IpAddr, port: u16) -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some(service.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (SKIP_MIRROR_LABEL.to_string(), "true".to_string()),
                (
                    tether_api::labels::MANAGED_BY.to_string(),
                    crate::provision::FIELD_MANAGER.to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: ip.to_string(),
                ..EndpointAddress::default()
            }]),
            ports: Some(vec![CoreEndpointPort {
                name: Some(PORT_NAME.into()),
                port: i32::from(port),
                protocol: Some("TCP".into()),
                ..CoreEndpointPort::default()
            }]),
            ..EndpointSubset::default()
        }]),
    }
}

/// Label that keeps the EndpointSlice mirroring controller from copying Endpoints.
const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_aggregators_before_1_34_route_by_endpoints() {
        assert!(routes_by_endpoints("32"));
        assert!(routes_by_endpoints("33+"));
        assert!(!routes_by_endpoints("34"));
        assert!(!routes_by_endpoints("37"));
        assert!(!routes_by_endpoints(""));
    }

    /// The leader's default `--proxy-cert-validity`.
    const DEFAULT_VALIDITY: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

    fn verifies(s: &Serving, dns: &str) -> bool {
        use rustls::client::WebPkiServerVerifier;
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let der = |p: &str| CertificateDer::from(pem::parse(p).unwrap().into_contents());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&s.ca)).unwrap();
        let verifier = WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        verifier
            .verify_server_cert(
                &der(&s.cert),
                &[],
                &ServerName::try_from(dns.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
            .is_ok()
    }

    #[test]
    fn debug_of_the_stored_serving_certificate_never_prints_a_private_key() {
        let s = next(None, "x.svc", DEFAULT_VALIDITY).unwrap();
        let text = format!("{s:?} {s:#?}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        assert!(text.contains("CERTIFICATE"), "{text}");
    }

    #[test]
    fn the_serving_certificate_round_trips_through_its_secret_and_names_the_service() {
        let dns = service_dns("tether-system", "tether-leader-proxy");
        assert_eq!(dns, "tether-leader-proxy.tether-system.svc");
        let s = next(None, &dns, DEFAULT_VALIDITY).unwrap();
        let back = from_secret(&secret("tether-system", "tether-leader-proxy-serving", &s)).unwrap();
        assert_eq!(back, s);
        assert!(
            verifies(&s.serving, &dns),
            "the leaf chains to its CA for the Service name"
        );
        assert!(!verifies(&s.serving, "other.tether-system.svc"));
        assert!(from_secret(&Secret::default()).is_none());
        let svc = api_service(
            &s.serving.ca,
            "tether-system",
            "tether-leader-proxy",
            "10.0.0.1/abc",
        );
        let b = svc["spec"]["caBundle"].as_str().unwrap();
        assert_eq!(B64.decode(b).unwrap(), s.serving.ca.as_bytes());
        assert_eq!(svc["metadata"]["name"], tether_tunnel::API_SERVICE);
        assert_eq!(svc["spec"]["service"]["namespace"], "tether-system");
        assert_eq!(svc["metadata"]["annotations"][SERVED_BY], "10.0.0.1/abc");
    }

    #[test]
    fn a_renewed_leaf_keeps_the_ca_so_the_ca_bundle_does_not_change() {
        let dns = service_dns("tether-system", "tether-leader-proxy");
        let first = next(None, &dns, std::time::Duration::from_secs(90)).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let at = renew_at(&first.serving.cert).unwrap();
        assert!(
            (at - now - time::Duration::seconds(60)).abs() < time::Duration::seconds(3),
            "renewed at two thirds of 90 s: {at} (now {now})"
        );
        let expires = expires_at(&first.serving.cert).unwrap();
        assert!(
            (expires - now.unix_timestamp() - 90).abs() < 3,
            "expires 90 s after it was made: {expires} (now {now})"
        );
        assert!(expires_at("not a certificate").is_none());
        assert!(!is_due(&first, now));
        assert!(is_due(&first, now + time::Duration::seconds(61)));
        let second = next(Some(&first), &dns, std::time::Duration::from_secs(90)).unwrap();
        assert_eq!(second.serving.ca, first.serving.ca, "same CA");
        assert_eq!(second.ca_key, first.ca_key);
        assert_ne!(second.serving.cert, first.serving.cert, "a new leaf");
        assert_ne!(second.serving.key, first.serving.key, "with a new key");
        assert!(verifies(&second.serving, &dns));

        // A Secret of an earlier version (no CA key) is due at once and replaced whole.
        let old = Stored {
            ca_key: None,
            ..first.clone()
        };
        assert!(is_due(&old, now));
        let replaced = next(Some(&old), &dns, DEFAULT_VALIDITY).unwrap();
        assert_ne!(replaced.serving.ca, first.serving.ca);
        assert!(replaced.ca_key.is_some() && verifies(&replaced.serving, &dns));
    }

    #[test]
    fn the_slice_names_one_ready_address_under_the_service_port_name() {
        let slice = endpoint_slice(
            "tether-system",
            "tether-leader-proxy",
            "10.203.0.1".parse().unwrap(),
            8443,
        );
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints.len(), 1);
        assert_eq!(slice.endpoints[0].addresses, ["10.203.0.1"]);
        let port = &slice.ports.as_ref().unwrap()[0];
        assert_eq!((port.name.as_deref(), port.port), (Some(PORT_NAME), Some(8443)));
        assert_eq!(
            slice
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get(SLICE_SERVICE_LABEL)
                .map(String::as_str),
            Some("tether-leader-proxy")
        );
    }
}
