//! `fleet sites ...`, `fleet tenants ...` and `fleet pools ...`: the
//! inventory an operator sets up before devices arrive, through the API
//! (`/api/v1/sites/`, `/tenants/`, `/pools/`; hub inventory commands).

use clap::Subcommand;
use fleet_api::inventory::{Pool, Site, Tenant};
use serde_json::{json, Value};

use crate::cli::{decode, emit, filters, or_dash, table_of, Api, Output, Target};

#[derive(Subcommand, Debug, Clone)]
pub enum SitesCommand {
    /// Every site.
    List,
    /// One site.
    Show {
        /// The site id.
        id: String,
    },
    /// Create a site. `--inventory-only` is fixed for the site's life: every
    /// device created at it is inventory-only.
    Create {
        /// The site id: ASCII letters, digits, '-' and '_'.
        id: String,
        /// A display name.
        #[arg(long)]
        name: String,
        /// Every device created at the site is inventory-only (fixed for the site's life).
        #[arg(long)]
        inventory_only: bool,
        /// Placement (the customer-ready trait) is not managed at this site.
        #[arg(long)]
        no_placement: bool,
        /// The back-end VRF flips may write this site's switches (otherwise they are simulated).
        #[arg(long)]
        backend_vrf_flip_allowed: bool,
    },
    /// Rename a site or turn its Placement management on or off.
    Update {
        /// The site id.
        id: String,
        /// A new display name.
        #[arg(long)]
        name: Option<String>,
        /// Whether the workflow service manages the customer-ready trait in Placement here.
        #[arg(long)]
        placement_enabled: Option<bool>,
        /// Whether the back-end VRF flips may write this site's switches.
        #[arg(long)]
        backend_vrf_flip_allowed: Option<bool>,
    },
    /// Delete a site nothing refers to.
    Delete {
        /// The site id.
        id: String,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum TenantsCommand {
    /// Every tenant.
    List,
    /// One tenant.
    Show {
        /// The tenant id.
        id: String,
    },
    /// Create a tenant.
    Create {
        /// The tenant id: ASCII letters, digits, '-' and '_'.
        id: String,
        /// A display name.
        #[arg(long)]
        name: String,
    },
    /// Rename a tenant.
    Update {
        /// The tenant id.
        id: String,
        /// The new display name.
        #[arg(long)]
        name: String,
    },
    /// Delete a tenant nothing refers to.
    Delete {
        /// The tenant id.
        id: String,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum PoolCommand {
    /// Every pool, or a site's.
    List {
        /// Only this site's pools.
        #[arg(long)]
        site: Option<String>,
    },
    /// One pool.
    Show {
        /// The pool id.
        id: String,
    },
    /// Create a pool; its kind decides the role of devices that join it.
    Create {
        /// The pool id: ASCII letters, digits, '-' and '_'.
        id: String,
        /// The site the pool is in.
        #[arg(long)]
        site: String,
        /// metal-host, vps-host, provider, metal-dedicated or custom.
        #[arg(long)]
        kind: String,
        /// The owning tenant.
        #[arg(long)]
        owner: Option<String>,
        /// The hardware profile's GPUs per device (acceptance checks joins against it).
        #[arg(long)]
        gpus: Option<i32>,
        /// The hardware profile's GPU model.
        #[arg(long, requires = "gpus")]
        gpu_model: Option<String>,
    },
    /// Change a pool's owner (`--owner ""` clears it) or hardware profile.
    Update {
        /// The pool id.
        id: String,
        /// The owning tenant ("" clears it).
        #[arg(long)]
        owner: Option<String>,
        /// The hardware profile's GPUs per device.
        #[arg(long, conflicts_with = "clear_profile")]
        gpus: Option<i32>,
        /// The hardware profile's GPU model.
        #[arg(long, requires = "gpus")]
        gpu_model: Option<String>,
        /// Remove the hardware profile.
        #[arg(long)]
        clear_profile: bool,
    },
    /// Delete a pool nothing refers to.
    Delete {
        /// The pool id.
        id: String,
    },
}

fn site_row(s: &Site) -> Vec<String> {
    vec![
        s.id.clone(),
        s.name.clone(),
        s.inventory_only.to_string(),
        s.placement_enabled.to_string(),
        s.backend_vrf_flip_allowed.to_string(),
        s.created_at.to_rfc3339(),
    ]
}
const SITE_HEADER: &[&str] = &[
    "ID",
    "NAME",
    "INVENTORY-ONLY",
    "PLACEMENT",
    "BACKEND-FLIPS",
    "CREATED",
];

fn tenant_row(t: &Tenant) -> Vec<String> {
    vec![t.id.clone(), t.name.clone(), t.created_at.to_rfc3339()]
}
const TENANT_HEADER: &[&str] = &["ID", "NAME", "CREATED"];

fn pool_row(p: &Pool) -> Vec<String> {
    vec![
        p.id.clone(),
        p.site_id.clone(),
        p.kind.clone(),
        or_dash(p.owner_tenant_id.as_ref()),
        p.hardware_profile.as_ref().map_or("-".into(), |h| {
            format!(
                "{} x {}",
                h.gpu_count,
                if h.gpu_model.is_empty() {
                    "GPU"
                } else {
                    &h.gpu_model
                }
            )
        }),
        p.created_at.to_rfc3339(),
    ]
}
const POOL_HEADER: &[&str] = &["ID", "SITE", "KIND", "OWNER", "PROFILE", "CREATED"];

/// What a command does with the records under one collection
/// (`/api/v1/sites/`): list them (with these filters), or show, create,
/// update or delete one.
enum Call {
    List(Vec<(&'static str, String)>),
    Show(String),
    Create(Value),
    Update(String, Value),
    Delete(String),
}

/// Runs `call` on the collection at `path` and prints the records it
/// answers, as JSON or as a table of `header` with a `row` each.
async fn run<T: serde::Serialize + serde::de::DeserializeOwned>(
    api: &Api,
    out: Output,
    path: &str,
    call: Call,
    row: fn(&T) -> Vec<String>,
    header: &[&str],
) -> anyhow::Result<()> {
    let one = match call {
        Call::List(q) => {
            let items: Vec<T> = api.list_all(path, &q, None).await?;
            return print(out, &items, row, header);
        }
        Call::Show(id) => api.get(&format!("{path}{id}/"), &[]).await?,
        Call::Create(body) => api.post(path, body).await?,
        Call::Update(id, body) => api.patch(&format!("{path}{id}/"), body).await?,
        Call::Delete(id) => api.delete(&format!("{path}{id}/")).await?,
    };
    print(out, &[decode::<T>(one, "answer")?], row, header)
}

fn print<T: serde::Serialize>(
    out: Output,
    items: &[T],
    row: fn(&T) -> Vec<String>,
    header: &[&str],
) -> anyhow::Result<()> {
    emit(out == Output::Json, items, |items| {
        table_of(header, items, row)
    })
}

pub async fn sites(t: Target, what: SitesCommand) -> anyhow::Result<()> {
    let call = match what {
        SitesCommand::List => Call::List(vec![]),
        SitesCommand::Show { id } => Call::Show(id),
        SitesCommand::Create {
            id,
            name,
            inventory_only,
            no_placement,
            backend_vrf_flip_allowed,
        } => Call::Create(
            json!({"id": id, "name": name, "inventory_only": inventory_only, "placement_enabled": !no_placement, "backend_vrf_flip_allowed": backend_vrf_flip_allowed}),
        ),
        SitesCommand::Update {
            id,
            name,
            placement_enabled,
            backend_vrf_flip_allowed,
        } => {
            let mut body = json!({});
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            if let Some(p) = placement_enabled {
                body["placement_enabled"] = json!(p);
            }
            if let Some(b) = backend_vrf_flip_allowed {
                body["backend_vrf_flip_allowed"] = json!(b);
            }
            Call::Update(id, body)
        }
        SitesCommand::Delete { id } => Call::Delete(id),
    };
    run(
        &t.api()?,
        t.output,
        "/api/v1/sites/",
        call,
        site_row,
        SITE_HEADER,
    )
    .await
}

pub async fn tenants(t: Target, what: TenantsCommand) -> anyhow::Result<()> {
    let call = match what {
        TenantsCommand::List => Call::List(vec![]),
        TenantsCommand::Show { id } => Call::Show(id),
        TenantsCommand::Create { id, name } => Call::Create(json!({"id": id, "name": name})),
        TenantsCommand::Update { id, name } => Call::Update(id, json!({"name": name})),
        TenantsCommand::Delete { id } => Call::Delete(id),
    };
    run(
        &t.api()?,
        t.output,
        "/api/v1/tenants/",
        call,
        tenant_row,
        TENANT_HEADER,
    )
    .await
}

fn profile(gpus: Option<i32>, model: Option<String>) -> Value {
    match gpus {
        Some(g) => json!({"gpu_count": g, "gpu_model": model.unwrap_or_default()}),
        None => Value::Null,
    }
}

pub async fn pools(api: &Api, out: Output, what: PoolCommand) -> anyhow::Result<()> {
    let call = match what {
        PoolCommand::List { site } => Call::List(filters([("site", site)])),
        PoolCommand::Show { id } => Call::Show(id),
        PoolCommand::Create {
            id,
            site,
            kind,
            owner,
            gpus,
            gpu_model,
        } => Call::Create(
            json!({"id": id, "site_id": site, "kind": kind, "owner_tenant_id": owner,
                   "hardware_profile": profile(gpus, gpu_model)}),
        ),
        PoolCommand::Update {
            id,
            owner,
            gpus,
            gpu_model,
            clear_profile,
        } => {
            let mut body = json!({"clear_hardware_profile": clear_profile});
            if let Some(o) = owner {
                body["owner_tenant_id"] = json!(o);
            }
            if gpus.is_some() {
                body["hardware_profile"] = profile(gpus, gpu_model);
            }
            Call::Update(id, body)
        }
        PoolCommand::Delete { id } => Call::Delete(id),
    };
    run(api, out, "/api/v1/pools/", call, pool_row, POOL_HEADER).await
}
