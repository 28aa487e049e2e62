//! Generates the protobuf code Orrery compiles, so that no build of Orrery needs `protoc`:
//! the etcd client of `orrery-store-etcd`, and the gnostic OpenAPI v2 messages the API
//! server encodes `/openapi/v2` with. Run from anywhere; paths are taken from this crate's
//! location.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crates");
    let root = crates.join("store-etcd");
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

    // gnostic's OpenAPIv2.proto (github.com/google/gnostic-models, openapiv2/), as client-go
    // reads it. Its `google.protobuf.Any` is generated too, so the API server needs no
    // prost-types.
    let api = crates.join("apiserver");
    let out = api.join("src/openapi_v2pb");
    prost_build::Config::new()
        .out_dir(&out)
        .compile_well_known_types()
        .compile_protos(
            &[api.join("proto/openapiv2/OpenAPIv2.proto")],
            &[api.join("proto"), protoc_bin_vendored::include_path()?],
        )?;
    println!("wrote {}", out.display());
    Ok(())
}
