//! The model library's tests against references: every family's tiny
//! model and classifier against sentence-transformers and transformers in
//! float64 (`families`), all-mpnet-base-v2 against sentence-transformers
//! (`mpnet`), and the phased pass against the one-kernel pass (`phased`).
//! One binary: each test binary is linked whole.

mod families;
mod mpnet;
mod phased;
