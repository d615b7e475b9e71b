//! Sentence embeddings: a sequence's final hidden states (the graph's `embd` node, one row per
//! token) pooled into one vector and L2-normalized, as llama.cpp's embedding pooling and
//! `common_embd_normalize(.., 2)` compute them.

/// How a sequence's rows become one vector (llama.cpp's `pooling_type` 1, 2, 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's row (sentence-transformers' default).
    Mean,
    /// The first token's row (BERT's `[CLS]`).
    Cls,
    /// The last token's row (decoder embedding models).
    Last,
}

impl Pooling {
    pub const NAMES: [&'static str; 3] = ["mean", "cls", "last"];

    /// llama.cpp's number for it (the GGUF key `{arch}.pooling_type`); 0 (none) and others
    /// have no pooled vector.
    pub fn from_llama(n: usize) -> Option<Pooling> {
        match n {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// One vector from `rows` (a sequence's rows of `n` values, at least one row).
pub fn pool(rows: &[f32], n: usize, how: Pooling) -> Vec<f32> {
    let count = rows.len() / n.max(1);
    match how {
        Pooling::Cls => rows[..n].to_vec(),
        Pooling::Last => rows[(count - 1) * n..count * n].to_vec(),
        Pooling::Mean => {
            // llama.cpp multiplies by a matrix of 1/count entries: each row's share is
            // rounded before the f32 sum.
            let share = 1.0 / count as f32;
            let mut out = vec![0.0f32; n];
            for row in rows.chunks_exact(n) {
                for (o, &x) in out.iter_mut().zip(row) {
                    *o += x * share;
                }
            }
            out
        }
    }
}

/// Scales `v` to unit Euclidean length (the sum of squares in f64, as llama.cpp's); a zero
/// vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
    let norm = sum.sqrt();
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    for x in v {
        *x *= scale;
    }
}

/// One unit vector from a sequence's rows: pooled by `how`, then normalized.
pub fn vector(rows: &[f32], n: usize, how: Pooling) -> Vec<f32> {
    let mut v = pool(rows, n, how);
    normalize(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_picks_and_averages_rows() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        assert_eq!(pool(&rows, 2, Pooling::Cls), vec![1.0, 2.0]);
        assert_eq!(pool(&rows, 2, Pooling::Last), vec![5.0, 9.0]);
        let m = pool(&rows, 2, Pooling::Mean);
        assert!(
            (m[0] - 3.0).abs() < 1e-6 && (m[1] - 5.0).abs() < 1e-6,
            "{m:?}"
        );
    }

    #[test]
    fn normalized_vectors_have_unit_length() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0; 3];
        normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
        let v = vector(&[3.0, 4.0, 3.0, 4.0], 2, Pooling::Mean);
        assert_eq!(v, vec![0.6, 0.8]);
    }

    #[test]
    fn llama_numbers_and_names_round_trip() {
        for (i, name) in Pooling::NAMES.iter().enumerate() {
            let p = Pooling::from_llama(i + 1).unwrap();
            assert_eq!(p.name(), *name);
            assert_eq!(Pooling::parse(name), Some(p));
        }
        assert_eq!(Pooling::from_llama(0), None);
        assert_eq!(Pooling::parse("max"), None);
    }
}
