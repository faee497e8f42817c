//! Which doc blocks the test runs, in which order and for which member, and what it skips.

/// The docs whose `sh` blocks run, in this order.
pub(super) const DOCS: [&str; 2] = ["README.md", "docs/operations.md"];

/// How the test treats a block.
#[derive(Clone, Copy, Debug)]
pub(super) enum How {
    /// Run it in place; `member` is the cluster `M$` and `# each member cluster` mean.
    Run { member: &'static str },
    /// Run it after every other block: it uses clusters the later blocks set up (the README's
    /// sandbox tour comes before its install steps).
    Last { member: &'static str },
    /// Not run here, and why.
    Skip(&'static str),
}

/// Every `sh` block of [`DOCS`], in their order, by the start of its first line.
pub(super) const PLAN: &[(&str, &str, How)] = &[
    ("README.md", "source .sandbox/env", How::Last { member: "east" }),
    ("README.md", "# leader cluster", How::Run { member: "east" }),
    (
        "README.md",
        "helm install tether-leader oci://ghcr.io/",
        How::Skip(
            "installs the published chart from ghcr.io, which this machine cannot reach (no traffic \
             leaves it); tests/nodes.rs installs the same chart with `helm install oci://...` from \
             a local registry it pushed the packaged chart to",
        ),
    ),
    (
        "README.md",
        "tether init --clusterset prod --values-file join.yaml",
        How::Run { member: "west" },
    ),
    (
        "README.md",
        "# leader: who may reach east",
        How::Run { member: "east" },
    ),
    (
        "README.md",
        "# leader: publish prod's members as ClusterProfiles",
        How::Run { member: "east" },
    ),
    (
        "docs/operations.md",
        "M$ kubectl -n tether-system describe clusterset prod",
        How::Run { member: "east" },
    ),
    (
        "docs/operations.md",
        "L$ tether token create",
        How::Run { member: "east" },
    ),
    (
        "docs/operations.md",
        "L$ tether status",
        How::Run { member: "east" },
    ),
    (
        "docs/operations.md",
        "M$ tether leave",
        How::Run { member: "west" },
    ),
    (
        "docs/operations.md",
        "L$ helm upgrade tether-leader charts/tether-leader -n tether-system --reset-then-reuse-values --set leaderURL=",
        How::Skip(
            "moves every member to a new URL, which needs a second address of the leader's API \
             server with a certificate valid for it; tests/change.rs moves a running fleet to a \
             second address and proves the members follow and stay Ready",
        ),
    ),
    (
        "docs/operations.md",
        "# 1. Publish both CAs",
        How::Skip(
            "needs the leader's API server restarted on a serving certificate of a new CA (step 2 \
             is the platform's own procedure); tests/change.rs rotates the CA of a running fleet \
             through these three steps",
        ),
    ),
    (
        "docs/operations.md",
        "helm install tether-leader charts/tether-leader",
        How::Skip(
            "installs the leader a second time (this cluster already runs it); tests/nodes.rs \
             installs the leader with these values plus the UID OpenShift's SCC would inject, and \
             checks the pods run as that UID",
        ),
    ),
    (
        "docs/operations.md",
        "L$ helm upgrade tether-leader charts/tether-leader -n tether-system --reset-then-reuse-values --set serviceMonitor.enabled=true",
        How::Run { member: "east" },
    ),
    (
        "docs/operations.md",
        "L$ helm upgrade tether-leader charts/tether-leader -n tether-system --reset-then-reuse-values",
        How::Run { member: "east" },
    ),
];

/// Lines of run blocks that are not run, and why.
pub(super) const SKIPPED_LINES: &[(&str, &str)] = &[
    (
        "source .sandbox/env",
        "the test puts the real kubectl, helm and tether on PATH and the three clusters' \
         kubeconfigs in KUBECONFIG itself, as this file does for `make demo`",
    ),
    (
        "make demo-down",
        "stops the `make demo` sandbox in .sandbox/; this test stops its own clusters",
    ),
    (
        "helm install tether-agent charts/tether-agent -n tether-system --create-namespace \\\n  -f join.yaml",
        "the one-step alternative of the two lines above it, on the same member (a second release \
         of the chart would conflict); tests/nodes.rs joins its member west exactly so",
    ),
];
