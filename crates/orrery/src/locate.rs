//! Where a command finds the control plane: one rule for every subcommand.
//!
//! `orrery up` and `orrery server` keep everything in a data directory (`--data-dir`, or
//! `ORRERY_DATA_DIR`, default `./orrery-data`): the admin kubeconfig, the certificates, the
//! store and, for `up`, the simulated clusters' admin address. A client command finds them
//! the same way, in this order:
//!
//! - its kubeconfig: `--kubeconfig`, else the data directory's `admin.kubeconfig` when
//!   `--data-dir` or `ORRERY_DATA_DIR` names one, else `$KUBECONFIG`, else
//!   `./orrery-data/admin.kubeconfig`;
//! - its data directory: `--data-dir` or `ORRERY_DATA_DIR`, else the directory of the
//!   kubeconfig above when it is a data directory's `admin.kubeconfig` (what `orrery up`
//!   tells you to export), else `./orrery-data`.
//!
//! So `export KUBECONFIG=D/admin.kubeconfig` (what `orrery up --data-dir D` prints) and
//! `export ORRERY_DATA_DIR=D` each make every command find `D`.

use std::path::{Path, PathBuf};

/// The data directory when nothing names one.
pub const DEFAULT_DATA_DIR: &str = "./orrery-data";
/// The admin kubeconfig's name in a data directory.
pub const ADMIN_KUBECONFIG: &str = "admin.kubeconfig";

/// The flags every client command takes to find the control plane.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Locate {
    /// The data directory of `orrery up` or `orrery server` (its admin.kubeconfig; for
    /// `up`, its simulated clusters).
    #[arg(long, env = "ORRERY_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// The admin kubeconfig (default: the data directory's admin.kubeconfig when
    /// --data-dir or ORRERY_DATA_DIR is set, else $KUBECONFIG, else
    /// ./orrery-data/admin.kubeconfig).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
}

impl Locate {
    /// The kubeconfig to use.
    pub fn kubeconfig(&self) -> PathBuf {
        resolve_kubeconfig(
            self.kubeconfig.clone(),
            self.data_dir.clone(),
            std::env::var_os("KUBECONFIG"),
        )
    }

    /// The data directory to use.
    pub fn data_dir(&self) -> PathBuf {
        resolve_data_dir(self.data_dir.clone(), &self.kubeconfig())
    }
}

fn resolve_kubeconfig(
    explicit: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    env: Option<std::ffi::OsString>,
) -> PathBuf {
    explicit
        .or_else(|| data_dir.map(|d| d.join(ADMIN_KUBECONFIG)))
        .or_else(|| {
            env.filter(|v| !v.is_empty())
                .and_then(|v| std::env::split_paths(&v).next())
        })
        .unwrap_or_else(|| Path::new(DEFAULT_DATA_DIR).join(ADMIN_KUBECONFIG))
}

fn resolve_data_dir(explicit: Option<PathBuf>, kubeconfig: &Path) -> PathBuf {
    explicit
        .or_else(|| {
            (kubeconfig.file_name()? == ADMIN_KUBECONFIG)
                .then(|| kubeconfig.parent().map(Path::to_path_buf))
                .flatten()
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        p
                    }
                })
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn the_kubeconfig_comes_from_the_flag_then_the_data_dir_then_the_environment() {
        assert_eq!(
            resolve_kubeconfig(Some(p("k")), Some(p("d")), Some("e".into())),
            p("k")
        );
        assert_eq!(
            resolve_kubeconfig(None, Some(p("d")), Some("e".into())),
            p("d/admin.kubeconfig")
        );
        assert_eq!(resolve_kubeconfig(None, None, Some("e:f".into())), p("e"));
        assert_eq!(
            resolve_kubeconfig(None, None, Some("".into())),
            p("./orrery-data/admin.kubeconfig")
        );
        assert_eq!(
            resolve_kubeconfig(None, None, None),
            p("./orrery-data/admin.kubeconfig")
        );
    }

    #[test]
    fn the_data_dir_is_the_exported_kubeconfigs_directory() {
        assert_eq!(
            resolve_data_dir(None, &p("/srv/d2/admin.kubeconfig")),
            p("/srv/d2")
        );
        assert_eq!(resolve_data_dir(None, &p("admin.kubeconfig")), p("."));
        assert_eq!(
            resolve_data_dir(Some(p("x")), &p("/srv/d2/admin.kubeconfig")),
            p("x")
        );
        // A kubeconfig of another name says nothing about a data directory.
        assert_eq!(
            resolve_data_dir(None, &p("/home/u/.kube/config")),
            p("./orrery-data")
        );
    }
}
