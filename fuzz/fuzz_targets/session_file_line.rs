//! Fuzz target `session_file_line`: see `agent_host::fuzzing::session_file_line` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_host::fuzzing::session_file_line(data));
