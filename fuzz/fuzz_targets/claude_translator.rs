//! Fuzz target `claude_translator`: see `agent_host::fuzzing::claude_translator` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::claude_translator(data));
