//! Fuzz target `acp_translator`: see `agent_host::fuzzing::acp_translator` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::acp_translator(data));
