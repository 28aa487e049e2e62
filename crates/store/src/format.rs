//! The format of what a store holds, recorded in the store itself (the same key on every
//! backend: a SQLite file and an etcd keyspace alike), so that a build knows whether it reads
//! what an earlier or a later one wrote.
//!
//! ```text
//!   no record, no object ──────────────► record CURRENT (a new store)
//!   no record, objects   ── version 0 ─┐ (written before formats were recorded)
//!   record v < CURRENT  ───────────────┴► each step v → v+1: run it, then record it (CAS)
//!   record v = CURRENT  ───────────────► nothing
//!   record v > CURRENT  ───────────────► refused: a later build wrote it
//! ```
//!
//! Steps are idempotent and recorded only once done, so a crash mid-step runs it again; the
//! record is written with a compare-and-swap, so replicas starting together on one etcd run
//! each step's record once (a step may run twice, which idempotence allows). Each record
//! keeps the list of migrations made, with the build that made them.

use std::future::Future;
use std::pin::Pin;

use orrery_api::{Object, Time};
use serde::{Deserialize, Serialize};

use crate::{ListOptions, Store, StoreError};

/// Where the record lives (a key space the Kubernetes API does not serve).
pub const KEY: &str = "/internal/format";
pub const API_VERSION: &str = "internal.orrery.io/v1";
pub const KIND: &str = "StoreFormat";

/// The format this build writes. Raise it with a step in [`STEPS`] and a fixture of the
/// old format under `tests/fixtures/`.
pub const CURRENT: u32 = 1;

/// One migration made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Migrated {
    pub from: u32,
    pub to: u32,
    pub at: Time,
    /// The build that made it.
    pub by: String,
    pub what: String,
}

/// The record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Format {
    pub version: u32,
    /// The build that last wrote the record.
    pub written_by: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<Migrated>,
}

/// What [`ensure`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A new store: the current format recorded.
    Created,
    /// Already current.
    Current,
    /// Brought up from an older format.
    Migrated(Vec<Migrated>),
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "the store holds format version {found} (written by {by}), newer than this build \
         reads ({CURRENT}): run that version or a later one (downgrades are not supported; \
         restore a backup taken before the upgrade)"
    )]
    Newer { found: u32, by: String },
    #[error("the store's format record does not parse: {0}")]
    Unreadable(String),
    #[error("migrating the store from format {from} to {to}: {source}")]
    Step {
        from: u32,
        to: u32,
        source: StoreError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

type StepFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// A step from `from` to `from + 1`.
#[derive(Debug)]
pub struct Step {
    pub from: u32,
    pub what: &'static str,
    pub run: for<'a> fn(&'a dyn Store) -> StepFuture<'a>,
}

/// Every step, in order.
pub const STEPS: &[Step] = &[Step {
    from: 0,
    // Builds before formats were recorded wrote what this one reads as it is (older content
    // digests are read as current where they are met): only the record is new.
    what: "recorded the format of a store written before formats were recorded",
    run: |_| Box::pin(async { Ok(()) }),
}];

fn read(o: &Object) -> Result<Format, FormatError> {
    o.spec
        .clone()
        .ok_or_else(|| FormatError::Unreadable("no spec".into()))
        .and_then(|s| serde_json::from_value(s).map_err(|e| FormatError::Unreadable(e.to_string())))
}

fn object(f: &Format) -> Object {
    let mut o = Object::new(API_VERSION, KIND).with_name("format");
    o.spec = serde_json::to_value(f).ok();
    o
}

/// Checks the store's format and brings an older one up to [`CURRENT`]; `build` names this
/// build in the record (`orrery 0.1.0`).
pub async fn ensure(store: &dyn Store, build: &str) -> Result<Outcome, FormatError> {
    ensure_with(store, build, STEPS, CURRENT).await
}

/// [`ensure`] with the given steps and current version (tests).
pub async fn ensure_with(
    store: &dyn Store,
    build: &str,
    steps: &[Step],
    current: u32,
) -> Result<Outcome, FormatError> {
    let mut made = Vec::new();
    loop {
        let (found, revision) = match store.get(KEY).await {
            Ok(o) => (Some(read(&o)?), o.revision()),
            Err(StoreError::NotFound { .. }) => (None, None),
            Err(e) => return Err(e.into()),
        };
        let mut format = match found {
            Some(f) => f,
            None => {
                let page = store
                    .list("/registry/", &ListOptions::default().with_limit(1))
                    .await?;
                if page.items.is_empty() {
                    let f = Format {
                        version: current,
                        written_by: build.to_string(),
                        migrations: Vec::new(),
                    };
                    match store.create(KEY, object(&f)).await {
                        Ok(_) => return Ok(Outcome::Created),
                        // Another replica recorded it first: read it.
                        Err(StoreError::AlreadyExists { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Format {
                    version: 0,
                    written_by: "a build before formats were recorded".into(),
                    migrations: Vec::new(),
                }
            }
        };
        if format.version > current {
            return Err(FormatError::Newer {
                found: format.version,
                by: format.written_by,
            });
        }
        if format.version == current {
            return Ok(if made.is_empty() {
                Outcome::Current
            } else {
                Outcome::Migrated(made)
            });
        }
        let from = format.version;
        let Some(step) = steps.iter().find(|s| s.from == from) else {
            return Err(FormatError::Unreadable(format!(
                "no migration from format {from} in this build"
            )));
        };
        (step.run)(store)
            .await
            .map_err(|source| FormatError::Step {
                from,
                to: from + 1,
                source,
            })?;
        let m = Migrated {
            from,
            to: from + 1,
            at: Time::now(),
            by: build.to_string(),
            what: step.what.to_string(),
        };
        format.version = from + 1;
        format.written_by = build.to_string();
        format.migrations.push(m.clone());
        let written = match revision {
            Some(rev) => store.update(KEY, object(&format), Some(rev)).await,
            None => store.create(KEY, object(&format)).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(from, to = from + 1, what = step.what, "migrated the store");
                made.push(m);
            }
            // Another replica recorded this step: read what it wrote.
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
