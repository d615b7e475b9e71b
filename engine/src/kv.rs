//! The key/value cache: one K and one V tensor per layer, `[head_dim, n_kv_heads, n_ctx]`,
//! row `p` holding the token at position `p` (one sequence per cache).

use abi::{DType, TensorDesc};

/// Cache rows come in pages of this many (llama.cpp's KV padding).
pub const KV_PAGE: usize = 256;

#[derive(Clone)]
pub struct CacheTensor {
    data: Vec<u8>,
    dtype: DType,
    ne: [i64; 4],
}

impl CacheTensor {
    fn new(dtype: DType, head_dim: usize, n_heads: usize, n_ctx: usize) -> CacheTensor {
        let bytes = head_dim * n_heads * n_ctx * dtype.info().block_bytes as usize;
        CacheTensor {
            data: vec![0u8; bytes],
            dtype,
            ne: [head_dim as i64, n_heads as i64, n_ctx as i64, 1],
        }
    }

    /// The cache as `[head_dim, n_heads, n_ctx]`, what attention reads.
    pub fn desc(&self) -> TensorDesc {
        TensorDesc::contiguous(self.data.as_ptr() as *mut u8, self.dtype, &self.ne)
    }

    /// The cache as `[head_dim * n_heads, n_ctx]`: one row per position, what set_rows writes.
    pub fn desc_2d(&mut self) -> TensorDesc {
        TensorDesc::contiguous(
            self.data.as_mut_ptr() as *mut u8,
            self.dtype,
            &[self.ne[0] * self.ne[1], self.ne[2]],
        )
    }
}

#[derive(Clone)]
pub struct LayerCache {
    pub k: CacheTensor,
    pub v: CacheTensor,
}

#[derive(Clone)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    pub n_ctx: usize,
    /// Positions 0..n_past are filled.
    pub n_past: usize,
}

impl KvCache {
    pub fn new(
        dtype: DType,
        n_layers: usize,
        head_dim: usize,
        n_kv_heads: usize,
        n_ctx: usize,
    ) -> KvCache {
        let layers = (0..n_layers)
            .map(|_| LayerCache {
                k: CacheTensor::new(dtype, head_dim, n_kv_heads, n_ctx),
                v: CacheTensor::new(dtype, head_dim, n_kv_heads, n_ctx),
            })
            .collect();
        KvCache {
            layers,
            n_ctx,
            n_past: 0,
        }
    }

    /// A cache of `n_ctx` positions for every cached layer of `p`.
    ///
    /// The tensors hold a whole number of 256-row pages (llama.cpp pads its cache the same
    /// way): attention runs over the used rows padded to 256, capped at the tensor, so a cache
    /// of another size would change the float order, and a sequence's results would depend on
    /// the size it was given.
    pub fn for_program(p: &crate::graph::Program, dtype: DType, n_ctx: usize) -> KvCache {
        let rows = n_ctx.max(1).next_multiple_of(KV_PAGE);
        let layers = p
            .kv_layers
            .iter()
            .map(|&[d, h]| LayerCache {
                k: CacheTensor::new(dtype, d, h, rows),
                v: CacheTensor::new(dtype, d, h, rows),
            })
            .collect();
        KvCache {
            layers,
            n_ctx,
            n_past: 0,
        }
    }

    /// Forgets everything after `n` positions (the data stays; it is masked out).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.k.data.len() + l.v.data.len())
            .sum()
    }
}
