//! Debug aid: prints the top logits after each step of a teacher-forced sequence, the way the
//! golden script feeds llama.cpp (prompt in one batch, then one token at a time).
//! Usage: logits MODEL PROMPT_IDS(comma) [FORCED_IDS(comma)]

use engine::{Model, Session, SessionOptions};

fn parse(s: &str) -> Vec<u32> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.trim().parse().unwrap())
        .collect()
}

fn top(l: &[f32], n: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    idx.into_iter().take(n).map(|i| (i, l[i])).collect()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = Model::load(std::path::Path::new(&a[1])).unwrap();
    let opts = SessionOptions {
        n_ctx: 2048,
        n_threads: 2,
        ..Default::default()
    };
    let mut s = Session::new(&model, &opts).unwrap();
    let prompt = parse(&a[2]);
    let forced = a.get(3).map(|x| parse(x)).unwrap_or_default();
    let mut l = s.eval(&prompt, true).unwrap().unwrap();
    println!("0 {:?}", top(&l, 5));
    for (i, &t) in forced.iter().enumerate() {
        l = s.eval(&[t], true).unwrap().unwrap();
        println!("{} {:?}", i + 1, top(&l, 3));
    }
}
