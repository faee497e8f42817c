//! Helpers shared by the end-to-end tests: access to Tether kinds as untyped objects (so tests
//! can send what the Rust types would refuse to build), API error inspection, RBAC set-up, and
//! (`sim`) a leader with simulated members.

pub mod access;
pub mod fleet;
pub mod inventory;
pub mod liveness;
pub mod pods;
pub mod probe;
pub mod registry;
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

/// The ValidatingAdmissionPolicy that scopes the leader's ServiceAccount (what the leader
/// chart installs by default), under `config/`.
pub const LEADER_POLICY: &str = "policy/leader-scope.yaml";

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
            Some(
                kind @ ("APIService" | "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"),
            ) => {
                let (group, plural) = match kind {
                    "APIService" => ("apiregistration.k8s.io", "apiservices"),
                    "ValidatingAdmissionPolicy" => {
                        ("admissionregistration.k8s.io", "validatingadmissionpolicies")
                    }
                    _ => (
                        "admissionregistration.k8s.io",
                        "validatingadmissionpolicybindings",
                    ),
                };
                let ar = kube::api::ApiResource::from_gvk_with_plural(
                    &kube::core::GroupVersionKind::gvk(group, "v1", kind),
                    plural,
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
    libtest_mimic::run(&args, vec![trial(name, test)]).exit_code()
}

/// One test of a lab binary: `test` on a runtime of its own.
fn trial<F, Fut>(name: &'static str, test: F) -> libtest_mimic::Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    libtest_mimic::Trial::test(name, move || {
        tokio::runtime::Runtime::new()
            .map_err(|e| libtest_mimic::Failed::from(e.to_string()))?
            .block_on(test());
        Ok(())
    })
}

/// As `lab_main`, for a test too long for a plain `cargo test`: it is ignored unless the command
/// line has `--ignored` or `--include-ignored`, and only then enters the lab.
pub fn long_lab_main<F, Fut>(what: &str, name: &'static str, test: F) -> std::process::ExitCode
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let args = libtest_mimic::Arguments::from_args();
    let runs = (args.ignored || args.include_ignored) && !args.list;
    if runs && let Err(err) = tether_testkit::lab::enter() {
        eprintln!("error: {what} cannot run here: {err}");
        return std::process::ExitCode::FAILURE;
    }
    libtest_mimic::run(&args, vec![trial(name, test).with_ignored_flag(true)]).exit_code()
}

/// One scenario of a shared-fixture test binary: it gets the fixture, and panics to fail.
pub type Scenario<W> = for<'a> fn(&'a W) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// A test binary of named scenarios over one fixture, in its own lab network namespace: the
/// fixture is built once, the scenarios the command line selects run one after another in the
/// order given (each sees what the ones before left), and each is reported as its own test, so
/// the first failure hides nothing and the name says what broke.
pub fn lab_scenarios<W, S, SF>(
    what: &str,
    setup: S,
    scenarios: Vec<(&'static str, Scenario<W>)>,
) -> std::process::ExitCode
where
    S: FnOnce() -> SF,
    SF: std::future::Future<Output = W>,
{
    use futures::FutureExt;
    use std::collections::HashMap;
    let args = libtest_mimic::Arguments::from_args();
    let selected = |name: &str| match &args.filter {
        Some(f) if args.exact => name == f,
        Some(f) => name.contains(f.as_str()),
        None => true,
    } && !args.skip.iter().any(|s| name.contains(s.as_str()));
    let mut results: HashMap<&'static str, Result<(), String>> = HashMap::new();
    if !args.list && scenarios.iter().any(|(n, _)| selected(n)) {
        if let Err(err) = tether_testkit::lab::enter() {
            eprintln!("error: {what} cannot run here: {err}");
            return std::process::ExitCode::FAILURE;
        }
        let panic_text = |p: Box<dyn std::any::Any + Send>| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())
        };
        let runtime = match tokio::runtime::Runtime::new() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {what}: no runtime: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        runtime.block_on(async {
            let start = std::time::Instant::now();
            let world = match std::panic::AssertUnwindSafe(setup()).catch_unwind().await {
                Ok(w) => w,
                Err(p) => {
                    let why = format!("the fixture failed: {}", panic_text(p));
                    for (name, _) in &scenarios {
                        results.insert(name, Err(why.clone()));
                    }
                    return;
                }
            };
            for (name, run) in &scenarios {
                if !selected(name) {
                    continue;
                }
                eprintln!("== [{:6.1}s] {name}", start.elapsed().as_secs_f64());
                let r = std::panic::AssertUnwindSafe(run(&world)).catch_unwind().await;
                results.insert(name, r.map_err(panic_text));
            }
            eprintln!("== [{:6.1}s] done", start.elapsed().as_secs_f64());
        });
    }
    let trials = scenarios
        .iter()
        .map(|(name, _)| {
            let result = results.remove(name);
            libtest_mimic::Trial::test(*name, move || match result {
                Some(r) => r.map_err(libtest_mimic::Failed::from),
                None => Ok(()),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// The leader's ClusterProfile RBAC as the leader chart sets it up with `clusterProfile.enabled`:
/// `config/rbac/leader-inventory.yaml` (read everywhere), and in each of `namespaces` (created
/// here) a RoleBinding to `tether-leader-inventory-write`.
pub async fn allow_inventory(admin: &Client, namespaces: &[&str]) -> Result<(), kube::Error> {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::api::{Patch, PatchParams};
    apply_config_file(admin, "rbac/leader-inventory.yaml").await?;
    for ns in namespaces {
        create_namespace(admin, ns).await?;
        let binding: RoleBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tether-leader-inventory-write", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "tether-leader-inventory-write"},
            "subjects": [{"kind": "ServiceAccount", "name": "tether-leader", "namespace": sim::HOME}],
        }))
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .patch(
                "tether-leader-inventory-write",
                &PatchParams::apply("tether-e2e").force(),
                &Patch::Apply(&binding),
            )
            .await?;
    }
    Ok(())
}

/// The upstream ClusterProfile CRD Tether ships (`config/upstream/`), applied and Established.
pub async fn install_cluster_profile_crd(admin: &Client) -> Result<(), tether_testkit::Error> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../config/upstream/multicluster.x-k8s.io_clusterprofiles.yaml"),
    )
    .expect("the shipped ClusterProfile CRD");
    let crd = serde_norway::from_str(&text).expect("the shipped ClusterProfile CRD parses");
    tether_testkit::install_crds(admin, &[crd]).await
}
