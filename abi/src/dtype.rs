//! Element and block formats, declared once.
//!
//! GGML formats keep ggml's numeric ids so a GGUF tensor type maps to a [`DType`] without a
//! translation table. mollm's own formats start at 1000 so they can never collide with a future
//! ggml id.

/// Static facts about a format: how many elements one block holds and how many bytes it takes.
/// Plain element types are blocks of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DTypeInfo {
    pub name: &'static str,
    pub block_len: u32,
    pub block_bytes: u32,
    pub quantized: bool,
}

macro_rules! dtypes {
    ($( $variant:ident = $id:expr, $name:expr, $blen:expr, $bbytes:expr, $q:expr; )*) => {
        /// A tensor element format. `#[repr(u32)]`: crosses the plugin boundary as its id.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum DType { $( $variant = $id, )* }

        impl DType {
            /// Every format, in declaration order.
            pub const ALL: &'static [DType] = &[ $( DType::$variant, )* ];

            pub const fn info(self) -> DTypeInfo {
                match self {
                    $( DType::$variant => DTypeInfo {
                        name: $name, block_len: $blen, block_bytes: $bbytes, quantized: $q,
                    }, )*
                }
            }

            /// The format with this numeric id (ggml's for ggml formats), if declared.
            pub const fn from_id(id: u32) -> Option<DType> {
                match id {
                    $( $id => Some(DType::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

dtypes! {
    F32   = 0,  "f32",  1, 4, false;
    F16   = 1,  "f16",  1, 2, false;
    Q4_0  = 2,  "q4_0", 32, 18, true;
    Q4_1  = 3,  "q4_1", 32, 20, true;
    Q5_0  = 6,  "q5_0", 32, 22, true;
    Q5_1  = 7,  "q5_1", 32, 24, true;
    Q8_0  = 8,  "q8_0", 32, 34, true;
    Q8_1  = 9,  "q8_1", 32, 36, true;
    Q2_K  = 10, "q2_K", 256, 84, true;
    Q3_K  = 11, "q3_K", 256, 110, true;
    Q4_K  = 12, "q4_K", 256, 144, true;
    Q5_K  = 13, "q5_K", 256, 176, true;
    Q6_K  = 14, "q6_K", 256, 210, true;
    Q8_K  = 15, "q8_K", 256, 292, true;
    I8    = 24, "i8",   1, 1, false;
    I16   = 25, "i16",  1, 2, false;
    I32   = 26, "i32",  1, 4, false;
    I64   = 27, "i64",  1, 8, false;
    F64   = 28, "f64",  1, 8, false;
    BF16  = 30, "bf16", 1, 2, false;
    // mollm's own formats (quant/src/mollm.rs has the layouts and the reference kernels).
    W4G32  = 1000, "w4g32",  32, 18, true;
    W4G128 = 1001, "w4g128", 128, 66, true;
    W8PC   = 1002, "w8pc",   64, 68, true;
    A8G128 = 1010, "a8g128", 128, 132, true;
}

impl DType {
    pub const fn id(self) -> u32 {
        self as u32
    }

    pub const fn name(self) -> &'static str {
        self.info().name
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks or the
    /// size overflows. Callers use this on untrusted shapes, so it never panics.
    pub const fn row_bytes(self, n: u64) -> Option<u64> {
        let info = self.info();
        let blen = info.block_len as u64;
        if n % blen != 0 {
            return None;
        }
        (n / blen).checked_mul(info.block_bytes as u64)
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_unique() {
        for &d in DType::ALL {
            assert_eq!(DType::from_id(d.id()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(
            DType::from_id(4),
            None,
            "ggml id 4 (old q4_2) was removed and must stay unknown"
        );
    }

    #[test]
    fn row_bytes_checks_blocks_and_overflow() {
        assert_eq!(DType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(DType::Q4_K.row_bytes(100), None);
        assert_eq!(DType::F32.row_bytes(u64::MAX), None);
    }
}
