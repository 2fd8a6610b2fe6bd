//! `fleet placer`, `fleet gateway [join-token ...]`, `fleet radar` and
//! `fleet sim agents`: the status consumers and the simulated node agents.

use anyhow::Context;
use clap::Subcommand;
use fleet::config::FleetConfig;
use fleet_bus::Subjects;
use fleet_domain::Trust;
use fleet_runtime::Shutdown;

#[derive(Subcommand)]
pub enum GatewayCommand {
    /// Issue a join token for node agents (printed once, stored hashed).
    JoinToken {
        /// The site.
        #[arg(long)]
        site: String,
        /// The pool new devices join (its kind decides their role).
        #[arg(long)]
        pool: Option<String>,
        /// platform, tenant-owned or tenant-controlled.
        #[arg(long, default_value = "platform")]
        trust: String,
        /// The owning tenant (tenant-owned and tenant-controlled devices).
        #[arg(long)]
        owner: Option<String>,
        /// What it is for (shown by `list`).
        #[arg(long, default_value = "")]
        description: String,
    },
}

#[derive(Subcommand)]
pub enum SimCommand {
    /// Run N simulated node agents against the gateway until interrupted:
    /// join, open a session, heartbeat, close cleanly on exit.
    Agents {
        /// How many simulated agents.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// A join token; without one, a token is issued for --site/--pool.
        #[arg(long, env = "FLEET_JOIN_TOKEN")]
        join_token: Option<String>,
        /// The site.
        #[arg(long, default_value = "s1")]
        site: String,
        /// The pool.
        #[arg(long)]
        pool: Option<String>,
        /// GPUs each simulated machine reports.
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Host names and hardware identifiers derive from it (the same
        /// prefix and number is the same machine).
        #[arg(long, default_value = "sim")]
        prefix: String,
    },
}

pub async fn placer(config: FleetConfig) -> anyhow::Result<()> {
    let (_trigger, shutdown) = Shutdown::from_signals();
    fleet_placer::run(config.common(), config.placer, shutdown).await
}

pub async fn workflow(config: FleetConfig) -> anyhow::Result<()> {
    let (_trigger, shutdown) = Shutdown::from_signals();
    fleet_workflow::run(config.common(), config.workflow, shutdown).await
}

pub async fn radar(config: FleetConfig) -> anyhow::Result<()> {
    let (_trigger, shutdown) = Shutdown::from_signals();
    fleet_radar::run(config.common(), config.radar, shutdown).await
}

pub async fn gateway(config: FleetConfig, what: Option<GatewayCommand>) -> anyhow::Result<()> {
    match what {
        None => {
            let (_trigger, shutdown) = Shutdown::from_signals();
            fleet_gateway::run(config.common(), config.gateway, shutdown).await
        }
        Some(GatewayCommand::JoinToken {
            site,
            pool,
            trust,
            owner,
            description,
        }) => {
            let trust = Trust::parse(&trust).context("--trust")?;
            let db = fleet_store::connect(&config.database.url, 2).await?;
            fleet_store::check_schema(&db).await?;
            let token = fleet_gateway::issue_join_token(
                &db,
                &site,
                pool.as_deref(),
                trust,
                owner.as_deref(),
                &description,
            )
            .await
            .context("issuing a join token (do the site, pool and tenant exist?)")?;
            println!("{token}");
            Ok(())
        }
    }
}

pub async fn sim(config: FleetConfig, what: SimCommand) -> anyhow::Result<()> {
    match what {
        SimCommand::Agents {
            count,
            join_token,
            site,
            pool,
            gpus,
            prefix,
        } => {
            let join_token = match join_token {
                Some(t) => t,
                None => {
                    let db = fleet_store::connect(&config.database.url, 2).await?;
                    fleet_store::check_schema(&db).await?;
                    fleet_gateway::issue_join_token(&db, &site, pool.as_deref(), Trust::Platform, None, "fleet sim agents")
                        .await
                        .context("issuing a join token for the simulated agents (do the site and pool exist?)")?
                }
            };
            let nats = fleet_bus::connect_now(&config.nats, "fleet-sim").await?;
            let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
            let (_trigger, shutdown) = Shutdown::from_signals();
            let opts = fleet_agent_sim::SimOptions {
                count,
                join_token,
                prefix,
                gpus,
                concurrency: 32,
            };
            fleet_agent_sim::run_agents(nats, subjects, opts, shutdown).await;
            Ok(())
        }
    }
}
