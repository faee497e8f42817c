//! Ensures the API server can find and trust the active leader replica: a serving certificate
//! for `<service>.<namespace>.svc` kept in one Secret that every replica shares (created once,
//! never rotated behind a running aggregator's back), its CA in the APIService's `caBundle`,
//! and an EndpointSlice of the selector-less proxy Service that names only the replica that
//! leads. Pure builders; `mod.rs` applies them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::ObjectMeta;

/// Label that ties an EndpointSlice to its Service (what the aggregator selects by).
pub const SLICE_SERVICE_LABEL: &str = "kubernetes.io/service-name";
/// Label that keeps the EndpointSlice controllers away from the slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The port name shared by the proxy Service and its EndpointSlice.
pub const PORT_NAME: &str = "https";
/// How long the generated serving certificate is valid.
const VALID_DAYS: i64 = 3650;

pub use tether_tunnel::cert::Serving;

/// The DNS name the aggregator verifies: `<service>.<namespace>.svc`.
pub fn service_dns(namespace: &str, service: &str) -> String {
    format!("{service}.{namespace}.svc")
}

/// Generates a CA and a serving certificate for `dns`.
pub fn generate(dns: &str) -> Result<Serving, rcgen::Error> {
    tether_tunnel::cert::generate("tether-proxy-ca", dns, time::Duration::days(VALID_DAYS))
}

/// The Secret that holds `serving` (type `kubernetes.io/tls`, plus `ca.crt`).
pub fn secret(namespace: &str, name: &str, serving: &Serving) -> Secret {
    let data = BTreeMap::from([
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

/// Reads a serving certificate back from its Secret.
pub fn from_secret(s: &Secret) -> Option<Serving> {
    let get = |k: &str| {
        s.data
            .as_ref()?
            .get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|t| !t.trim().is_empty())
    };
    Some(Serving {
        cert: get("tls.crt")?,
        key: get("tls.key")?,
        ca: get("ca.crt")?,
    })
}

/// The merge patch that sets the APIService's `caBundle` to `ca_pem`.
pub fn ca_bundle_patch(ca_pem: &str) -> serde_json::Value {
    serde_json::json!({"spec": {"caBundle": B64.encode(ca_pem)}})
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_round_trips_through_its_secret_and_names_the_service() {
        let dns = service_dns("tether-system", "tether-leader-proxy");
        assert_eq!(dns, "tether-leader-proxy.tether-system.svc");
        let s = generate(&dns).unwrap();
        let back = from_secret(&secret("tether-system", "tether-leader-proxy-serving", &s)).unwrap();
        assert_eq!(back, s);
        let der = pem::parse(&s.cert).unwrap().into_contents();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let sans = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .clone();
        assert!(format!("{sans:?}").contains(&dns), "{sans:?}");
        assert!(from_secret(&Secret::default()).is_none());
        let patch = ca_bundle_patch(&s.ca);
        let b = patch["spec"]["caBundle"].as_str().unwrap();
        assert_eq!(B64.decode(b).unwrap(), s.ca.as_bytes());
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
