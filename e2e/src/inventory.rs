//! ClusterProfile consumers against a leader, for `tests/inventory.rs`: a client built from a
//! member's profile with `tether credential` as its exec plugin (as kube-rs builds it), the
//! leader ServiceAccounts that use them, and upstream's own consumer programs
//! (`e2e/clusterprofile-consumer`, `e2e/multicluster-consumer`).

use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::inventory::{ClusterProfile, UPSTREAM_VERSION};
use tether_testkit::controller::binary;
use tether_testkit::{Tools, eventually};

use crate::access::apply;
use crate::create_namespace;
use crate::fleet::{self, LeaderSide};
use crate::sim::SET;

/// The inventory namespace the consumers read.
pub const INVENTORY: &str = "inventory";
/// Leader ServiceAccounts using the profiles: one granted on both sides, one granted on the
/// leader only (the member's RBAC gives it nothing), one granted nowhere.
pub const CONSUMER: &str = "system:serviceaccount:apps:consumer";
/// Granted on the leader only.
pub const OUTSIDER: &str = "system:serviceaccount:apps:outsider";
/// Granted nowhere.
pub const STRANGER: &str = "system:serviceaccount:apps:stranger";

/// The ClusterProfiles of namespace `ns`.
pub fn profiles(admin: &Client, ns: &str) -> Api<ClusterProfile> {
    Api::namespaced(admin.clone(), ns)
}

/// Runs the `tether` CLI with the leader admin's kubeconfig.
pub async fn tether(leader: &LeaderSide, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(binary("tether").expect("tether binary"))
        .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
        .args(args)
        .output()
        .await
        .expect("run tether")
}

/// A client of member `name` built from its profile in the inventory namespace, as a
/// ClusterProfile consumer builds it: the access provider's cluster entry and `tether credential`
/// as the exec plugin, reading the token of leader ServiceAccount `sa` from a file.
pub async fn client_from_profile(leader: &LeaderSide, name: &str, sa: &str, dir: &std::path::Path) -> Client {
    let (ns, sa_name) = sa
        .strip_prefix("system:serviceaccount:")
        .and_then(|s| s.split_once(':'))
        .expect("a ServiceAccount");
    let token = crate::service_account_token(&leader.admin, ns, sa_name)
        .await
        .expect("token");
    let file = dir.join(format!("{sa_name}.token"));
    std::fs::write(&file, token).expect("token file");
    let p = profiles(&leader.admin, INVENTORY)
        .get(name)
        .await
        .expect("profile");
    let provider = p
        .status
        .and_then(|s| s.access_providers.into_iter().find(|a| a.name == "tether"))
        .expect("the tether access provider");
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "m", "cluster": provider.cluster}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": binary("tether").expect("tether binary"),
            "args": ["credential", "--leader-url", leader.cluster.url(), "--token-file", file],
            "provideClusterInfo": true, "interactiveMode": "Never"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "m", "user": "u"}}],
    }))
    .expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// The names of the nodes `client` lists, sorted.
pub async fn node_names(client: &Client) -> Result<Vec<String>, kube::Error> {
    let mut names: Vec<String> = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    names.sort();
    Ok(names)
}

/// Each member reached from its profile by `CONSUMER` (its nodes, as the member lists them),
/// refused by the member for `OUTSIDER` (under its prefixed name) and by the leader for
/// `STRANGER` (no `managedclusters/proxy`): `tether grant` on the leader, the agent's allow-list
/// and RBAC on each member, as an admin would set them.
pub async fn consumers_reach_members(leader: &LeaderSide, members: &[(&str, &fleet::MemberSide)]) {
    let admin = &leader.admin;
    create_namespace(admin, "apps").await.expect("namespace");
    for sa in [CONSUMER, OUTSIDER, STRANGER] {
        let name = sa.rsplit(':').next().expect("name");
        apply(
            admin,
            Some("apps"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": "apps"}}),
        )
        .await;
    }
    let dir = tempfile::tempdir().expect("dir");
    for &(name, m) in members {
        for sa in [CONSUMER, OUTSIDER] {
            let out = tether(leader, &["grant", "--cluster", name, "--user", sa]).await;
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "tether grant {sa}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let member_name = format!(
                "tether:{SET}:serviceaccount:apps:{}",
                sa.rsplit(':').next().expect("name")
            );
            assert!(
                said.contains(&format!("--user={member_name}")),
                "grant prints the member's name: {said}"
            );
        }
        // The member's own RBAC: the consumer may list nodes there, the outsider nothing.
        crate::access::allow_impersonation(m, &[CONSUMER, OUTSIDER], &[]).await;
        apply(
            &m.admin,
            None,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
        )
        .await;
        apply(&m.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "consumer-node-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": format!("tether:{SET}:serviceaccount:apps:consumer")}]}))
        .await;

        let own = node_names(&m.admin).await.expect("the member's own nodes");
        let consumer = client_from_profile(leader, name, CONSUMER, dir.path()).await;
        eventually(
            &format!("{name}'s nodes through its profile"),
            Duration::from_secs(30),
            || async {
                let seen = node_names(&consumer).await.map_err(|e| e.to_string())?;
                (seen == own).then_some(()).ok_or(format!("{seen:?} != {own:?}"))
            },
        )
        .await;

        // The member refuses the outsider under its own prefixed name; the leader the stranger.
        let outsider_on_member = format!("tether:{SET}:serviceaccount:apps:outsider");
        for (sa, says) in [
            (OUTSIDER, vec![outsider_on_member.as_str()]),
            (STRANGER, vec![STRANGER, "managedclusters/proxy"]),
        ] {
            let client = client_from_profile(leader, name, sa, dir.path()).await;
            let err = node_names(&client).await.expect_err("refused");
            let msg = crate::message(&err);
            assert_eq!(crate::status_code(&err), Some(403), "{sa}: {msg}");
            assert!(says.iter().all(|w| msg.contains(w)), "{sa} on {name}: {msg}");
        }
    }
}

/// Upstream's own consumer code (`e2e/clusterprofile-consumer`: cluster-inventory-api's
/// clientset and `pkg/access`, built by `make tools`) lists every profile of the inventory
/// namespace and each member's nodes through it, with a provider file naming `tether credential`
/// and the consumer's token: what it sees must be each member's own nodes.
pub async fn upstream_consumer_sees_every_member(
    leader: &LeaderSide,
    members: &[(&str, &fleet::MemberSide)],
) {
    let tools = Tools::locate().expect("make tools");
    let consumer = tools.path("clusterprofile-consumer");
    // The CRD shipped in config/upstream/ is upstream's, byte for byte.
    let upstream = std::fs::read_to_string(
        consumer
            .canonicalize()
            .expect("consumer")
            .with_file_name("multicluster.x-k8s.io_clusterprofiles.yaml"),
    )
    .expect("upstream CRD beside the consumer");
    let shipped = std::fs::read_to_string(
        tether_testkit::tools::repo_root().join("config/upstream/multicluster.x-k8s.io_clusterprofiles.yaml"),
    )
    .expect("shipped CRD");
    assert!(
        upstream == shipped,
        "config/upstream/ differs from cluster-inventory-api {UPSTREAM_VERSION}'s CRD"
    );

    let dir = tempfile::tempdir().expect("dir");
    let token = crate::service_account_token(&leader.admin, "apps", "consumer")
        .await
        .expect("token");
    let token_file = dir.path().join("consumer.token");
    std::fs::write(&token_file, token).expect("token file");
    let providers = dir.path().join("providers.json");
    let tether = binary("tether").expect("tether binary");
    std::fs::write(
        &providers,
        json!({"providers": [{"name": "tether", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": tether,
            "args": ["credential", "--leader-url", leader.cluster.url(), "--token-file", token_file],
            "provideClusterInfo": true}}]})
        .to_string(),
    )
    .expect("provider file");
    let out = tokio::process::Command::new(&consumer)
        .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
        .arg(format!("--namespace={INVENTORY}"))
        .arg(format!("--clusterprofile-provider-file={}", providers.display()))
        .arg(format!("--write-kubeconfigs={}", dir.path().display()))
        .output()
        .await
        .expect("run clusterprofile-consumer");
    assert!(
        out.status.success(),
        "clusterprofile-consumer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).expect("its JSON");
    eprintln!("cluster-inventory-api's pkg/access saw: {seen}");
    assert_eq!(
        seen.as_object().map(|o| o.len()),
        Some(members.len()),
        "one entry per profile: {seen}"
    );
    for &(name, m) in members {
        let own = node_names(&m.admin).await.expect("the member's own nodes");
        assert_eq!(
            seen[name]["nodes"],
            json!(own),
            "{name} through the leader, by upstream code: {seen}"
        );
    }

    // multicluster-runtime's manager and clusters provider, over the clusters pkg/access built.
    for &(_, m) in members {
        apply(
            &m.admin,
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "tether-probe", "namespace": "default"}, "data": {"from": "test"}}),
        )
        .await;
    }
    let out = tokio::process::Command::new(tools.path("multicluster-consumer"))
        .arg(format!("--kubeconfigs={}", dir.path().display()))
        .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
        .args(["--name=tether-probe", "--timeout=60s"])
        .output()
        .await
        .expect("run multicluster-consumer");
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "multicluster-runtime's reconciler: {}",
        said.trim().replace('\n', "; ")
    );
    assert!(
        out.status.success(),
        "multicluster-consumer: {said}\n{}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    for &(name, _) in members {
        assert!(
            said.contains(&format!("seen {name} default/tether-probe")),
            "{said}"
        );
    }
}

/// Finding 5 of the trust review, as the attacker does it: whoever may write ClusterProfiles (or
/// their status) points member `name`'s `tether` access provider at a server of theirs, with
/// their own CA so that TLS succeeds, and waits for consumers' tokens. A consumer builds its
/// client from that profile with `tether credential` as the exec plugin, once as the docs
/// before `--leader-url` said and once as they say now; the attacker's server records every
/// `Authorization` header it is sent. It must record none, and the plugin must say why.
pub async fn a_profile_naming_another_server_collects_no_consumer_token(leader: &LeaderSide, name: &str) {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    // The attacker's HTTPS server: a CA and serving certificate of its own, on loopback.
    let pki = tether_testkit::pki::Pki::generate("attacker").expect("the attacker's PKI");
    let cert = CertificateDer::from_pem_slice(pki.serving_cert.as_bytes()).expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(pki.serving_key.as_bytes()).expect("key");
    let tls = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let server = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let collector = {
        let heard = heard.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, heard) = (acceptor.clone(), heard.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = vec![0; 16 * 1024];
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).to_string();
                    for line in request.lines() {
                        if line.to_ascii_lowercase().starts_with("authorization:") {
                            heard.lock().expect("lock").push(line.to_string());
                        }
                    }
                    let _ = tls
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                        .await;
                });
            }
        })
    };

    // The profile as the attacker rewrote it: the leader's own entry, but their server and CA.
    let p = profiles(&leader.admin, INVENTORY)
        .get(name)
        .await
        .expect("profile");
    let mut cluster = p
        .status
        .and_then(|s| s.access_providers.into_iter().find(|a| a.name == "tether"))
        .expect("the tether access provider")
        .cluster;
    cluster.server = Some(server.clone());
    cluster.certificate_authority = None;
    cluster.certificate_authority_data = Some(base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        &pki.ca_cert,
    ));
    let dir = tempfile::tempdir().expect("dir");
    let token = crate::service_account_token(&leader.admin, "apps", "consumer")
        .await
        .expect("token");
    let file = dir.path().join("consumer.token");
    std::fs::write(&file, &token).expect("token file");
    let tether = binary("tether").expect("tether binary");
    let file = file.display().to_string();
    let ways = [
        (
            "as the docs said before --leader-url",
            vec!["credential", "--token-file", &file],
        ),
        (
            "naming its leader",
            vec![
                "credential",
                "--leader-url",
                leader.cluster.url(),
                "--token-file",
                &file,
            ],
        ),
    ];
    for (how, args) in ways {
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "m", "cluster": cluster}],
            "users": [{"name": "u", "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": tether, "args": args,
                "provideClusterInfo": true, "interactiveMode": "Never"}}}],
            "contexts": [{"name": "c", "context": {"cluster": "m", "user": "u"}}],
        }))
        .expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        // NB: kube runs the exec plugin when it builds the client: a refusal may come there.
        let said = match Client::try_from(config) {
            Err(e) => format!("{e:?}"),
            Ok(consumer) => format!(
                "{:?}",
                node_names(&consumer)
                    .await
                    .expect_err("a consumer gets nothing from the attacker's server")
            ),
        };
        eprintln!("a consumer {how}, at the attacker's {server}: {said}");
        assert!(
            said.contains(&server) || said.contains("--leader-url"),
            "the plugin says why ({how}): {said}"
        );
        assert!(
            heard.lock().expect("lock").is_empty(),
            "the attacker's server was sent a token ({how}): {:?}",
            heard.lock().expect("lock")
        );
    }
    collector.abort();
}
