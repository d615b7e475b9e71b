//! get_rows: table rows (any dequantizable format) widened to f32.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

pub(crate) unsafe fn get_rows(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<(), Error> {
    let (table, ids, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = table.dtype().expect("validated");
    let m = ids.ne[0];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let id = read_i32(&ids, i) as i64;
        if id < 0 || id >= table.ne[1] {
            return invalid(format!(
                "get_rows: id {id} at {i} outside 0..{}",
                table.ne[1]
            ));
        }
        rows.push(id);
    }
    let k = table.ne[0] as usize;
    let bytes = dt.row_bytes(k as u64).expect("validated") as usize;
    let err = std::sync::Mutex::new(None);
    for_rows(host, m, table.ne[0], |i| {
        let src = core::slice::from_raw_parts(row_ptr(&table, rows[i as usize], 0, 0), bytes);
        let mut dst = vec![0f32; k];
        if let Err(e) = quant::dequantize_row(dt, src, &mut dst) {
            err.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(Error::Unsupported(format!("get_rows: {e}")));
            return;
        }
        write_from(&out, i, 0, 0, &dst);
    });
    match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
