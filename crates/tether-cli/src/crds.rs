//! `tether crds apply`: brings the cluster's Tether CRDs to this version's schemas, as the charts'
//! pre-install and pre-upgrade hooks do. Helm installs a chart's `crds/` once and never upgrades
//! them; this applies them server-side (the API server keeps every stored object and refuses to
//! drop a version still stored), records the version that applied them, and never replaces CRDs
//! a newer version applied (a downgraded agent keeps the newer schemas).

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use tether_api::crds::{Side, for_side};

use crate::VERSION;
use crate::cluster::Target;

/// On each CRD: the Tether version that last applied it.
pub const APPLIED_BY: &str = "multicluster.tether.dev/crds-version";
/// The field manager of the CRDs this command applies.
const MANAGER: &str = "tether-crds";

/// `tether crds`.
#[derive(clap::Subcommand, Debug)]
pub enum CrdsCommand {
    /// Apply this version's CRDs (server-side): new fields and versions appear, stored objects
    /// stay; CRDs a newer Tether applied are left alone.
    #[command(after_help = "Examples:\n  tether crds apply --side leader\n  tether crds apply --side agent")]
    Apply {
        /// Which chart's CRDs: the leader's (every kind) or a member's (ClusterSet, ClusterProperty).
        #[arg(long, value_enum)]
        side: SideArg,
        /// Also apply SIG-Multicluster's ClusterProfile CRD (cluster-inventory-api, as
        /// published), for the leader's `--cluster-profiles`. One that another cluster manager
        /// installed is left as it is.
        #[arg(long)]
        cluster_profiles: bool,
    },
}

/// The upstream ClusterProfile CRD, as cluster-inventory-api publishes it (see
/// `tether_api::inventory::UPSTREAM_VERSION`).
pub const CLUSTER_PROFILE_CRD: &str =
    include_str!("../../../config/upstream/multicluster.x-k8s.io_clusterprofiles.yaml");

/// The upstream ClusterProfile CRD, parsed.
pub fn cluster_profile_crd() -> anyhow::Result<CustomResourceDefinition> {
    serde_norway::from_str(CLUSTER_PROFILE_CRD).context("the bundled ClusterProfile CRD does not parse")
}

/// `--side`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideArg {
    /// The leader cluster.
    Leader,
    /// A member cluster.
    Agent,
}

/// Whether CRDs applied by version `theirs` may be replaced by this version's: not if theirs is
/// newer (an unreadable version counts as older: ours is known good).
pub fn may_replace(theirs: Option<&str>) -> bool {
    let ours = semver::Version::parse(VERSION).ok();
    match (theirs.and_then(|t| semver::Version::parse(t).ok()), ours) {
        (Some(theirs), Some(ours)) => theirs <= ours,
        _ => true,
    }
}

/// `tether crds apply`.
pub async fn crds(target: &Target, cmd: CrdsCommand) -> anyhow::Result<()> {
    let CrdsCommand::Apply {
        side,
        cluster_profiles,
    } = cmd;
    let side = match side {
        SideArg::Leader => Side::Leader,
        SideArg::Agent => Side::Agent,
    };
    if cluster_profiles && side != Side::Leader {
        crate::bail_code!(
            Usage,
            "--cluster-profiles goes with --side leader: members publish no ClusterProfiles"
        );
    }
    let api = Api::<CustomResourceDefinition>::all(target.client().await?);
    let mut crds: Vec<(CustomResourceDefinition, bool)> =
        for_side(side).into_iter().map(|(_, c)| (c, false)).collect();
    if cluster_profiles {
        crds.push((cluster_profile_crd()?, true));
    }
    for (mut crd, upstream) in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let existing = api
            .get_opt(&name)
            .await
            .with_context(|| format!("cannot read CRD {name}"))?;
        let theirs = existing
            .as_ref()
            .and_then(|c| c.metadata.annotations.as_ref())
            .and_then(|a| a.get(APPLIED_BY))
            .cloned();
        if upstream && existing.is_some() && theirs.is_none() {
            println!("CRD {name} was installed by someone else (another cluster manager): left as it is");
            continue;
        }
        if !may_replace(theirs.as_deref()) {
            println!(
                "CRD {name} was applied by Tether {} (newer than {VERSION}): left as it is",
                theirs.unwrap_or_default()
            );
            continue;
        }
        crd.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(APPLIED_BY.into(), VERSION.into());
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("cannot apply CRD {name}"))?;
        println!(
            "CRD {name} {} ({VERSION})",
            if existing.is_some() { "upgraded" } else { "created" }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_of_a_newer_version_are_never_replaced() {
        assert!(may_replace(None));
        assert!(may_replace(Some("garbage")));
        assert!(may_replace(Some("0.0.1")));
        assert!(may_replace(Some(VERSION)));
        assert!(!may_replace(Some("99.0.0")));
    }
}
