//! Fuzz target `jsonrpc_line`: see `agent_host::fuzzing::jsonrpc_line` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::jsonrpc_line(data));
