//! A Leader ClusterSet's identity on its leader: its home namespace and its name (the set ID).
//! Set IDs are unique per namespace, not per leader, so everything the leader creates for a set
//! or a member carries both, and nothing of one set can be mistaken for another's.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::{ClusterSet, labels};

/// A ClusterSet on its leader: `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetRef {
    /// The set's home namespace.
    pub namespace: String,
    /// The set's name, its ID.
    pub name: String,
}

impl SetRef {
    /// The set `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The identity of a ClusterSet object.
    pub fn of(set: &ClusterSet) -> Self {
        Self::new(set.namespace().unwrap_or_default(), set.name_any())
    }

    /// The identity recorded in an object's labels, if both labels are there.
    pub fn from_labels(l: &BTreeMap<String, String>) -> Option<Self> {
        Some(Self::new(
            l.get(labels::CLUSTER_SET_NAMESPACE)?,
            l.get(labels::CLUSTER_SET)?,
        ))
    }

    /// The labels that record this identity on an object.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::CLUSTER_SET.to_string(), self.name.clone()),
            (labels::CLUSTER_SET_NAMESPACE.to_string(), self.namespace.clone()),
        ])
    }

    /// A label selector for exactly this set's objects.
    pub fn selector(&self) -> String {
        format!(
            "{}={},{}={}",
            labels::CLUSTER_SET,
            self.name,
            labels::CLUSTER_SET_NAMESPACE,
            self.namespace
        )
    }

    /// Whether an object's labels say it belongs to this set.
    pub fn owns(&self, l: &BTreeMap<String, String>) -> bool {
        Self::from_labels(l).as_ref() == Some(self)
    }
}

impl std::fmt::Display for SetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
