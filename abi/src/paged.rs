//! Paged caches: how attention's optional `block_table` maps a sequence's cache rows onto the
//! pool (see the attention schema). Declared here once so every backend maps rows the same way.

use crate::TensorDesc;

/// Where the sequence's cache row `j` lives: itself (no table), or its page's place in the pool.
pub struct PagedRows {
    /// Pool page of each page of the sequence; empty: unpaged.
    table: Vec<i64>,
    page: i64,
    /// Rows the sequence can address (the `C` that attention's padding is capped at).
    pub len: i64,
}

impl PagedRows {
    /// The rows of an attention call over `cache_rows` pool rows: `table` is its optional fifth
    /// input, `page` its `page_rows` attribute. Refuses a table entry outside the pool.
    ///
    /// # Safety
    /// `table`, when given, is a schema-validated 1-D I32 descriptor on valid memory.
    pub unsafe fn new(
        table: Option<&TensorDesc>,
        page: i64,
        cache_rows: i64,
    ) -> Result<PagedRows, String> {
        let Some(t) = table else {
            return Ok(PagedRows {
                table: Vec::new(),
                page: 0,
                len: cache_rows,
            });
        };
        let n_pages = cache_rows / page.max(1);
        let table: Vec<i64> = (0..t.ne[0])
            .map(|i| {
                let p = t.data.wrapping_offset((i * t.nb[0]) as isize) as *const i32;
                p.read_unaligned() as i64
            })
            .collect();
        if let Some((i, &b)) = table
            .iter()
            .enumerate()
            .find(|(_, &b)| b < 0 || b >= n_pages)
        {
            return Err(format!(
                "attention: block_table[{i}] = {b} is outside the pool's {n_pages} pages"
            ));
        }
        Ok(PagedRows {
            len: table.len() as i64 * page,
            table,
            page,
        })
    }

    /// The pool row of the sequence's row `j` (`j < len`).
    #[inline(always)]
    pub fn get(&self, j: i64) -> i64 {
        if self.table.is_empty() {
            j
        } else {
            self.table[(j / self.page) as usize] * self.page + j % self.page
        }
    }
}
