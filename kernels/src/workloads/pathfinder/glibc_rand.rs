//! glibc's `rand()`, bit for bit, with a jump-ahead for filling on every core.

/// glibc's `rand()`: the `random_r` TYPE_3 additive feedback generator
/// (`r[i] = r[i−3] + r[i−31]` mod 2³², output `r >> 1`), seeded by
/// `srand(seed)` exactly as glibc does (Park–Miller fill of 31 words, 310
/// outputs discarded).
///
/// ```
/// use coexec_kernels::workloads::GlibcRand;
///
/// let mut r = GlibcRand::new(9);
/// assert_eq!(r.next_i32(), 444454915);
/// ```
#[derive(Debug, Clone)]
pub struct GlibcRand {
    state: [u32; 31],
    f: usize,
    r: usize,
}

impl GlibcRand {
    /// The generator after `srand(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; 31];
        let mut word = if seed == 0 { 1i32 } else { seed as i32 };
        state[0] = word as u32;
        for s in state.iter_mut().skip(1) {
            // Park–Miller "minimal standard" by Schrage's method, as glibc.
            let hi = word / 127_773;
            let lo = word % 127_773;
            word = 16_807 * lo - 2_836 * hi;
            if word < 0 {
                word += 2_147_483_647;
            }
            *s = word as u32;
        }
        let mut g = Self { state, f: 3, r: 0 };
        for _ in 0..310 {
            g.next_i32();
        }
        g
    }

    /// The next `rand()` value, in `0..2³¹`.
    #[inline]
    pub fn next_i32(&mut self) -> i32 {
        let v = self.state[self.f].wrapping_add(self.state[self.r]);
        self.state[self.f] = v;
        self.f = if self.f == 30 { 0 } else { self.f + 1 };
        self.r = if self.r == 30 { 0 } else { self.r + 1 };
        (v >> 1) as i32
    }

    /// The generator `n` draws further on, in `O(31² · log n)` without
    /// drawing them. The words obey `x[i+31] = x[i+28] + x[i]` mod 2³², a
    /// linear recurrence with characteristic polynomial `P = t³¹ − t²⁸ − 1`,
    /// so with the current window `y[0..31]` (the last 31 words, oldest
    /// first), `y[k] = Σⱼ cⱼ·y[j]` where `Σⱼ cⱼ tʲ = tᵏ mod P` (P is monic,
    /// so the division works over the integers mod 2³²).
    ///
    /// ```
    /// use coexec_kernels::workloads::GlibcRand;
    ///
    /// let mut a = GlibcRand::new(9);
    /// for _ in 0..1000 {
    ///     a.next_i32();
    /// }
    /// let mut b = GlibcRand::new(9).jumped(1000);
    /// assert_eq!(a.next_i32(), b.next_i32());
    /// ```
    pub fn jumped(&self, n: u64) -> Self {
        let y: [u32; 31] = std::array::from_fn(|j| self.state[(self.f + j) % 31]);
        // c = tⁿ mod P, by squaring.
        let mut c = [0u32; 31];
        c[0] = 1;
        let mut base = [0u32; 31];
        base[1] = 1;
        let mut e = n;
        while e > 0 {
            if e & 1 == 1 {
                c = poly_mulmod(&c, &base);
            }
            base = poly_mulmod(&base, &base);
            e >>= 1;
        }
        // The new window is y[n..n+31]: tⁿ⁺ᵐ for m = 0..31.
        let mut state = [0u32; 31];
        for s in &mut state {
            *s = c.iter().zip(&y).fold(0u32, |acc, (&cj, &yj)| {
                acc.wrapping_add(cj.wrapping_mul(yj))
            });
            c = poly_times_t(&c);
        }
        // Oldest word first at 0; the feedback tap is 3 words behind the
        // front, i.e. 28 ahead of it.
        Self { state, f: 0, r: 28 }
    }
}

/// `a·b mod (t³¹ − t²⁸ − 1)`, coefficients mod 2³².
fn poly_mulmod(a: &[u32; 31], b: &[u32; 31]) -> [u32; 31] {
    let mut p = [0u32; 61];
    for (i, &ai) in a.iter().enumerate() {
        if ai == 0 {
            continue;
        }
        for (j, &bj) in b.iter().enumerate() {
            p[i + j] = p[i + j].wrapping_add(ai.wrapping_mul(bj));
        }
    }
    // tⁱ = tⁱ⁻³¹·(t²⁸ + 1), highest first so every carried term is reduced too.
    for i in (31..61).rev() {
        let v = p[i];
        p[i - 3] = p[i - 3].wrapping_add(v);
        p[i - 31] = p[i - 31].wrapping_add(v);
    }
    std::array::from_fn(|i| p[i])
}

/// `c·t mod (t³¹ − t²⁸ − 1)`.
fn poly_times_t(c: &[u32; 31]) -> [u32; 31] {
    let top = c[30];
    let mut out = [0u32; 31];
    out[1..].copy_from_slice(&c[..30]);
    out[28] = out[28].wrapping_add(top);
    out[0] = out[0].wrapping_add(top);
    out
}
