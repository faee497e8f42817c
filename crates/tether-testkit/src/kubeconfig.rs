//! Kubeconfigs of a test cluster: the admin's, and one per client certificate (kubelets,
//! kube-proxy, the tests' own users).

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Error;
use crate::pki::Pki;

/// The admin's kubeconfig of a cluster at `url`.
pub(crate) fn admin_kubeconfig(name: &str, url: &str, pki: &Pki) -> String {
    client_kubeconfig(
        name,
        url,
        &pki.ca_cert,
        &(pki.admin_cert.clone(), pki.admin_key.clone()),
    )
}

/// A kubeconfig for `url` that authenticates with a client certificate and key (PEM).
pub(crate) fn client_kubeconfig(
    name: &str,
    url: &str,
    ca_pem: &str,
    (cert, key): &(String, String),
) -> String {
    let ca = B64.encode(ca_pem);
    let cert = B64.encode(cert);
    let key = B64.encode(key);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {name}-admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\ncurrent-context: {name}\n"
    )
}

/// The client configuration of a kubeconfig file.
pub(crate) async fn kube_config(path: &Path) -> Result<Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}
