//! etcd's v3 gRPC API: messages and clients generated from `proto/` by
//! `cargo run --manifest-path tools/proto-gen/Cargo.toml` and checked in, so that building
//! Orrery needs no `protoc`. Do not edit the generated files; regenerate them.

#![allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    dead_code
)]

pub mod authpb {
    include!("authpb.rs");
}
pub mod etcdserverpb {
    include!("etcdserverpb.rs");
}
pub mod mvccpb {
    include!("mvccpb.rs");
}
