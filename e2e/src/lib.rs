//! Helpers shared by the end-to-end tests: access to Tether kinds as untyped objects (so tests
//! can send what the Rust types would refuse to build), API error inspection, RBAC set-up, and
//! (`sim`) a leader with simulated members.

pub mod access;
pub mod fleet;
pub mod pods;
pub mod scale;
pub mod sim;
pub mod soak;

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

/// Sends the controllers' logs (RUST_LOG, default `info` for Tether) to the test output.
pub fn init_logs() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,tether_leader=info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_test_writer()
        .try_init();
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

/// Applies a multi-document RBAC file from `config/rbac/` (ServiceAccounts, ClusterRoles,
/// ClusterRoleBindings, Roles, RoleBindings), creating namespaces it names.
pub async fn apply_rbac_file(client: &Client, file: &str) -> Result<(), kube::Error> {
    apply_config_file(client, file).await
}

/// Applies a multi-document file from `config/` (`rbac/leader.yaml`, `proxy/leader-proxy.yaml`;
/// a bare name is under `rbac/`): RBAC objects, ServiceAccounts, Services and APIServices.
pub async fn apply_config_file(client: &Client, file: &str) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kube::api::{Patch, PatchParams};
    use serde::Deserialize;

    let file = if file.contains('/') {
        file.to_string()
    } else {
        format!("rbac/{file}")
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config")
        .join(&file);
    let text = std::fs::read_to_string(&path).map_err(|e| kube::Error::Service(Box::new(e)))?;
    let pp = PatchParams::apply("tether-e2e").force();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(doc).map_err(|e| kube::Error::Service(Box::new(e)))?;
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let ns = value["metadata"]["namespace"].as_str().map(str::to_string);
        if let Some(ns) = &ns {
            let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            Api::<Namespace>::all(client.clone())
                .patch(ns, &pp, &Patch::Apply(body))
                .await?;
        }
        let ns = ns.unwrap_or_default();
        let patch = Patch::Apply(value.clone());
        match value["kind"].as_str() {
            Some("ServiceAccount") => drop(
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("ClusterRole") => drop(
                Api::<ClusterRole>::all(client.clone())
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("ClusterRoleBinding") => drop(
                Api::<ClusterRoleBinding>::all(client.clone())
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("Role") => drop(
                Api::<Role>::namespaced(client.clone(), &ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("RoleBinding") => drop(
                Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("Service") => drop(
                Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns)
                    .patch(&name, &pp, &patch)
                    .await?,
            ),
            Some("APIService") => {
                let ar = kube::api::ApiResource::from_gvk_with_plural(
                    &kube::core::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
                    "apiservices",
                );
                drop(
                    Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar)
                        .patch(&name, &pp, &patch)
                        .await?,
                )
            }
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    Ok(())
}

/// A short-lived token of a ServiceAccount (TokenRequest), to run a controller with its own RBAC.
pub async fn service_account_token(client: &Client, ns: &str, name: &str) -> Result<String, kube::Error> {
    service_account_token_for(client, ns, name, 3600).await
}

/// As `service_account_token`, valid for `seconds`.
pub async fn service_account_token_for(
    client: &Client,
    ns: &str,
    name: &str,
    seconds: i64,
) -> Result<String, kube::Error> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..Default::default()
        },
        ..Default::default()
    };
    let got = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(name, &PostParams::default(), &req)
        .await?;
    Ok(got.status.map(|s| s.token).unwrap_or_default())
}

/// The join RBAC of `set`, exactly as `tether init` creates it (the production builder).
pub async fn join_role(client: &Client, set: &tether_api::SetRef) -> Result<(), kube::Error> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let (role, binding) = tether_join::token::join_rbac(set);
    Api::<Role>::namespaced(client.clone(), &set.namespace)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), &set.namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Creates a namespace.
pub async fn create_namespace(client: &Client, name: &str) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::Namespace;
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map(drop)
}

/// The `main` of a test binary whose one test must run in its own lab network namespace (the
/// node tier, member access): enters the lab before any thread starts, then runs `test` on a
/// fresh runtime under libtest-mimic, which prints and counts like the standard harness.
pub fn lab_main<F, Fut>(what: &str, name: &'static str, test: F) -> std::process::ExitCode
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let args = libtest_mimic::Arguments::from_args();
    if let Err(err) = tether_testkit::lab::enter() {
        eprintln!("error: {what} cannot run here: {err}");
        return std::process::ExitCode::FAILURE;
    }
    let trial = libtest_mimic::Trial::test(name, move || {
        tokio::runtime::Runtime::new()
            .map_err(|e| libtest_mimic::Failed::from(e.to_string()))?
            .block_on(test());
        Ok(())
    });
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
