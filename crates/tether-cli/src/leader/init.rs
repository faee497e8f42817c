//! `tether init`: the ClusterSet, its join RBAC and a join token, then the commands that join a
//! member, each printed so that it works when copied.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::runtime::wait::await_condition;
use serde_json::json;
use tether_api::{ClusterSet, SetRef};
use tether_join::CaPin;
use tether_join::settle::Settle;
use tether_join::token::{
    BootstrapToken, MANAGER, TOKEN_NAMESPACE, join_name, join_rbac, join_service_account,
};

use crate::cluster::{Target, ca_pem};

use super::{InitArgs, apply, set_object};

/// Creates the namespace, ClusterSet and join RBAC, waits for the leader, mints a token and
/// prints the join command. Safe to run again (a new token is minted each time).
pub async fn init(target: &Target, args: InitArgs) -> anyhow::Result<()> {
    let ns = target.namespace.as_str();
    let set = args.clusterset.as_str();
    let set_ref = SetRef::new(ns, set);
    let (role, binding) = join_rbac(&set_ref);
    let set_obj = set_object(ns, set, args.approval)?;
    if args.dry_run {
        for doc in [
            set_obj.clone(),
            serde_json::to_value(&role)?,
            serde_json::to_value(&binding)?,
        ] {
            print!("---\n{}", serde_norway::to_string(&doc)?);
        }
        println!(
            "# plus a join token (bootstrap token in kube-system) valid for {:?}",
            args.token_ttl
        );
        return Ok(());
    }
    let config = target.config().await?;
    let client = Client::try_from(config.clone())?;
    let mut nsobj = Namespace::default();
    nsobj.metadata.name = Some(ns.into());
    apply(&Api::<Namespace>::all(client.clone()), &nsobj).await?;
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    if let Some(existing) = sets.get_opt(set).await?
        && existing.spec.role != tether_api::clusterset::ClusterSetRole::Leader
    {
        crate::bail_code!(
            Usage,
            "{ns}/{set} is a Member ClusterSet: this cluster is a member, not a leader"
        );
    }
    sets.patch(set, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&set_obj))
        .await
        .context("is Tether installed? helm install tether-leader charts/tether-leader")?;
    apply(&Api::<Role>::namespaced(client.clone(), ns), &role).await?;
    apply(&Api::<RoleBinding>::namespaced(client.clone(), ns), &binding).await?;
    eprintln!("ClusterSet {ns}/{set} applied; waiting for the leader controller…");
    wait_for_leader(&sets, set, args.wait).await?;

    let token = create_token(&client, &config, &set_ref, args.token_ttl).await?;
    let url = match &args.leader_url {
        Some(url) => url.clone(),
        None => published_url(&client)
            .await
            .unwrap_or_else(|| config.cluster_url.to_string())
            .trim_end_matches('/')
            .to_string(),
    };
    let ca = match &args.ca_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --ca-file {}", path.display()))?,
        None => ca_pem(&config).context(
            "the kubeconfig has no CA for this cluster; pass --ca-file with the leader API server's CA",
        )?,
    };
    let hash = pin_for(&url, &ca).await?;
    anonymous_discovery(&config).await;
    let expires = Timestamp::now() + SignedDuration::from_secs(args.token_ttl.as_secs() as i64);
    if let Some(path) = &args.values_file {
        let file = join_file(
            &url,
            &token.value,
            &hash.to_string(),
            &set_ref,
            &expires.to_string(),
        )?;
        std::fs::write(path, file).with_context(|| format!("cannot write {}", path.display()))?;
        println!(
            "Wrote the join config to {} (it holds a secret token until {expires}: keep it private).",
            path.display()
        );
        println!("On each member cluster, either:");
        println!(
            "  tether join --config-file {} --name <CLUSTER-NAME>",
            path.display()
        );
        println!("or:");
        println!(
            "  helm install tether-agent charts/tether-agent -n tether-system --create-namespace -f {} --set cluster.name=<CLUSTER-NAME>",
            path.display()
        );
        return Ok(());
    }
    println!(
        "ClusterSet {set} is ready ({:?} approval). Token kind: {}.",
        args.approval, token.kind
    );
    println!("\nJoin a member cluster (with that cluster's kubeconfig):");
    println!(
        "  tether join --leader {url} --token {} --ca-cert-hash {hash} --name <CLUSTER-NAME>",
        token.value
    );
    println!("\nor install the agent there with Helm:");
    println!("{}", helm_command(&url, &token.value, &hash, &set_ref));
    println!(
        "\nThe token expires at {expires}; `tether token create --clusterset {set} -n {ns}` makes another."
    );
    println!(
        "To keep the token off command lines (and out of shell history), write it to a file instead:\n  \
         tether init --clusterset {set} -n {ns} --values-file join.yaml\n\
         then `helm install ... -f join.yaml` or `tether join --config-file join.yaml` on each member."
    );
    Ok(())
}

/// How long `pin_for` waits for the leader to prove one CA.
const PIN_PROBE: Duration = Duration::from_secs(10);

/// The pin members check: of the one CA in `bundle`, or, when it holds several (a CA rotation's
/// overlap), of the first that the leader at `url` proves now, exactly as a joining member will
/// check it; else of the first, with a warning.
async fn pin_for(url: &str, bundle: &str) -> anyhow::Result<tether_join::pin::CaPin> {
    let cas = tether_join::pin::certificates(bundle).context("the CA is not PEM certificates")?;
    let first = cas
        .first()
        .map(|c| c.pin.clone())
        .context("no CA certificate found (expected PEM 'CERTIFICATE' blocks)")?;
    if cas.len() == 1 {
        return Ok(first);
    }
    for ca in &cas {
        let proven =
            tokio::time::timeout(PIN_PROBE, tether_join::discovery::fetch_leader_ca(url, &ca.pin)).await;
        if matches!(proven, Ok(Ok(_))) {
            eprintln!(
                "{} CAs given; the leader's serving certificate chains to {} ({}): pinning it",
                cas.len(),
                ca.subject,
                ca.pin
            );
            return Ok(ca.pin.clone());
        }
    }
    eprintln!(
        "warning: none of the {} CAs could be proven by the leader at {url}; pinning the first ({first})",
        cas.len()
    );
    Ok(first)
}

/// The URL in `kube-public/cluster-info`. NB: the leader publishes it once it leads a set, a
/// moment after it picked up the set `init` just made: give it a few seconds.
async fn published_url(client: &Client) -> Option<String> {
    for _ in 0..10 {
        if let Some(url) = tether_join::discovery::published_url(client).await {
            return Some(url);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

/// The join config `init --values-file` writes: the agent chart's own values, so one file serves
/// `helm install -f` and `tether join --config-file` alike; what is not a value is a comment.
pub fn join_file(url: &str, token: &str, hash: &str, set: &SetRef, expires: &str) -> anyhow::Result<String> {
    let values = json!({
        "parentURL": url,
        "token": token,
        "caCertHash": hash,
        "clusterSet": set.name,
        "leader": {"namespace": set.namespace},
    });
    Ok(format!(
        "# Join config of ClusterSet {}/{} (tether init --values-file). It holds a secret join token,\n\
         # valid until {expires}: keep it private. On a member cluster, either:\n\
         #   tether join --config-file <this file> --name <CLUSTER-NAME>\n\
         #   helm install tether-agent charts/tether-agent -n tether-system --create-namespace -f <this file> --set cluster.name=<CLUSTER-NAME>\n{}",
        set.namespace,
        set.name,
        serde_norway::to_string(&values)?
    ))
}

/// The `helm install` line that joins a member to `set`, every value that differs from the
/// chart's defaults spelled out, so it works when copied as printed.
pub fn helm_command(url: &str, token: &str, hash: &CaPin, set: &SetRef) -> String {
    format!(
        "  helm install tether-agent charts/tether-agent -n tether-system --create-namespace \\\n    \
         --set parentURL={url} --set token={token} --set caCertHash={hash} \\\n    \
         --set clusterSet={} --set leader.namespace={} --set cluster.name=<CLUSTER-NAME>",
        set.name, set.namespace
    )
}

/// Waits until the leader controller has written the set's status (`kube::runtime::wait`).
async fn wait_for_leader(sets: &Api<ClusterSet>, set: &str, wait: Duration) -> anyhow::Result<()> {
    let picked_up = |s: Option<&ClusterSet>| {
        s.and_then(|s| s.status.as_ref())
            .and_then(|st| st.observed_generation)
            .is_some()
    };
    match tokio::time::timeout(wait, await_condition(sets.clone(), set, picked_up)).await {
        Ok(r) => r.map(drop).map_err(Into::into),
        Err(_) => crate::bail_code!(
            Timeout,
            "the leader controller has not picked up ClusterSet {set} within {wait:?}: is it installed and \
             running? (helm install tether-leader charts/tether-leader -n tether-system; \
             kubectl -n tether-system logs deploy/tether-leader)"
        ),
    }
}

/// A join token and how it authenticates.
pub struct JoinToken {
    /// The bearer token.
    pub value: String,
    /// `bootstrap token` or `ServiceAccount token`.
    pub kind: &'static str,
}

/// Mints a join token: a bootstrap token where the API server accepts them (checked by
/// authenticating with it), else a short-lived token of the set's join ServiceAccount.
pub async fn create_token(
    client: &Client,
    config: &kube::Config,
    set: &SetRef,
    ttl: Duration,
) -> anyhow::Result<JoinToken> {
    let token = BootstrapToken::random();
    let expires = Timestamp::now() + SignedDuration::from_secs(ttl.as_secs() as i64);
    let secrets = Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE);
    secrets
        .create(&PostParams::default(), &token.secret(Some(set), Some(expires)))
        .await
        .context("cannot create the join token")?;
    let value = token.token();
    if authenticates(config, &value).await {
        return Ok(JoinToken {
            value,
            kind: "bootstrap token",
        });
    }
    // Bootstrap-token authentication is off here: fall back to a ServiceAccount token.
    secrets
        .delete(&token.secret_name(), &DeleteParams::default())
        .await
        .ok();
    let sa = join_service_account(set);
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), &set.namespace),
        &sa,
    )
    .await?;
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(ttl.as_secs() as i64),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), &set.namespace)
        .create_token_request(&join_name(set), &PostParams::default(), &req)
        .await
        .context("cannot mint a ServiceAccount join token")?;
    Ok(JoinToken {
        value: token.status.map(|s| s.token).unwrap_or_default(),
        kind: "ServiceAccount token (bootstrap tokens are not enabled here)",
    })
}

/// Waits (at most 15 s) until an anonymous caller may read `kube-public/cluster-info`, as a
/// joining member does before it sends anything: the leader grants that read a moment after it
/// publishes the ConfigMap, so a join run at once could otherwise be refused. Where it never may
/// (anonymous authentication off), says what members need instead.
async fn anonymous_discovery(config: &kube::Config) {
    use tether_join::discovery::{DISCOVERY_CONFIGMAP, DISCOVERY_NAMESPACE};
    let mut config = config.clone();
    config.auth_info = AuthInfo::default();
    let Ok(client) = Client::try_from(config) else {
        return;
    };
    let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, DISCOVERY_NAMESPACE);
    let mut last = String::from("no answer");
    // NB: one deadline over the tries, so a hanging API server cannot stretch the 15 s.
    let tries = async {
        loop {
            match api.get(DISCOVERY_CONFIGMAP).await {
                Ok(_) => return true,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(15), tries).await.is_ok() {
        return;
    }
    eprintln!(
        "warning: anonymous callers cannot read {DISCOVERY_NAMESPACE}/{DISCOVERY_CONFIGMAP} here ({last}): \
         give members the leader's CA itself (the agent chart's leader.caBundle) besides the pin"
    );
}

/// Whether the API server accepts `token`. A new bootstrap token can be refused (401) until the
/// authenticator's cache has seen its Secret, so 401s are retried for `TOKEN_SETTLE`; a server
/// without bootstrap-token authentication keeps refusing it.
async fn authenticates(config: &kube::Config, token: &str) -> bool {
    let mut config = config.clone();
    config.auth_info = AuthInfo {
        token: Some(token.to_string().into()),
        ..AuthInfo::default()
    };
    let Ok(client) = Client::try_from(config) else {
        return false;
    };
    let api = Api::<SelfSubjectReview>::all(client);
    let mut unseen = Settle::unauthorized();
    loop {
        match api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
        {
            Ok(_) => return true,
            Err(e) if unseen.tolerate(&e) => tokio::time::sleep(Duration::from_millis(300)).await,
            Err(_) => return false,
        }
    }
}
