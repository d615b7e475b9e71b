//! candle's speed on a Qwen2 GGUF (candle-transformers' quantized_qwen2), measured as
//! llama-bench measures: pp = one forward over N random tokens from an empty cache, tg = N
//! single-token forwards from an empty cache; one warm-up, then `reps` runs, median tokens/s.
//! Threads: RAYON_NUM_THREADS (candle's CPU kernels run on rayon's pool).
//! Usage: candle-bench MODEL.gguf PP TG REPS  -> one JSON line per test.

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_qwen2::ModelWeights;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        return Err("usage: candle-bench MODEL.gguf PP TG REPS".into());
    }
    let (pp, tg, reps): (usize, usize, usize) = (a[2].parse()?, a[3].parse()?, a[4].parse()?);
    let dev = Device::Cpu;
    let mut f = std::fs::File::open(&a[1])?;
    let ct = gguf_file::Content::read(&mut f)?;
    // Random ids below the embedding's row count (candle gives GGUF shapes outermost first).
    let vocab = ct
        .tensor_infos
        .get("token_embd.weight")
        .ok_or("no token_embd.weight")?
        .shape
        .dims()[0] as u32;
    let mut m = ModelWeights::from_gguf(ct, &mut f, &dev)?;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut tok = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % vocab as u64) as u32
    };
    let mut run = |test: &str, n: usize| -> Result<(), Box<dyn std::error::Error>> {
        if n == 0 {
            return Ok(());
        }
        let mut ts = Vec::new();
        for r in 0..=reps {
            m.clear_kv_cache();
            let t0 = Instant::now();
            if test == "pp" {
                let ids: Vec<u32> = (0..n).map(|_| tok()).collect();
                let x = Tensor::new(ids.as_slice(), &dev)?.unsqueeze(0)?;
                m.forward(&x, 0)?.to_vec2::<f32>()?;
            } else {
                for i in 0..n {
                    let x = Tensor::new(&[tok()], &dev)?.unsqueeze(0)?;
                    m.forward(&x, i)?.to_vec2::<f32>()?;
                }
            }
            if r > 0 {
                ts.push(n as f64 / t0.elapsed().as_secs_f64());
            }
        }
        ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{{\"test\":\"{test}{n}\",\"median_ts\":{:.3},\"runs\":{ts:?},\"threads\":{}}}",
            ts[ts.len() / 2],
            candle_core::utils::get_num_threads()
        );
        Ok(())
    };
    run("pp", pp)?;
    run("tg", tg)?;
    Ok(())
}
