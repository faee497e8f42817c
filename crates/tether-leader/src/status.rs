//! A Leader ClusterSet's status as a pure value: counts, conditions and a member summary that is
//! bounded (at most `MAX_MEMBER_SUMMARY` entries, members needing attention first), so the object
//! stays a few tens of KiB with 10,000 members.

use std::cmp::Reverse;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tether_api::clusterset::{MAX_MEMBER_SUMMARY, MemberCounts, MemberSummary};
use tether_api::conditions::{ConditionType, Reason, SetState, Status};
use tether_api::{ClusterSet, ClusterSetStatus, ManagedCluster};

/// The status of a member's Ready condition (`True`, `False` or `Unknown`).
pub fn ready_status(mc: &ManagedCluster) -> &str {
    mc.status
        .as_ref()
        .and_then(|s| tether_api::conditions::find(&s.conditions, ConditionType::Ready))
        .map(|c| c.status.as_str())
        .unwrap_or("Unknown")
}

/// Computes the status of `set` from its live members and its Pending request count.
/// `blocked` is the reason a deletion waits, if it does.
pub fn leader_status(
    set: &ClusterSet,
    members: &[std::sync::Arc<ManagedCluster>],
    pending: usize,
    blocked: Option<String>,
    now: Timestamp,
) -> ClusterSetStatus {
    let total = members.len();
    let ready = members.iter().filter(|m| ready_status(m) == "True").count();
    let mut summary: Vec<MemberSummary> = members
        .iter()
        .map(|m| MemberSummary {
            name: m.name_any(),
            cluster_id: m.spec.cluster_id.clone(),
            ready: ready_status(m).to_string(),
        })
        .collect();
    // Not-ready members first, then by name: the bounded list shows what needs attention.
    summary.sort_by(|a, b| (Reverse(a.ready != "True"), &a.name).cmp(&(Reverse(b.ready != "True"), &b.name)));
    let truncated = summary.len() > MAX_MEMBER_SUMMARY as usize;
    summary.truncate(MAX_MEMBER_SUMMARY as usize);

    let previous = set
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut conditions = vec![condition(
        previous,
        ConditionType::Ready,
        Status::True,
        Reason::Serving,
        format!("{ready} of {total} members ready, {pending} pending"),
        now,
    )];
    let deleting = set.metadata.deletion_timestamp.is_some();
    if let Some(why) = blocked {
        conditions.push(condition(
            previous,
            ConditionType::DeletionBlocked,
            Status::True,
            Reason::MembersRemain,
            why,
            now,
        ));
    }
    ClusterSetStatus {
        observed_generation: set.metadata.generation,
        state: Some(
            if deleting {
                SetState::Deleting
            } else {
                SetState::Active
            }
            .as_str()
            .into(),
        ),
        conditions,
        members: Some(MemberCounts {
            total: total as i32,
            ready: ready as i32,
            not_ready: (total - ready) as i32,
            pending: pending as i32,
        }),
        member_summary: summary,
        summary_truncated: truncated,
        membership: None,
    }
}

pub use tether_api::conditions::condition;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tether_api::clusterset::ClusterSetRole;
    use tether_api::{ClusterSetSpec, ManagedClusterSpec, ManagedClusterStatus};

    fn set() -> ClusterSet {
        let mut s = ClusterSet::new(
            "prod",
            ClusterSetSpec {
                role: ClusterSetRole::Leader,
                leader: None,
                member: None,
            },
        );
        s.metadata.generation = Some(3);
        s
    }

    fn member(name: &str, ready: Status) -> std::sync::Arc<ManagedCluster> {
        let mut mc = ManagedCluster::new(
            name,
            ManagedClusterSpec {
                cluster_id: format!("id-{name}"),
                cluster_set: "prod".into(),
                public_key: None,
            },
        );
        mc.status = Some(ManagedClusterStatus {
            conditions: vec![condition(
                &[],
                ConditionType::Ready,
                ready,
                Reason::HeartbeatReceived,
                String::new(),
                Timestamp::now(),
            )],
            ..ManagedClusterStatus::default()
        });
        std::sync::Arc::new(mc)
    }

    #[test]
    fn counts_members_by_readiness() {
        let ms = [
            member("a", Status::True),
            member("b", Status::Unknown),
            member("c", Status::True),
        ];
        let st = leader_status(&set(), &ms, 2, None, Timestamp::now());
        assert_eq!(
            st.members,
            Some(MemberCounts {
                total: 3,
                ready: 2,
                not_ready: 1,
                pending: 2
            })
        );
        assert_eq!(st.observed_generation, Some(3));
        assert_eq!(st.state.as_deref(), Some(SetState::Active.as_str()));
        assert_eq!(st.member_summary[0].name, "b", "not-ready members come first");
        assert!(!st.summary_truncated);
    }

    #[test]
    fn summary_is_bounded_and_stays_small_with_ten_thousand_members() {
        let ms: Vec<_> = (0..10_000)
            .map(|i| {
                member(
                    &format!("member-{i:05}-{}", "x".repeat(40)),
                    if i % 7 == 0 { Status::Unknown } else { Status::True },
                )
            })
            .collect();
        let st = leader_status(&set(), &ms, 0, None, Timestamp::now());
        assert_eq!(st.member_summary.len(), MAX_MEMBER_SUMMARY as usize);
        assert!(st.summary_truncated);
        assert!(st.member_summary.iter().all(|m| m.ready == "Unknown"));
        let bytes = serde_json::to_vec(&st).unwrap().len();
        assert!(bytes < 64 * 1024, "status is {bytes} bytes");
    }

    #[test]
    fn an_unchanged_status_compares_equal() {
        let ms = [member("a", Status::True)];
        let mut s = set();
        s.status = Some(leader_status(&s, &ms, 0, None, Timestamp::now()));
        let later = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(60);
        assert_eq!(s.status, Some(leader_status(&s, &ms, 0, None, later)));
    }

    #[test]
    fn a_blocked_deletion_says_why() {
        let mut s = set();
        s.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let ms = [member("a", Status::True)];
        let st = leader_status(&s, &ms, 0, Some("1 member remains".into()), Timestamp::now());
        assert_eq!(st.state.as_deref(), Some(SetState::Deleting.as_str()));
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::DeletionBlocked)
            .unwrap();
        assert!(c.status == "True" && c.reason == Reason::MembersRemain, "{c:?}");
    }
}
