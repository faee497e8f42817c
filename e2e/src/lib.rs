//! Helpers shared by the end-to-end tests: access to Tether kinds as untyped objects (so tests
//! can send what the Rust types would refuse to build) and API error inspection.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource};

/// An untyped API for kind `K` in `ns` (or cluster-wide when `ns` is None).
pub fn dynamic<K: Resource<DynamicType = ()>>(client: &Client, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Creates an object from raw JSON, returning the API server's answer.
pub async fn create_raw<K: Resource<DynamicType = ()>>(
    client: &Client,
    ns: Option<&str>,
    body: serde_json::Value,
) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    dynamic::<K>(client, ns)
        .create(&PostParams::default(), &obj)
        .await
}

/// The HTTP status code of an API error, if it is one.
pub fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The API server's message of an API error, or the error's text.
pub fn message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}
