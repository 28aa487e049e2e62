// Test support: a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used)]

//! A process that writes to a store as fast as it can from many concurrent writers and prints
//! one line per acknowledged write, for the crash test (which kills it with SIGKILL):
//!
//! ```text
//! store-writer sqlite PATH [--writers N] [--round R]
//! store-writer etcd ENDPOINT PREFIX [--writers N] [--round R]
//! ```
//!
//! Output: `ready`, then `C key rev` per create and `U key rev n` per counter update.
//!
//! `store-writer script sqlite PATH [--compaction-step N]` instead runs the writes given as
//! JSON lines on standard input, for the model test's crash step (see `crash.rs`).

use parking_lot::Mutex;
use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use orrery_store::{Store, StoreError};

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let script = args.first().is_some_and(|a| a == "script");
    if script {
        args.remove(0);
    }
    let flag = |name: &str, default: usize| -> anyhow::Result<usize> {
        match args.iter().position(|a| a == name) {
            Some(i) => args
                .get(i + 1)
                .context("flag without a value")?
                .parse()
                .context("not a number"),
            None => Ok(default),
        }
    };
    let writers = flag("--writers", 64)?;
    let compaction_step = flag("--compaction-step", 500)?;
    let round = flag("--round", 0)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let store: Arc<dyn Store> = match args.first().map(String::as_str) {
            Some("sqlite") => {
                let path = args.get(1).context("sqlite PATH")?;
                let mut config = orrery_store_sqlite::SqliteConfig::new(path);
                config.compaction_step = compaction_step;
                Arc::new(orrery_store_sqlite::SqliteStore::open(config)?)
            }
            Some("etcd") => {
                let endpoint = args.get(1).context("etcd ENDPOINT PREFIX")?;
                let prefix = args.get(2).context("etcd ENDPOINT PREFIX")?;
                let config = orrery_store_etcd::EtcdConfig::new(vec![endpoint.clone()])
                    .with_prefix(prefix.clone());
                Arc::new(orrery_store_etcd::EtcdStore::connect(config).await?)
            }
            other => bail!("unknown backend {other:?}"),
        };
        if script {
            return orrery_store_testkit::crash::serve(store).await;
        }
        let out = Arc::new(Mutex::new(std::io::stdout()));
        let say = move |line: String| {
            let mut o = out.lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        };
        say("ready".into());
        let mut tasks = Vec::new();
        for w in 0..writers {
            let store = store.clone();
            let say = say.clone();
            tasks.push(tokio::spawn(async move {
                let counter = format!("/crash/counter/w{w}");
                for i in 0u64.. {
                    let key = format!("/crash/r{round}/w{w}/{i:08}");
                    let obj =
                        orrery_store_testkit::object(&format!("{i}"), "crash", &"x".repeat(200));
                    let created = store.create(&key, obj).await?;
                    say(format!("C {key} {}", created.metadata.resource_version));
                    if i % 4 == 0 {
                        let updated =
                            orrery_store::update_with(store.as_ref(), &counter, |mut o| {
                                let n: u64 = o.other["data"]["payload"]
                                    .as_str()
                                    .unwrap_or("0")
                                    .parse()
                                    .unwrap_or(0);
                                o.other.insert(
                                    "data".into(),
                                    serde_json::json!({"payload": (n + 1).to_string()}),
                                );
                                Ok(Some(o))
                            })
                            .await;
                        let updated = match updated {
                            Err(StoreError::NotFound { .. }) => {
                                store
                                    .create(
                                        &counter,
                                        orrery_store_testkit::object("counter", "crash", "1"),
                                    )
                                    .await?
                            }
                            other => other?,
                        };
                        let n = updated.other["data"]["payload"]
                            .as_str()
                            .unwrap_or("0")
                            .to_string();
                        say(format!(
                            "U {counter} {} {n}",
                            updated.metadata.resource_version
                        ));
                    }
                }
                Ok::<(), StoreError>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok(())
    })
}
