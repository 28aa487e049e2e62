//! Orrery's Kubernetes-compatible API server: the Kubernetes REST API over the store, so that
//! stock `kubectl` and client libraries work against Orrery unchanged.
//!
//! - [`app`]: the composition root, `App`, which every handler takes; [`router`]: requests
//!   to their surface;
//! - [`rest`]: the verbs (get, list, watch, create, update, patch, delete, subresources);
//! - [`discovery`], [`openapi`]: what clients read to learn the API;
//! - [`schema`], [`patch`], [`strategy`], [`crd`]: validation and patching;
//! - [`auth`]: identities and bearer tokens; [`rbac`]: authorization; [`table`]: `kubectl get`
//!   output.

// The OpenAPI document of the DRO-DS endpoints is one large `json!` literal.
#![recursion_limit = "512"]

pub mod admission;
pub mod agent_api;
pub mod app;
pub mod auth;
pub mod ca;
pub mod crd;
pub mod discovery;
pub mod dro;
pub mod error;
pub mod fairness;
pub mod http;
pub mod identity;
pub mod impersonation;
pub mod managed;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod pipeline;
pub mod proxy;
pub mod resources;
pub mod rest;
pub mod router;
pub mod routes;
pub mod schema;
pub mod strategy;
pub mod table;
pub mod trace;
pub mod tunnels;
pub mod ui;

pub use app::{ApiConfig, App};
pub mod audit;
pub mod encryption;
pub mod openapi_v2pb;
pub mod pki;
pub mod protobuf;
pub mod rbac;
pub mod registry;
pub mod reviews;
pub mod seal;
pub mod server;
