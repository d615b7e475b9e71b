//! Graphs: the builders' graphs compile and survive JSON; bad graphs are refused naming the
//! node and the problem; random corruption never panics; the memory plan never lets two live
//! values share memory.

use super::build::w;
use super::program::{compile, Kind, Program, Src};
use super::{plan::Plan, GraphFile};
use crate::model::{llama, HParams};
use crate::tensor::Weight;
use abi::{DType, TensorDesc};

fn hp() -> HParams {
    HParams {
        arch: "llama".into(),
        n_layer: 2,
        n_layer_mtp: 0,
        n_embd: 64,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_rot: 16,
        n_vocab: 100,
        n_ctx_train: 256,
        eps: 1e-5,
        rope_base: 10000.0,
        rope_freq_scale: 1.0,
        n_swa: 0,
        rope_base_swa: 10000.0,
        swa_layers: vec![false; 2],
        attn_scale: None,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        expert_weights_norm: false,
        n_head_kv_layers: vec![2; 2],
        shortconv_l_cache: 0,
        n_layer_dense_lead: 0,
        n_ff_shexp: 0,
        ssm: None,
        recurrent_layers: vec![false; 2],
        rope_sections: Vec::new(),
        wkv_head_size: 0,
        pooling_type: None,
        expert_gating: 0,
    }
}

/// Shapes of the tiny model's weights (data never read by compile).
fn weight(name: &str) -> Option<Weight> {
    let layer = |s: &str| name.starts_with("blk.") && name.ends_with(s);
    let (dt, shape): (DType, &[i64]) = match name {
        "token_embd.weight" => (DType::F32, &[64, 100]),
        "output_norm.weight" => (DType::F32, &[64]),
        "q4.weight" => (DType::Q4_0, &[64]),
        _ if layer("attn_norm.weight") || layer("ffn_norm.weight") => (DType::F32, &[64]),
        _ if layer("attn_q.weight") || layer("attn_output.weight") => (DType::F32, &[64, 64]),
        _ if layer("attn_k.weight") || layer("attn_v.weight") => (DType::F32, &[64, 32]),
        _ if layer("ffn_gate.weight") || layer("ffn_up.weight") => (DType::F32, &[64, 128]),
        _ if layer("ffn_down.weight") => (DType::F32, &[128, 64]),
        _ => return None,
    };
    Some(Weight {
        desc: TensorDesc::contiguous(core::ptr::null_mut(), dt, shape),
        file_mapped: false,
        cache_slot: false,
        room: 0,
    })
}

fn graph() -> GraphFile {
    llama::build(&hp(), &|n| weight(n).is_some() && n != "output.weight").unwrap()
}

fn try_compile(g: GraphFile) -> Result<Program, String> {
    compile(g, &weight, "test.mollm").map_err(|e| e.to_string())
}

#[test]
fn builder_graphs_compile_and_round_trip_through_json() {
    let g = graph();
    let text = g.to_json();
    let back = GraphFile::from_json(text.as_bytes(), "x").unwrap();
    assert_eq!(back, g);
    let p = try_compile(back).unwrap();
    assert_eq!(p.kv_layers, vec![[16, 2]; 2]);
    let out = &p.nodes[p.output];
    assert_eq!(out.name, "result_output");
    assert_eq!(super::program::shape_str(&out.shape), "100, O, 1, 1");
}

/// Each product posts the next product's weight for warming, the last one the first one's
/// (the next step's); other nodes post nothing.
#[test]
fn each_product_warms_the_next_products_weight() {
    let p = try_compile(graph()).unwrap();
    let targets = super::run::warm_targets(&p);
    let products: Vec<(usize, usize)> = (0..p.nodes.len())
        .filter_map(|i| match (p.nodes[i].kind, &p.nodes[i].inputs[..]) {
            (Kind::Abi(abi::Op::MatMul, _), [Src::Weight(w), ..]) => Some((i, *w)),
            _ => None,
        })
        .collect();
    // Two layers of seven products, and the output.
    assert_eq!(products.len(), 15);
    for (k, &(i, _)) in products.iter().enumerate() {
        let next = products[(k + 1) % products.len()].1;
        assert_eq!(targets[i], Some(next), "node {}", p.nodes[i].name);
    }
    let names: Vec<&str> = products
        .iter()
        .map(|&(_, w)| p.weight_names[w].as_str())
        .collect();
    assert_eq!(names[..2], ["blk.0.attn_q.weight", "blk.0.attn_k.weight"]);
    assert_eq!(
        targets.iter().filter(|t| t.is_some()).count(),
        products.len()
    );
}

/// Replays the plan: at every node, no two values still needed (inputs, the output and
/// anything read later) overlap.
#[test]
fn the_plan_never_overlaps_live_values() {
    let p = try_compile(graph()).unwrap();
    let plan = Plan::new(&p, 32, 4);
    let n = p.nodes.len();
    let size = |i: usize| {
        let s = super::dim::eval_shape(&p.nodes[i].shape, 32, 4);
        (s.iter().product::<i64>() as usize * 4).max(1)
    };
    let mut last = vec![0usize; n];
    for (i, node) in p.nodes.iter().enumerate() {
        last[plan.base[i]] = last[plan.base[i]].max(i);
        for s in &node.inputs {
            if let Src::Node(j) = s {
                last[plan.base[*j]] = last[plan.base[*j]].max(i);
            }
        }
    }
    last[plan.base[p.output]] = usize::MAX;
    for i in 0..n {
        let live: Vec<usize> = (0..=i)
            .filter(|&b| plan.base[b] == b && last[b] >= i)
            .collect();
        for (x, &a) in live.iter().enumerate() {
            for &b in &live[x + 1..] {
                let (ra, rb) = (
                    plan.offset[a]..plan.offset[a] + size(a),
                    plan.offset[b]..plan.offset[b] + size(b),
                );
                assert!(
                    ra.end <= rb.start || rb.end <= ra.start,
                    "at node {i}: {} and {} overlap",
                    p.nodes[a].name,
                    p.nodes[b].name
                );
            }
        }
    }
    assert!(plan.arena_bytes >= size(p.output));
    // Views share their source's memory.
    for (i, node) in p.nodes.iter().enumerate() {
        if let (Kind::Reshape, Src::Node(j)) = (node.kind, node.inputs[0]) {
            assert_eq!(plan.offset[i], plan.offset[j]);
        }
    }
}

fn refused(edit: impl FnOnce(&mut GraphFile), want: &[&str]) {
    let mut g = graph();
    edit(&mut g);
    let e = try_compile(g).err().expect("refused");
    assert!(e.starts_with("test.mollm: "), "{e}");
    for w in want {
        assert!(e.contains(w), "{e:?} does not say {w:?}");
    }
}

fn node(g: &mut GraphFile, name: &str) -> usize {
    g.nodes.iter().position(|n| n.name == name).unwrap()
}

#[test]
fn bad_graphs_are_refused_naming_the_node_and_the_problem() {
    refused(
        |g| {
            let i = node(g, "attn_norm-1");
            g.nodes[i].op = "frobnicate".into()
        },
        &["'attn_norm-1'", "unknown op 'frobnicate'"],
    );
    refused(
        |g| {
            let i = node(g, "ffn_gate-0");
            g.nodes[i].inputs[0] = w("blk.0.nope.weight")
        },
        &[
            "'ffn_gate-0'",
            "weight 'blk.0.nope.weight' is not in the model",
        ],
    );
    refused(
        |g| {
            let i = node(g, "l_out-0");
            g.nodes[i].inputs.pop();
        },
        &["'l_out-0'", "add takes 2 inputs, got 1"],
    );
    refused(
        |g| {
            let i = node(g, "ffn_norm-0");
            g.nodes[i].inputs[1] = w("q4.weight")
        },
        &["'ffn_norm-0'", "does not accept q4_0"],
    );
    refused(
        |g| {
            let i = node(g, "Kcur-0.1");
            g.nodes[i].shape[1] = "n_heads".into()
        },
        &["'Kcur-0.1'", "unknown name 'n_heads'"],
    );
    refused(
        |g| {
            let i = node(g, "Kcur-0.1");
            g.nodes[i].shape[1] = "n_head_kv*T".into()
        },
        &["'Kcur-0.1'", "changes the element count"],
    );
    refused(
        |g| {
            let i = node(g, "attn_norm-0");
            g.nodes[i].inputs[0] = "l_out-1".into()
        },
        &["'attn_norm-0'", "not computed before it"],
    );
    refused(
        |g| {
            let i = node(g, "attn_norm-0");
            g.nodes[i].inputs[0] = "ghost".into()
        },
        &["'attn_norm-0'", "'ghost' is not a node"],
    );
    refused(
        |g| {
            let i = node(g, "attn_norm-0");
            g.nodes[i].attrs.insert("epsilon".into(), 1.0);
        },
        &["'attn_norm-0'", "no attribute 'epsilon'"],
    );
    refused(
        |g| {
            let i = node(g, "Qcur-0");
            g.nodes[i].inputs.swap(0, 1)
        },
        &["'Qcur-0'", "must be a weight"],
    );
    refused(
        |g| {
            let i = node(g, "kqv_out-1");
            g.nodes[i].attrs.insert("layer".into(), 0.0);
        },
        &["'kqv_out-1'", "kv layer 0 is written by two nodes"],
    );
    refused(
        |g| {
            let i = node(g, "kqv_out-0");
            g.nodes[i].attrs.insert("layer".into(), 9.0);
        },
        &["'kqv_out-0'", "'layer'"],
    );
    refused(
        |g| {
            let n = g.nodes[3].clone();
            g.nodes.push(n)
        },
        &["defined twice"],
    );
    refused(
        |g| g.output = "attn_norm-0".into(),
        &["'attn_norm-0'", "[n_vocab, O]"],
    );
    refused(
        |g| g.output = "nowhere".into(),
        &["'nowhere' is not a node"],
    );
    refused(
        |g| {
            let i = node(g, "Qcur-0.1");
            g.nodes[i].shape = vec!["9223372036854775807".into(), "T".into()]
        },
        &["'Qcur-0.1'", "element count"],
    );
    let e = GraphFile::from_json(br#"{"version": 2, "nodes": []}"#, "p.mollm")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("graph version 2, this mollm runs version 1"),
        "{e}"
    );
}

/// A tiny xorshift, so the fuzz cases are the same every run.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn corrupted_graphs_are_refused_without_panicking() {
    let text = graph().to_json().into_bytes();
    let mut s = 0x9e3779b97f4a7c15u64;
    let (mut refused, mut ok) = (0, 0);
    for _ in 0..3000 {
        let mut b = text.clone();
        for _ in 0..1 + rng(&mut s) % 4 {
            let i = (rng(&mut s) as usize) % b.len();
            b[i] = match rng(&mut s) % 4 {
                0 => b'0' + (rng(&mut s) % 10) as u8,
                1 => b'"',
                2 => b"T*O+-,[]{}:"[(rng(&mut s) % 11) as usize],
                _ => rng(&mut s) as u8,
            };
        }
        match GraphFile::from_json(&b, "f")
            .map_err(|e| e.to_string())
            .and_then(|g| try_compile(g).map(|_| ()))
        {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(!e.is_empty());
                refused += 1
            }
        }
    }
    assert!(refused > 2000, "{refused} refused, {ok} accepted");
    // Structural mutations: operands, attributes and dimensions replaced at random.
    let g0 = graph();
    let names: Vec<String> = g0.nodes.iter().map(|n| n.name.clone()).collect();
    for _ in 0..2000 {
        let mut g = g0.clone();
        let i = (rng(&mut s) as usize) % g.nodes.len();
        let n = &mut g.nodes[i];
        match rng(&mut s) % 4 {
            0 if !n.inputs.is_empty() => {
                let k = (rng(&mut s) as usize) % n.inputs.len();
                n.inputs[k] = names[(rng(&mut s) as usize) % names.len()].clone();
            }
            1 => {
                let v = [0.0, -1.0, 1e300, 2.5, 1e15, 4096.0][(rng(&mut s) % 6) as usize];
                let k = [
                    "eps",
                    "n_dims",
                    "layer",
                    "window",
                    "mode",
                    "s",
                    "act",
                    "chain_cols",
                ][(rng(&mut s) % 8) as usize];
                n.attrs.insert(k.into(), v);
            }
            2 => n.shape = vec!["T".into(); (rng(&mut s) % 5) as usize],
            _ => g.nodes.swap(i, (rng(&mut s) as usize) % names.len()),
        }
        let _ = try_compile(g);
    }
}
