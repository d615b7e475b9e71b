//! get_rows: embedding lookup with exact dequantization.

use crate::tensor::{block_row, invalid, read_i32, widen_row, write_row, Error, Result};
use abi::{DType, HostApi, TensorDesc};

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (table, ids, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = table.dtype().expect("validated");
    let m = ids.ne[0];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let id = read_i32(ids, i) as i64;
        if id < 0 || id >= table.ne[1] {
            return invalid(format!(
                "get_rows: id {id} at {i} outside 0..{}",
                table.ne[1]
            ));
        }
        rows.push(id);
    }
    let k = table.ne[0] as usize;
    let err = std::sync::Mutex::new(None);
    super::for_rows(host, m, table.ne[0], |i| {
        let src = block_row(table, rows[i as usize], 0, 0);
        let mut dst = vec![0f32; k];
        if dt == DType::F32 && table.nb[0] != 4 {
            // Strided f32 table: gather.
            for (j, d) in dst.iter_mut().enumerate() {
                *d = (table.data.wrapping_offset(
                    (rows[i as usize] * table.nb[1] + j as i64 * table.nb[0]) as isize,
                ) as *const f32)
                    .read();
            }
        } else if !widen_row(dt, src, &mut dst) {
            if let Err(e) = quant::dequantize_row(dt, src, &mut dst) {
                err.lock()
                    .unwrap()
                    .get_or_insert(Error::Unsupported(format!("get_rows: {e}")));
                return;
            }
        }
        write_row(out, i, 0, 0, &dst);
    });
    match err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
