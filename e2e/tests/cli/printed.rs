//! What `tether init` prints works as printed: every command, and the join file.

use super::*;

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
