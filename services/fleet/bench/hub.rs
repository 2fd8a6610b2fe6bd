use fleet_runtime::FleetConfig;

#[derive(clap::Args)]
pub struct HubBench {}

pub async fn run(_config: FleetConfig, _b: HubBench) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
