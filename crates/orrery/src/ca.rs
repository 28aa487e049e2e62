//! `orrery ca`: the installation's certificate authority, and its rotation in two steps
//! (`stage`, then `switch`; docs/operating.md "Rotating the CA").

use anyhow::Context;

#[derive(Debug, clap::Subcommand)]
pub enum CaCommand {
    /// What the server signs with, what it has staged, and which clusters' agents trust
    /// the bundle it hands out.
    Status(CaArgs),
    /// Step 1: make a new CA and trust it beside the current one (nothing is signed with it
    /// yet). Agents learn the bundle at their next --ca-refresh-interval.
    Stage(CaArgs),
    /// Step 2: sign with the staged CA from now on and stop trusting the old one. Refused
    /// while a cluster's agent does not trust the staged CA yet, unless --force.
    Switch(SwitchArgs),
}

#[derive(Debug, clap::Args)]
pub struct CaArgs {
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

#[derive(Debug, clap::Args)]
pub struct SwitchArgs {
    /// Switch although some clusters' agents do not trust the staged CA (each then needs a
    /// new bootstrap token to register again).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

async fn admin_get(path: &std::path::Path, uri: &str) -> anyhow::Result<serde_json::Value> {
    let client = orrery_client::from_kubeconfig(path)
        .await
        .with_context(|| format!("using the admin kubeconfig {}", path.display()))?;
    let req = http::Request::get(uri).body(Vec::new())?;
    let text = client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("the server refused: {}", s.message),
        other => anyhow::anyhow!("reaching the server: {other}"),
    })?;
    Ok(serde_json::from_str(&text)?)
}

fn short(v: &serde_json::Value) -> String {
    v.as_str()
        .map(|h| h.chars().take(16).collect())
        .unwrap_or_else(|| "none".into())
}

fn print(v: &serde_json::Value) {
    println!("signing CA   {}", short(&v["signing"]));
    println!("staged CA    {}", short(&v["staged"]));
    println!("bundle       {}", short(&v["bundle"]));
    let c = &v["clusters"];
    let list = |k: &str| -> Vec<String> {
        c[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    println!(
        "clusters     {} trust the bundle",
        c["trusting"].as_u64().unwrap_or(0)
    );
    let (behind, away) = (list("notYet"), list("notConnected"));
    if !behind.is_empty() {
        println!("  not yet (connected): {}", behind.join(", "));
    }
    if !away.is_empty() {
        println!("  not connected:       {}", away.join(", "));
    }
}

pub async fn run(cmd: CaCommand) -> anyhow::Result<()> {
    match cmd {
        CaCommand::Status(a) => {
            print(&admin_get(&a.locate.kubeconfig(), "/agent/v1/ca").await?);
        }
        CaCommand::Stage(a) => {
            let v = crate::token::admin_post(
                &a.locate.kubeconfig(),
                "/agent/v1/ca/stage",
                &serde_json::json!({}),
            )
            .await?;
            if v["made"].as_bool() == Some(true) {
                println!("staged a new CA: trusted beside the current one, signing nothing yet");
            } else {
                println!("a CA was already staged; kept it");
            }
            print(&v);
        }
        CaCommand::Switch(a) => {
            let v = crate::token::admin_post(
                &a.locate.kubeconfig(),
                "/agent/v1/ca/switch",
                &serde_json::json!({ "force": a.force }),
            )
            .await?;
            println!("switched: the staged CA signs from now on, the old one is trusted no more");
            print(&v);
        }
    }
    Ok(())
}
