//! The member ClusterSet's status as the agent sees its membership: `Registered`,
//! `LeaderReachable`, `CAVerified` and `Ready` conditions with reasons, the dedicated namespace,
//! the credential's expiry and the last heartbeat. Pure: `View::status` builds the object; the
//! session writes it only when it changed (the heartbeat time at most once a minute).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use tether_api::ClusterSetStatus;
use tether_api::clusterset::Membership;
use tether_api::conditions::{ConditionType, Reason, SetState, Status, condition};

/// One condition's state: `(status, reason, message)`.
pub type State = (bool, Reason, String);

/// What the agent knows about its membership.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct View {
    /// Registered with the leader.
    pub registered: Option<State>,
    /// The leader answers heartbeats.
    pub reachable: Option<State>,
    /// The leader's CA was verified.
    pub ca_verified: Option<State>,
    /// The leader supports this agent's version (its judgement on the ManagedCluster, mirrored).
    pub version_supported: Option<State>,
    /// The membership details.
    pub membership: Membership,
    /// Leaving (the ClusterSet is being deleted).
    pub leaving: bool,
}

impl View {
    /// Whether the member is fully working.
    pub fn ready(&self) -> bool {
        matches!(self.registered, Some((true, _, _))) && matches!(self.reachable, Some((true, _, _)))
    }

    /// The status object for `generation`, keeping transition times from `previous`.
    pub fn status(
        &self,
        previous: &[Condition],
        generation: Option<i64>,
        now: Timestamp,
    ) -> ClusterSetStatus {
        let mut conditions = vec![];
        let mut push = |type_: ConditionType, s: &Option<State>| {
            if let Some((ok, reason, message)) = s {
                conditions.push(condition(
                    previous,
                    type_,
                    Status::of(*ok),
                    *reason,
                    message.clone(),
                    now,
                ));
            }
        };
        push(ConditionType::Registered, &self.registered);
        push(ConditionType::LeaderReachable, &self.reachable);
        push(ConditionType::CAVerified, &self.ca_verified);
        push(ConditionType::AgentVersionSupported, &self.version_supported);
        let ready = if self.ready() {
            (true, Reason::Joined, "registered and heartbeating".to_string())
        } else {
            let why = [&self.registered, &self.reachable]
                .into_iter()
                .flatten()
                .find(|(ok, _, _)| !ok)
                .map(|(_, reason, message)| (*reason, message.clone()))
                .unwrap_or((Reason::Joining, "registering with the leader".to_string()));
            (false, why.0, why.1)
        };
        push(ConditionType::Ready, &Some(ready));
        let state = if self.leaving {
            SetState::Leaving
        } else if self.ready() {
            SetState::Ready
        } else if matches!(self.registered, Some((true, _, _))) {
            SetState::NotReady
        } else {
            SetState::Joining
        };
        ClusterSetStatus {
            observed_generation: generation,
            state: Some(state.as_str().into()),
            conditions,
            membership: Some(self.membership.clone()),
            ..ClusterSetStatus::default()
        }
    }
}

/// A timestamp for the status.
pub fn time(t: Timestamp) -> Time {
    Time(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_registration_and_a_reachable_leader() {
        let now = Timestamp::now();
        let mut v = View::default();
        let s = v.status(&[], Some(1), now);
        assert_eq!(s.state.as_deref(), Some(SetState::Joining.as_str()));
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Ready)
            .unwrap();
        assert!(
            ready.status == "False" && ready.reason == Reason::Joining,
            "{ready:?}"
        );

        v.registered = Some((true, Reason::Approved, "namespace tether-prod-east".into()));
        v.reachable = Some((false, Reason::LeaderUnreachable, "connection refused".into()));
        let s = v.status(&[], Some(1), now);
        assert_eq!(s.state.as_deref(), Some(SetState::NotReady.as_str()));
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Ready)
            .unwrap();
        assert_eq!(ready.reason, Reason::LeaderUnreachable, "Ready says why not");

        v.reachable = Some((true, Reason::HeartbeatOK, String::new()));
        let s = v.status(&[], Some(1), now);
        assert_eq!(s.state.as_deref(), Some(SetState::Ready.as_str()));
        let later = now + k8s_openapi::jiff::SignedDuration::from_secs(30);
        assert_eq!(
            v.status(&s.conditions, Some(1), later),
            s,
            "unchanged status compares equal"
        );
    }
}
