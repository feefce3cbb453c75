//! The deterministic generators the workloads' inputs come from.

/// splitmix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix. The `k`-th
/// value of a stream with seed `s` is `splitmix64(s + k·γ)`; callers pass the
/// counter already combined.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `k`-th value of stream `tag` under `seed`: `splitmix64(seed ^ (tag << 56) ^ k)`.
pub(crate) fn stream(seed: u64, tag: u64, k: u64) -> u64 {
    splitmix64(seed ^ (tag << 56) ^ k)
}

/// The top 24 bits of `z` as an f32 in `[0, 1)`: `(z >> 40) · 2⁻²⁴`, exact.
pub(crate) fn unit_f32(z: u64) -> f32 {
    (z >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// The top 24 bits of `z` as an f32 in `[-1, 1)`: `(z >> 40) · 2⁻²³ − 1`, exact
/// (every result is a multiple of 2⁻²³ below 1 in magnitude).
pub(crate) fn sym_unit_f32(z: u64) -> f32 {
    (z >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_stay_in_range() {
        for k in 0..10_000 {
            let z = stream(1, 2, k);
            let u = unit_f32(z);
            let s = sym_unit_f32(z);
            assert!((0.0..1.0).contains(&u));
            assert!((-1.0..1.0).contains(&s));
        }
        assert_eq!(sym_unit_f32(0), -1.0);
        assert_eq!(sym_unit_f32(u64::MAX), 1.0 - 1.0 / 8_388_608.0);
    }
}
