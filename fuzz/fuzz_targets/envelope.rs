//! Fuzz target `envelope`: see `agent_host::fuzzing::envelope` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::envelope(data));
