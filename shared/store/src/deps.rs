//! What every database service connects to at start, once: its pool
//! (working as its own role, the schema checked), NATS, JetStream and the
//! names of its subjects and streams.

use async_nats::jetstream;
use fleet_bus::{StreamNames, Subjects};
use fleet_runtime::Common;
use sqlx::PgPool;

use crate::Role;

pub struct Deps {
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub streams: StreamNames,
}

impl Deps {
    /// Connects as `role` (when `database.set_role`), checks the schema is
    /// this build's, and connects to NATS as `fleet-<service>`.
    pub async fn connect(common: &Common, role: Role) -> anyhow::Result<Deps> {
        let pool = crate::connect_as(
            &common.database.url,
            common.database.max_connections,
            common.database.set_role.then_some(role),
        )
        .await?;
        crate::check_schema(&pool).await?;
        let nats = fleet_bus::connect_now(&common.nats, role.client_name()).await?;
        let js = jetstream::new(nats.clone());
        Ok(Deps {
            pool,
            nats,
            js,
            subjects: Subjects::new(&common.nats.subject_root, &common.nats.radar_root),
            streams: StreamNames::new(&common.nats.stream_prefix),
        })
    }
}
