//! `memcmp` and `bcmp` for the WebAssembly build, eight bytes at a time.
//!
//! Why: WebAssembly has no instruction for comparing memory, so on `wasm32` the toolchain's
//! `compiler_builtins` supplies `memcmp` as a loop over single bytes (its definition is weak, so
//! this one replaces it at link time). Every key comparison in the tracker's ordered maps — IP
//! text that shares its first bytes, node names, UIDs — goes through it, and under the host's
//! fuel and epoch metering each iteration of that loop pays for a check. Comparing words cuts
//! the iterations eightfold. Natively the platform's C library provides these (vectorised).

/// The first `n` bytes of `a` and `b` compared as unsigned bytes, as C's `memcmp`.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes (the C contract).
#[cfg_attr(target_arch = "wasm32", unsafe(no_mangle))]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, and both are valid for n bytes; unaligned reads are allowed.
        let (x, y) = unsafe { ((a.add(i) as *const u64).read_unaligned(), (b.add(i) as *const u64).read_unaligned()) };
        if x != y {
            // Little-endian: the lowest differing bit is in the first differing byte.
            let shift = (x ^ y).trailing_zeros() & !7;
            return i32::from((x >> shift) as u8) - i32::from((y >> shift) as u8);
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// Zero when the first `n` bytes of `a` and `b` are equal, as C's `bcmp` (what `==` on byte
/// slices compiles to).
///
/// # Safety
/// As [`memcmp`].
#[cfg_attr(target_arch = "wasm32", unsafe(no_mangle))]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_compare_agrees_with_slice_order_on_every_length_and_first_difference() {
        let base: Vec<u8> = (0..40u8).map(|b| b.wrapping_mul(37)).collect();
        for n in 0..base.len() {
            for at in 0..n {
                for delta in [1u8, 0x80, 0xff] {
                    let mut other = base.clone();
                    other[at] = other[at].wrapping_add(delta);
                    let want = base[..n].cmp(&other[..n]) as i32;
                    // SAFETY: both hold at least n bytes.
                    let got = unsafe { memcmp(base.as_ptr(), other.as_ptr(), n) }.signum();
                    assert_eq!(got, want, "n {n}, first difference at {at}, +{delta}");
                }
            }
            // SAFETY: as above.
            assert_eq!(unsafe { bcmp(base.as_ptr(), base.clone().as_ptr(), n) }, 0);
        }
    }
}
