#![no_main]
// The component is compiled before the first input, not in it: libFuzzer's per-input timeout
// (30 s in run.sh) must not count the one-time compile, which once took longer than that on a
// loaded machine and stopped a run on the empty input (docs/fuzzing.md, run 7).
libfuzzer_sys::fuzz_target!(
    init: {
        clb_fuzz::differential::logic();
    },
    |data: &[u8]| clb_fuzz::differential(data)
);
