//! rope's cache, as `ggml_rope_cache_init` / `rope_yarn` compute it (the reference's rope and
//! the GPU backends' share it).

use abi::RopeAttrs as RopeParams;

fn corr_dim(n_dims: i64, n_ctx_orig: i64, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// `ggml_rope_yarn_corr_dims`.
pub fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    let lo = if 0.0 > start { 0.0 } else { start };
    let hi = if ((p.n_dims - 1) as f32) < end {
        (p.n_dims - 1) as f32
    } else {
        end
    };
    [lo, hi]
}

fn yarn_ramp(low: f32, high: f32, i0: i64) -> f32 {
    let y = ((i0 / 2) as f32 - low) / 0.001f32.max(high - low);
    1.0 - 1f32.min(0f32.max(y))
}

/// `ggml_rope_cache_init` for one position: `[cos, sin]` pairs for `i0 = 0, 2, .., n_dims-2`.
pub fn rope_cache(pos: i32, p: &RopeParams, corr: [f32; 2], theta_scale: f32) -> Vec<f32> {
    let n = p.n_dims as usize;
    let mut cache = vec![0f32; n];
    let mut theta = pos as f32;
    for i0 in (0..n).step_by(2) {
        let theta_extrap = theta; // theta / 1.0f: no frequency factors
        let theta_interp = p.freq_scale * theta_extrap;
        let mut th = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let ramp_mix = yarn_ramp(corr[0], corr[1], i0 as i64) * p.ext_factor;
            // GCC contracts the first product: fma(interp, 1 - mix, extrap * mix).
            th = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
            mscale *= 0.1f32.mul_add((1.0 / p.freq_scale).ln(), 1.0);
        }
        cache[i0] = th.cos() * mscale;
        cache[i0 + 1] = th.sin() * mscale;
        theta *= theta_scale;
    }
    cache
}
