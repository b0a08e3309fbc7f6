//! Generates the gRPC code from `proto/palisade.proto` (the lock service) and
//! `proto/palisade_raft.proto` (Raft traffic between nodes) with a vendored `protoc`, so a build
//! needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/palisade.proto");
    println!("cargo:rerun-if-changed=proto/palisade_raft.proto");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(
        config,
        &["proto/palisade.proto", "proto/palisade_raft.proto"],
        &["proto"],
    )?;
    Ok(())
}
