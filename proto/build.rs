//! Generates the tonic/prost code from `proto/` at build time. protoc comes from the
//! `protoc-bin-vendored` crate, so a machine with only the Rust toolchain can build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds protoc through PROTOC; a build script runs alone, so setting it is safe.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/idemraft/v1/idemraft.proto");
    // The encoded descriptors feed gRPC server reflection, so grpcurl needs no .proto file.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("idemraft_descriptor.bin"))
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/idemraft/v1/idemraft.proto"], &["proto"])?;
    Ok(())
}
