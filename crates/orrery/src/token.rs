//! `orrery token create`: a bootstrap token for a member's agent.

use anyhow::Context;

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Print a bootstrap token that lets an agent register one cluster (or, with a name
    /// ending in `*`, any cluster whose name starts with what precedes it).
    Create(CreateArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The cluster the token may register.
    #[arg(long)]
    pub cluster: String,
    /// How long the token is valid (e.g. 24h, 90m; 0 for no expiry).
    #[arg(long, default_value = "24h")]
    pub ttl: String,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

/// POSTs `body` to an admin endpoint of the server the admin kubeconfig names; the JSON
/// answer.
pub async fn admin_post(
    kubeconfig: &std::path::Path,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let client = orrery_client::from_kubeconfig(kubeconfig)
        .await
        .with_context(|| format!("using the admin kubeconfig {}", kubeconfig.display()))?;
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body)?)?;
    let text = client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("the server refused: {}", s.message),
        other => anyhow::anyhow!("reaching the server: {other}"),
    })?;
    Ok(serde_json::from_str(&text)?)
}

pub async fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create(args) => {
            let path = args.locate.kubeconfig();
            let v = admin_post(
                &path,
                "/agent/v1/tokens",
                &serde_json::json!({ "cluster": args.cluster, "ttl": args.ttl }),
            )
            .await?;
            let token = v["token"].as_str().context("the server sent no token")?;
            println!("{token}");
            Ok(())
        }
    }
}
