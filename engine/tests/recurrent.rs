//! Recurrent state in the engine, on the random-weight LFM2, Qwen3.5 and RWKV-7 models
//! (scripts/make_random_lfm2.py, scripts/make_random_qwen35.py, scripts/make_random_rwkv7.py):
//! the prompt's last logits equal llama.cpp's (fixtures/golden/random-{lfm2,qwen35,rwkv7}.json) at every recorded id; each sequence owns its state (a fork continues on its own copy, two sequences
//! in one step compute what each computes alone); and truncating short of a sequence's end
//! starts it over instead of keeping a state that no longer matches its history.

#[path = "common/random.rs"]
mod random;

use engine::{Model, Session, SessionOptions, Work};
use serde_json::Value;
use std::path::Path;

/// llama.cpp's prompt chunk in the golden data.
const NB: usize = 64;

fn opts() -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch: NB,
        n_threads: 2,
        ..Default::default()
    }
}

fn golden(family: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../fixtures/golden/random-{family}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn prompt_logits_equal_llama_cpps() {
    let families = [golden("lfm2"), golden("qwen35"), golden("rwkv7")];
    let models = families
        .iter()
        .flat_map(|g| g["models"].as_object().unwrap().iter());
    for (key, m) in models {
        let model = Model::load(&random::random_checkpoint(m["gguf"].as_str().unwrap())).unwrap();
        let probe = ids(&m["probe_ids"]);
        for case in m["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let mut s = Session::new(&model, &opts()).unwrap();
            let row = s.eval(&ids(&case["tokens"]), true).unwrap().unwrap();
            let mut want: Vec<(usize, f32)> = case["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t[0].as_u64().unwrap() as usize,
                        t[1].as_f64().unwrap() as f32,
                    )
                })
                .collect();
            let top1 = want[0].0;
            want.extend(
                probe
                    .iter()
                    .zip(case["probe"].as_array().unwrap())
                    .map(|(&i, v)| (i as usize, v.as_f64().unwrap() as f32)),
            );
            let diff = want
                .iter()
                .map(|&(i, v)| (row[i] - v).abs())
                .fold(0f32, f32::max);
            let argmax = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap();
            assert_eq!(argmax, top1, "{key} {name}: top-1");
            // llama.cpp's F32 chains are mirrored: the same floats, up to its printing.
            assert!(diff <= 1e-5, "{key} {name}: logits differ by {diff}");
        }
    }
}

#[test]
fn each_sequence_owns_its_state() {
    for file in [
        "lfm2-random.gguf",
        "qwen35-random.gguf",
        "qwen3next-random.gguf",
        "rwkv7-random.gguf",
    ] {
        owns_its_state(file);
    }
}

fn owns_its_state(file: &str) {
    let model = Model::load(&random::random_checkpoint(file)).unwrap();
    let pool = SessionOptions {
        kv_pool_rows: 8 * 256,
        ..opts()
    };
    let mut s = Session::new(&model, &pool).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 256).collect();
    let mut a = s.new_sequence(256);
    let step = |s: &mut Session, seq: &mut engine::Sequence, t: &[u32]| -> Vec<f32> {
        let out = s.step(&mut [Work {
            seq,
            tokens: t,
            n_out: 1,
        }]);
        out.unwrap().to_vec()
    };
    step(&mut s, &mut a, &prompt);
    let mut b = a.fork();
    // Each continues with its own tokens; a fresh sequence fed the same stream agrees bit for
    // bit, whether it steps alone or beside the other.
    let la = step(&mut s, &mut a, &[7]);
    let lb = step(&mut s, &mut b, &[9]);
    let mut fresh_a = s.new_sequence(256);
    step(&mut s, &mut fresh_a, &prompt);
    assert!(same_bits(&step(&mut s, &mut fresh_a, &[7]), &la), "{file}");
    let mut fresh_b = s.new_sequence(256);
    step(&mut s, &mut fresh_b, &prompt);
    let out = s
        .step(&mut [
            Work {
                seq: &mut fresh_b,
                tokens: &[9],
                n_out: 1,
            },
            Work {
                seq: &mut a,
                tokens: &[3],
                n_out: 1,
            },
        ])
        .unwrap()
        .to_vec();
    let v = out.len() / 2;
    assert!(
        same_bits(&out[..v], &lb),
        "{file}: batched beside another sequence"
    );
}

#[test]
fn truncating_short_of_the_end_starts_over() {
    let model = Model::load(&random::random_checkpoint("lfm2-random.gguf")).unwrap();
    let mut s = Session::new(&model, &opts()).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 11 + 3) % 256).collect();
    let first = s.eval(&prompt, true).unwrap().unwrap();
    assert_eq!(
        s.truncate(prompt.len()),
        prompt.len(),
        "the whole history stays"
    );
    assert_eq!(s.truncate(10), 0, "recurrent state cannot be cut back");
    assert!(s.history().is_empty());
    let again = s.eval(&prompt, true).unwrap().unwrap();
    assert!(same_bits(&first, &again), "started over from a zero state");
}

/// Prefix reuse with recurrent state: a prompt extending another's whole prompt chunks takes
/// their pages and the state snapshot kept where they end, and its logits (and the tokens after
/// them) are bit for bit those of computing everything; without a snapshot nothing is reused.
#[test]
fn a_reused_prefix_restores_the_state_snapshot() {
    for file in [
        "qwen35-random.gguf",
        "lfm2-random.gguf",
        "rwkv7-random.gguf",
    ] {
        let model = Model::load(&random::random_checkpoint(file)).unwrap();
        // Chunks of 16 tokens: units of one 256-row page.
        let o = SessionOptions {
            n_ctx: 1024,
            n_batch: 16,
            kv_pool_rows: 8 * 256,
            ..opts()
        };
        let mut s = Session::new(&model, &o).unwrap();
        let toks = |seed: u32, n: u32| -> Vec<u32> {
            (0..n).map(|i| (i * 37 + seed * 11) % 256).collect()
        };
        let feed = |s: &mut Session, seq: &mut engine::Sequence, p: &[u32]| -> Vec<f32> {
            let mut at = seq.history.len();
            let mut last = Vec::new();
            while at < p.len() {
                let end = engine::session::chunk_end(16, at, p.len());
                let n_out = (end == p.len()) as usize;
                let out = s
                    .step(&mut [Work {
                        seq,
                        tokens: &p[at..end],
                        n_out,
                    }])
                    .unwrap();
                if n_out == 1 {
                    last = out.to_vec();
                }
                at = end;
            }
            last
        };
        let base = toks(1, 300);
        let mut a = s.new_sequence_for(&base, 1024);
        feed(&mut s, &mut a, &base);
        assert!(
            s.kv_pool().snapshot_bytes() > 0,
            "{file}: a snapshot at the unit's end"
        );
        let mut pb = base[..270].to_vec();
        pb.extend(toks(2, 30));
        let mut b = s.new_sequence_for(&pb, 1024);
        assert_eq!(
            b.history.len(),
            256,
            "{file}: the first unit and its state reused"
        );
        let lb = feed(&mut s, &mut b, &pb);
        let mut c = s.new_sequence(1024);
        let lc = feed(&mut s, &mut c, &pb);
        assert!(
            same_bits(&lb, &lc),
            "{file}: the reused prefix changed the logits"
        );
        for tok in [5u32, 77, 3] {
            let out = s
                .step(&mut [
                    Work {
                        seq: &mut b,
                        tokens: &[tok],
                        n_out: 1,
                    },
                    Work {
                        seq: &mut c,
                        tokens: &[tok],
                        n_out: 1,
                    },
                ])
                .unwrap()
                .to_vec();
            let v = out.len() / 2;
            assert!(
                same_bits(&out[..v], &out[v..]),
                "{file}: decoding after reuse"
            );
        }
    }
    // No snapshots kept: the pages alone do not resume the state, so nothing is reused.
    std::env::set_var("MOLLM_STATE_SNAPSHOTS_MB", "0");
    let model = Model::load(&random::random_checkpoint("qwen35-random.gguf")).unwrap();
    let o = SessionOptions {
        n_ctx: 1024,
        n_batch: 16,
        ..opts()
    };
    let mut s = Session::new(&model, &o).unwrap();
    let p: Vec<u32> = (0..300).map(|i| (i * 13) % 256).collect();
    let mut a = s.new_sequence(1024);
    for c in p.chunks(16) {
        s.step(&mut [Work {
            seq: &mut a,
            tokens: c,
            n_out: 1,
        }])
        .unwrap();
    }
    assert_eq!(s.kv_pool().snapshot_bytes(), 0);
    assert_eq!(s.new_sequence_for(&p, 1024).history.len(), 0);
    std::env::remove_var("MOLLM_STATE_SNAPSHOTS_MB");
}
