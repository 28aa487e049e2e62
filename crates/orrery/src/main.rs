//! `orrery`: the one binary. Each subcommand lives in its own module; this file only parses
//! the command line and sets up logging.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod agent;
mod backup;
mod bundle;
mod ca;
mod config;
mod credentials;
mod dns;
mod export;
mod history_from;
mod interpret;
mod join;
mod kubeconfig;
mod locate;
mod push;
mod rollout;
mod scrub;
mod server;
mod sim;
mod status;
mod token;
mod up;
mod up_ha;
mod user;

/// Keeps transparent huge pages off this process's memory. mimalloc asks for them on its
/// segments, and a 2 MiB page is resident whole once any of it is touched: a server's heap of
/// many small objects then holds far more than it uses (7 % of the leader's and 13 % of a
/// follower's resident memory at 3,000 members, with no change in latency; docs/benchmarks.md).
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(error = %e, "could not turn transparent huge pages off; going on");
    }
}

/// mimalloc: per-thread free lists suit a server that builds and drops JSON trees on every
/// core (see docs/benchmarks.md for what it changed).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "orrery",
    version,
    about = "Orrery: a cross-cluster resource orchestrator"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a control plane and a fleet of simulated member clusters on this machine.
    Up(up::UpArgs),
    /// Run the control plane: the Kubernetes-compatible API over the store.
    Server(Box<server::ServerArgs>),
    /// Run a member cluster's agent (pull mode): real, simulated, or a simulated fleet.
    Agent(Box<agent::AgentArgs>),
    /// Bring a member into the fleet: push mode (the server reaches its API), or --pull (the
    /// agent's bundle applied to it, or printed with --print).
    Join(Box<join::JoinArgs>),
    /// Unregister a member cluster and remove what `orrery join` put in it.
    Unjoin(join::UnjoinArgs),
    /// Bootstrap tokens for agents.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Users: a kubeconfig with a client certificate signed by Orrery's CA.
    #[command(subcommand)]
    User(user::UserCommand),
    /// The certificate authority: its status, and its rotation (stage, then switch).
    #[command(subcommand)]
    Ca(ca::CaCommand),
    /// A kubeconfig for a member cluster's API through the cluster proxy.
    Kubeconfig(kubeconfig::KubeconfigArgs),
    /// An exec credential plugin for ClusterProfile consumers (KEP-4322): a short-lived token
    /// for one cluster's proxy (docs/inventory.md).
    Credentials(credentials::CredentialsArgs),
    /// The fleet in the terminal: clusters, water levels, workloads and where they run.
    Status(status::StatusArgs),
    /// A workload's progressive rollout: status, pause, resume, abort, approve, history, undo.
    Rollout(rollout::RolloutArgs),
    /// Run an operation of Karmada's resource interpreter on local files (a
    /// ResourceInterpreterCustomization's scripts, or Orrery's built-in rules).
    Interpret(Box<interpret::InterpretArgs>),
    /// The simulated clusters of `orrery up`: list them, inject faults, change their load.
    Sim(sim::SimArgs),
    /// Remove from a stopped server's store what is no longer current (after turning on
    /// encryption at rest: docs/security.md).
    Scrub(scrub::ScrubArgs),
    /// Write a consistent snapshot of a running server's store (and its certificate
    /// authority) to a file.
    Backup(backup::BackupArgs),
    /// Make a data directory a server starts from out of a backup.
    Restore(backup::RestoreArgs),
}

/// The log filter when `ORRERY_LOG` sets none.
fn default_filter(command: &Command) -> &'static str {
    // kube-rs warns "Server cert bypassed" when an agent fetches the server's CA before
    // checking it against the hash its token pins: that is by design (the agent logs it at
    // debug), so the warning is not shown unless asked for.
    match command {
        // `orrery up`'s agents run in the control plane's process: what they would say at
        // info (registered, connected) the server says too, so only their warnings show
        // (ORRERY_LOG=info shows all).
        Command::Up(_) => {
            "info,orrery_agent=warn,orrery_sim=warn,orrery_sim::admin=info,kube_client::client::tls=error"
        }
        // A plugin's output is its answer; what it says goes to stderr, warnings only.
        Command::Credentials(_) => "warn,kube_client::client::tls=error",
        _ => "info,kube_client::client::tls=error",
    }
}

fn init_logging(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_env("ORRERY_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours on a terminal only: not in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<()> {
    let command = Cli::command();
    let env = |k: &str| std::env::var(k).ok();
    let expanded = match config::expand(std::env::args_os().collect(), &command, &env) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let matches = command.clone().get_matches_from(expanded.args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some((name, sub)) = matches.subcommand()
        && config::COMMANDS.contains(&name)
        && sub.get_flag("print_config")
        && let Some(cmd) = command.find_subcommand(name)
    {
        print!("{}", config::print(cmd, sub, &expanded.sources));
        return Ok(());
    }
    init_logging(cli.log_format, default_filter(&cli.command));
    no_huge_pages();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(args).await,
            Command::Server(args) => server::run(*args).await,
            Command::Agent(args) => agent::run(*args).await,
            Command::Token(cmd) => token::run(cmd).await,
            Command::User(cmd) => user::run(cmd).await,
            Command::Ca(cmd) => ca::run(cmd).await,
            Command::Kubeconfig(args) => kubeconfig::run(args),
            Command::Credentials(args) => credentials::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Rollout(args) => rollout::run(args).await,
            Command::Interpret(args) => interpret::run(*args),
            Command::Join(args) => join::run(*args).await,
            Command::Unjoin(args) => join::unjoin(args).await,
            Command::Sim(args) => sim::run(args).await,
            Command::Scrub(args) => scrub::run(args).await,
            Command::Backup(args) => backup::backup(args).await,
            Command::Restore(args) => backup::restore(args).await,
        }
    })
}

#[cfg(test)]
mod tests {
    /// Clap checks its own rules (unique names, conflicts naming flags that exist) only when
    /// a command is used: every command at once here.
    #[test]
    fn the_flags_hold_together() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
