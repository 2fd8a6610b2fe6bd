//! The storm guard (issue 16): a job or an impairment cordon that would
//! take more than the configured share of a site's in-service devices out
//! of service within the window waits, before its first external write,
//! for an operator's confirmation; a source outage never trips it, and
//! nothing is ever started without being asked.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::{v1, ErrorCode};
use fleet_testkit::placement::FakePlacement;
use fleet_workflow_client::WorkflowError;

use crate::support::*;

struct Fleet {
    env: TestEnv,
    placement: FakePlacement,
    devices: Vec<String>,
    stops: Services,
}

impl Fleet {
    /// `n` devices of site s1 in service (`in_use` through the hub), each
    /// with a Placement resource provider carrying the customer-ready trait;
    /// the guard at 10 % of a site, at least 5 devices, within an hour.
    async fn start(n: usize) -> Fleet {
        let env = TestEnv::new().await;
        let placement = FakePlacement::start().await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let mut devices = vec![];
        let t0 = Utc::now();
        for i in 0..n {
            let name = format!("storm-{i:03}");
            let uuid = fleet_testkit::ironic::random_uuid();
            devices.push(device_for(&env, "s1", &name, &uuid).await);
            placement.provider(&uuid, &[READY]);
            env.publish_snapshot(&openstack_as("s1", &name, t0, Node::InUse))
                .await;
        }
        eventually(&format!("{n} devices in service"), || async {
            let sql = "SELECT count(*) FROM devices WHERE operational_status = 'in_use' \
                       AND entered_service_at IS NOT NULL";
            (count(&env, sql, None).await == n as i64).then_some(())
        })
        .await;
        let site = placement.site_config();
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert("s1".into(), site);
            c.storm_guard.max_share = 0.10;
            c.storm_guard.min_devices = 5;
            c.storm_guard.window = Duration::from_secs(3600);
        })
        .await;
        Fleet {
            env,
            placement,
            devices,
            stops: vec![(trigger, task), (hub_trigger, hub_task)].into(),
        }
    }

    async fn cordon(&self, range: std::ops::Range<usize>) -> v1::ImpairmentAccepted {
        workflow_client(&self.env)
            .create_impairment(&v1::CreateImpairmentRequest {
                device_ids: self.devices[range].to_vec(),
                reason: "switch firmware".into(),
                ticket_url: String::new(),
                created_by: "test".into(),
            })
            .await
            .unwrap()
    }

    async fn confirm(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        workflow_client(&self.env)
            .confirm_impairment(&v1::ConfirmRequest {
                id: id.into(),
                confirmed_by: "operator".into(),
                reason: reason.into(),
            })
            .await
    }

    /// JOBS messages written for `id` so far (the outbox keeps its rows
    /// until the relay publishes them; the stream keeps them after).
    async fn queued(&self, id: &str) -> i64 {
        let pending = "SELECT count(*) FROM workflow_outbox WHERE subject LIKE '%.' || $1 || '.%'";
        let worked = "SELECT count(*) FROM impairment_event_devices WHERE event_id = $1 \
                      AND status <> 'pending'";
        count(&self.env, pending, Some(id)).await + count(&self.env, worked, Some(id)).await
    }

    async fn stop(self) {
        self.stops.stop().await;
        self.env.cleanup().await;
    }
}

fn refused(r: Result<v1::ImpairmentAccepted, WorkflowError>) -> (ErrorCode, String) {
    match r {
        Err(WorkflowError::Refused { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// "pauses before its first external write and waits for an operator's
/// confirmation through the API".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordon_over_the_share_waits_for_a_confirmation_before_any_write() {
    let f = Fleet::start(40).await;
    // 10 % of 40 is 4, at least 5: a 6-device cordon trips.
    let held = f.cordon(0..6).await;
    let guard = held.storm_guard.clone().expect("the storm guard holds it");
    assert!(guard.awaiting_confirmation);
    assert_eq!(
        guard
            .trips
            .iter()
            .map(|t| (
                t.scope_kind.as_str(),
                t.scope_id.as_str(),
                t.in_service,
                t.taking,
                t.in_window,
                t.limit
            ))
            .collect::<Vec<_>>(),
        vec![("site", "s1", 40, 6, 0, 5)]
    );
    let id = held.event_id.clone();
    // Nothing queued, nothing written: no hold at the hub, every trait in
    // place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(f.queued(&id).await, 0);
    assert_eq!(f.placement.writes(), 0);
    let held_at_hub = "SELECT count(*) FROM devices WHERE impairment_hold IS NOT NULL";
    assert_eq!(count(&f.env, held_at_hub, None).await, 0);

    // A confirmation needs a reason; a clear is refused while it waits.
    let (code, message) = refused(f.confirm(&id, " ").await);
    assert_eq!(code, ErrorCode::InvalidArgument, "{message}");
    let clear = workflow_client(&f.env).clear_impairment(&id, "test").await;
    let (code, message) = refused(clear);
    assert_eq!(code, ErrorCode::InvalidState, "{message}");
    assert!(message.contains("storm guard"), "{message}");

    // Confirmed: the cordon runs; confirming again answers the same.
    f.confirm(&id, "planned maintenance window, CHG-1")
        .await
        .unwrap();
    let e = impairment_in(&f.env, &id, &["cordoned"], Duration::from_secs(30)).await;
    assert!(
        e.devices.iter().all(|d| d.1 == "cordoned"),
        "{:?}",
        e.devices
    );
    assert_eq!(f.placement.writes(), 6);
    f.confirm(&id, "again").await.unwrap();
    let (by, reason): (String, String) =
        sqlx::query_as("SELECT confirmed_by, confirm_reason FROM impairment_events WHERE id = $1")
            .bind(&id)
            .fetch_one(&f.env.pool)
            .await
            .unwrap();
    assert_eq!(
        (by.as_str(), reason.as_str()),
        ("operator", "planned maintenance window, CHG-1")
    );
    f.stop().await;
}

/// "within a window": what admitted work took counts against the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_window_holds_counts_against_the_next_cordon() {
    let f = Fleet::start(40).await;
    let first = f.cordon(0..5).await;
    assert!(
        first.storm_guard.is_none(),
        "5 of 40 is within the limit of 5"
    );
    let second = f.cordon(5..6).await;
    let trip = &second.storm_guard.expect("the sixth trips").trips[0];
    assert_eq!((trip.in_window, trip.taking, trip.limit), (5, 1, 5));
    f.stop().await;
}

/// "a source outage never trips it and never triggers remediation": with
/// every source silent the hub turns statuses unknown and connectivity
/// unreachable; the guard's counts do not move, a small cordon is admitted,
/// and the workflow service started no work of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_never_trips_the_guard_and_starts_nothing() {
    let f = Fleet::start(40).await;
    // Ironic is unreachable: connector-openstack publishes every device's
    // conditions Unknown (the outage rule of spec/connectors.md).
    let at = Utc::now();
    for i in 0..40 {
        let name = format!("storm-{i:03}");
        let unknown =
            fleet_domain::catalogue::observation_types_of(fleet_domain::Source::Openstack)
                .map(|t| cond(t.as_str(), "Unknown", "IronicUnreachable"))
                .collect();
        f.env
            .publish_snapshot(&snapshot("openstack", "s1", "name", &name, at, unknown))
            .await;
    }
    eventually("every device unknown after the outage", || async {
        let sql = "SELECT count(*) FROM devices WHERE operational_status = 'unknown'";
        (count(&f.env, sql, None).await == 40).then_some(())
    })
    .await;
    let work = || async {
        (
            count(&f.env, "SELECT count(*) FROM jobs", None).await,
            count(&f.env, "SELECT count(*) FROM impairment_events", None).await,
        )
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(work().await, (0, 0), "nothing started on its own");
    let admitted = f.cordon(0..3).await;
    assert!(
        admitted.storm_guard.is_none(),
        "an outage trips nothing: {:?}",
        admitted.storm_guard
    );
    assert_eq!(work().await, (0, 1));
    f.stop().await;
}
