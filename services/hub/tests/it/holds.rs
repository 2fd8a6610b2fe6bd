//! `impairment_holds`: one event's hold on many devices in one transaction,
//! each device applied or refused on its own.

use fleet_proto::v1;
use v1::hub_command::Command as C;

use crate::support::*;

fn holds(event: &str, ids: &[&str], set: bool) -> C {
    C::ImpairmentHolds(v1::ImpairmentHolds {
        event_id: event.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        set,
    })
}

fn results(r: &v1::HubReply) -> Vec<(String, Option<i32>)> {
    match &r.record {
        Some(v1::hub_reply::Record::Holds(h)) => h
            .results
            .iter()
            .map(|x| (x.device_id.clone(), x.error.as_ref().map(|e| e.code)))
            .collect(),
        other => panic!("expected holds, got {other:?} ({:?})", r.error),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impairment_holds_apply_or_refuse_each_device_on_its_own() {
    let (env, hub) = start().await;
    let a = env.create_device("s1", "hold-a").await;
    let b = env.create_device("s1", "hold-b").await;
    // b carries another event's hold.
    let r = env
        .command("impairment_holds", 0, holds("imp_other", &[&b], true))
        .await;
    assert_eq!(results(&r), vec![(b.clone(), None)]);
    let version_b = env.device_field(&b, "version").await;

    let r = env
        .command(
            "impairment_holds",
            0,
            holds("imp_1", &[&a, &b, "dev_missing"], true),
        )
        .await;
    let invalid_state = fleet_proto::ErrorCode::InvalidState as i32;
    let not_found = fleet_proto::ErrorCode::NotFound as i32;
    assert_eq!(
        results(&r),
        vec![
            (a.clone(), None),
            (b.clone(), Some(invalid_state)),
            ("dev_missing".into(), Some(not_found)),
        ]
    );
    assert_eq!(env.device_field(&a, "impairment_hold").await, "imp_1");
    assert_eq!(
        env.device_field(&a, "operational_status").await,
        "quarantine"
    );
    assert_eq!(env.device_field(&b, "impairment_hold").await, "imp_other");
    assert_eq!(
        env.device_field(&b, "version").await,
        version_b,
        "the refused device is left exactly as it was"
    );

    // Again: the event's own hold is a no-op; removing it re-derives.
    let r = env
        .command("impairment_holds", 0, holds("imp_1", &[&a], true))
        .await;
    assert_eq!(results(&r), vec![(a.clone(), None)]);
    let r = env
        .command("impairment_holds", 0, holds("imp_1", &[&a, &b], false))
        .await;
    assert_eq!(
        results(&r),
        vec![(a.clone(), None), (b.clone(), Some(invalid_state))]
    );
    assert_eq!(
        env.device_field(&a, "coalesce(impairment_hold, '')").await,
        ""
    );
    // A request without an event or devices is refused whole.
    let r = env
        .command("impairment_holds", 0, holds("", &[&a], true))
        .await;
    assert_eq!(
        r.error.map(|e| e.code),
        Some(fleet_proto::ErrorCode::InvalidArgument as i32)
    );
    hub.stop(env).await;
}
