//! Generates the prost types of `proto/agent_host.proto`, and their serde implementations in
//! the canonical protobuf JSON mapping (pbjson) for the `agenthost.v1.json` codec. The .proto
//! is parsed by `protox`, in Rust, so no `protoc` is needed on the machine. The relay fleet's
//! frames, `proto/relay.proto`, get prost types only (no JSON codec).

use prost::Message;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=proto/agent_host.proto");
    println!("cargo:rerun-if-changed=proto/relay.proto");
    let descriptors = protox::compile(["proto/agent_host.proto", "proto/relay.proto"], ["proto"])?;
    let bytes = descriptors.encode_to_vec();
    prost_build::Config::new().compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .build(&[".agent_host"])?;
    Ok(())
}
