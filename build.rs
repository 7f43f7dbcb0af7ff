//! Generates the prost types of `proto/agent_host.proto`. The .proto is parsed by `protox`,
//! in Rust, so no `protoc` is needed on the machine.

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=proto/agent_host.proto");
    let descriptors = protox::compile(["proto/agent_host.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
