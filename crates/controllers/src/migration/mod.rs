//! Migrations: the move of a stateful workload and its data to another cluster.

pub mod plan;
