use super::*;

#[test]
fn member_ready_follows_the_cache_and_is_off_unless_asked() {
    use kube::runtime::watcher::Event;
    let member = |name: &str, ready: &str| {
        let mut mc = ManagedCluster::new(
            name,
            tether_api::ManagedClusterSpec {
                cluster_id: format!("id-{name}"),
                cluster_set: "prod".into(),
                public_key: None,
            },
        );
        mc.metadata.namespace = Some(format!("tether-prod-{name}"));
        mc.status = Some(tether_api::ManagedClusterStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: "HeartbeatReceived".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..Default::default()
        });
        mc
    };
    let (store, mut writer) = kube::runtime::reflector::store::<ManagedCluster>();
    writer.apply_watcher_event(&Event::Apply(member("east", "True")));
    writer.apply_watcher_event(&Event::Apply(member("west", "Unknown")));
    let off = Metrics::default();
    off.follow_members(store.clone());
    assert!(!off.encode().contains("member_ready"), "off by default");

    let on = Metrics::default().with_member_ready();
    on.follow_members(store);
    let text = on.encode();
    assert!(text.ends_with("# EOF\n"), "{text}");
    for want in [
        "tether_leader_member_ready{clusterset=\"prod\",namespace=\"tether-prod-east\",member=\"east\"} 1",
        "tether_leader_member_ready{clusterset=\"prod\",namespace=\"tether-prod-west\",member=\"west\"} 0",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    writer.apply_watcher_event(&Event::Delete(member("west", "Unknown")));
    assert!(
        !on.encode().contains("member=\"west\""),
        "a removed member's series goes"
    );
}

#[test]
fn encodes_every_family_with_its_labels() {
    let m = Metrics::default();
    m.registrations("Approved");
    m.set_members(
        "prod",
        &MemberCounts {
            total: 3,
            ready: 2,
            not_ready: 1,
            pending: 0,
        },
    );
    m.heartbeat(Duration::from_secs(10));
    drop(m.reconcile_timer("member"));
    m.set_proxy_cert_expiry(1_800_000_000);
    m.proxy_cert_renewal("failed");
    let text = m.encode();
    for want in [
        "tether_leader_registrations_total{result=\"Approved\"} 1",
        "tether_leader_members{clusterset=\"prod\",state=\"ready\"} 2",
        "tether_leader_heartbeat_age_seconds_count 1",
        "tether_leader_reconcile_duration_seconds_count{controller=\"member\"} 1",
        "tether_leader_is_leader 0",
        "tether_leader_proxy_certificate_expiry_timestamp_seconds 1800000000",
        "tether_leader_proxy_certificate_renewals_total{result=\"failed\"} 1",
        "tether_leader_proxy_certificate_renewals_total{result=\"renewed\"} 0",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
}

#[test]
fn every_proxy_result_and_revocation_reason_is_exposed_from_the_start() {
    use crate::proxy::challenge::Refused;
    let text = Metrics::default().encode();
    for result in Proxied::ALL {
        let want = format!(
            "tether_leader_proxy_requests_total{{result=\"{}\"}} 0",
            result.label()
        );
        assert!(text.contains(&want), "missing {want} in\n{text}");
    }
    for reason in Revoked::ALL {
        let want = format!(
            "tether_leader_tunnel_revocations_total{{reason=\"{}\"}} 0",
            reason.label()
        );
        assert!(text.contains(&want), "missing {want} in\n{text}");
    }
    // Each label once (two variants under one label would hide one), and every refused proof
    // listed.
    let labels: std::collections::HashSet<_> = Proxied::ALL.map(Proxied::label).into_iter().collect();
    assert_eq!(labels.len(), Proxied::ALL.len());
    let reasons: std::collections::HashSet<_> = Revoked::ALL.map(Revoked::label).into_iter().collect();
    assert_eq!(reasons.len(), Revoked::ALL.len());
    for refused in [
        Refused::Malformed,
        Refused::Forged,
        Refused::Expired,
        Refused::Reused,
    ] {
        assert!(Proxied::ALL.contains(&Proxied::Refused(refused)), "{refused:?}");
    }
}
