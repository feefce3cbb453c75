//! How the GPU twin lays a piece of a batch out on the device: plain host
//! logic, tested without a GPU.
//!
//! Dense layers run over the piece's tokens back to back (`[T, H]`, no
//! padding), as on the CPU. Attention runs as cuBLAS strided-batched GEMMs,
//! which need equal shapes, so the piece's sequences (sorted shortest
//! first) are cut into **groups** of similar length, each padded to its
//! longest: a group of `B` sequences padded to `P` is `B·heads` products
//! `[P, d]·[d, P]`. A sequence joins the group while the group's padded
//! attention work stays within 5/4 of its real work, or, for sequences of
//! at most [`SHORT`] tokens (where attention is a small part of the work),
//! while the group's padded rows stay within twice its real tokens.
//!
//! Q, K and V of a group are laid `[B, heads, P, d]`; a *padded row* is one
//! `(sequence, position)` pair of a group, real or padding. Per padded row
//! the plan holds the token it comes from (or [`NONE`]), where its head 0
//! starts in the Q/K/V buffers, and the distance between its heads:
//! `split_heads` and `merge_heads` in `src/cu/bert.cu` read these tables.

/// A padded row that holds no token.
pub(crate) const NONE: u32 = u32::MAX;

/// Sequences this short join a group whatever their padding.
const SHORT: usize = 32;

/// The most tokens in one piece: a chunk larger than this runs piece by
/// piece, so the device buffers stay bounded (for MiniLM about 126 MB for
/// the token-sized activations, plus the padded Q, K, V and the scores).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const PIECE_TOKENS: usize = 8192;

/// Sequences of one attention group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    /// Its first sequence in the piece.
    pub(crate) first: usize,
    /// Sequences in it.
    pub(crate) count: usize,
    /// The padded length: its longest sequence's.
    pub(crate) pad: usize,
    /// Its first padded row (its Q, K and V start at `row0·H` floats).
    pub(crate) row0: usize,
    /// Where its scores start in the score buffer (floats).
    pub(crate) score0: usize,
}

/// One strided-batched GEMM as cuBLAS reads it (column-major): for each
/// `i < batch`, `C_i = alpha·op(A_i)·op(B_i)`, `C_i` `m×n`, `op(A_i)`
/// `m×k`, `op(B_i)` `k×n`, operand `X_i` at `i·sx` elements from `X`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Gemm {
    pub(crate) ta: bool,
    pub(crate) tb: bool,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) alpha: f32,
    pub(crate) lda: usize,
    pub(crate) sa: usize,
    pub(crate) ldb: usize,
    pub(crate) sb: usize,
    pub(crate) ldc: usize,
    pub(crate) sc: usize,
    pub(crate) batch: usize,
}

impl Gemm {
    /// Elements from an operand's start to its last element read, plus
    /// one: `rows × cols` stored column-major with leading dimension `ld`.
    fn extent(rows: usize, cols: usize, ld: usize, stride: usize, batch: usize) -> usize {
        (batch - 1) * stride + (cols - 1) * ld + rows
    }

    /// Elements A, B and C span, for checking buffers against.
    pub(crate) fn extents(&self) -> [usize; 3] {
        let (ar, ac) = if self.ta {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (br, bc) = if self.tb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        [
            Self::extent(ar, ac, self.lda, self.sa, self.batch),
            Self::extent(br, bc, self.ldb, self.sb, self.batch),
            Self::extent(self.m, self.n, self.ldc, self.sc, self.batch),
        ]
    }

    /// The product on the host, as cuBLAS defines it (tests check the
    /// descriptors with it).
    #[cfg(test)]
    pub(crate) fn run_host(&self, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..self.batch {
            let (a, b) = (&a[i * self.sa..], &b[i * self.sb..]);
            for col in 0..self.n {
                for row in 0..self.m {
                    let mut s = 0.0f64;
                    for l in 0..self.k {
                        let x = if self.ta {
                            a[row * self.lda + l]
                        } else {
                            a[l * self.lda + row]
                        };
                        let y = if self.tb {
                            b[l * self.ldb + col]
                        } else {
                            b[col * self.ldb + l]
                        };
                        s += x as f64 * y as f64;
                    }
                    c[i * self.sc + col * self.ldc + row] = self.alpha * s as f32;
                }
            }
        }
    }
}

/// A piece's layout on the device.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Tokens.
    pub(crate) tokens: usize,
    /// Sequences.
    pub(crate) seqs: usize,
    /// Padded rows of all groups.
    pub(crate) rows: usize,
    /// Floats of the score buffer.
    pub(crate) scores: usize,
    pub(crate) groups: Vec<Group>,
    /// The tables the kernels read, uploaded as one buffer of `u32`:
    /// token ids `[T]`, positions `[T]`, sequence starts `[S + 1]` (in
    /// tokens), then per padded row its token (or [`NONE`]), the offset of
    /// its head 0 and the distance between heads (floats).
    pub(crate) meta: Vec<u32>,
    heads: usize,
    head_dim: usize,
}

/// Where each table starts in [`Plan::meta`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tables {
    pub(crate) ids: usize,
    pub(crate) pos: usize,
    pub(crate) starts: usize,
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) stride: usize,
}

impl Plan {
    /// The plan for `seqs` (ids, sorted shortest first), for an encoder
    /// of `heads` heads of `head_dim` wide. `None` when a buffer would hold
    /// 2^31 elements or more, past the kernels' 32-bit indices (a piece far
    /// past [`PIECE_TOKENS`]).
    pub(crate) fn new(seqs: &[&[u32]], heads: usize, head_dim: usize) -> Option<Self> {
        let h = heads * head_dim;
        let tokens: usize = seqs.iter().map(|s| s.len()).sum();
        let mut groups: Vec<Group> = Vec::new();
        let (mut rows, mut scores) = (0, 0);
        let (mut sum, mut sumsq) = (0usize, 0usize);
        for (j, s) in seqs.iter().enumerate() {
            let l = s.len();
            debug_assert!(j == 0 || seqs[j - 1].len() <= l, "sorted shortest first");
            let joins = groups.last().is_some_and(|g| {
                if l <= SHORT {
                    (g.count + 1) * l <= 2 * (sum + l)
                } else {
                    4 * (g.count + 1) * l * l <= 5 * (sumsq + l * l)
                }
            });
            if joins {
                let g = groups.last_mut().expect("joins");
                g.count += 1;
                g.pad = l;
                sum += l;
                sumsq += l * l;
            } else {
                if let Some(g) = groups.last() {
                    rows += g.count * g.pad;
                    scores += g.count * heads * g.pad * g.pad;
                }
                groups.push(Group {
                    first: j,
                    count: 1,
                    pad: l,
                    row0: rows,
                    score0: scores,
                });
                (sum, sumsq) = (l, l * l);
            }
        }
        if let Some(g) = groups.last() {
            rows += g.count * g.pad;
            scores += g.count * heads * g.pad * g.pad;
        }
        // Under 2^31: the kernels' 32-bit grid-stride loops step past the
        // end without wrapping.
        let fits = |n: usize| n < 1 << 31;
        if !fits(3 * rows * h) || !fits(scores) || !fits(tokens * 3 * h) {
            return None;
        }
        let mut meta = Vec::with_capacity(2 * tokens + seqs.len() + 1 + 3 * rows);
        for s in seqs {
            meta.extend_from_slice(s);
        }
        for s in seqs {
            meta.extend(0..s.len() as u32);
        }
        let mut at = 0u32;
        meta.push(0);
        for s in seqs {
            at += s.len() as u32;
            meta.push(at);
        }
        let starts: Vec<u32> = meta[2 * tokens..].to_vec();
        let (mut src, mut dst, mut stride) = (vec![], vec![], vec![]);
        for g in &groups {
            for b in 0..g.count {
                let (start, len) = (starts[g.first + b] as usize, seqs[g.first + b].len());
                for p in 0..g.pad {
                    src.push(if p < len { (start + p) as u32 } else { NONE });
                    dst.push(((g.row0 + b * g.pad) * h + p * head_dim) as u32);
                    stride.push((g.pad * head_dim) as u32);
                }
            }
        }
        meta.extend(src);
        meta.extend(dst);
        meta.extend(stride);
        Some(Self {
            tokens,
            seqs: seqs.len(),
            rows,
            scores,
            groups,
            meta,
            heads,
            head_dim,
        })
    }

    /// Where each table starts in [`Plan::meta`].
    pub(crate) fn tables(&self) -> Tables {
        let starts = 2 * self.tokens;
        let src = starts + self.seqs + 1;
        Tables {
            ids: 0,
            pos: self.tokens,
            starts,
            src,
            dst: src + self.rows,
            stride: src + 2 * self.rows,
        }
    }

    /// Whether every group's products stay inside the Q/K/V blocks
    /// (`rows·H` floats each) and the score buffer: checked before any
    /// product is enqueued.
    pub(crate) fn products_fit(&self) -> bool {
        let h = self.heads * self.head_dim;
        let block = self.rows * h;
        self.groups.iter().all(|g| {
            let at = g.row0 * h;
            let [ka, qb, sc] = self.scores_gemm(g).extents();
            let [va, sb, oc] = self.context_gemm(g).extents();
            at + ka.max(qb).max(va).max(oc) <= block && g.score0 + sc.max(sb) <= self.scores
        })
    }

    /// Group `g`'s scores `S = Q·Kᵀ·scale` (`[P, P]` per sequence and
    /// head, a query per row), from K and Q at the group's start: A is K,
    /// B is Q, C the group's scores.
    pub(crate) fn scores_gemm(&self, g: &Group) -> Gemm {
        let (p, d) = (g.pad, self.head_dim);
        Gemm {
            ta: true,
            tb: false,
            m: p,
            n: p,
            k: d,
            alpha: 1.0 / (d as f32).sqrt(),
            lda: d,
            sa: p * d,
            ldb: d,
            sb: p * d,
            ldc: p,
            sc: p * p,
            batch: g.count * self.heads,
        }
    }

    /// Group `g`'s context `O = softmax(S)·V` (`[P, d]` per sequence and
    /// head): A is V at the group's start, B its scores, C where its Q was.
    pub(crate) fn context_gemm(&self, g: &Group) -> Gemm {
        let (p, d) = (g.pad, self.head_dim);
        Gemm {
            ta: false,
            tb: false,
            m: d,
            n: p,
            k: p,
            alpha: 1.0,
            lda: d,
            sa: p * d,
            ldb: p,
            sb: p * p,
            ldc: d,
            sc: p * d,
            batch: g.count * self.heads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(lens: &[usize]) -> Vec<Vec<u32>> {
        lens.iter()
            .enumerate()
            .map(|(i, &l)| (0..l as u32).map(|t| 1000 * i as u32 + t).collect())
            .collect()
    }

    fn plan(lens: &[usize], heads: usize, d: usize) -> (Plan, Vec<Vec<u32>>) {
        let s = seqs(lens);
        let refs: Vec<&[u32]> = s.iter().map(Vec::as_slice).collect();
        (Plan::new(&refs, heads, d).expect("fits"), s)
    }

    #[test]
    fn every_token_has_exactly_one_padded_row_in_its_own_sequence() {
        let lens = [1, 3, 8, 30, 33, 40, 41, 60, 120, 128, 250, 256];
        let (p, s) = plan(&lens, 4, 8);
        let t = p.tables();
        let src = &p.meta[t.src..t.dst];
        let mut seen = vec![0; p.tokens];
        for &r in src.iter().filter(|&&r| r != NONE) {
            seen[r as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        // ids and positions of each token, and the starts.
        let starts = &p.meta[t.starts..t.src];
        for (j, q) in s.iter().enumerate() {
            let a = starts[j] as usize;
            assert_eq!(&p.meta[t.ids + a..t.ids + a + q.len()], q.as_slice());
            let pos: Vec<u32> = (0..q.len() as u32).collect();
            assert_eq!(&p.meta[t.pos + a..t.pos + a + q.len()], pos.as_slice());
        }
        assert_eq!(starts[lens.len()] as usize, p.tokens);
        assert_eq!(p.meta.len(), t.stride + p.rows);
    }

    #[test]
    fn groups_cover_the_sequences_in_order_and_bound_the_padding() {
        let lens: Vec<usize> = (0..200).map(|i| 1 + (i * i) % 256).collect();
        let mut lens = lens;
        lens.sort();
        let (p, _) = plan(&lens, 12, 32);
        let mut next = 0;
        for g in &p.groups {
            assert_eq!(g.first, next);
            next += g.count;
            let group = &lens[g.first..g.first + g.count];
            assert_eq!(g.pad, *group.last().unwrap());
            let real: usize = group.iter().map(|l| l * l).sum();
            if g.pad > SHORT {
                assert!(4 * g.count * g.pad * g.pad <= 5 * real, "{g:?}");
            } else {
                assert!(g.count * g.pad <= 2 * group.iter().sum::<usize>(), "{g:?}");
            }
        }
        assert_eq!(next, lens.len());
        // Few groups: a cheap launch count per layer.
        assert!(p.groups.len() < 30, "{} groups", p.groups.len());
    }

    #[test]
    fn many_short_sequences_and_one_longer_pad_at_most_twice() {
        let mut lens = vec![2; 4000];
        lens.push(32);
        let (p, _) = plan(&lens, 12, 32);
        assert!(
            p.rows <= 2 * p.tokens,
            "{} padded rows for {} tokens",
            p.rows,
            p.tokens
        );
    }

    /// The attention of a plan run on the host through the same tables
    /// and GEMM descriptors the device gets (the `split_heads`, softmax and
    /// `merge_heads` steps of `bert.cu` written again here), against
    /// attention computed per sequence and head directly.
    #[test]
    fn descriptors_and_tables_compute_each_sequences_attention() {
        let (heads, d) = (3, 4);
        let h = heads * d;
        let lens = [2, 3, 3, 5, 9, 40, 47];
        let (p, _) = plan(&lens, heads, d);
        let t = p.tables();
        let qkv: Vec<f32> = (0..p.tokens * 3 * h)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        // split_heads
        let n = p.rows * h;
        let (mut q, mut k, mut v) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]);
        for r in 0..p.rows {
            for c in 0..h {
                let (head, kk) = (c / d, c % d);
                let o = (p.meta[t.dst + r] + head as u32 * p.meta[t.stride + r]) as usize + kk;
                let s = p.meta[t.src + r];
                let (a, b, e) = if s == NONE {
                    (0.0, 0.0, 0.0)
                } else {
                    let at = s as usize * 3 * h + c;
                    (qkv[at], qkv[at + h], qkv[at + 2 * h])
                };
                (q[o], k[o], v[o]) = (a, b, e);
            }
        }
        assert!(
            q.iter().chain(&k).chain(&v).all(|x| x.is_finite()),
            "every slot written"
        );
        assert!(p.products_fit());
        let mut s = vec![f32::NAN; p.scores];
        for g in &p.groups {
            let gm = p.scores_gemm(g);
            let [ea, eb, ec] = gm.extents();
            let at = g.row0 * h;
            assert!(at + ea <= n && at + eb <= n && g.score0 + ec <= p.scores);
            gm.run_host(&k[at..], &q[at..], &mut s[g.score0..]);
            // softmax over each row's real keys
            let starts = &p.meta[t.starts + g.first..];
            for r in 0..g.count * heads * g.pad {
                let b = r / (heads * g.pad);
                let len = (starts[b + 1] - starts[b]) as usize;
                let row = &mut s[g.score0 + r * g.pad..][..g.pad];
                let max = row[..len].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row[..len].iter().map(|x| (x - max).exp()).sum();
                for (j, x) in row.iter_mut().enumerate() {
                    *x = if j < len { (*x - max).exp() / sum } else { 0.0 };
                }
            }
            let cm = p.context_gemm(g);
            let [ea, eb, ec] = cm.extents();
            assert!(at + ea <= n && g.score0 + eb <= p.scores && at + ec <= n);
            let (before, o) = q.split_at_mut(at);
            let _ = before;
            cm.run_host(&v[at..], &s[g.score0..], o);
        }
        // merge_heads
        let mut ctx = vec![f32::NAN; p.tokens * h];
        for r in 0..p.rows {
            let src = p.meta[t.src + r];
            if src == NONE {
                continue;
            }
            for c in 0..h {
                let o = (p.meta[t.dst + r] + (c / d) as u32 * p.meta[t.stride + r]) as usize;
                ctx[src as usize * h + c] = q[o + c % d];
            }
        }
        // Direct attention per sequence and head.
        let mut at = 0;
        for &l in &lens {
            for head in 0..heads {
                for i in 0..l {
                    let qi = &qkv[(at + i) * 3 * h + head * d..][..d];
                    let sc: Vec<f64> = (0..l)
                        .map(|j| {
                            let kj = &qkv[(at + j) * 3 * h + h + head * d..][..d];
                            qi.iter().zip(kj).map(|(a, b)| (a * b) as f64).sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for kk in 0..d {
                        let want: f64 = (0..l)
                            .map(|j| {
                                e[j] / sum * qkv[(at + j) * 3 * h + 2 * h + head * d + kk] as f64
                            })
                            .sum();
                        let got = ctx[(at + i) * h + head * d + kk] as f64;
                        assert!(
                            (got - want).abs() < 1e-5,
                            "seq len {l} head {head} row {i}: {got} vs {want}"
                        );
                    }
                }
            }
            at += l;
        }
    }

    #[test]
    fn a_piece_too_large_for_32_bit_tables_is_refused() {
        let long = vec![0u32; 512];
        let refs: Vec<&[u32]> = (0..1 << 14).map(|_| long.as_slice()).collect();
        assert!(Plan::new(&refs, 16, 64).is_none());
    }
}
