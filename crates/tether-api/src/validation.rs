//! Patterns and CEL rules shared by the schemas, so that every kind validates names the same way.

/// DNS-1123 label: lowercase alphanumerics and '-', starting and ending alphanumeric.
pub const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// DNS-1123 subdomain: dot-separated DNS-1123 labels.
pub const DNS1123_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A Go-style duration such as `10s`, `1m30s` or `24h`.
pub const DURATION: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";
/// An `age` X25519 recipient (bech32, `age1` + 58 characters).
pub const AGE_RECIPIENT: &str = r"^age1[02-9ac-hj-np-z]{58}$";
/// A kubeadm-style CA pin: `sha256:` + hex SHA-256 of the CA's SubjectPublicKeyInfo.
pub const CA_CERT_HASH: &str = r"^sha256:[a-f0-9]{64}$";

/// Longest cluster name (it is a DNS label).
pub const MAX_CLUSTER_NAME: u32 = 63;
/// Longest cluster ID (KEP-2149 allows a DNS subdomain of up to 128 characters).
pub const MAX_CLUSTER_ID: u32 = 128;
/// Most labels a member may ask for.
pub const MAX_LABELS: u32 = 32;
/// CEL rule bounding label keys and values like Kubernetes does (prefix/name ≤ 253/63, value ≤ 63).
pub const LABELS_RULE: &str = "self.all(k, k.size() <= 317 && self[k].size() <= 63)";
/// The reserved label keys as an RE2 pattern inside a CEL string literal (hence the doubled
/// backslashes): the same keys as `labels::is_reserved`, which a CRD test holds to one table on
/// a real API server.
macro_rules! reserved_label_key {
    () => {
        r"^(([^/]*\\.)?(tether\\.dev|x-k8s\\.io)/|(kubernetes|k8s)\\.io/|app\\.kubernetes\\.io/managed-by$)"
    };
}
/// CEL rule refusing reserved label keys in a map of labels.
pub const NO_RESERVED_LABELS_RULE: &str = concat!("self.all(k, !k.matches('", reserved_label_key!(), "'))");
/// The message of `NO_RESERVED_LABELS_RULE`: it names the first reserved key.
pub const NO_RESERVED_LABELS_MESSAGE: &str = concat!(
    "'label key ' + self.filter(k, k.matches('",
    reserved_label_key!(),
    "'))[0] + ' is reserved: the set, name, ID and manager labels are the leader\\'s alone, and so are \
     keys under tether.dev, x-k8s.io, kubernetes.io/ and k8s.io/; ask for another key'"
);
/// CEL rule making a field immutable once set.
pub const IMMUTABLE_RULE: &str = "self == oldSelf";
