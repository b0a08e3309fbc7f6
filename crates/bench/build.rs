//! Generates a minimal etcd v3 client (leases and the lock service) from `proto/` with a vendored
//! `protoc`, so a build needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(
            config,
            &["proto/etcdserverpb.proto", "proto/v3lockpb.proto"],
            &["proto"],
        )?;
    Ok(())
}
