use super::*;

#[test]
fn what_the_encoder_writes_the_decoder_reads_back() {
    let mut samples = Vec::new();
    for seed in 0..64u8 {
        let data: Vec<u8> = (0..400u32).map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed)).collect();
        let mut d2 = Dec::new(&data);
        samples.push((d2.observation(), d2.outcome(), d2.command()));
    }
    for (o, out, c) in samples {
        let mut e = Enc::default();
        e.observation(&o);
        e.outcome(&out);
        e.command(&c);
        let mut back = Dec::new(&e.bytes);
        // Lists longer than the encoder's bounds are truncated; the generator keeps within them.
        assert_eq!(back.observation(), o);
        assert_eq!(back.outcome(), out);
        assert_eq!(back.command(), c);
    }
}
