//! Fuzz target `codex_translator`: see `agent_host::fuzzing::codex_translator` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::codex_translator(data));
