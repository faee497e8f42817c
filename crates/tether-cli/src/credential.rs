//! `tether credential`: a client-go exec credential plugin (`client.authentication.k8s.io`
//! `ExecCredential`) for the ClusterProfiles the leader publishes. It returns a token of the
//! caller's own identity on the leader: by default the projected ServiceAccount token of the pod
//! it runs in, else a token file or the output of a command. The consumer then reaches a member
//! through the leader's proxy as itself: the leader's RBAC on `managedclusters/proxy` and the
//! member's impersonation allow-list and RBAC decide. Nothing is minted or stored here.
//!
//! The token goes only where its owner chose (trust invariant 5): the consumer names its leader
//! (`--leader-url`, in its provider file), client-go says which server the credential is for
//! (`provideClusterInfo: true`), and a server that is not the leader gets nothing: a
//! ClusterProfile rewritten to point elsewhere cannot collect consumers' tokens.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tether_api::inventory::ExecExtension;

/// Where a pod's projected ServiceAccount token is mounted.
pub const POD_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The most a token may be (a JWT is a few KiB).
const MAX_TOKEN: usize = 64 * 1024;
/// How long a token command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest client-go caches a credential before it asks again (a projected token file is
/// rotated by the kubelet well before it expires).
const MAX_CACHE: SignedDuration = SignedDuration::from_mins(5);
/// The API versions of ExecCredential this plugin answers.
const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// `tether credential`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Used by client-go as an exec credential plugin, named in a ClusterProfile \
    consumer's provider file:\n  \
    {\"providers\": [{\"name\": \"tether\", \"execConfig\": {\"apiVersion\": \
    \"client.authentication.k8s.io/v1\", \"command\": \"tether\", \"args\": [\"credential\", \
    \"--leader-url\", \"https://leader:6443\"], \"provideClusterInfo\": true}}]}\n\
    Run by hand it prints the ExecCredential it would give."
)]
pub struct CredentialArgs {
    /// The leader's URL (`https://host[:port]`): the token is given only for a server there
    /// (client-go names it with `provideClusterInfo: true`); any other is refused.
    #[arg(long, value_name = "URL", env = "TETHER_LEADER_URL")]
    pub leader_url: Option<String>,
    /// Read the token from this file (read anew each time: projected tokens rotate). Default:
    /// the pod's ServiceAccount token.
    #[arg(long, value_name = "FILE", conflicts_with = "token_command")]
    pub token_file: Option<PathBuf>,
    /// Run this command (with `sh -c`, at most 30 s) and use what it prints as the token.
    #[arg(long, value_name = "COMMAND")]
    pub token_command: Option<String>,
    /// Copy this binary to DIR/tether (mode 0755) and exit, e.g. from an init container of
    /// the consumer's pod, with an emptyDir shared with the consumer's container.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["token_file", "token_command"])]
    pub install_to: Option<PathBuf>,
}

/// Copies the running binary to `dir/tether`, executable.
fn install(dir: &Path) -> anyhow::Result<()> {
    let me = std::env::current_exe().context("cannot find this binary")?;
    let to = dir.join("tether");
    std::fs::copy(&me, &to).with_context(|| format!("cannot copy {} to {}", me.display(), to.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot make {} executable", to.display()))?;
    }
    eprintln!(
        "installed {}: name it as the provider's command, with args [credential]",
        to.display()
    );
    Ok(())
}

/// What client-go says about the request in `KUBERNETES_EXEC_INFO`: the ExecCredential's API
/// version, and the member from the ClusterProfile's exec extension (when it names one).
#[derive(Debug, PartialEq)]
pub struct ExecInfo {
    /// The ExecCredential API version to answer with.
    pub api_version: String,
    /// The member, from `spec.cluster.config`.
    pub member: Option<ExecExtension>,
    /// The server the credential is for, from `spec.cluster.server` (`provideClusterInfo`).
    pub server: Option<String>,
    /// A proxy client-go would send the request through (`spec.cluster.proxy-url`).
    pub proxy_url: Option<String>,
    /// Whether client-go would skip verifying the server (`insecure-skip-tls-verify`).
    pub insecure: bool,
}

/// Reads `KUBERNETES_EXEC_INFO` (absent when run by hand: then `v1`, no member).
pub fn exec_info(text: Option<&str>) -> anyhow::Result<ExecInfo> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        return Ok(ExecInfo {
            api_version: API_VERSIONS[0].into(),
            member: None,
            server: None,
            proxy_url: None,
            insecure: false,
        });
    };
    let v: Value = serde_json::from_str(text).context("KUBERNETES_EXEC_INFO is not JSON")?;
    let api_version = v["apiVersion"].as_str().unwrap_or(API_VERSIONS[0]).to_string();
    if !API_VERSIONS.contains(&api_version.as_str()) {
        crate::bail_code!(
            Usage,
            "KUBERNETES_EXEC_INFO asks for ExecCredential {api_version}; this plugin answers {}",
            API_VERSIONS.join(" and ")
        );
    }
    let member = serde_json::from_value(v["spec"]["cluster"]["config"].clone()).ok();
    let cluster = &v["spec"]["cluster"];
    Ok(ExecInfo {
        api_version,
        member,
        server: cluster["server"].as_str().map(str::to_string),
        proxy_url: cluster["proxy-url"]
            .as_str()
            .filter(|p| !p.trim().is_empty())
            .map(str::to_string),
        insecure: cluster["insecure-skip-tls-verify"].as_bool().unwrap_or(false),
    })
}

/// `scheme://host:port` of an https URL (the port explicit), lowercased; None if it is not one.
fn origin(url: &str) -> Option<String> {
    let uri: http::Uri = url.trim().parse().ok()?;
    if uri.scheme_str() != Some("https") {
        return None;
    }
    let host = uri.host()?.to_ascii_lowercase();
    Some(format!("https://{host}:{}", uri.port_u16().unwrap_or(443)))
}

/// Whether the credential may go where client-go says it goes (`info`, from
/// `KUBERNETES_EXEC_INFO`; `None` when that is absent) for a consumer whose leader is `leader`:
/// only to the leader's own origin, directly (no proxy a ClusterProfile named in between) and
/// verified (a profile's own CA cannot make another server pass for the leader: client-go sends
/// nothing before TLS verification, so `insecure-skip-tls-verify` is the one way around it).
/// Without exec information (run by hand) the token is printed only to a terminal, never to a
/// program that could forward it.
pub fn check_server(leader: Option<&str>, info: Option<&ExecInfo>, terminal: bool) -> anyhow::Result<()> {
    let Some(info) = info else {
        if terminal {
            return Ok(());
        }
        crate::bail_code!(
            Usage,
            "tether credential is an exec credential plugin: run by client-go (which sets \
             KUBERNETES_EXEC_INFO, with provideClusterInfo: true) it gives a token for its leader; \
             by hand it prints one only to a terminal"
        );
    };
    let Some(leader) = leader else {
        crate::bail_code!(
            Usage,
            "tether credential gives a token only for the leader its consumer names: add \
             \"--leader-url\", \"https://<the leader's host:port>\" to the exec plugin's args \
             (or set TETHER_LEADER_URL)"
        );
    };
    let Some(want) = origin(leader) else {
        crate::bail_code!(Usage, "--leader-url {leader} is not an https:// URL");
    };
    let Some(server) = info.server.as_deref() else {
        crate::bail_code!(
            Usage,
            "client-go did not say which server the token is for: set provideClusterInfo: true in \
             the exec plugin's config"
        );
    };
    if origin(server).as_deref() != Some(want.as_str()) {
        crate::bail_code!(
            Usage,
            "refusing to give a token for {server}: this consumer's leader is {leader} (--leader-url); \
             a ClusterProfile that names another server was not published by that leader"
        );
    }
    if let Some(proxy) = &info.proxy_url {
        crate::bail_code!(
            Usage,
            "refusing to give a token for {server} through proxy {proxy}: the leader's profiles name \
             no proxy, and a proxy sees the token whenever TLS is not verified end to end"
        );
    }
    if info.insecure {
        crate::bail_code!(
            Usage,
            "refusing to give a token for {server} without TLS verification \
             (insecure-skip-tls-verify): whoever answers at that address would read it"
        );
    }
    Ok(())
}

/// The token's expiry from its JWT `exp` claim, if it is a JWT that has one (not verified: the
/// leader's API server does that; this only tells client-go when to ask again).
pub fn jwt_expiry(token: &str) -> Option<Timestamp> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    Timestamp::from_second(claims["exp"].as_i64()?).ok()
}

/// The ExecCredential answering `info` with `token`, cached by client-go until the token expires
/// or `MAX_CACHE` from `now`, whichever is first.
pub fn exec_credential(info: &ExecInfo, token: &str, now: Timestamp) -> Value {
    let cap = now.checked_add(MAX_CACHE).unwrap_or(now);
    let until = jwt_expiry(token).map_or(cap, |exp| exp.min(cap));
    json!({
        "apiVersion": info.api_version,
        "kind": "ExecCredential",
        "status": {
            "token": token,
            "expirationTimestamp": until.to_string(),
        },
    })
}

/// Reads at most `MAX_TOKEN` bytes of token from `path`.
fn token_from_file(path: &Path) -> anyhow::Result<String> {
    let f = std::fs::File::open(path).with_context(|| {
        if path == Path::new(POD_TOKEN) {
            format!(
                "cannot read {POD_TOKEN}: outside a pod (or with automountServiceAccountToken off) \
                 pass --token-file or --token-command"
            )
        } else {
            format!("cannot read the token file {}", path.display())
        }
    })?;
    let mut text = String::new();
    f.take(MAX_TOKEN as u64 + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    Ok(text)
}

/// Runs `command` with `sh -c` for at most `COMMAND_TIMEOUT`; what it prints (at most
/// `MAX_TOKEN` bytes are read: a command that prints more fails) is the token. Its error output
/// goes where this process's goes (client-go shows it).
async fn token_from_command(command: &str) -> anyhow::Result<String> {
    use tokio::io::AsyncReadExt as _;
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run the token command: {command}"))?;
    let mut stdout = child.stdout.take().context("the token command has no output")?;
    let run = async {
        let mut out = Vec::new();
        (&mut stdout)
            .take(MAX_TOKEN as u64 + 1)
            .read_to_end(&mut out)
            .await?;
        drop(stdout);
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out))
    };
    let (status, out) = tokio::time::timeout(COMMAND_TIMEOUT, run)
        .await
        .with_context(|| format!("the token command did not finish within {COMMAND_TIMEOUT:?}: {command}"))?
        .with_context(|| format!("cannot run the token command: {command}"))?;
    if !status.success() {
        anyhow::bail!("the token command failed ({status}): {command}");
    }
    String::from_utf8(out).context("the token command printed something other than UTF-8")
}

/// `tether credential`.
pub async fn credential(args: CredentialArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.install_to {
        return install(dir);
    }
    let exec_info_text = std::env::var("KUBERNETES_EXEC_INFO").ok();
    let info = exec_info(exec_info_text.as_deref())?;
    // NB: before the token is read: a refused server learns nothing, not even that one exists.
    check_server(
        args.leader_url.as_deref(),
        exec_info_text
            .is_some_and(|t| !t.trim().is_empty())
            .then_some(&info),
        std::io::IsTerminal::is_terminal(&std::io::stdout()),
    )?;
    let raw = match (&args.token_command, &args.token_file) {
        (Some(cmd), _) => token_from_command(cmd).await?,
        (None, Some(path)) => token_from_file(path)?,
        (None, None) => token_from_file(Path::new(POD_TOKEN))?,
    };
    let token = raw.trim();
    let whom = info
        .member
        .as_ref()
        .map(|m| format!(" for member {} of ClusterSet {}", m.cluster_name, m.cluster_set))
        .unwrap_or_default();
    if token.is_empty() || token.len() > MAX_TOKEN || token.chars().any(char::is_whitespace) {
        crate::bail_code!(
            Usage,
            "no usable token{whom}: it is empty, longer than {MAX_TOKEN} bytes or has whitespace inside"
        );
    }
    println!("{}", exec_credential(&info, token, Timestamp::now()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: Value) -> String {
        let b = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            b(br#"{"alg":"RS256"}"#),
            b(claims.to_string().as_bytes()),
            b(b"sig")
        )
    }

    #[tokio::test]
    async fn a_token_command_is_bounded_in_time_and_size() {
        assert_eq!(token_from_command("echo abc").await.unwrap().trim(), "abc");
        assert!(token_from_command("exit 3").await.is_err());
        // Endless output: read up to the bound, then the command is killed (not waited for).
        let start = std::time::Instant::now();
        let endless = tokio::time::timeout(
            std::time::Duration::from_secs(40),
            token_from_command("yes aaaaaaaaaaaaaaaa"),
        )
        .await
        .expect("bounded by the command timeout");
        assert!(endless.is_err(), "more than {MAX_TOKEN} bytes is no token");
        assert!(start.elapsed() <= COMMAND_TIMEOUT + std::time::Duration::from_secs(5));
    }

    #[test]
    fn install_to_copies_this_binary_executable() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path()).unwrap();
        let to = dir.path().join("tether");
        let me = std::fs::metadata(std::env::current_exe().unwrap()).unwrap();
        let copy = std::fs::metadata(&to).unwrap();
        assert_eq!(copy.len(), me.len());
        #[cfg(unix)]
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&copy.permissions()) & 0o777,
            0o755
        );
        assert!(install(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn a_token_goes_only_to_the_leader_the_consumer_names() {
        let leader = Some("https://Leader.example:6443");
        let proxy = "https://leader.example:6443/apis/proxy.multicluster.tether.dev/v1alpha1/namespaces/n/managedclusters/east/proxy";
        let info = |server: Option<&str>, proxy_url: Option<&str>, insecure: bool| {
            Some(ExecInfo {
                api_version: API_VERSIONS[0].into(),
                member: None,
                server: server.map(str::to_string),
                proxy_url: proxy_url.map(str::to_string),
                insecure,
            })
        };
        // (what, leader flag, exec info, stdout a terminal, allowed)
        type Case<'a> = (&'a str, Option<&'a str>, Option<ExecInfo>, bool, bool);
        let cases: Vec<Case> = vec![
            (
                "the leader's proxy path",
                leader,
                info(Some(proxy), None, false),
                false,
                true,
            ),
            (
                "the leader itself",
                leader,
                info(Some("https://leader.example:6443"), None, false),
                false,
                true,
            ),
            ("by hand, to a terminal", None, None, true, true),
            (
                "by hand, to a program (no exec info): refused",
                leader,
                None,
                false,
                false,
            ),
            (
                "another host",
                leader,
                info(Some("https://evil.example:6443/apis/x"), None, false),
                false,
                false,
            ),
            (
                "another port",
                leader,
                info(Some("https://leader.example:7443/apis/x"), None, false),
                false,
                false,
            ),
            (
                "plain http",
                leader,
                info(Some("http://leader.example:6443/apis/x"), None, false),
                false,
                false,
            ),
            (
                "a look-alike host",
                leader,
                info(Some("https://leader.example.evil:6443"), None, false),
                false,
                false,
            ),
            (
                "userinfo before another host",
                leader,
                info(Some("https://leader.example:6443@evil.example/x"), None, false),
                false,
                false,
            ),
            (
                "no --leader-url",
                None,
                info(Some(proxy), None, false),
                true,
                false,
            ),
            (
                "no server (provideClusterInfo off)",
                leader,
                info(None, None, false),
                false,
                false,
            ),
            (
                "the leader's URL through a profile's proxy",
                leader,
                info(Some(proxy), Some("http://evil.example:3128"), false),
                false,
                false,
            ),
            (
                "the leader's URL without TLS verification",
                leader,
                info(Some(proxy), None, true),
                false,
                false,
            ),
            (
                "the default port spelled out",
                Some("https://leader.example"),
                info(Some("https://leader.example:443/x"), None, false),
                false,
                true,
            ),
        ];
        for (what, leader, info, terminal, allowed) in cases {
            let got = check_server(leader, info.as_ref(), terminal);
            assert_eq!(got.is_ok(), allowed, "{what}: {got:?}");
            if let (Err(e), Some(s)) = (&got, info.as_ref().and_then(|i| i.server.as_deref()))
                && leader.is_some()
                && origin(s).is_some()
            {
                let text = e.to_string();
                assert!(text.contains(s), "{what}: the refusal names the server: {text}");
            }
        }
    }

    #[test]
    fn exec_info_names_the_version_and_the_member() {
        let none = exec_info(None).unwrap();
        assert_eq!(none.api_version, "client.authentication.k8s.io/v1");
        assert_eq!(none.member, None);
        let text = json!({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
            "spec": {"interactive": false, "cluster": {"server": "https://l", "config":
                {"clusterName": "east", "clusterSet": "prod", "namespace": "tether-prod-east-1"}}}})
        .to_string();
        let got = exec_info(Some(&text)).unwrap();
        assert_eq!(got.api_version, "client.authentication.k8s.io/v1beta1");
        assert_eq!(got.member.map(|m| m.cluster_name).as_deref(), Some("east"));
        assert_eq!(got.server.as_deref(), Some("https://l"));
        assert_eq!((got.proxy_url, got.insecure), (None, false));
        let text = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
            "spec": {"cluster": {"server": "https://l", "proxy-url": "http://p:3128",
                                 "insecure-skip-tls-verify": true}}})
        .to_string();
        let got = exec_info(Some(&text)).unwrap();
        assert_eq!(
            (got.proxy_url.as_deref(), got.insecure),
            (Some("http://p:3128"), true)
        );
        assert!(exec_info(Some(r#"{"apiVersion": "client.authentication.k8s.io/v2"}"#)).is_err());
        assert!(exec_info(Some("not json")).is_err());
    }

    #[test]
    fn a_credential_is_cached_until_the_token_expires_or_five_minutes_pass() {
        let info = exec_info(None).unwrap();
        let now = Timestamp::from_second(1_000_000).unwrap();
        let soon = jwt(json!({"exp": 1_000_060, "sub": "system:serviceaccount:argocd:ctl"}));
        let cred = exec_credential(&info, &soon, now);
        assert_eq!(cred["kind"], "ExecCredential");
        assert_eq!(cred["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(cred["status"]["token"], soon);
        assert_eq!(cred["status"]["expirationTimestamp"], "1970-01-12T13:47:40Z");
        let later = jwt(json!({"exp": 2_000_000}));
        assert_eq!(
            exec_credential(&info, &later, now)["status"]["expirationTimestamp"],
            "1970-01-12T13:51:40Z",
            "capped at five minutes"
        );
        assert_eq!(
            exec_credential(&info, "opaque-token", now)["status"]["expirationTimestamp"],
            "1970-01-12T13:51:40Z"
        );
        assert_eq!(jwt_expiry("a.b.c"), None);
    }
}
