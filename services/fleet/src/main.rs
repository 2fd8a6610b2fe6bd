//! `fleet`: one binary, a subcommand per service. It parses arguments,
//! loads configuration, starts logging, builds the shutdown signal and calls
//! the service's `run`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fleet::config::FleetConfig;
use fleet::{bench, connector_cmd, migrate};
use fleet_runtime::Shutdown;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod consumers_cmd;
mod dev_cmd;

#[derive(Parser)]
#[command(
    name = "fleet",
    version,
    about = "Fleet status mesh: the control plane that tells the truth about every machine"
)]
struct Cli {
    /// Configuration file (TOML); environment `FLEET__SECTION__KEY` overrides it.
    #[arg(long, global = true, env = "FLEET_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the hub: observations in, derived status out.
    Hub,
    /// Apply the database migrations (creates the database if missing).
    Migrate,
    /// Benchmarks against the local NATS and PostgreSQL.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// Print the effective configuration (secrets redacted).
    Config,
    /// Exit 0 when `http://<addr><path>` answers 2xx within 2 s (for
    /// container healthchecks: the image has no curl).
    Probe {
        /// `host:port/path`, for example `127.0.0.1:9401/readyz`.
        target: String,
    },
    /// Run the operator HTTP API.
    Api,
    /// API tokens: create (printed once), list, revoke.
    Token {
        #[command(subcommand)]
        what: fleet::api_cmd::TokenCommand,
    },
    /// Run the placer: GPU allocations over NATS, capacity from STATUS.
    Placer,
    /// Run the node agent gateway, or issue a join token.
    Gateway {
        #[command(subcommand)]
        what: Option<consumers_cmd::GatewayCommand>,
    },
    /// Run the Radar outbound projection.
    Radar,
    /// Run the workflow service: jobs over devices (Image and Unimage Node
    /// against Ironic), work from the JOBS stream.
    Workflow,
    /// Simulated node agents (the agent protocol, no hardware).
    Sim {
        #[command(subcommand)]
        what: consumers_cmd::SimCommand,
    },
    /// Run a connector: poll a source system, publish its observations.
    Connector {
        #[command(subcommand)]
        which: connector_cmd::ConnectorCommand,
    },
    /// Run the whole mesh in this process against simulated external systems.
    Dev(dev_cmd::DevArgs),
    /// Operator CLI: devices through the API.
    Devices {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::cli::DevicesCommand,
    },
    /// Operator CLI: impairment events through the API.
    Impairments {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::cli::ImpairmentsCommand,
    },
    /// Operator CLI: GPU allocations through the API (the placer books them).
    Allocations {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::cli::AllocationsCommand,
    },
    /// Operator CLI: sites through the API (the hub writes them).
    Sites {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::inventory_cmd::SitesCommand,
    },
    /// Operator CLI: tenants through the API (the hub writes them).
    Tenants {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::inventory_cmd::TenantsCommand,
    },
    /// Operator CLI: pools, their hardware profiles and capacity through the API.
    Pools {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::cli::PoolsCommand,
    },
    /// Operator CLI: jobs through the API (the workflow service runs them).
    Jobs {
        #[command(flatten)]
        target: fleet::cli::Target,
        #[command(subcommand)]
        what: fleet::cli::JobsCommand,
    },
}

/// Errors print as one line with their causes (`{:#}`), never a
/// backtrace, and exit with status 1.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = json_output(&cli);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if json {
                // Under `-o json` the error is JSON too, with the API's
                // code when the API gave one.
                let code = e
                    .downcast_ref::<fleet::cli::ApiError>()
                    .map(|a| a.code.clone());
                let body =
                    serde_json::json!({"error": {"code": code, "message": format!("{e:#}")}});
                eprintln!("{body}");
            } else {
                eprintln!("error: {e:#}");
            }
            std::process::ExitCode::from(1)
        }
    }
}

/// Whether the command asked for JSON output (`-o json`).
fn json_output(cli: &Cli) -> bool {
    let target = match &cli.command {
        Command::Devices { target, .. }
        | Command::Impairments { target, .. }
        | Command::Allocations { target, .. }
        | Command::Pools { target, .. }
        | Command::Sites { target, .. }
        | Command::Tenants { target, .. }
        | Command::Jobs { target, .. } => target,
        _ => return false,
    };
    target.output == fleet::cli::Output::Json
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut config = FleetConfig::load(cli.config.as_deref())?;
    if matches!(cli.command, Command::Dev(_)) && std::env::var_os("RUST_LOG").is_none() {
        config.log.filter = "warn".into();
    }
    fleet_runtime::init_tracing(&config.log.format, &config.log.filter);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        match cli.command {
            Command::Hub => {
                let (_trigger, shutdown) = Shutdown::from_signals();
                fleet_hub::run(config.common(), config.hub, shutdown).await
            }
            Command::Migrate => migrate(&config).await,
            Command::Api => fleet::api_cmd::api(config).await,
            Command::Token { what } => fleet::api_cmd::token(config, what).await,
            Command::Connector { which } => {
                let (_trigger, shutdown) = Shutdown::from_signals();
                connector_cmd::run(config, which, shutdown).await
            }
            Command::Placer => consumers_cmd::placer(config).await,
            Command::Gateway { what } => consumers_cmd::gateway(config, what).await,
            Command::Radar => consumers_cmd::radar(config).await,
            Command::Workflow => consumers_cmd::workflow(config).await,
            Command::Sim { what } => consumers_cmd::sim(config, what).await,
            Command::Bench { what } => bench::run(config, what).await,
            Command::Dev(args) => dev_cmd::run(config, args).await,
            Command::Devices { target, what } => fleet::cli::devices(target, what).await,
            Command::Impairments { target, what } => fleet::cli::impairments(target, what).await,
            Command::Allocations { target, what } => fleet::cli::allocations(target, what).await,
            Command::Pools { target, what } => fleet::cli::pools(target, what).await,
            Command::Sites { target, what } => fleet::inventory_cmd::sites(target, what).await,
            Command::Tenants { target, what } => fleet::inventory_cmd::tenants(target, what).await,
            Command::Jobs { target, what } => fleet::cli::jobs(target, what).await,
            Command::Probe { target } => fleet::probe(&target).await,
            Command::Config => {
                let mut c = config.clone();
                c.database.url = fleet_store::redact(&c.database.url);
                println!("{}", serde_json::to_string_pretty(&c)?);
                Ok(())
            }
        }
    });
    // Flush exported spans before the process ends.
    fleet_runtime::shutdown_tracing();
    result
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every subcommand says what it is.
    #[test]
    fn every_cli_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = vec![];
        walk(&super::Cli::command(), "fleet", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
