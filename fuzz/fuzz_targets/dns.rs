#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orrery_fuzz::dns(data));
