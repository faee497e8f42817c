//! Every Ready change the leader wrote, per member, as a watch of ManagedClusters sees them.

use super::*;

/// A Ready change: when it was seen, its status and reason.
type Change = (Instant, String, String);

/// Every Ready change the leader wrote, per member, from a watch of ManagedClusters.
#[derive(Clone, Default)]
pub(super) struct Transitions(Arc<Mutex<HashMap<String, Vec<Change>>>>);

impl Transitions {
    pub(super) fn follow(admin: &Client) -> (Self, tokio::task::JoinHandle<()>) {
        let t = Self::default();
        let seen = t.clone();
        let stream = watcher(
            Api::<ManagedCluster>::all(admin.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .applied_objects()
        .for_each(move |mc| {
            if let Ok(mc) = mc
                && let Some(c) = mc
                    .status
                    .as_ref()
                    .and_then(|s| find(&s.conditions, ConditionType::Ready))
            {
                let mut all = seen.0.lock().unwrap_or_else(|p| p.into_inner());
                let list = all.entry(mc.name_any()).or_default();
                if list
                    .last()
                    .is_none_or(|(_, s, r)| s != &c.status || r != &c.reason)
                {
                    list.push((Instant::now(), c.status.clone(), c.reason.clone()));
                }
            }
            async {}
        });
        (t, tokio::spawn(stream))
    }

    /// When `name` was first seen `status` after `since`.
    pub(super) fn first(&self, name: &str, status: &str, since: Instant) -> Option<Instant> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.get(name)?
            .iter()
            .find(|(at, s, _)| *at >= since && s == status)
            .map(|(at, _, _)| *at)
    }

    /// Those of `names` with a Ready change after `since` that `pick(status, reason)` picks,
    /// sorted, each with its Ready changes after it: `Status/Reason +secs`.
    pub(super) fn changed_since(
        &self,
        names: &HashSet<String>,
        since: Instant,
        pick: impl Fn(&str, &str) -> bool,
    ) -> Vec<(String, Vec<String>)> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(String, Vec<String>)> = names
            .iter()
            .filter_map(|n| {
                let after: Vec<&Change> = all.get(n)?.iter().filter(|(at, _, _)| *at >= since).collect();
                after.iter().any(|(_, s, r)| pick(s, r)).then(|| {
                    let changes = after
                        .iter()
                        .map(|(at, s, r)| format!("{s}/{r} +{:.1}s", at.duration_since(since).as_secs_f64()))
                        .collect();
                    (n.clone(), changes)
                })
            })
            .collect();
        out.sort();
        out
    }

    /// How many members are `Ready=True` with `reason` now.
    pub(super) fn count(&self, reason: &str) -> usize {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.values()
            .filter(|l| l.last().is_some_and(|(_, s, r)| s == "True" && r == reason))
            .count()
    }
}
