//! Issue 16: Release (seed 002) against the real Ironic, at a standalone
//! site (the lessee and the customer-ready trait are the node's own), with
//! a NetBox of the test's own: the fully managed hand-back clears the
//! maintenance lease and adds the trait, each write preceded by a NetBox
//! re-read requiring `active`, the proof and the partition latches; the
//! internal Release writes nothing.

use std::time::Duration;

use chrono::Utc;
use fleet_latch::{Latch, LatchWrite, LatchWriter};
use fleet_proto::v1;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::*;

const MAINT: &str = "maint-project";
const WITHIN: Duration = Duration::from_secs(60);

struct Release {
    ironic: RealIronic,
    env: TestEnv,
    netbox: MockServer,
    mesh: Mesh,
}

impl Release {
    /// The real Ironic read by connector-openstack, the hub, and the
    /// workflow service with the site's maintenance project and NetBox.
    async fn start() -> Release {
        let ironic = RealIronic::connect().await;
        let netbox = MockServer::start().await;
        let mut site = site_config(&ironic);
        site.openstack.maintenance_project_id = MAINT.into();
        let reader = Reader {
            maintenance_project: MAINT,
            ..Default::default()
        };
        let url = netbox.uri();
        let (ironic, env, mesh) = Mesh::start_with(ironic, site, false, reader, |c| {
            c.netbox.url = url;
            c.netbox.token.value =
                fleet_runtime::config::Secret::new("0123456789abcdef0123456789abcdef01234567");
            c.step_timeout = Duration::from_secs(30);
        })
        .await;
        Release {
            ironic,
            env,
            netbox,
            mesh,
        }
    }

    /// An available node leased to the maintenance project, its device
    /// (NetBox id `netbox_id`) with the enrollment proof for it.
    async fn leased_device(&self, prefix: &str, netbox_id: i64) -> (String, String) {
        let name = unique(prefix);
        let uuid = self.ironic.available_node(&name).await;
        self.ironic
            .patch(
                &uuid,
                json!([{"op": "add", "path": "/lessee", "value": MAINT}]),
            )
            .await;
        let device = proven_device(&self.env, "s1", &name, &uuid, netbox_id).await;
        (device, uuid)
    }

    async fn netbox_says(&self, id: i64, status: &str, delay: Duration) {
        Mock::given(method("GET"))
            .and(path(format!("/api/dcim/devices/{id}/")))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"id": id, "name": "n", "status": {"value": status, "label": status}}))
                    .set_delay(delay),
            )
            .mount(&self.netbox)
            .await;
    }

    async fn release(
        &self,
        devices: &[String],
        to_pool: bool,
    ) -> Result<v1::Job, fleet_workflow_client::WorkflowError> {
        self.release_as(devices, if to_pool { "fully_managed" } else { "" })
            .await
    }

    /// A fully managed Release of `device` alone, waited for until it ends.
    async fn handed_back(&self, device: &str) -> v1::Job {
        let job = self.release(&[device.to_string()], true).await.unwrap();
        job_terminal(&self.env, &job.id, WITHIN).await
    }

    /// Asserts node `uuid` was not handed back: still leased to the
    /// maintenance project, without the customer-ready trait.
    async fn assert_kept(&self, uuid: &str) {
        let (lessee, traits) = self.ironic.lessee_and_traits(uuid).await;
        assert_eq!(lessee, MAINT, "the lease is untouched");
        assert!(!traits.iter().any(|t| t == READY), "no trait: {traits:?}");
    }

    /// A Release to the customer pool for `mode` (empty: internal).
    async fn release_as(
        &self,
        devices: &[String],
        mode: &str,
    ) -> Result<v1::Job, fleet_workflow_client::WorkflowError> {
        create_with(&self.env, "release", devices, |r| {
            r.release_to_customer_pool = !mode.is_empty();
            r.engagement_mode = mode.into();
        })
        .await
    }

    async fn latch(&self, device: &str, latch: Latch, reason: &str) {
        let writer = LatchWriter::new(self.env.nats.clone(), self.env.subjects.clone(), "test");
        let key = v1::DeviceKey {
            site: String::new(),
            kind: "device_id".into(),
            key: device.into(),
        };
        let w = LatchWrite::new(
            latch,
            key,
            reason,
            "test",
            fleet_testkit::micros(Utc::now()),
        )
        .unwrap();
        writer.write(&w).await.expect("latch written");
    }

    async fn stop(self) {
        self.mesh.stop(self.ironic, self.env).await;
    }
}

/// The fully managed hand-back end to end: the maintenance lease cleared,
/// then the customer-ready trait added, then the hub derives `available`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fully_managed_release_clears_the_lease_adds_the_trait_and_is_available() {
    let r = Release::start().await;
    let (device, uuid) = r.leased_device("rel", 501).await;
    r.netbox_says(501, "active", Duration::ZERO).await;
    let job = r.handed_back(&device).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let (lessee, traits) = r.ironic.lessee_and_traits(&uuid).await;
    assert!(lessee.is_null(), "lease cleared: {lessee}");
    assert!(traits.iter().any(|t| t == READY), "{traits:?}");
    assert_eq!(
        r.env.device_field(&device, "operational_status").await,
        "available"
    );
    // NetBox was read immediately before each of the two writes.
    let reads = r.netbox.received_requests().await.unwrap_or_default();
    assert!(reads.len() >= 2, "{} NetBox reads", reads.len());
    r.stop().await;
}

/// "the final handoff activity therefore re-reads NetBox and requires
/// active ... This closes the window where NetBox can move a device to rma
/// after the release job was admitted."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_netbox_moved_to_rma_after_admission_is_not_handed_back() {
    let r = Release::start().await;
    let (device, uuid) = r.leased_device("rma", 502).await;
    r.netbox_says(502, "rma", Duration::ZERO).await;
    let job = r.handed_back(&device).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].failure_code, "RELEASE_INVENTORY_NOT_ACTIVE");
    r.assert_kept(&uuid).await;
    r.stop().await;
}

/// NVLink: "The handoff reads the durable latch immediately before each
/// customer-facing mutation ... True and Unknown refuse the handoff". The
/// latch goes Unknown after admission, while the step reads NetBox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nvlink_latch_written_after_admission_refuses_the_hand_back() {
    let r = Release::start().await;
    let (device, uuid) = r.leased_device("nvl", 503).await;
    r.netbox_says(503, "active", Duration::from_secs(2)).await;
    let job = r
        .release(std::slice::from_ref(&device), true)
        .await
        .unwrap();
    // Admitted on absence; the move starts while the step waits on NetBox.
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.latch(&device, Latch::NvlinkPartition, "MoveInProgress")
        .await;
    let job = job_terminal(&r.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "failed", "{:?}", job.devices);
    assert_eq!(job.devices[0].failure_code, "RELEASE_NVLINK_LATCH_REFUSED");
    r.assert_kept(&uuid).await;
    r.stop().await;
}

/// Back-end: "Admission refuses through the release_to_customer_pool gate";
/// an internal Release (no customer) is admitted all the same and writes
/// nothing customer-facing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_end_latch_refuses_a_customer_release_at_admission_not_an_internal_one() {
    let r = Release::start().await;
    let (device, uuid) = r.leased_device("bkv", 504).await;
    r.latch(&device, Latch::BackendVrf, "IsolateVerified").await;
    let refused = r
        .release(std::slice::from_ref(&device), true)
        .await
        .unwrap_err();
    match refused {
        fleet_workflow_client::WorkflowError::Ineligible { refusals, .. } => {
            assert_eq!(refusals.len(), 1, "{refusals:?}");
            assert_eq!(refusals[0].refusal, "condition_disqualifier_asserted");
            assert_eq!(refusals[0].detail, "BackendPortsInMaintenanceVrf");
        }
        other => panic!("expected INELIGIBLE, got {other:?}"),
    }
    // The internal Release waits for validation, which a leased node in
    // the maintenance pool with SLURM healthy reaches.
    let job = r
        .release(std::slice::from_ref(&device), false)
        .await
        .unwrap();
    let name = r.env.device_field(&device, "name").await;
    slurm_healthy(&r.env, &name).await;
    // InMaintenancePool comes from connector-openstack reading the lessee.
    let job = job_terminal(&r.env, &job.id, WITHIN).await;
    let _ = uuid;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let (lessee, _) = r
        .ironic
        .lessee_and_traits(&r.env.device_field(&device, "infrastructure_ref").await)
        .await;
    assert_eq!(lessee, MAINT, "an internal Release writes nothing");
    r.stop().await;
}

/// The Metal hand-back: "writing operational_status=delegated" through the
/// hub after NetBox reads `active` and both latches are clear; nothing
/// written to Ironic; the front-end latch Unknown (no verified flip on
/// record). A device NetBox moved to `rma` is refused and stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metal_release_delegates_through_the_hub_and_refuses_rma() {
    let r = Release::start().await;
    let (device, uuid) = r.leased_device("metal", 505).await;
    let (rma, _) = r.leased_device("metal-rma", 506).await;
    r.netbox_says(505, "active", Duration::ZERO).await;
    r.netbox_says(506, "rma", Duration::ZERO).await;
    // Validated in the maintenance pool: SLURM registered and healthy (a
    // quarantined device is refused by the hub, as the hand-back's own
    // re-check).
    let name = r.env.device_field(&device, "name").await;
    slurm_healthy(&r.env, &name).await;
    eventually("validation", || async {
        (r.env.device_field(&device, "operational_status").await == "validation").then_some(())
    })
    .await;
    let job = r
        .release_as(&[device.clone(), rma.clone()], "metal")
        .await
        .unwrap();
    let job = job_terminal(&r.env, &job.id, WITHIN).await;
    let by_id = |id: &str| job.devices.iter().find(|d| d.device_id == id).unwrap();
    assert_eq!(by_id(&device).status, "succeeded", "{:?}", job.devices);
    assert_eq!(by_id(&rma).failure_code, "RELEASE_INVENTORY_NOT_ACTIVE");
    assert_eq!(
        r.env.device_field(&device, "operational_status").await,
        "delegated"
    );
    assert_ne!(
        r.env.device_field(&rma, "operational_status").await,
        "delegated"
    );
    let latch: (String, String) = sqlx::query_as(
        "SELECT status, reason FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
    )
    .bind(&device)
    .fetch_one(&r.env.pool)
    .await
    .unwrap();
    assert_eq!(latch, ("Unknown".into(), "HandoverBreach".into()));
    // A Metal hand-back writes nothing to Ironic.
    r.assert_kept(&uuid).await;
    // "self_managed" is refused by name at creation.
    let e = r
        .release_as(&[device.clone()], "self_managed")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not run by this build"), "{e}");
    r.stop().await;
}
