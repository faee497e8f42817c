//! The `tether` binary against a real leader and two real members with both controllers
//! running: init → join ×2 → status → leave → destroy, each command twice where it matters,
//! failures that leave nothing behind, and `kubectl tether` as a plugin.

use std::path::Path;
use std::process::Output;
use std::time::Duration;
use tether_api::clusterset::LeaderSpec;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams};
use tether_api::{ClusterSet, ManagedCluster};
use tether_e2e::fleet::{self, LeaderSide, MemberSide, policy};
use tether_e2e::sim::{HOME, SET};
use tether_testkit::controller::binary;
use tether_testkit::{Tools, eventually};

#[path = "cli/printed.rs"]
mod printed;

#[path = "cli/removal.rs"]
mod removal;

async fn tether(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(binary("tether").expect("tether binary"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env("NO_COLOR", "1");
    cmd.output().await.expect("run tether")
}

/// `tether join --leader L --token T --ca-cert-hash H --name N` with `kubeconfig`.
async fn join_with(kubeconfig: &Path, leader: &str, token: &str, hash: &str, name: &str) -> Output {
    let args = [
        "join",
        "--leader",
        leader,
        "--token",
        token,
        "--ca-cert-hash",
        hash,
        "--name",
        name,
    ];
    tether(kubeconfig, &args).await
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "tether failed: {}", text(o));
    text(o)
}

#[track_caller]
fn fails(o: &Output, says: &str) -> String {
    let t = text(o);
    assert!(!o.status.success(), "tether should have failed: {t}");
    assert!(t.contains(says), "the error should say {says:?}: {t}");
    t
}

/// As [`fails`], and exits with `code` (README, "Exit codes": 2 usage, 3 not found, 4
/// forbidden, 5 unreachable, 6 timed out).
#[track_caller]
fn fails_with(o: &Output, code: i32, says: &str) -> String {
    let t = fails(o, says);
    assert_eq!(o.status.code(), Some(code), "exit code of: {t}");
    t
}

/// `--flag value` from a printed `tether join …` line.
fn flag(line: &str, name: &str) -> String {
    let mut words = line.split_whitespace();
    words.find(|w| *w == name);
    words.next().unwrap_or_default().to_string()
}

async fn no_member_set(m: &MemberSide) {
    let sets = Api::<ClusterSet>::namespaced(m.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(
        sets.items.is_empty(),
        "nothing left behind: {:?}",
        tether_e2e::sim::names(&sets.items)
    );
    let s = Api::<Secret>::namespaced(m.admin.clone(), HOME)
        .get_opt("tether-join-token")
        .await
        .expect("get");
    assert!(s.is_none(), "no token Secret left behind");
}

#[tokio::test]
async fn init_join_status_leave_destroy_with_failures_that_leave_nothing_behind() {
    let leader = LeaderSide::named("cli-leader").start().await;
    let (mut east, mut west) = tokio::join!(fleet::bare_member("east"), fleet::bare_member("west"));
    let lk = leader.cluster.kubeconfig().to_path_buf();

    // init prints a join command; running it again is fine.
    let out = ok(&tether(&lk, &["init", "--clusterset", SET]).await);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("tether join"))
        .expect("join line")
        .to_string();
    assert!(out.contains("helm install tether-agent"), "{out}");
    let (url, token, hash) = (
        flag(&line, "--leader"),
        flag(&line, "--token"),
        flag(&line, "--ca-cert-hash"),
    );
    assert_eq!(hash, leader.cluster.ca_cert_hash(), "the pin is the leader CA's");
    ok(&tether(&lk, &["init", "--clusterset", SET]).await);
    let listed = ok(&tether(&lk, &["token", "list", "--clusterset", SET]).await);
    assert!(
        listed.contains(&token[..6]) && !listed.contains(&token[7..]),
        "IDs only: {listed}"
    );
    // token create / delete: the deleted token is gone from the list; deleting it again is fine.
    let extra = ok(&tether(&lk, &["token", "create", "--clusterset", SET]).await)
        .trim()
        .to_string();
    let extra_id = extra.split('.').next().unwrap_or_default().to_string();
    assert!(ok(&tether(&lk, &["token", "list"]).await).contains(&extra_id));
    ok(&tether(&lk, &["token", "delete", &extra_id]).await);
    assert!(ok(&tether(&lk, &["token", "delete", &extra_id]).await).contains("nothing to do"));
    assert!(
        !ok(&tether(&lk, &["token", "list"]).await).contains(&extra_id),
        "deleted"
    );

    let ek = east.cluster.kubeconfig().to_path_buf();
    let wk = west.cluster.kubeconfig().to_path_buf();
    // A join config file from `init --values-file` drives `join --config-file` (dry run: checks, creates nothing).
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("join.yaml");
    let file_arg = file.display().to_string();
    ok(&tether(&lk, &["init", "--clusterset", SET, "--values-file", &file_arg]).await);
    let dry = ok(&tether(
        &wk,
        &["join", "--config-file", &file_arg, "--name", "west", "--dry-run"],
    )
    .await);
    assert!(
        dry.contains("token is valid for ClusterSet prod") && dry.contains("role: Member"),
        "{dry}"
    );
    // Failures first, each leaving nothing behind.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let t = fails_with(
        &join_with(&wk, &url, &token, &wrong, "west").await,
        1,
        "does not match",
    );
    assert!(t.contains(&hash), "shows the hash it saw: {t}");
    fails_with(
        &join_with(&wk, &url, "abcdef.0000000000000000", &hash, "west").await,
        4,
        "rejected the token",
    );
    fails_with(
        &join_with(&wk, "https://127.0.0.1:1", &token, &hash, "west").await,
        5,
        "cannot read",
    );
    // A name that is not a DNS label is refused before anything is sent, with one to pass.
    fails_with(
        &join_with(&wk, &url, &token, &hash, "West_1").await,
        2,
        "for example --name west-1",
    );
    fails_with(&join_with(&wk, &url, &token, &hash, "west").await, 6, "no agent");
    no_member_set(&west).await;

    // Joins with the agents running; a second join is a no-op.
    east.start_agent();
    west.start_agent();
    let (e, w) = tokio::join!(
        join_with(&ek, &url, &token, &hash, "east"),
        join_with(&wk, &url, &token, &hash, "west")
    );
    assert!(ok(&e).contains("Joined ClusterSet prod as east"));
    ok(&w);
    assert!(ok(&join_with(&ek, &url, &token, &hash, "east").await).contains("Already joined"));

    // The set's counts follow within a second or two (debounced).
    let status = eventually("status with 2 members", Duration::from_secs(15), || async {
        let out = text(&tether(&lk, &["status"]).await);
        if out.contains("2 members, 2 ready") {
            Ok(out)
        } else {
            Err(out)
        }
    })
    .await;
    for name in ["east", "west"] {
        let row = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {status}"));
        assert!(row.contains("True"), "{row}");
    }
    let json_out = ok(&tether(&lk, &["status", "-o", "json"]).await);
    let rows: serde_json::Value = serde_json::from_str(&json_out).expect("json");
    assert_eq!(rows.as_array().map(Vec::len), Some(2));
    let member_view = ok(&tether(&ek, &["status"]).await);
    assert!(
        member_view.contains("Ready") && member_view.contains("tether-prod-east"),
        "{member_view}"
    );
    // KUBECONFIG as a list of files is merged as kubectl merges it: the first file's current
    // context by default, any listed context with --context.
    let list = std::env::join_paths([&lk, &ek]).expect("KUBECONFIG list");
    for (context, says) in [(None, "2 members, 2 ready"), (Some("east"), "tether-prod-east")] {
        let mut cmd = tokio::process::Command::new(binary("tether").expect("tether binary"));
        cmd.env("KUBECONFIG", &list).env("NO_COLOR", "1").arg("status");
        if let Some(context) = context {
            cmd.args(["--context", context]);
        }
        let out = ok(&cmd.output().await.expect("run tether"));
        assert!(out.contains(says), "{context:?}: {out}");
    }

    // `tether version` shows the CLI's version and each member's agent version (the leader
    // controller here is a process outside the cluster, without a Lease: tests/nodes.rs checks
    // the replicas' versions on real pods).
    let versions = ok(&tether(&lk, &["version"]).await);
    let cli_version = env!("CARGO_PKG_VERSION");
    assert!(
        versions.contains(&format!("tether CLI {cli_version}")),
        "{versions}"
    );
    for name in ["east", "west"] {
        let row = versions
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{name} in {versions}"));
        assert!(row.contains(cli_version) && row.contains("True"), "{row}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&ok(&tether(&lk, &["version", "-o", "json"]).await)).expect("json");
    assert_eq!(json["client"], cli_version);
    assert_eq!(json["agents"].as_array().map(Vec::len), Some(2), "{json}");

    // What a command names and does not exist exits 3; an unreachable cluster 5.
    fails_with(
        &tether(&lk, &["member", "remove", "nobody"]).await,
        3,
        "no member nobody",
    );
    fails_with(
        &tether(&lk, &["status", "--clusterset", "nosuch"]).await,
        3,
        "no ClusterSet",
    );
    fails_with(
        &tether(&lk, &["approve", "nosuch"]).await,
        3,
        "no registration request",
    );
    let unreachable = dir.path().join("unreachable.kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', \
         insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("write");
    fails_with(&tether(&unreachable, &["status"]).await, 5, "error");
    // Unknown flags are clap's usage errors: 2.
    fails_with(
        &tether(&lk, &["status", "--no-such-flag"]).await,
        2,
        "--no-such-flag",
    );

    // destroy refuses while members remain.
    fails(
        &tether(&lk, &["destroy", "--clusterset", SET]).await,
        "still has 2 member(s)",
    );
    // leave, twice.
    ok(&tether(&ek, &["leave"]).await);
    assert!(ok(&tether(&ek, &["leave"]).await).contains("nothing to do"));
    no_member_set(&east).await;
    let mcs = Api::<ManagedCluster>::namespaced(leader.admin.clone(), &tether_e2e::sim::ns_of("east"));
    eventually("east gone at the leader", Duration::from_secs(60), || async {
        match mcs.get_opt("east").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;

    // destroy --dry-run says what would go and changes nothing; without --yes (stdin is not a
    // terminal here) it refuses; with it, --force removes the rest; a second destroy is fine.
    let plan = ok(&tether(&lk, &["destroy", "--clusterset", SET, "--force", "--dry-run"]).await);
    assert!(
        plan.contains("member west") && plan.contains("join token") && plan.contains("nothing was changed"),
        "{plan}"
    );
    fails_with(
        &tether(&lk, &["destroy", "--clusterset", SET, "--force"]).await,
        2,
        "pass --yes to confirm",
    );
    assert!(
        Api::<ClusterSet>::namespaced(leader.admin.clone(), HOME)
            .get_opt(SET)
            .await
            .expect("get")
            .is_some_and(|s| s.metadata.deletion_timestamp.is_none()),
        "a dry run and a refusal leave the set"
    );
    ok(&tether(&lk, &["destroy", "--clusterset", SET, "--force", "--yes"]).await);
    ok(&tether(&lk, &["destroy", "--clusterset", SET, "--force", "--yes"]).await);
    assert!(
        Api::<ClusterSet>::namespaced(leader.admin.clone(), HOME)
            .get_opt(SET)
            .await
            .expect("get")
            .is_none()
    );
    eventually("west's namespace gone", Duration::from_secs(60), || async {
        match Api::<Namespace>::all(leader.admin.clone())
            .get_opt(&tether_e2e::sim::ns_of("west"))
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    let tokens = Api::<Secret>::namespaced(leader.admin.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!("{}={SET}", tether_api::labels::CLUSTER_SET)))
        .await
        .expect("list");
    assert!(tokens.items.is_empty(), "join tokens removed");
    west.kill_agent();
    east.kill_agent();
}

#[tokio::test]
async fn kubectl_runs_it_as_a_plugin() {
    let dir = tempfile::tempdir().expect("tmp");
    let plugin = dir.path().join("kubectl-tether");
    std::os::unix::fs::symlink(binary("tether").expect("tether"), &plugin).expect("symlink");
    let kubectl = Tools::locate().expect("tools").path("kubectl");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::process::Command::new(kubectl)
        .args(["tether", "version"])
        .env("PATH", path)
        .env("KUBECONFIG", dir.path().join("none"))
        .output()
        .await
        .expect("kubectl");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("tether CLI"), "{t}");
    let completions = tether(Path::new("/nonexistent"), &["completions", "bash"]).await;
    assert!(ok(&completions).contains("complete"), "bash completions");
}

#[tokio::test]
async fn without_bootstrap_tokens_init_falls_back_to_a_service_account_token_and_manual_approval_works() {
    let cluster = tether_testkit::TestCluster::builder("cli-nobootstrap")
        .bootstrap_tokens(false)
        .audit_log(true)
        .start()
        .await
        .expect("leader");
    let leader = LeaderSide::on(cluster).start().await;
    let mut east = fleet::bare_member("east-sa").await;
    east.start_agent();
    let lk = leader.cluster.kubeconfig().to_path_buf();
    let out = ok(&tether(&lk, &["init", "--clusterset", SET, "--approval", "manual"]).await);
    assert!(
        out.contains("ServiceAccount token"),
        "the fallback says so: {out}"
    );
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("tether join"))
        .expect("join line")
        .to_string();
    let (url, token, hash) = (
        flag(&line, "--leader"),
        flag(&line, "--token"),
        flag(&line, "--ca-cert-hash"),
    );

    // The join waits for an admin; approve it from the leader side.
    let ek = east.cluster.kubeconfig().to_path_buf();
    let join = tokio::spawn(async move { join_with(&ek, &url, &token, &hash, "east").await });
    let requests = Api::<tether_api::ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME);
    let name = eventually("a request awaiting approval", Duration::from_secs(60), || async {
        let list = requests
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| format!("{:?}", s.reason) == "AwaitingApproval")
            })
            .map(|r| r.metadata.name.clone().unwrap_or_default())
            .ok_or_else(|| format!("{} requests", list.items.len()))
    })
    .await;
    assert!(ok(&tether(&lk, &["approve", &name]).await).contains("approved"));
    ok(&tether(&lk, &["approve", &name]).await);
    let joined = join.await.expect("join task");
    assert!(
        ok(&joined).contains("Joined ClusterSet prod as east"),
        "{}",
        text(&joined)
    );
    let again = ok(&tether(&lk, &["approve", &name]).await);
    assert!(
        again.contains("nothing to do"),
        "approving a decided request is a no-op: {again}"
    );
    east.kill_agent();
}

/// The words of a printed command (continuation lines joined), `<CLUSTER-NAME>` filled in.
fn words_of(out: &str, starts: &str, name: &str) -> Vec<String> {
    let mut lines = out.lines().skip_while(|l| !l.trim_start().starts_with(starts));
    let mut text = String::new();
    for l in lines.by_ref() {
        let l = l.trim();
        text.push_str(l.trim_end_matches('\\'));
        text.push(' ');
        if !l.ends_with('\\') {
            break;
        }
    }
    assert!(!text.is_empty(), "no `{starts}` line in {out}");
    text.split_whitespace()
        .map(|w| w.replace("<CLUSTER-NAME>", name))
        .collect()
}

/// The documents `helm <args>` renders (`template`), as JSON values.
fn rendered(args: &[String]) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    let out = helm(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout).to_string();
    serde_norway::Deserializer::from_str(&yaml)
        .filter_map(|d| serde_json::Value::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

/// Waits until member `name` of `set` has its ManagedCluster on the leader.
async fn wait_joined(leader: &fleet::LeaderSide, set: &tether_api::SetRef, name: &str) {
    let ns = tether_leader::naming::member_namespace(set, name);
    eventually(
        &format!("{name} joined {set}"),
        Duration::from_secs(60),
        || async {
            Api::<ManagedCluster>::namespaced(leader.admin.clone(), &ns)
                .get(name)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

fn helm(args: &[String]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = std::env::temp_dir();
    std::process::Command::new(Tools::locate().expect("tools").path("helm"))
        .args(args)
        .current_dir(root)
        .env("HELM_CACHE_HOME", tmp.join("tether-helm-cache"))
        .env("HELM_CONFIG_HOME", tmp.join("tether-helm-config"))
        .env("HELM_DATA_HOME", tmp.join("tether-helm-data"))
        .output()
        .expect("run helm")
}
