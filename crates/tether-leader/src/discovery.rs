//! Makes the leader discoverable the way kubeadm clusters are: `kube-public/cluster-info` holds
//! the leader's CA (and URL) and anyone may read it, so an agent can check the CA against its pin
//! before it sends a token. A ConfigMap that exists (kubeadm's) is left alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use crate::Error;

use tether_join::discovery::{DISCOVERY_CONFIGMAP as NAME, DISCOVERY_NAMESPACE as NAMESPACE, cluster_info};

const READER: &str = "tether:cluster-info-reader";

/// The discovery objects: the ConfigMap and the anonymous read access to it.
pub fn objects(ca_pem: &str, url: &str) -> (ConfigMap, Role, RoleBinding) {
    let labels = BTreeMap::from([(
        tether_api::labels::MANAGED_BY.to_string(),
        crate::provision::FIELD_MANAGER.to_string(),
    )]);
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NAMESPACE.into()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    let cm = cluster_info(ca_pem, url, labels.clone());
    let role = Role {
        metadata: meta(READER),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![NAME.into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(READER),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: READER.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: "system:anonymous".into(),
            ..Subject::default()
        }]),
    };
    (cm, role, binding)
}

async fn create_if_absent<K>(api: Api<K>, obj: &K) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(Error::api::<K>(
            "create",
            api.namespace(),
            obj.meta().name.as_deref().unwrap_or_default(),
        )(source)),
    }
}

/// Publishes the discovery objects that do not exist yet, and brings a `cluster-info` the
/// leader made to its current URL and CA (`helm upgrade --set leaderURL=...`): agents re-read it
/// over their verified connection and follow. One the leader did not make (kubeadm's) stays.
pub async fn publish(client: &Client, ca_pem: &str, url: &str) -> Result<(), Error> {
    let (cm, role, binding) = objects(ca_pem, url);
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    let created = create_if_absent(configmaps.clone(), &cm).await?;
    if !created {
        keep_in_step(&configmaps, &cm).await?;
    }
    create_if_absent(Api::<Role>::namespaced(client.clone(), NAMESPACE), &role).await?;
    create_if_absent(
        Api::<RoleBinding>::namespaced(client.clone(), NAMESPACE),
        &binding,
    )
    .await?;
    if created {
        info!(
            namespace = NAMESPACE,
            name = NAME,
            "Published the leader's CA for joining agents"
        );
    }
    Ok(())
}

/// Replaces the data of the existing `cluster-info` with `want`'s if the leader made it and it
/// differs (a resourceVersion-checked update: a concurrent writer wins, the next start retries).
async fn keep_in_step(configmaps: &Api<ConfigMap>, want: &ConfigMap) -> Result<(), Error> {
    let Some(mut current) = configmaps.get_opt(NAME).await.map_err(Error::api::<ConfigMap>(
        "get",
        configmaps.namespace(),
        NAME,
    ))?
    else {
        return Ok(());
    };
    let ours = current
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(tether_api::labels::MANAGED_BY))
        .is_some_and(|v| v == crate::provision::FIELD_MANAGER);
    if !ours || current.data == want.data {
        return Ok(());
    }
    current.data = want.data.clone();
    configmaps
        .replace(NAME, &PostParams::default(), &current)
        .await
        .map_err(Error::api::<ConfigMap>("update", configmaps.namespace(), NAME))?;
    info!(
        namespace = NAMESPACE,
        name = NAME,
        "Updated the published leader URL and CA"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configmap_carries_the_ca_and_only_anonymous_get_on_it() {
        let (cm, role, binding) = objects("-----BEGIN CERTIFICATE-----\n", "https://leader:6443");
        let kc = &cm.data.unwrap()[tether_join::discovery::DISCOVERY_KEY];
        assert!(
            kc.contains("certificate-authority-data: LS0tLS1CRUdJTi") && kc.contains("https://leader:6443")
        );
        let rule = &role.rules.unwrap()[0];
        assert_eq!(
            (rule.verbs.clone(), rule.resource_names.clone()),
            (vec!["get".to_string()], Some(vec![NAME.to_string()]))
        );
        assert_eq!(binding.subjects.unwrap()[0].name, "system:anonymous");
    }
}
