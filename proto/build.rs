//! Generates the tonic/prost code from `proto/` at build time. protoc comes from the
//! `protoc-bin-vendored` crate, so a machine with only the Rust toolchain can build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds protoc through PROTOC; a build script runs alone, so setting it is safe.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/idemraft/v1/idemraft.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/idemraft/v1/idemraft.proto"], &["proto"])?;
    Ok(())
}
