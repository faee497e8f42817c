//! The SIG-Multicluster `about.k8s.io` ClusterProperty (KEP-2149), with the upstream schema:
//! v1alpha1 (served) and v1beta1 (served, stored). Tether writes through v1alpha1, which every
//! released version of the CRD serves.

/// `about.k8s.io/v1alpha1` ClusterProperty.
pub mod v1alpha1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    /// Spec represents the desired behavior.
    #[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[kube(
        group = "about.k8s.io",
        version = "v1alpha1",
        kind = "ClusterProperty",
        derive = "PartialEq",
        doc = "ClusterProperty is a resource provides a way to store identification related,\ncluster scoped information for multi-cluster tools while creating flexibility\nfor implementations.",
        printcolumn(name = "value", type_ = "string", json_path = ".spec.value"),
        printcolumn(name = "age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )]
    pub struct ClusterPropertySpec {
        /// Value is the property-dependent string.
        #[schemars(length(min = 1))]
        pub value: String,
    }
}

/// `about.k8s.io/v1beta1` ClusterProperty (storage version upstream).
pub mod v1beta1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    /// ClusterPropertySpec defines the desired state of ClusterProperty
    #[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[kube(
        group = "about.k8s.io",
        version = "v1beta1",
        kind = "ClusterProperty",
        status = "ClusterPropertyStatus",
        derive = "PartialEq",
        doc = "ClusterProperty is the Schema for the clusterproperties API",
        printcolumn(name = "value", type_ = "string", json_path = ".spec.value"),
        printcolumn(name = "age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )]
    pub struct ClusterPropertySpec {
        /// ClusterProperty value
        #[schemars(length(min = 1))]
        pub value: String,
    }

    /// ClusterPropertyStatus defines the observed state of ClusterProperty
    #[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
    pub struct ClusterPropertyStatus {}
}

pub use v1alpha1::ClusterProperty;
