//! Engine-side tensors: f32 activations the engine owns, and weights that live in the model
//! file's memory map.

use abi::{DType, TensorDesc};

/// A dense f32 activation tensor, ggml shape order (`ne[0]` innermost).
#[derive(Clone, Debug)]
pub struct Act {
    pub data: Vec<f32>,
    pub ne: [i64; 4],
}

impl Act {
    pub fn zeros(shape: &[i64]) -> Act {
        let mut ne = [1i64; 4];
        ne[..shape.len()].copy_from_slice(shape);
        let n: i64 = ne.iter().product();
        Act {
            data: vec![0.0; n as usize],
            ne,
        }
    }

    pub fn from_vec(data: Vec<f32>, shape: &[i64]) -> Act {
        let mut ne = [1i64; 4];
        ne[..shape.len()].copy_from_slice(shape);
        assert_eq!(
            ne.iter().product::<i64>() as usize,
            data.len(),
            "shape {shape:?} vs {} values",
            data.len()
        );
        Act { data, ne }
    }

    /// Same data, another shape with as many elements.
    pub fn reshape(mut self, shape: &[i64]) -> Act {
        let mut ne = [1i64; 4];
        ne[..shape.len()].copy_from_slice(shape);
        assert_eq!(
            ne.iter().product::<i64>(),
            self.ne.iter().product::<i64>(),
            "reshape {:?} -> {shape:?}",
            self.ne
        );
        self.ne = ne;
        self
    }

    /// Row `i` of `ne[0]` values.
    pub fn row(&self, i: usize) -> &[f32] {
        let n = self.ne[0] as usize;
        &self.data[i * n..(i + 1) * n]
    }

    pub fn nrows(&self) -> usize {
        (self.ne[1] * self.ne[2] * self.ne[3]) as usize
    }

    /// Keeps only the listed rows (in order), as a 2-D tensor.
    pub fn select_rows(&self, rows: &[usize]) -> Act {
        let n = self.ne[0] as usize;
        let mut data = Vec::with_capacity(rows.len() * n);
        for &r in rows {
            data.extend_from_slice(self.row(r));
        }
        Act::from_vec(data, &[self.ne[0], rows.len() as i64])
    }

    pub fn desc(&self) -> TensorDesc {
        TensorDesc::contiguous(self.data.as_ptr() as *mut u8, DType::F32, &self.ne)
    }

    pub fn desc_mut(&mut self) -> TensorDesc {
        TensorDesc::contiguous(self.data.as_mut_ptr() as *mut u8, DType::F32, &self.ne)
    }
}

/// A weight tensor inside the model's memory map (or another buffer the model keeps alive).
#[derive(Clone, Copy, Debug)]
pub struct Weight {
    pub desc: TensorDesc,
    /// The data is in a read-only file mapping: its resident pages may be dropped (they come
    /// back from the file), e.g. once a backend has repacked the weight.
    pub file_mapped: bool,
    /// The data is a slot of the expert cache, which the next expert to use the slot
    /// overwrites: prepared (repacked) only into the slot itself, in `room` bytes from the
    /// data, and that repack is dropped when the slot gets another expert.
    pub cache_slot: bool,
    /// Bytes from `data` a repack may take (cache slots; 0 otherwise).
    pub room: usize,
}

// SAFETY: weights are read-only views into memory the model owns for its whole life.
unsafe impl Send for Weight {}
unsafe impl Sync for Weight {}

impl Weight {
    pub fn dtype(&self) -> DType {
        self.desc
            .dtype()
            .expect("weights are built from known dtypes")
    }

    pub fn ne(&self) -> [i64; 4] {
        self.desc.ne
    }

    /// Matrix `i` of a stack along the third dimension (one expert of `[K, N, n_expert]`).
    pub fn slice(&self, i: usize) -> Weight {
        let d = &self.desc;
        assert!((i as i64) < d.ne[2], "slice {i} of {:?}", d.ne);
        let data = d.data.wrapping_offset(d.nb[2] as isize * i as isize);
        Weight {
            desc: TensorDesc::contiguous(data, self.dtype(), &[d.ne[0], d.ne[1]]),
            file_mapped: self.file_mapped,
            cache_slot: self.cache_slot,
            room: 0,
        }
    }
}
