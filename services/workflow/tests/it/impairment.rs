//! Impairment cordon and release (seed 002, "Impairment events") against
//! the hub and a Placement of the test's own: the hold and the quarantine
//! through the hub, the customer-ready trait removed and restored under
//! Placement's generation, transient failures retried, permanent ones
//! coded, and a re-run that repeats no write.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::v1;
use fleet_testkit::placement::FakePlacement;
use fleet_workflow_client::WorkflowError;

use crate::support::*;

const OTHER: &str = "HW_CPU_X86_AVX2";

struct Setup {
    env: TestEnv,
    placement: FakePlacement,
    stops: Services,
}

impl Setup {
    async fn start(max_attempts: u32) -> Setup {
        let env = TestEnv::new().await;
        let placement = FakePlacement::start().await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let site = placement.site_config();
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.max_attempts = max_attempts;
            c.sites.insert("s1".into(), site);
        })
        .await;
        Setup {
            env,
            placement,
            stops: vec![(trigger, task), (hub_trigger, hub_task)].into(),
        }
    }

    /// A device at s1 with a resource provider carrying the trait, made
    /// `in_use` by an OpenStack snapshot (a pre-hold in_use host).
    async fn in_use(&self, name: &str) -> (String, String) {
        let uuid = fleet_testkit::ironic::random_uuid();
        let id = device_for(&self.env, "s1", name, &uuid).await;
        self.placement.provider(&uuid, &[OTHER, READY]);
        self.env
            .publish_snapshot(&openstack_as("s1", name, Utc::now(), Node::InUse))
            .await;
        let env = &self.env;
        eventually(&format!("{id} in_use"), || async {
            (env.device_field(&id, "operational_status").await == "in_use").then_some(())
        })
        .await;
        (id, uuid)
    }

    async fn create(&self, devices: &[&String]) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        workflow_client(&self.env)
            .create_impairment(&v1::CreateImpairmentRequest {
                device_ids: devices.iter().map(|d| d.to_string()).collect(),
                reason: "fabric flap".into(),
                ticket_url: "https://tickets.invalid/1".into(),
                created_by: "test".into(),
            })
            .await
    }

    async fn clear(&self, id: &str) {
        workflow_client(&self.env)
            .clear_impairment(id, "test")
            .await
            .unwrap();
    }

    /// The impairment hold `device` carries (empty: none).
    async fn hold(&self, device: &str) -> String {
        self.env
            .device_field(device, "coalesce(impairment_hold, '')")
            .await
    }

    async fn stop(self) {
        self.stops.stop().await;
        self.env.cleanup().await;
    }
}

fn has(p: &FakePlacement, uuid: &str, t: &str) -> bool {
    p.traits(uuid).unwrap().iter().any(|x| x == t)
}

const WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_and_release_through_the_hub_and_placement() {
    let s = Setup::start(5).await;
    let (a, ua) = s.in_use("imp-a").await;
    // A fresh device: operational_status unknown before the hold, so its
    // release restores no trait (seed 002: only a pre-hold available or
    // in_use host).
    let ub = fleet_testkit::ironic::random_uuid();
    let b = device_for(&s.env, "s1", "imp-b", &ub).await;
    s.placement.provider(&ub, &[READY]);

    let accepted = s.create(&[&a, &b]).await.unwrap();
    assert_eq!(accepted.status, "accepted");
    let id = accepted.event_id;
    let e = impairment_in(&s.env, &id, &["cordoned"], WITHIN).await;
    for d in &e.devices {
        assert_eq!(
            (d.1.as_str(), d.2.as_deref(), d.3.as_deref(), d.4.as_deref()),
            (
                "cordoned",
                Some("remove_customer_ready_trait"),
                Some("done"),
                None
            ),
            "{d:?}"
        );
    }
    for d in [&a, &b] {
        assert_eq!(
            s.env.device_field(d, "operational_status").await,
            "quarantine"
        );
        assert_eq!(s.env.device_field(d, "impairment_hold").await, id);
    }
    assert!(!has(&s.placement, &ua, READY) && has(&s.placement, &ua, OTHER));
    assert!(!has(&s.placement, &ub, READY));
    assert_eq!(s.placement.writes(), 2);

    // One hold per device: a second event naming a held device is refused
    // and records nothing.
    let again = s.create(&[&a]).await.unwrap_err();
    assert_eq!(
        again.code(),
        fleet_proto::ErrorCode::InvalidState,
        "{again}"
    );

    let c = workflow_client(&s.env);
    let r = c.clear_impairment(&id, "test").await.unwrap();
    assert_eq!(r.status, "release_pending");
    // Being released (or already cleared): not queued twice.
    let twice = c.clear_impairment(&id, "test").await.unwrap_err();
    assert_eq!(
        twice.code(),
        fleet_proto::ErrorCode::InvalidState,
        "{twice}"
    );
    let e = impairment_in(&s.env, &id, &["cleared"], WITHIN).await;
    let da = e.devices.iter().find(|d| d.0 == a).unwrap();
    assert_eq!(
        (da.1.as_str(), da.2.as_deref(), da.3.as_deref()),
        (
            "cleared",
            Some("restore_customer_ready_trait"),
            Some("done")
        )
    );
    let db = e.devices.iter().find(|d| d.0 == b).unwrap();
    assert_eq!((db.1.as_str(), db.2.as_deref()), ("cleared", None));
    assert!(has(&s.placement, &ua, READY) && has(&s.placement, &ua, OTHER));
    assert!(
        !has(&s.placement, &ub, READY),
        "b was not available or in_use before the hold"
    );
    assert_eq!(s.placement.writes(), 3);
    assert_eq!(s.hold(&a).await, "");
    assert_eq!(s.env.device_field(&a, "operational_status").await, "in_use");
    let done: bool =
        sqlx::query_scalar("SELECT cleared_at IS NOT NULL FROM impairment_events WHERE id = $1")
            .bind(&id)
            .fetch_one(&s.env.pool)
            .await
            .unwrap();
    assert!(done, "a cleared event carries cleared_at");
    s.stop().await;
}

/// Placement away for a while: the device is `retrying` and then cordoned;
/// a generation conflict is read again, never written over; a provider
/// Placement does not know fails the device with its code and the event is
/// `partially_failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_retry_conflicts_reread_and_a_missing_provider_fails_coded() {
    let s = Setup::start(6).await;
    let (a, ua) = s.in_use("imp-out-a").await;
    let unknown = device_for(
        &s.env,
        "s1",
        "imp-out-b",
        &fleet_testkit::ironic::random_uuid(),
    )
    .await;
    let no_ref = s.env.create_device("s1", "imp-out-c").await;
    s.placement.unavailable(2);
    s.placement.conflicts(1);

    let id = s.create(&[&a, &unknown, &no_ref]).await.unwrap().event_id;
    let e = impairment_in(&s.env, &id, &["partially_failed"], WITHIN).await;
    let by = |d: &str| e.devices.iter().find(|x| x.0 == d).unwrap().clone();
    assert_eq!(
        (by(&a).1.as_str(), by(&a).3.as_deref(), by(&a).4),
        ("cordoned", Some("done"), None),
        "retried through the outage and the conflict"
    );
    assert!(!has(&s.placement, &ua, READY) && has(&s.placement, &ua, OTHER));
    assert_eq!(
        (
            by(&unknown).1.as_str(),
            by(&unknown).3.as_deref(),
            by(&unknown).4.as_deref()
        ),
        (
            "failed",
            Some("failed"),
            Some("PLACEMENT_RESOURCE_PROVIDER_NOT_FOUND")
        )
    );
    assert_eq!(
        by(&no_ref).4.as_deref(),
        Some("PLACEMENT_RESOURCE_PROVIDER_NOT_FOUND"),
        "no infrastructure_ref: no provider to cordon"
    );
    // The hold came first: the failed devices are quarantined all the same.
    assert_eq!(
        s.env.device_field(&unknown, "operational_status").await,
        "quarantine"
    );
    let attempts: i32 = sqlx::query_scalar(
        "SELECT attempts FROM impairment_event_devices WHERE event_id = $1 AND device_id = $2",
    )
    .bind(&id)
    .bind(&a)
    .fetch_one(&s.env.pool)
    .await
    .unwrap();
    assert!(
        attempts >= 1,
        "the outage was retried ({attempts} attempts recorded)"
    );

    // Placement down for good: the release of the cordoned device retries
    // and fails with the retryable code; clearing again after it is back
    // converges.
    s.placement.unavailable(1000);
    s.clear(&id).await;
    let e = impairment_in(&s.env, &id, &["release_failed"], Duration::from_secs(40)).await;
    let da = e.devices.iter().find(|x| x.0 == a).unwrap();
    assert_eq!(
        (da.1.as_str(), da.4.as_deref()),
        ("release_failed", Some("PLACEMENT_UNAVAILABLE"))
    );
    assert_eq!(
        s.hold(&a).await,
        id,
        "the hold stays until the trait is back"
    );
    s.placement.unavailable(0);
    s.clear(&id).await;
    impairment_in(&s.env, &id, &["cleared"], WITHIN).await;
    assert!(has(&s.placement, &ua, READY));
    assert_eq!(s.hold(&a).await, "");
    s.stop().await;
}

/// Refusals that record nothing: no reason, an unknown device, no devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_record_nothing() {
    let s = Setup::start(3).await;
    let a = s.env.create_device("s1", "imp-bad").await;
    let c = workflow_client(&s.env);
    let cases = [
        (vec![a.clone()], "", fleet_proto::ErrorCode::InvalidArgument),
        (vec![], "r", fleet_proto::ErrorCode::InvalidArgument),
        (
            vec![a.clone(), "dev_missing".into()],
            "r",
            fleet_proto::ErrorCode::NotFound,
        ),
    ];
    for (devices, reason, code) in cases {
        let e = c
            .create_impairment(&v1::CreateImpairmentRequest {
                device_ids: devices.clone(),
                reason: reason.into(),
                ticket_url: String::new(),
                created_by: "test".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{devices:?} {reason:?}: {e}");
    }
    let none = count(&s.env, "SELECT count(*) FROM impairment_events", None).await;
    assert_eq!(none, 0);
    let e = c.clear_impairment("imp_missing", "test").await.unwrap_err();
    assert_eq!(e.code(), fleet_proto::ErrorCode::NotFound);
    s.stop().await;
}

/// The workflow service stopped in the middle of a cordon and started
/// again: every device ends cordoned, each trait written exactly once (a
/// resumed device reads Placement and finds nothing left to write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_service_finishes_the_cordon_without_writing_twice() {
    let env = TestEnv::new().await;
    let placement = FakePlacement::start().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let mut devices = vec![];
    for i in 0..40 {
        let uuid = fleet_testkit::ironic::random_uuid();
        devices.push(device_for(&env, "s1", &format!("imp-r-{i:02}"), &uuid).await);
        placement.provider(&uuid, &[READY]);
    }
    let site = placement.site_config();
    let config = |c: &mut fleet_workflow::Config| {
        c.workers = 4;
        c.sites.insert("s1".into(), site.clone());
    };
    let (_w, trigger, task) = start_workflow(&env, config).await;
    let id = workflow_client(&env)
        .create_impairment(&v1::CreateImpairmentRequest {
            device_ids: devices.clone(),
            reason: "restart".into(),
            ticket_url: String::new(),
            created_by: "test".into(),
        })
        .await
        .unwrap()
        .event_id;
    // Stop it once a few devices are done.
    eventually("a few devices cordoned", || async {
        let e = impairment(&env, &id).await;
        (e.devices.iter().filter(|d| d.1 == "cordoned").count() >= 4).then_some(())
    })
    .await;
    stop(trigger, task).await;
    let midway = impairment(&env, &id).await;
    let (_w, trigger, task) = start_workflow(&env, config).await;
    let e = impairment_in(&env, &id, &["cordoned"], Duration::from_secs(40)).await;
    assert!(
        midway.devices.iter().any(|d| d.1 == "pending"),
        "the stop landed with devices still to cordon"
    );
    assert!(
        e.devices.iter().all(|d| d.1 == "cordoned"),
        "{:?}",
        e.devices
    );
    assert_eq!(
        placement.writes(),
        devices.len(),
        "one trait write per device, none repeated"
    );
    stop(trigger, task).await;
    stop(hub_trigger, hub_task).await;
    env.cleanup().await;
}
