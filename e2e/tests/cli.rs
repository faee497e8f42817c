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

#[tokio::test]
async fn every_command_init_prints_works_as_printed_for_a_set_outside_tether_system() {
    let leader = LeaderSide::named("cli-produs").start().await;
    let (mut east, mut west) = tokio::join!(fleet::bare_member("east-us"), fleet::bare_member("west-us"));
    east.start_agent();
    west.start_agent();
    let lk = leader.cluster.kubeconfig().to_path_buf();
    let set = tether_api::SetRef::new("tether-us", "prod-us");
    let out = ok(&tether(&lk, &["init", "--clusterset", "prod-us", "-n", "tether-us"]).await);

    // The `tether join` line, run exactly as printed, joins prod-us (not the default prod).
    let join = words_of(&out, "tether join", "east");
    let args: Vec<&str> = join[1..].iter().map(String::as_str).collect();
    let ek = east.cluster.kubeconfig().to_path_buf();
    let joined = ok(&tether(&ek, &args).await);
    assert!(joined.contains("Joined ClusterSet prod-us as east"), "{joined}");
    let east_ns = tether_leader::naming::member_namespace(&set, "east");
    Api::<ManagedCluster>::namespaced(leader.admin.clone(), &east_ns)
        .get("east")
        .await
        .expect("east is a member of tether-us/prod-us");

    // The "makes another" command, as printed, makes a token of that set.
    let another = out
        .lines()
        .find_map(|l| {
            l.split('`')
                .nth(1)
                .filter(|c| c.starts_with("tether token create"))
        })
        .expect("token create command");
    let words: Vec<&str> = another.split_whitespace().skip(1).collect();
    let fresh = ok(&tether(&lk, &words).await).trim().to_string();

    // The Helm line, as printed (with that fresh token), renders a membership of prod-us whose
    // leader namespace is tether-us; applied in a member with a running agent, it joins.
    let mut helm_args: Vec<String> = words_of(&out, "helm install", "west")[1..].to_vec();
    helm_args[0] = "template".into();
    let token_value = helm_args
        .iter()
        .position(|w| w.starts_with("token="))
        .expect("token=");
    helm_args[token_value] = format!("token={fresh}");
    let docs = rendered(&helm_args);
    let membership = docs
        .iter()
        .find(|d| d["kind"] == "ClusterSet")
        .expect("a ClusterSet in the chart");
    assert_eq!(membership["metadata"]["name"], "prod-us", "{membership}");
    assert_eq!(
        membership["spec"]["member"]["leaderNamespace"], "tether-us",
        "{membership}"
    );
    let secret = docs
        .iter()
        .find(|d| {
            d["kind"] == "Secret"
                && d["metadata"]["name"] == membership["spec"]["member"]["joinTokenSecretRef"]["name"]
        })
        .expect("the join token Secret");
    let member_set: ClusterSet = serde_json::from_value(membership.clone()).expect("ClusterSet");
    let token_secret: Secret = serde_json::from_value(secret.clone()).expect("Secret");
    let pp = kube::api::PostParams::default();
    Api::<Secret>::namespaced(west.admin.clone(), HOME)
        .create(&pp, &token_secret)
        .await
        .expect("token Secret");
    Api::<ClusterSet>::namespaced(west.admin.clone(), HOME)
        .create(&pp, &member_set)
        .await
        .expect("Member ClusterSet");
    wait_joined(&leader, &set, "west").await;
    east.kill_agent();
    west.kill_agent();
}

/// The two-step join, every command as printed: an agent installed with no membership idles and
/// says so (`Registered=False`, NotJoined, with the command to run); `tether init --values-file
/// join.yaml` prints two ways to use the file, and both work verbatim: `tether join
/// --config-file` and the agent chart with `-f` (rendered here; the node tier installs it).
#[tokio::test]
async fn the_join_file_from_init_works_verbatim_with_tether_join_and_with_helm() {
    let leader = LeaderSide::named("cli-file").start().await;
    let (mut east, mut west) = tokio::join!(fleet::bare_member("east"), fleet::bare_member("west"));
    east.start_agent();
    west.start_agent();
    let (lk, ek) = (
        leader.cluster.kubeconfig().to_path_buf(),
        east.cluster.kubeconfig().to_path_buf(),
    );

    let idle = ok(&tether(&ek, &["status"]).await);
    assert!(
        idle.contains("NotJoined") && idle.contains("tether join --config-file join.yaml"),
        "{idle}"
    );
    eventually(
        "the idle agent says it has not joined",
        Duration::from_secs(30),
        || async {
            let log = east.agent.as_ref().map(|a| a.log()).unwrap_or_default();
            if log.contains("NotJoined") && log.contains("tether join") {
                Ok(())
            } else {
                Err(log)
            }
        },
    )
    .await;

    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("join.yaml").display().to_string();
    // `--output`, the former name of `--values-file`, still works.
    let out = ok(&tether(&lk, &["init", "--clusterset", SET, "--output", &file]).await);
    let content = std::fs::read_to_string(&file).expect("join.yaml");
    assert!(
        content.contains("parentURL:") && content.contains("namespace: tether-system"),
        "{content}"
    );

    let join = words_of(&out, "tether join", "east");
    assert!(join.contains(&"--config-file".to_string()), "{join:?}");
    let args: Vec<&str> = join[1..].iter().map(String::as_str).collect();
    let joined = ok(&tether(&ek, &args).await);
    assert!(joined.contains("Joined ClusterSet prod as east"), "{joined}");

    // The Helm line as printed, rendered (`template` for `install`): the file is the chart's values.
    let mut helm_args = words_of(&out, "helm install", "west")[1..].to_vec();
    assert!(helm_args.contains(&"-f".to_string()), "{helm_args:?}");
    helm_args[0] = "template".into();
    let docs = rendered(&helm_args);
    let pp = kube::api::PostParams::default();
    for d in docs.iter().filter(|d| {
        d["kind"] == "ClusterSet" || (d["kind"] == "Secret" && d["metadata"]["name"] == "tether-join-token")
    }) {
        if d["kind"] == "Secret" {
            let s: Secret = serde_json::from_value(d.clone()).expect("Secret");
            Api::<Secret>::namespaced(west.admin.clone(), HOME)
                .create(&pp, &s)
                .await
                .expect("Secret");
        } else {
            let s: ClusterSet = serde_json::from_value(d.clone()).expect("ClusterSet");
            Api::<ClusterSet>::namespaced(west.admin.clone(), HOME)
                .create(&pp, &s)
                .await
                .expect("ClusterSet");
        }
    }
    for name in ["east", "west"] {
        wait_joined(&leader, &tether_api::SetRef::new(HOME, SET), name).await;
    }
    east.kill_agent();
    west.kill_agent();
}

/// Every teardown works when the other side is gone: `tether leave --force` with no agent to
/// deregister removes the membership here (finalizer, key, credential, property), and `tether
/// destroy --force` with the leader controller dead removes the set, its members and its
/// finalizer by itself.
#[tokio::test]
async fn leave_and_destroy_force_work_when_the_other_side_is_gone() {
    use tether_api::about::ClusterProperty;
    let mut leader = LeaderSide::named("cli-gone")
        .policy(LeaderSpec::default())
        .start()
        .await;
    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let (mut east, mut west) = tokio::join!(
        fleet::member("east", &leader, &token, serde_json::json!({})),
        fleet::member("west", &leader, &token, serde_json::json!({})),
    );
    for name in ["east", "west"] {
        fleet::wait_mc(&leader.admin, name, "Ready", |mc| {
            fleet::ready(mc).as_deref() == Some("True")
        })
        .await;
    }
    let (lk, wk) = (
        leader.cluster.kubeconfig().to_path_buf(),
        west.cluster.kubeconfig().to_path_buf(),
    );

    // West's agent is gone: a plain leave waits for it; --force finishes by hand.
    west.kill_agent();
    let left = ok(&tether(&wk, &["leave", "--clusterset", SET, "--force"]).await);
    assert!(
        left.contains("without telling the leader") && left.contains("tether member remove west"),
        "{left}"
    );
    let sets = Api::<ClusterSet>::namespaced(west.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("sets");
    assert!(sets.items.is_empty(), "no ClusterSet left in west");
    let secrets = Api::<Secret>::namespaced(west.admin.clone(), HOME);
    for s in ["tether-agent-key", "tether-agent-credential", "tether-join-token"] {
        assert!(secrets.get_opt(s).await.expect("get").is_none(), "{s} removed");
    }
    assert!(
        Api::<ClusterProperty>::all(west.admin.clone())
            .get_opt("clusterset.k8s.io")
            .await
            .expect("get")
            .is_none(),
        "the clusterset.k8s.io property removed"
    );

    // The leader controller is gone: destroy --force does its part.
    leader.controller.kill();
    let out = ok(&tether(&lk, &["destroy", "--clusterset", SET, "--force", "-y"]).await);
    assert!(out.contains("destroyed"), "{out}");
    assert!(
        Api::<ClusterSet>::namespaced(leader.admin.clone(), HOME)
            .get_opt(SET)
            .await
            .expect("get")
            .is_none()
    );
    let members = Api::<ManagedCluster>::all(leader.admin.clone())
        .list(&ListParams::default())
        .await
        .expect("members");
    assert!(
        members.items.is_empty(),
        "{:?}",
        members
            .items
            .iter()
            .map(|m| m.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    eventually("the member namespaces go", Duration::from_secs(60), || async {
        let left = Api::<Namespace>::all(leader.admin.clone())
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=tether-leader"))
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await;
    east.kill_agent();
}

/// `tether member remove|list|unban` as an admin types them: a removed member whose agent still
/// holds a valid join token registers again (a new namespace); removed with `--ban` it is Denied
/// `Banned` (listed, naming the unban); after `unban` it registers again by itself.
#[tokio::test]
async fn member_remove_ban_list_and_unban() {
    use tether_api::registration::{RegistrationReason, RegistrationResult};
    let leader = LeaderSide::named("cli-member")
        .policy(policy("2s", "6s"))
        .start()
        .await;
    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let mut east = fleet::member("east", &leader, &token, serde_json::json!({})).await;
    let ready = |leader: &fleet::LeaderSide| {
        let admin = leader.admin.clone();
        async move {
            fleet::wait_mc(&admin, "east", "Ready", |mc| {
                fleet::ready(mc).as_deref() == Some("True")
            })
            .await;
            fleet::managed(&admin, "east").await.expect("east")
        }
    };
    let first = ready(&leader).await;
    let id = fleet::kube_system_uid(&east).await;
    let lk = leader.cluster.kubeconfig().to_path_buf();

    let out = ok(&tether(&lk, &["member", "remove", "east"]).await);
    assert!(
        out.contains("removed from ClusterSet prod") && out.contains("--ban"),
        "{out}"
    );
    let again = ready(&leader).await;
    assert_ne!(
        again.metadata.uid, first.metadata.uid,
        "removed, then registered again with its token"
    );

    let out = ok(&tether(&lk, &["member", "remove", "east", "--ban"]).await);
    assert!(
        out.contains("banned") && out.contains(&format!("tether member unban {id}")),
        "{out}"
    );
    eventually(
        "east's new request is Denied: Banned",
        Duration::from_secs(60),
        || async {
            let denied =
                Api::<tether_api::ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .any(|r| {
                        r.spec.cluster_id == id
                            && r.status.as_ref().is_some_and(|s| {
                                s.result == RegistrationResult::Denied
                                    && s.reason == RegistrationReason::Banned
                            })
                    });
            if denied {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await;
    let listed = ok(&tether(&lk, &["member", "list"]).await);
    assert!(
        listed.contains(&id) && listed.contains("Banned") && listed.contains("tether member unban"),
        "{listed}"
    );
    assert!(
        fleet::managed(&leader.admin, "east").await.is_err(),
        "banned: not a member"
    );

    let out = ok(&tether(&lk, &["member", "unban", &id]).await);
    assert!(out.contains("may register"), "{out}");
    let back = ready(&leader).await;
    assert_ne!(back.metadata.uid, again.metadata.uid);
    let listed = ok(&tether(&lk, &["member", "list", "-o", "json"]).await);
    assert!(
        !listed.contains("\"result\": \"Banned\""),
        "the ban is lifted: {listed}"
    );
    east.kill_agent();
}
