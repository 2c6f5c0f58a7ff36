//! `clb-host emulator`: serves the local Azure emulator until killed.

use super::args::EXIT_OK;
use anyhow::Context as _;
use clap::Args;
use std::io::Write;

/// Where the emulator listens and which resource group it emulates.
#[derive(Args)]
pub(super) struct EmulatorArgs {
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub(super) listen: std::net::SocketAddr,
    #[arg(long, default_value = "00000000-0000-0000-0000-000000000000")]
    pub(super) subscription: String,
    #[arg(long, default_value = "rg")]
    pub(super) resource_group: String,
    #[arg(long, default_value = "eastus")]
    pub(super) location: String,
    /// The VNet's resource group; default: the resource group.
    #[arg(long)]
    pub(super) vnet_resource_group: Option<String>,
    #[arg(long, default_value = "vnet")]
    pub(super) vnet: String,
    #[arg(long, default_value = clb_azure::DEFAULT_SERVICE_GATEWAY)]
    pub(super) service_gateway: String,
    /// Items per page of the services and addressLocations lists.
    #[arg(long, default_value_t = 100)]
    pub(super) page_size: usize,
    /// List IPv6 locations and addresses in upper case, as NRP may.
    #[arg(long)]
    pub(super) echo_ipv6_upper: bool,
    /// ARM's subscription write bucket (PUT, DELETE, POST): tokens when full.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) arm_write_burst: u32,
    /// Write tokens ARM adds a second.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) arm_write_refill_per_second: u32,
    /// ARM's subscription read bucket (GET, lists): tokens when full.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) arm_read_burst: u32,
    /// Read tokens ARM adds a second.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) arm_read_refill_per_second: u32,
    /// Write tokens another client of the subscription spends a second.
    #[arg(long, default_value_t = 0)]
    pub(super) arm_other_client_writes_per_second: u32,
    /// Do not throttle as ARM does (every call is answered, with no remaining-tokens headers).
    #[arg(long)]
    pub(super) no_arm_limits: bool,
}

pub(super) fn emulator(args: EmulatorArgs, out: &mut dyn Write) -> anyhow::Result<u8> {
    use clb_emulator::{ArmLimits, BucketLimits, Emulator, EmulatorConfig, EmulatorServer};
    let scope = clb_azure::Scope {
        vnet_resource_group: args.vnet_resource_group.unwrap_or_else(|| args.resource_group.clone()),
        subscription: args.subscription,
        resource_group: args.resource_group,
        location: args.location,
        vnet: args.vnet,
        service_gateway: args.service_gateway,
    };
    let config = EmulatorConfig {
        page_size: args.page_size.max(1),
        echo_ipv6_upper: args.echo_ipv6_upper,
        arm_limits: (!args.no_arm_limits).then_some(ArmLimits {
            writes: BucketLimits { burst: args.arm_write_burst, per_second: args.arm_write_refill_per_second },
            reads: BucketLimits { burst: args.arm_read_burst, per_second: args.arm_read_refill_per_second },
            other_client_writes_per_second: args.arm_other_client_writes_per_second,
            report_remaining: true,
        }),
        ..Default::default()
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        let emulator = std::sync::Arc::new(Emulator::with_config(scope, config));
        let server = EmulatorServer::start(emulator, args.listen).await?;
        writeln!(out, "listening on {}", server.url())?;
        out.flush()?;
        std::future::pending::<()>().await;
        Ok(EXIT_OK)
    })
}
