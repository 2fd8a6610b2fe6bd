//! The inventory commands: sites, tenants, pools and pool hardware profiles,
//! the set-up an operator does before devices arrive. Every input is
//! checked (`fleet_domain::inventory`) before any query; a site's
//! `inventory_only` is set at create and never again (seed 002, "immutable
//! after create"); a row something still references is not deleted.

use fleet_domain::inventory::{check_gpu_count, check_id, check_name, InventoryKind, PoolKind};
use fleet_domain::DomainError;
use fleet_proto::v1;
use fleet_proto::v1::hub_command::Command as C;
use fleet_proto::v1::hub_reply::Record;

use crate::commands::CommandError;
use crate::reply;
use crate::store::inventory::{self as store, PoolRow, SiteRow, Table, TenantRow};
use crate::Hub;

fn ts(t: chrono::DateTime<chrono::Utc>) -> Option<fleet_proto::Timestamp> {
    Some(fleet_proto::timestamp(t))
}

fn site(r: SiteRow) -> Record {
    Record::Site(v1::Site {
        id: r.id,
        name: r.name,
        inventory_only: r.inventory_only,
        placement_enabled: r.placement_enabled,
        backend_vrf_flip_allowed: r.backend_vrf_flip_allowed,
        created_at: ts(r.created_at),
    })
}

fn tenant(r: TenantRow) -> Record {
    Record::Tenant(v1::Tenant {
        id: r.id,
        name: r.name,
        created_at: ts(r.created_at),
    })
}

fn pool(r: PoolRow) -> Record {
    Record::Pool(v1::Pool {
        hardware_profile: r.gpu_count.map(|gpu_count| v1::PoolHardwareProfile {
            gpu_count,
            gpu_model: r.gpu_model.unwrap_or_default(),
        }),
        id: r.id,
        site_id: r.site_id,
        kind: r.kind,
        owner_tenant_id: r.owner_tenant_id.unwrap_or_default(),
        created_at: ts(r.created_at),
    })
}

fn profile(p: &Option<v1::PoolHardwareProfile>) -> Result<Option<(i32, &str)>, DomainError> {
    match p {
        None => Ok(None),
        Some(p) => {
            check_gpu_count(p.gpu_count)?;
            fleet_domain::limits::check_len(
                "hardware_profile.gpu_model",
                &p.gpu_model,
                fleet_domain::limits::MAX_REASON,
            )?;
            Ok(Some((p.gpu_count, p.gpu_model.as_str())))
        }
    }
}

/// The foreign-key violation of a missing (insert) or still referencing
/// (delete) row.
fn fk(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("23503"))
}

fn not_found(what: &str, id: &str) -> CommandError {
    DomainError::NotFound(format!("{what} {id}")).into()
}

/// Pool `id` as the command left it, for the reply.
async fn pool_now(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: &str,
) -> Result<Record, CommandError> {
    let row = store::pool(tx, id).await?;
    Ok(pool(row.ok_or_else(|| not_found("pool", id))?))
}

impl Hub {
    /// One inventory command, in one transaction.
    pub(crate) async fn inventory(&self, c: C, cause: &str) -> Result<v1::HubReply, CommandError> {
        let mut tx = self.deps.pool.begin().await?;
        let record = match c {
            C::CreateSite(s) => {
                check_id("id", &s.id)?;
                check_name("name", &s.name)?;
                store::insert_site(
                    &mut tx,
                    &s.id,
                    s.name.trim(),
                    s.inventory_only,
                    s.placement_enabled,
                    s.backend_vrf_flip_allowed,
                )
                .await?
                .map(site)
                .ok_or_else(|| DomainError::AlreadyExists(format!("site {} exists", s.id)))?
            }
            C::UpdateSite(s) => {
                check_id("id", &s.id)?;
                if let Some(n) = &s.name {
                    check_name("name", n)?;
                }
                store::update_site(
                    &mut tx,
                    &s.id,
                    s.name.as_deref().map(str::trim),
                    s.placement_enabled,
                    s.backend_vrf_flip_allowed,
                )
                .await?
                .map(site)
                .ok_or_else(|| not_found("site", &s.id))?
            }
            C::CreateTenant(t) => {
                check_id("id", &t.id)?;
                check_name("name", &t.name)?;
                store::insert_tenant(&mut tx, &t.id, t.name.trim())
                    .await?
                    .map(tenant)
                    .ok_or_else(|| DomainError::AlreadyExists(format!("tenant {} exists", t.id)))?
            }
            C::UpdateTenant(t) => {
                check_id("id", &t.id)?;
                check_name("name", &t.name)?;
                store::update_tenant(&mut tx, &t.id, t.name.trim())
                    .await?
                    .map(tenant)
                    .ok_or_else(|| not_found("tenant", &t.id))?
            }
            C::CreatePool(p) => {
                check_id("id", &p.id)?;
                check_id("site_id", &p.site_id)?;
                let kind = PoolKind::parse(&p.kind)?;
                let owner = (!p.owner_tenant_id.is_empty()).then_some(p.owner_tenant_id.as_str());
                if let Some(o) = owner {
                    check_id("owner_tenant_id", o)?;
                }
                let hardware = profile(&p.hardware_profile)?;
                match store::insert_pool(&mut tx, &p.id, &p.site_id, kind.as_str(), owner).await {
                    Ok(Some(())) => {}
                    Ok(None) => {
                        return Err(
                            DomainError::AlreadyExists(format!("pool {} exists", p.id)).into()
                        )
                    }
                    Err(e) if fk(&e) => {
                        return Err(DomainError::NotFound(format!(
                            "site {} or tenant {}",
                            p.site_id,
                            owner.unwrap_or("-")
                        ))
                        .into())
                    }
                    Err(e) => return Err(e.into()),
                }
                store::set_profile(&mut tx, &p.id, hardware).await?;
                pool_now(&mut tx, &p.id).await?
            }
            C::UpdatePool(p) => {
                check_id("id", &p.id)?;
                if p.clear_hardware_profile && p.hardware_profile.is_some() {
                    return Err(DomainError::InvalidArgument(
                        "hardware_profile and clear_hardware_profile exclude each other".into(),
                    )
                    .into());
                }
                let hardware = profile(&p.hardware_profile)?;
                if store::pool(&mut tx, &p.id).await?.is_none() {
                    return Err(not_found("pool", &p.id));
                }
                if let Some(owner) = &p.owner_tenant_id {
                    let owner = (!owner.is_empty()).then_some(owner.as_str());
                    if let Some(o) = owner {
                        check_id("owner_tenant_id", o)?;
                        if store::tenant(&mut tx, o).await?.is_none() {
                            return Err(not_found("tenant", o));
                        }
                    }
                    store::set_pool_owner(&mut tx, &p.id, owner).await?;
                }
                if hardware.is_some() || p.clear_hardware_profile {
                    store::set_profile(&mut tx, &p.id, hardware).await?;
                }
                pool_now(&mut tx, &p.id).await?
            }
            C::DeleteInventory(d) => {
                let kind = InventoryKind::parse(&d.kind)?;
                check_id("id", &d.id)?;
                let (table, before) = match kind {
                    InventoryKind::Site => {
                        (Table::Sites, store::site(&mut tx, &d.id).await?.map(site))
                    }
                    InventoryKind::Tenant => (
                        Table::Tenants,
                        store::tenant(&mut tx, &d.id).await?.map(tenant),
                    ),
                    InventoryKind::Pool => {
                        (Table::Pools, store::pool(&mut tx, &d.id).await?.map(pool))
                    }
                };
                let before = before.ok_or_else(|| not_found(kind.as_str(), &d.id))?;
                match store::delete(&mut tx, table, &d.id).await {
                    Ok(_) => before,
                    Err(e) if fk(&e) => {
                        return Err(DomainError::InvalidState(format!(
                            "{kind} {} is still referenced (by devices, pools, allocations or join tokens); \
                             nothing was deleted",
                            d.id
                        ))
                        .into())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            _ => {
                return Err(DomainError::InvalidArgument("not an inventory command".into()).into())
            }
        };
        tx.commit().await?;
        tracing::info!(cause, "inventory changed");
        Ok(reply::ok(record, 0))
    }
}
