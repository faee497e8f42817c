//! `tether grant`: who may reach a member through the leader. It writes the leader's side (a Role
//! on the member's `managedclusters/proxy`, for that member only, and a RoleBinding listing the
//! users and groups granted, in the member's namespace) and prints the member's side, which is
//! the member's own to apply: the agent's impersonation allow-list and a binding of the
//! impersonated name to a ClusterRole there.

use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::access::{MemberRef, find_member};
use crate::cluster::Target;

/// The Role and RoleBinding `grant` writes in the member's namespace.
pub const GRANT_NAME: &str = "tether-proxy";
/// The field manager of the Role.
const MANAGER: &str = "tether-cli";

/// `tether grant`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  tether grant --cluster east --user alice\n  \
                        tether grant --cluster east --group sre --role admin\n  \
                        tether grant --cluster east --user alice --revoke")]
pub struct GrantArgs {
    /// The member (its ManagedCluster name).
    #[arg(long, value_name = "MEMBER")]
    pub cluster: String,
    /// The ClusterSet, when several sets have a member of that name.
    #[arg(long)]
    pub clusterset: Option<String>,
    /// The leader user to let through; a leader ServiceAccount (a ClusterProfile consumer) as
    /// system:serviceaccount:<namespace>:<name>.
    #[arg(long, required_unless_present = "group", conflicts_with = "group")]
    pub user: Option<String>,
    /// The leader group to let through.
    #[arg(long)]
    pub group: Option<String>,
    /// The member's ClusterRole the printed member-side binding gives (view, edit, admin, ...).
    #[arg(long, default_value = "view")]
    pub role: String,
    /// Take the grant back (the member-side commands to undo are printed).
    #[arg(long)]
    pub revoke: bool,
}

/// Who is granted.
struct Who<'a> {
    kind: &'static str,
    name: &'a str,
}

impl Who<'_> {
    fn subject(&self) -> Subject {
        Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: self.kind.into(),
            name: self.name.into(),
            namespace: None,
        }
    }

    fn is(&self, s: &Subject) -> bool {
        s.kind == self.kind && s.name == self.name
    }
}

/// `tether grant`.
pub async fn grant(target: &Target, args: GrantArgs) -> anyhow::Result<()> {
    let who = match (&args.user, &args.group) {
        (Some(u), None) => Who {
            kind: "User",
            name: u,
        },
        (None, Some(g)) => Who {
            kind: "Group",
            name: g,
        },
        _ => crate::bail_code!(Usage, "pass one of --user or --group"),
    };
    let system = who.name.starts_with("system:")
        && (who.kind != "User" || tether_tunnel::identity::member_user("set", who.name).is_err());
    if who.name.trim().is_empty() || system {
        crate::bail_code!(
            Usage,
            "{} {:?} cannot be granted: the name is empty, or a system: name the agent never \
             impersonates (of system: users, only ServiceAccounts: system:serviceaccount:<namespace>:<name>)",
            who.kind.to_lowercase(),
            who.name
        );
    }
    let member = args.cluster.as_str();
    let located = find_member(
        target,
        MemberRef {
            name: member,
            set: args.clusterset.as_deref(),
            namespace: None,
        },
    )
    .await?;
    let ns = located.namespace.as_str();
    let set = located.set.clone().unwrap_or_else(|| "<SET>".into());
    let client = target.client().await?;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), ns);
    let impersonated = match who.kind {
        "User" => tether_tunnel::identity::member_user(&set, who.name)?,
        _ => tether_tunnel::identity::prefixed(&set, who.name),
    };
    let member_binding = format!(
        "tether-{set}-{}-{}",
        dns_part(who.name.strip_prefix("system:").unwrap_or(who.name)),
        args.role
    );
    let list_value = if who.kind == "User" { "users" } else { "groups" };

    if args.revoke {
        match remove_subject(&bindings, ns, &who).await? {
            Revoked::NobodyGranted => {
                println!("nobody was granted {member}; nothing to do");
                return Ok(());
            }
            Revoked::NotGranted => {
                println!(
                    "{} {} was not granted {member}; nothing to do",
                    who.kind.to_lowercase(),
                    who.name
                );
                return Ok(());
            }
            Revoked::Removed => {}
        }
        println!(
            "{} {} may no longer reach {member} through the leader (RoleBinding {ns}/{GRANT_NAME}).\n\
             On {member}, with its kubeconfig, undo its side:\n  \
             kubectl delete clusterrolebinding {member_binding}\n  \
             # and drop {} from the agent's proxy.impersonate.{list_value} (helm upgrade tether-agent ...)",
            who.kind.to_lowercase(),
            who.name,
            who.name
        );
        return Ok(());
    }

    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": GRANT_NAME, "namespace": ns,
                     "labels": {"app.kubernetes.io/managed-by": MANAGER}},
        "rules": [{
            "apiGroups": [tether_tunnel::GROUP],
            "resources": ["managedclusters/proxy"],
            "resourceNames": [member],
            "verbs": ["get", "create", "update", "patch", "delete"],
        }],
    });
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(client.clone(), ns)
        .patch(
            GRANT_NAME,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(role),
        )
        .await?;
    add_subject(&bindings, ns, &who).await?;
    let flag = if who.kind == "User" { "--user" } else { "--group" };
    println!(
        "{} {} may reach {member} through the leader (Role and RoleBinding {ns}/{GRANT_NAME}).\n\
         What they may do in {member} is {member}'s to decide. On {member}, with its kubeconfig:\n  \
         helm upgrade tether-agent charts/tether-agent -n tether-system --reuse-values --set '{}'\n  \
         # keep the {list_value} already listed there: helm get values tether-agent -n tether-system\n  \
         kubectl create clusterrolebinding {member_binding} --clusterrole={} {flag}={impersonated}\n\
         Then, with the leader kubeconfig (they may not list ManagedClusters, so they name the namespace):\n  \
         tether --cluster {member} --member-namespace {ns} -- get pods -A",
        who.kind.to_lowercase(),
        who.name,
        format_args!("proxy.impersonate.{list_value}={{{}}}", who.name),
        args.role,
    );
    Ok(())
}

/// What `--revoke` found.
enum Revoked {
    NobodyGranted,
    NotGranted,
    Removed,
}

/// Removes `who` from the RoleBinding (deleting it with its last subject); a concurrent writer's
/// subjects are kept (the write is conditional on what was read, and retried).
async fn remove_subject(bindings: &Api<RoleBinding>, ns: &str, who: &Who<'_>) -> anyhow::Result<Revoked> {
    for _ in 0..5 {
        let Some(mut binding) = bindings.get_opt(GRANT_NAME).await? else {
            return Ok(Revoked::NobodyGranted);
        };
        let before = binding.subjects.as_ref().map_or(0, Vec::len);
        let rest: Vec<Subject> = binding
            .subjects
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !who.is(s))
            .collect();
        if rest.len() == before {
            return Ok(Revoked::NotGranted);
        }
        let result = if rest.is_empty() {
            // NB: deleting on the condition that nobody was added since it was read.
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: binding.metadata.resource_version.clone(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            bindings.delete(GRANT_NAME, &dp).await.map(drop)
        } else {
            binding.subjects = Some(rest);
            bindings
                .replace(GRANT_NAME, &PostParams::default(), &binding)
                .await
                .map(drop)
        };
        match result {
            Ok(()) => return Ok(Revoked::Removed),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("RoleBinding {ns}/{GRANT_NAME} kept changing under us; run the command again")
}

/// Adds `who` to the RoleBinding, creating it if need be; a concurrent writer's subjects are
/// kept (the write is conditional on what was read, and retried).
async fn add_subject(bindings: &Api<RoleBinding>, ns: &str, who: &Who<'_>) -> anyhow::Result<()> {
    for _ in 0..5 {
        let result = match bindings.get_opt(GRANT_NAME).await? {
            None => {
                let binding: RoleBinding = serde_json::from_value(json!({
                    "metadata": {"name": GRANT_NAME, "namespace": ns,
                                 "labels": {"app.kubernetes.io/managed-by": MANAGER}},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GRANT_NAME},
                    "subjects": [who.subject()],
                }))?;
                bindings.create(&PostParams::default(), &binding).await.map(drop)
            }
            Some(b) if b.subjects.iter().flatten().any(|s| who.is(s)) => return Ok(()),
            Some(mut b) => {
                b.subjects.get_or_insert_with(Vec::new).push(who.subject());
                bindings
                    .replace(GRANT_NAME, &PostParams::default(), &b)
                    .await
                    .map(drop)
            }
        };
        match result {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("RoleBinding {ns}/{GRANT_NAME} kept changing under us; run the command again")
}

/// `name` as a part of an object name.
fn dns_part(name: &str) -> String {
    let label = crate::join::dns_label(name);
    label[..label.len().min(40)].trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_by_kind_and_name() {
        let alice = Who {
            kind: "User",
            name: "alice",
        };
        assert!(alice.is(&alice.subject()));
        assert!(
            !alice.is(&Who {
                kind: "Group",
                name: "alice"
            }
            .subject())
        );
        assert_eq!(dns_part("Alice@Example.com"), "alice-example-com");
    }
}
