#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| clb_fuzz::admission(data));
