//! Orrery's end-to-end tests, in one test binary: real `orrery` processes on loopback ports,
//! the real `kubectl`, and clients built with the `kube` crate (the harness is `common`). One
//! binary links once (32 did, each linking the whole dependency tree) and runs tests of every
//! area side by side: most of a test's time is spent waiting for a server, an agent or a
//! clock, so they overlap well. Run one area with `cargo test -p orrery --test e2e rotation::`.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

mod common;

mod api_model;
mod api_semantics;
mod autoscaling;
mod backfill;
mod backup;
mod cost;
mod data;
mod decisions;
mod dro;
mod dro_fuzz;
mod encryption;
mod examples;
mod ha;
mod hierarchy;
mod install;
mod kube_client;
mod kube_members;
mod kubectl;
mod layering;
mod locations;
mod members;
mod prediction;
mod propagation;
mod proxy;
mod quotas;
mod restarts;
mod rollouts;
mod rotation;
mod scheduling;
mod security;
mod server_crash;
mod services;
mod sig_multicluster;
mod stateful;
mod ui;
mod upgrade;
