//! Which cluster a command talks to (standard kubeconfig flags) and what the CLI reads from it:
//! the API server URL and the CA pin that `tether init` prints, and the controllers it can see.

use std::path::PathBuf;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The kubeconfig, context and namespace of a command.
#[derive(Clone, Debug)]
pub struct Target {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub context: Option<String>,
    /// `-n`.
    pub namespace: String,
}

impl Target {
    /// The client configuration from the kubeconfig; in a pod with no kubeconfig (the agent
    /// chart's uninstall hook), the pod's ServiceAccount.
    pub async fn config(&self) -> anyhow::Result<Config> {
        let kubeconfig = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?,
            None => match Kubeconfig::read() {
                Ok(kubeconfig) => kubeconfig,
                Err(_) if self.context.is_none() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                    return Config::incluster().context("cannot use the pod's ServiceAccount");
                }
                Err(err) => {
                    return Err(err)
                        .context("cannot read the kubeconfig: pass --kubeconfig or set KUBECONFIG");
                }
            },
        };
        let opts = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        Config::from_custom_kubeconfig(kubeconfig, &opts)
            .await
            .context("cannot use the kubeconfig (check --context)")
    }

    /// The namespace the kubeconfig's context (`--context`, else the current one) names, if it
    /// names one: where kubectl would work without `-n`.
    pub fn context_namespace(&self) -> Option<String> {
        let kubeconfig = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path).ok()?,
            None => Kubeconfig::read().ok()?,
        };
        let name = self.context.clone().or(kubeconfig.current_context)?;
        kubeconfig
            .contexts
            .into_iter()
            .find(|c| c.name == name)?
            .context?
            .namespace
            .filter(|ns| !ns.is_empty())
    }

    /// A client of the cluster.
    pub async fn client(&self) -> anyhow::Result<Client> {
        Client::try_from(self.config().await?).context("cannot build a Kubernetes client")
    }
}

/// The PEM of the CA the kubeconfig trusts for this cluster.
pub fn ca_pem(config: &Config) -> Option<String> {
    let pem: String = config
        .root_cert
        .iter()
        .flatten()
        .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())))
        .collect();
    (!pem.is_empty()).then_some(pem)
}

/// Waits up to `within` until `name` in `api` is gone (`kube::runtime::wait`); false on timeout.
pub async fn wait_deleted<K>(
    api: &kube::Api<K>,
    name: &str,
    uid: Option<String>,
    within: std::time::Duration,
) -> anyhow::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let Some(uid) = uid else { return Ok(true) };
    let gone = kube::runtime::wait::await_condition(
        api.clone(),
        name,
        kube::runtime::wait::conditions::is_deleted(&uid),
    );
    match tokio::time::timeout(within, gone).await {
        Ok(r) => r.map(|_| true).map_err(Into::into),
        Err(_) => Ok(false),
    }
}

/// Takes finalizer `finalizer` off ClusterSet `name`, on the condition that it did not change
/// since it was read (another writer's edit is never lost). Absent: nothing to do.
pub async fn remove_finalizer(
    sets: &kube::Api<tether_api::ClusterSet>,
    name: &str,
    finalizer: &str,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use kube::ResourceExt;
    let Some(current) = sets.get_opt(name).await? else {
        return Ok(());
    };
    let rest: Vec<String> = current
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizer)
        .cloned()
        .collect();
    let patch =
        serde_json::json!({"metadata": {"finalizers": rest, "resourceVersion": current.resource_version()}});
    sets.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .with_context(|| format!("cannot remove finalizer {finalizer} from ClusterSet {name}"))?;
    Ok(())
}
