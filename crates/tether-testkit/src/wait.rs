//! Polling with a deadline that reports what it saw last, and CRD installation that waits
//! until the API server serves the new kinds.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::Error;

/// Calls `check` every 200 ms until it returns `Ok`, or panics after `timeout` with the last
/// `Err` it returned: what the test was waiting for and what it saw instead.
#[allow(clippy::panic)] // NB: a test helper: failing the test is its job.
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {last:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Installs every Tether CRD (`tether_api::crds::all`) and waits until each is Established.
pub async fn install_tether_crds(client: &Client) -> Result<(), Error> {
    let crds: Vec<_> = tether_api::crds::all().into_iter().map(|(_, crd)| crd).collect();
    install_crds(client, &crds).await
}

/// Applies CRDs (server-side) and waits until each is Established.
pub async fn install_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("tether-testkit").force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(|source| Error::Api {
                op: format!("apply CRD {name}"),
                source,
            })?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = api.get(&name).await.map_err(|source| Error::Api {
                op: format!("get CRD {name}"),
                source,
            })?;
            let established = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    name,
                    what: "CRD not Established after 30s".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
