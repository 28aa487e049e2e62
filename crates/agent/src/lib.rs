//! Orrery's member agent (`orrery agent`): it runs beside a member cluster, dials in to the
//! server (the server never needs a route to the member), applies that cluster's Works to a
//! backend and reports back.
//!
//! - [`agent`]: registration, the Works loop, heartbeats and status reports, and the
//!   behaviour while the server is away;
//! - [`backend`]: the member itself, a real Kubernetes API ([`backend::kube`]) or another
//!   Orrery server ([`backend::orrery`]); the simulated cluster, its fleets and its
//!   fault-injection endpoint are the `orrery-sim` crate, a [`backend::Backend`] from outside;
//! - [`health`]: the probes and metrics of an agent run in its member;
//! - [`state`]: what an agent keeps (a file, or a Secret in its member); [`transport`]: its requests to the server.

pub mod agent;
pub mod backend;
pub mod backoff;
pub mod health;
pub mod state;
pub mod stats;
pub mod transport;

pub use agent::{AgentConfig, AgentError, Stopped, run};
pub use orrery_api::cluster::ClusterFacts;

/// Most status items one report carries (the server's batch limit).
pub const MAX_BATCH: usize = 1000;
