//! `tether token create|list|delete`: join tokens, listed by ID only.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use tether_api::{ClusterSet, SetRef, labels};
use tether_join::token::{TOKEN_NAMESPACE, secret_text};

use crate::cluster::Target;
use crate::output::render;

use super::{TokenCommand, create_token};

/// `tether token …`.
pub async fn token(target: &Target, cmd: TokenCommand) -> anyhow::Result<()> {
    let config = target.config().await?;
    let client = Client::try_from(config.clone())?;
    let secrets = Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE);
    match cmd {
        TokenCommand::Create { clusterset, ttl } => {
            let sets = Api::<ClusterSet>::namespaced(client.clone(), &target.namespace);
            if sets.get_opt(&clusterset).await?.is_none() {
                crate::bail_code!(
                    NotFound,
                    "no ClusterSet {}/{clusterset}: create it with `tether init --clusterset {clusterset}`",
                    target.namespace
                );
            }
            let set = SetRef::new(target.namespace.clone(), clusterset);
            let t = create_token(&client, &config, &set, ttl).await?;
            println!("{}", t.value);
        }
        TokenCommand::List { clusterset, output } => {
            // NB: a set is its namespace and name; `-n` picks the namespace.
            let selector = match &clusterset {
                Some(s) => SetRef::new(target.namespace.clone(), s.clone()).selector(),
                None => labels::CLUSTER_SET.to_string(),
            };
            let list = secrets.list(&ListParams::default().labels(&selector)).await?;
            #[derive(Serialize)]
            struct Row {
                id: String,
                clusterset: String,
                expires: String,
                usages: String,
            }
            let rows: Vec<Row> = list
                .items
                .iter()
                .filter(|s| s.type_.as_deref() == Some("bootstrap.kubernetes.io/token"))
                .map(|s| {
                    let text = |k: &str| secret_text(s, k).unwrap_or_default();
                    let usages = ["authentication", "signing"]
                        .into_iter()
                        .filter(|u| text(&format!("usage-bootstrap-{u}")) == "true")
                        .collect::<Vec<_>>()
                        .join(",");
                    Row {
                        id: text("token-id"),
                        clusterset: SetRef::from_labels(s.labels())
                            .map(|set| set.to_string())
                            .or_else(|| s.labels().get(labels::CLUSTER_SET).cloned())
                            .unwrap_or_default(),
                        expires: text("expiration"),
                        usages,
                    }
                })
                .collect();
            let table = rows
                .iter()
                .map(|r| {
                    vec![
                        r.id.clone(),
                        r.clusterset.clone(),
                        r.expires.clone(),
                        r.usages.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                render(output, &["ID", "CLUSTERSET", "EXPIRES", "USAGES"], table, &rows)?
            );
        }
        TokenCommand::Delete { id } => {
            match secrets
                .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
                .await
            {
                Ok(_) => println!("deleted token {id}"),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    println!("token {id} does not exist (nothing to do)")
                }
                Err(e) => return Err(e).context("cannot delete the token"),
            }
        }
    }
    Ok(())
}
