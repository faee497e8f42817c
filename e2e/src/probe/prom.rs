//! Prometheus text as the benchmarks read it: one series' value, and the API server's write
//! counts by resource.

use std::collections::{BTreeMap, HashMap};

use kube::Client;

/// The value of the series `series` (name and labels, as printed) in Prometheus or OpenMetrics
/// text `text`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `apiserver_request_total` of write verbs, by `resource[/subresource]`.
pub(crate) async fn request_counts(admin: &Client) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(vec![]).expect("request");
    let text = admin.request_text(req).await.expect("API server /metrics");
    parse_request_counts(&text)
}

/// `request_counts`, or `None` if the API server does not answer within `within` (a busy one
/// must not stall a timeline that reads it every second).
pub(crate) async fn request_counts_within(
    admin: &Client,
    within: std::time::Duration,
) -> Option<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(vec![]).expect("request");
    let text = tokio::time::timeout(within, admin.request_text(req))
        .await
        .ok()?
        .ok()?;
    Some(parse_request_counts(&text))
}

/// `apiserver_request_total` of every verb, by `VERB resource[/subresource]`, with requests
/// answered 429 (priority and fairness turned them away) counted apart.
pub(crate) async fn request_mix(admin: &Client) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(vec![]).expect("request");
    let text = admin.request_text(req).await.expect("API server /metrics");
    parse_counts(&text, |verb, code| {
        Some(format!("{verb} {}", if code == "429" { "(429) " } else { "" }))
    })
}

/// Sums `apiserver_request_total` samples of write verbs by `resource[/subresource]`.
pub fn parse_request_counts(text: &str) -> BTreeMap<String, f64> {
    parse_counts(text, |verb, _| {
        matches!(
            verb,
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        )
        .then(String::new)
    })
}

/// Sums `apiserver_request_total` samples by `resource[/subresource]`, each keyed after the
/// prefix `prefix` gives for its verb and code (none: not counted).
fn parse_counts(text: &str, prefix: impl Fn(&str, &str) -> Option<String>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let labels: HashMap<&str, &str> = labels
            .trim_start_matches("apiserver_request_total{")
            .trim_end_matches('}')
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .map(|(k, v)| (k, v.trim_end_matches('"')))
            .collect();
        let label = |name: &str| labels.get(name).copied().unwrap_or_default();
        let Some(mut what) = prefix(label("verb"), label("code")) else {
            continue;
        };
        what.push_str(label("resource"));
        if !label("subresource").is_empty() {
            what = format!("{what}/{}", label("subresource"));
        }
        // NB: a collection delete in a namespace (the namespace controller emptying a member's
        // namespace) is counted apart from deletes of one object.
        if label("verb") == "DELETE" && label("scope") == "namespace" {
            what.push_str(" (collection)");
        }
        *out.entry(what).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}
