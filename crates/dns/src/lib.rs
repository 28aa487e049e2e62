//! The clusterset DNS of multi-cluster services (KEP-1645's DNS specification):
//! `<svc>.<ns>.svc.clusterset.local` and the names under it, answered from a [`Directory`]
//! built from ServiceImports and their EndpointSlices.
//!
//! - [`directory`]: pure; names to records, and the directory from the objects;
//! - [`server`]: the responder (UDP and TCP on one address), answering from the directory it
//!   is given now.

pub mod directory;
pub mod server;

pub use directory::{Directory, Lookup, QType, Record};
pub use server::{answer, serve};
