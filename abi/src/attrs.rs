//! Each op's attributes as a typed struct, declared once: the macro below writes the struct,
//! its [`Attr`] table (names, kinds, slots: what the schema lists) and the conversions to and
//! from the wire form [`OpParams`]. Code outside `abi` reads and writes attributes through
//! these (`RopeAttrs::from_params(p).n_dims`), never by slot number.

use crate::{Attr, AttrKind, OpParams};

macro_rules! attr_ty {
    (F32) => {
        f32
    };
    (I64) => {
        i64
    };
}

macro_rules! op_attrs {
    ($(
        $(#[$meta:meta])*
        $name:ident { $( $field:ident : $kind:ident [$slot:literal] $doc:literal ),* $(,)? }
    )*) => { $(
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name { $( #[doc = $doc] pub $field: attr_ty!($kind), )* }

        impl $name {
            /// The attributes as the schema lists them.
            pub const ATTRS: &'static [Attr] = &[$(Attr {
                name: stringify!($field),
                kind: AttrKind::$kind,
                slot: $slot,
                doc: $doc,
            }),*];

            /// The attributes of a call.
            pub fn from_params(p: &OpParams) -> Self {
                $name { $( $field: op_attrs!(@get $kind, p, $slot), )* }
            }

            /// Changes the attributes of `p` in place (its other slots become zero).
            pub fn edit(p: &mut OpParams, f: impl FnOnce(&mut Self)) {
                let mut a = Self::from_params(p);
                f(&mut a);
                *p = a.to_params();
            }

            /// The call's wire form (unused slots zero).
            pub fn to_params(&self) -> OpParams {
                #[allow(unused_mut)]
                let mut p = OpParams::default();
                $( op_attrs!(@set $kind, p, $slot, self.$field); )*
                p
            }
        }
    )* };
    (@get F32, $p:ident, $slot:literal) => { $p.f[$slot] };
    (@get I64, $p:ident, $slot:literal) => { $p.i[$slot] };
    (@set F32, $p:ident, $slot:literal, $v:expr) => { $p.f[$slot] = $v };
    (@set I64, $p:ident, $slot:literal, $v:expr) => { $p.i[$slot] = $v };
}

op_attrs! {
    /// `rms_norm`.
    RmsNormAttrs {
        eps: F32[0] "added to the mean square",
    }
    /// `rope`: the one rope parameter type (the graph's rope nodes carry the same fields).
    RopeAttrs {
        mode: I64[0] "0 = normal (adjacent pairs), 2 = neox (split halves)",
        n_dims: I64[1] "rotated dimensions per head, even, <= D",
        n_ctx_orig: I64[2] "original training context (YaRN)",
        freq_base: F32[0] "theta base",
        freq_scale: F32[1] "1 / linear scaling factor",
        ext_factor: F32[2] "YaRN extrapolation mix; 0 disables YaRN",
        attn_factor: F32[3] "magnitude scale applied to cos/sin",
        beta_fast: F32[4] "YaRN ramp",
        beta_slow: F32[5] "YaRN ramp",
    }
    /// `mat_mul`.
    MatMulAttrs {
        chain_cols: I64[0] "0 = the chain follows M; g > 0: as separate calls of g columns",
    }
    /// `attention`.
    AttentionAttrs {
        n_kv: I64[0] "valid cache rows (with seqs: at least each sequence's)",
        window: I64[1] "sliding window length; 0 = unlimited",
        page_rows: I64[2] "rows per page with a block_table; 0 without",
        scale: F32[0] "applied to q.k",
        softcap: F32[1] "logit soft-capping; 0 = off",
    }
    /// `glu`.
    GluAttrs {
        act: I64[0] "0 = SiLU, 1 = GELU (tanh approximation)",
    }
    /// `scale`.
    ScaleAttrs {
        s: F32[0] "factor",
    }
    /// `softmax`.
    SoftmaxAttrs {
        scale: F32[0] "applied before the exponent",
    }
    /// `norm`.
    NormAttrs {
        eps: F32[0] "added to the variance",
        group: I64[0] "values normalized together (divides K); 0 = the whole row",
    }
    /// `l2_norm`.
    L2NormAttrs {
        eps: F32[0] "the smallest divisor (the norm is clamped up to it)",
    }
}

impl NormAttrs {
    /// The group length for rows of `k` values (`group`, or the whole row for 0).
    pub fn group_len(&self, k: i64) -> i64 {
        if self.group == 0 {
            k
        } else {
            self.group
        }
    }
}

impl RopeAttrs {
    /// ggml's and llama.cpp's settings for a model without rope scaling.
    pub fn new(mode: i64, n_dims: i64, freq_base: f32, n_ctx_orig: i64) -> RopeAttrs {
        RopeAttrs {
            mode,
            n_dims,
            n_ctx_orig,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }
}

impl MatMulAttrs {
    /// `chain_cols` as a column count (0: the chain follows the call's columns).
    pub fn chain(&self) -> usize {
        self.chain_cols.max(0) as usize
    }
}

impl OpParams {
    /// Sets the attribute `a` of a schema to `v` (converted to its kind): for code that fills
    /// attributes by name from the schema, such as a graph file's nodes.
    pub fn set(&mut self, a: &Attr, v: f64) {
        match a.kind {
            AttrKind::F32 => self.f[a.slot] = v as f32,
            AttrKind::I64 => self.i[a.slot] = v as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_through_their_slots() {
        let r = RopeAttrs {
            mode: 2,
            n_dims: 64,
            n_ctx_orig: 4096,
            freq_base: 1e6,
            freq_scale: 0.5,
            ext_factor: 0.25,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let p = r.to_params();
        assert_eq!(RopeAttrs::from_params(&p), r);
        assert_eq!((p.i[1], p.f[2]), (64, 0.25));
        for s in crate::SCHEMAS.iter() {
            for (i, a) in s.attrs.iter().enumerate() {
                assert!(
                    s.attrs[..i]
                        .iter()
                        .all(|b| b.kind != a.kind || b.slot != a.slot),
                    "{}: slot {} of {:?} used twice",
                    s.name,
                    a.slot,
                    a.kind
                );
            }
        }
    }
}
