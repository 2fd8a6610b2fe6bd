//! The latch write helper workflows use (`fleet-latch`), against the real
//! hub: a verified write is recorded and returned; a re-run is answered
//! with the same row; a stale-rejected write, a refused one and no hub at
//! all fail with the latch's failure code.

use std::time::Duration;

use chrono::Utc;
use fleet_latch::{Latch, LatchError, LatchWrite, LatchWriter};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_helper_records_verified_writes_and_fails_on_stale_rejected_ones() {
    let env = TestEnv::new().await;
    let hub = RunningHub::start(&env).await;
    let id = env.create_device("s1", "gpu-l1-01").await;
    let writer = LatchWriter::new(
        env.nats.clone(),
        env.subjects.clone(),
        "workflow:nvlink-move:job-41",
    );
    let device = LatchWrite::device_id(&id);
    let t1 = micros(Utc::now()) - chrono::Duration::seconds(30);
    let at = |secs: i64| t1 + chrono::Duration::seconds(secs);

    // A verified move is recorded, and the row returned is the one sent.
    let moved = LatchWrite::new(
        Latch::NvlinkPartition,
        device.clone(),
        "MoveVerified",
        "8 GPUs read back in partition repair",
        at(0),
    )
    .unwrap();
    let stored = writer.write(&moved).await.unwrap();
    assert_eq!(
        (
            stored.device_id.as_str(),
            stored.status.as_str(),
            stored.reason.as_str()
        ),
        (id.as_str(), "True", "MoveVerified")
    );
    assert_eq!(stored.observed_at, at(0));
    // Re-running the same job writes the same row: success.
    assert_eq!(writer.write(&moved).await.unwrap(), stored);

    // An older observation is stale-rejected: the hub returns the stored
    // row, and the helper fails with the NVLink code.
    let stale = LatchWrite::new(
        Latch::NvlinkPartition,
        device.clone(),
        "ReturnVerified",
        "returned (older read)",
        at(-5),
    )
    .unwrap();
    let e = writer.write(&stale).await.unwrap_err();
    assert_eq!(e.code().as_str(), "NVLINK_LATCH_WRITE_FAILED");
    match &e {
        LatchError::StaleRejected { stored, .. } => {
            assert_eq!(
                (stored.status.as_str(), stored.reason.as_str()),
                ("True", "MoveVerified")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string()
            .starts_with("NVLINK_LATCH_WRITE_FAILED: stale-rejected"),
        "{e}"
    );
    assert_eq!(
        condition_row(&env, &id, "NvLinkGpusInRepairPartition")
            .await
            .unwrap(),
        (
            "True".into(),
            "MoveVerified".into(),
            "8 GPUs read back in partition repair".into()
        ),
        "the stale write changed nothing"
    );
    // A later verified return lands.
    let back = LatchWrite::new(
        Latch::NvlinkPartition,
        device.clone(),
        "ReturnVerified",
        "",
        at(5),
    )
    .unwrap();
    assert_eq!(writer.write(&back).await.unwrap().status, "False");

    // The same rule, with their own codes, for the VRF latches.
    for (latch, newer, older, code) in [
        (
            Latch::FrontendVrf,
            "IsolateFlipVerified",
            "CustomerVrfFlipVerified",
            "SWITCH_VRF_LATCH_WRITE_FAILED",
        ),
        (
            Latch::BackendVrf,
            "IsolateVerified",
            "ApplyInProgress",
            "BACKEND_VRF_LATCH_WRITE_FAILED",
        ),
    ] {
        let w = LatchWrite::new(latch, device.clone(), newer, "verified", at(10)).unwrap();
        writer.write(&w).await.unwrap();
        let old = LatchWrite::new(latch, device.clone(), older, "older", at(9)).unwrap();
        let e = writer.write(&old).await.unwrap_err();
        assert!(matches!(e, LatchError::StaleRejected { .. }), "{e}");
        assert_eq!(e.code().as_str(), code);
        assert_eq!(
            condition_row(&env, &id, latch.condition_type().as_str())
                .await
                .unwrap()
                .1,
            newer
        );
    }

    // Refused by the hub: an unknown device, a future observation.
    let nobody = LatchWrite::new(
        Latch::BackendVrf,
        LatchWrite::device_id("no-such-device"),
        "ReturnVerified",
        "",
        at(0),
    )
    .unwrap();
    let future = LatchWrite::new(
        Latch::FrontendVrf,
        device.clone(),
        "IsolateFlipVerified",
        "",
        Utc::now() + chrono::Duration::minutes(10),
    )
    .unwrap();
    for (write, refusal, code) in [
        (&nobody, "NOT_FOUND", "BACKEND_VRF_LATCH_WRITE_FAILED"),
        (
            &future,
            "FUTURE_OBSERVATION",
            "SWITCH_VRF_LATCH_WRITE_FAILED",
        ),
    ] {
        let e = writer.write(write).await.unwrap_err();
        assert!(
            matches!(&e, LatchError::Refused { hub_code, .. } if hub_code.as_str_name() == refusal),
            "{e}"
        );
        assert_eq!(e.code().as_str(), code);
    }

    // No hub answers: unavailable after every attempt, with the code.
    let mut lost = LatchWriter::new(
        env.nats.clone(),
        fleet_bus::Subjects::new(&format!("{}-nohub", env.common.nats.subject_root), "r"),
        "workflow:test",
    );
    lost.timeout = Duration::from_millis(200);
    lost.attempts = 2;
    let e = lost.write(&back).await.unwrap_err();
    assert!(
        matches!(e, LatchError::Unavailable { attempts: 2, .. }),
        "{e}"
    );
    assert_eq!(e.code().as_str(), "NVLINK_LATCH_WRITE_FAILED");

    hub.stop(env).await;
}
