//! Generates the etcd client code that `orrery-store-etcd` compiles, so that no build of
//! Orrery needs `protoc`. Run from anywhere; paths are taken from this crate's location.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crates/store-etcd");
    let proto = root.join("proto");
    let out = root.join("src/rpc");
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    // prost-build reads the compiler from PROTOC; this process has no other thread yet.
    unsafe { std::env::set_var("PROTOC", &protoc) };
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(&out)
        .compile_protos(
            &[
                proto.join("etcd/api/etcdserverpb/rpc.proto"),
                proto.join("etcd/api/mvccpb/kv.proto"),
                proto.join("etcd/api/authpb/auth.proto"),
            ],
            &[proto, include],
        )?;
    // The grpc-gateway and OpenAPI options annotate the services for other generators;
    // nothing in the client refers to them.
    for unused in ["google.api.rs", "grpc.gateway.protoc_gen_openapiv2.options.rs"] {
        std::fs::remove_file(out.join(unused))?;
    }
    println!("wrote {}", out.display());
    Ok(())
}
