//! Compiles `schemas/fleet/v1/*.proto` with the pure-Rust `protox` compiler,
//! so a fresh machine builds with cargo alone (no system `protoc`).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../schemas");
    let dir = root.join("fleet/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    // `prost::Name` on every message: its full name is the `Fleet-Schema`
    // header (`fleet.v1.StatusChanged`).
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(fds)?;
    Ok(())
}
