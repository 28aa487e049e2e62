//! `orrery user create`: a kubeconfig for a person, with a client certificate signed by
//! Orrery's CA (CN = the user, O = each group, as Kubernetes reads them). The key is made here
//! and never sent; the server signs a request for it. What the user may do is RBAC's to say:
//! bind a role to the name or a group (`kubectl create rolebinding ... --user NAME`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Write a kubeconfig for a new user (a client certificate; no roles until bound).
    Create(CreateArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The user name (the certificate's CommonName).
    pub name: String,
    /// A group the user is in (repeatable; the certificate's Organization).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// How long the certificate is valid (e.g. 24h, 30d). Certificates cannot be revoked:
    /// keep this short and issue again.
    #[arg(long, default_value = "24h")]
    pub ttl: String,
    /// Where to write the kubeconfig (default: ./<name>.kubeconfig).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

pub async fn run(cmd: UserCommand) -> anyhow::Result<()> {
    let UserCommand::Create(args) = cmd;
    let path = args.locate.kubeconfig();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let server = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .context("the admin kubeconfig names no server")?;
    let (key, csr) = orrery_apiserver::pki::key_and_csr().context("making a key")?;
    let v = crate::token::admin_post(
        &path,
        "/agent/v1/users",
        &serde_json::json!({
            "name": args.name, "groups": args.groups, "ttl": args.ttl, "csr": csr,
        }),
    )
    .await?;
    let cert = v["certificate"]
        .as_str()
        .context("the server sent no certificate")?;
    let ca = v["ca"].as_str().context("the server sent no CA")?;
    let out = args
        .output
        .unwrap_or_else(|| PathBuf::from(format!("{}.kubeconfig", args.name)));
    orrery_apiserver::pki::write_kubeconfig(
        &out,
        &orrery_apiserver::pki::cert_kubeconfig(&server, ca, &args.name, cert, &key),
    )
    .with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote {} for user {:?} (groups {:?}), valid until {}; it may do nothing until a role is bound to it",
        out.display(),
        args.name,
        args.groups,
        v["expires"].as_str().unwrap_or("?")
    );
    Ok(())
}
