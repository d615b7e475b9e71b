//! Intel AMX int8 tiles (Sapphire Rapids and later), for prompt GEMMs whose reference chain
//! takes exact integer sums per sub-block: a tile product is the same exact sum, so the float
//! chain after it stays the reference's, bit for bit.
//!
//! Linux hands the 8 KiB of tile state to a process only after `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`; without it the first tile instruction dies with SIGILL (what
//! llama.cpp's AMX build does on these machines). [`available`] asks once per process and
//! says no on any CPU or kernel without AMX, so nothing else ever executes a tile
//! instruction there. The instructions are written as inline assembly (this toolchain has no
//! AMX intrinsics); tile numbers are fixed by the one configuration below.

/// Whether this process may use AMX int8 tiles: the CPU has AMX-TILE and AMX-INT8 and the
/// kernel granted the tile data permission. `MOLLM_AMX=0` says no (for comparisons).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if !abi::settings::AMX.on(true) {
            return false;
        }
        cpu_has_amx_int8() && request_tile_data()
    })
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_amx_int8() -> bool {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: cpuid exists on every x86-64 CPU; leaf 7 is read only where leaf 0 lists it.
    // (Newer toolchains made these intrinsics safe: the block is for older ones.)
    #[allow(unused_unsafe)]
    unsafe {
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        // EDX bit 24: AMX-TILE, bit 25: AMX-INT8.
        edx & (3 << 24) == 3 << 24
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_amx_int8() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a permission request; it changes no memory. Fails (non-zero) on kernels
    // without AMX support, which then never see a tile instruction.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub use tiles::*;

/// The tile configuration for products of `K`-byte rows (32: Q4_K's sub-blocks, 64: Q6_K's
/// byte planes), loaded on this thread while the value lives; dropping it gives the tile
/// state back. A kernel that takes `&Tiles<K>` runs on the configuration it needs, and a task
/// loads it once for all its calls: `ldtilecfg` and `tilerelease` per 16-row group took ~8%
/// of the Q4_K tile kernel's time on Qwen2.5-1.5B's prompt (perf, pp256).
pub struct Tiles<const K: usize> {
    /// Not `Send`: the configuration belongs to the thread that loaded it.
    _thread: core::marker::PhantomData<*const ()>,
}

#[cfg(target_arch = "x86_64")]
impl<const K: usize> Tiles<K> {
    /// Loads the configuration (zeroing this thread's tiles).
    ///
    /// # Safety
    /// [`available`] returned true.
    pub unsafe fn load() -> Tiles<K> {
        const { assert!(K == 32 || K == 64, "tile rows of 32 or 64 bytes") };
        match K {
            64 => configure_k64(),
            _ => configure(),
        }
        Tiles {
            _thread: core::marker::PhantomData,
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl<const K: usize> Drop for Tiles<K> {
    fn drop(&mut self) {
        // SAFETY: `load` ran on this thread (the value cannot leave it), so AMX is available.
        unsafe { release() }
    }
}

#[cfg(target_arch = "x86_64")]
mod tiles {
    use core::arch::asm;

    /// A tile configuration (palette 1).
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    /// Palette 1 with tiles 0 and 1 of 16 x 16 i32 (the accumulators), 2 and 3 of 16 rows of
    /// `k` bytes (A: 16 activation columns of `k` signed bytes), 4 and 5 of `k / 4` rows of
    /// 64 bytes (B: `k / 4` quads of 16 weight rows, the VNNI layout).
    const fn config(k: u16) -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes: [(usize, u8, u16); 6] = [
            (0, 16, 64),
            (1, 16, 64),
            (2, 16, k),
            (3, 16, k),
            (4, (k / 4) as u8, 64),
            (5, (k / 4) as u8, 64),
        ];
        let mut i = 0;
        while i < shapes.len() {
            let (t, rows, colsb) = shapes[i];
            c[16 + 2 * t] = colsb as u8;
            c[17 + 2 * t] = (colsb >> 8) as u8;
            c[48 + t] = rows;
            i += 1;
        }
        Config(c)
    }

    /// K = 32: one 32-element sub-block per product (Q4_K).
    const CONFIG: Config = config(32);
    /// Every tile 16 rows of 64 bytes (Q6_K's byte planes): tiles 0-3 accumulators, 4 and 5
    /// A (16 activation columns of 64 signed bytes), 6 and 7 B (16 quads of 16 weight rows).
    const CONFIG_K64: Config = {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
            t += 1;
        }
        Config(c)
    };

    /// Loads the K = 64 configuration ([`load2`], [`dot_planes`]).
    ///
    /// # Safety
    /// [`super::available`] returned true.
    #[inline(always)]
    pub(super) unsafe fn configure_k64() {
        asm!("ldtilecfg [{p}]", p = in(reg) CONFIG_K64.0.as_ptr(), options(nostack, readonly));
    }

    /// Tiles 0-3 to zero (the K = 64 configuration's accumulators).
    ///
    /// # Safety
    /// a [`super::Tiles`]`<64>` is loaded on this thread.
    #[inline(always)]
    pub unsafe fn zero4() {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
    }

    /// K = 64, accumulator pair `P` (0 or 1): `C[2P] += A · Blo` (signed by unsigned bytes),
    /// `C[2P + 1] += A · Bhi` (signed by signed), `A` (tile `4 + P`) 16 rows of 64 bytes at
    /// `a`, the B tiles `load2::<6, 7>` left.
    ///
    /// # Safety
    /// `load2::<6, 7>` ran on this thread since the [`super::Tiles`]`<64>` was loaded; `a` covers 1 KiB.
    #[inline(always)]
    pub unsafe fn dot_planes<const P: usize>(a: *const u8) {
        asm!(
            "tileloadd tmm{t}, [{a} + {s}*1]",
            "tdpbsud tmm{l}, tmm{t}, tmm6",
            "tdpbssd tmm{h}, tmm{t}, tmm7",
            a = in(reg) a,
            s = in(reg) 64usize,
            t = const 4 + P,
            l = const 2 * P,
            h = const 2 * P + 1,
            options(nostack, readonly),
        );
    }

    /// Tiles 0-1 (`pairs` 1) or 0-3 (`pairs` 2) to `c`, 1 KiB apart (rows of 64 bytes).
    ///
    /// # Safety
    /// a [`super::Tiles`]`<64>` is loaded on this thread; `c` covers `2 * pairs` KiB.
    #[inline(always)]
    pub unsafe fn store4(c: *mut u8, pairs: usize) {
        asm!(
            "tilestored [{c} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            c = in(reg) c,
            c1 = in(reg) c.add(1024),
            s = in(reg) 64usize,
            options(nostack),
        );
        if pairs == 2 {
            asm!(
                "tilestored [{c} + {s}*1], tmm2",
                "tilestored [{c1} + {s}*1], tmm3",
                c = in(reg) c.add(2048),
                c1 = in(reg) c.add(3072),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
    }

    /// Loads the configuration on this thread (zeroing its tiles).
    ///
    /// # Safety
    /// [`super::available`] returned true.
    #[inline(always)]
    pub(super) unsafe fn configure() {
        asm!("ldtilecfg [{p}]", p = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    }

    /// Gives the tile state back (the thread's context switches stop saving it).
    ///
    /// # Safety
    /// As [`configure`].
    #[inline(always)]
    pub(super) unsafe fn release() {
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Tiles 0 and 1 (the accumulators) to zero.
    ///
    /// # Safety
    /// a [`super::Tiles`]`<32>` is loaded on this thread.
    #[inline(always)]
    pub unsafe fn zero_acc() {
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
    }

    /// Tiles `X` and `Y` from `p0` and `p1` (rows of 64 bytes, 64 apart), kept for several
    /// products: the B operands, tiles 4 and 5 of [`dot2_b`] (K / 4 rows of 64 unsigned
    /// bytes) or 6 and 7 of [`dot_planes`] (16 rows each).
    ///
    /// # Safety
    /// a [`super::Tiles`] (32 or 64) is loaded on this thread, with tiles `X` and `Y`
    /// configured; the pointers cover the rows read.
    #[inline(always)]
    pub unsafe fn load2<const X: usize, const Y: usize>(p0: *const u8, p1: *const u8) {
        asm!(
            "tileloadd tmm{x}, [{p0} + {s}*1]",
            "tileloadd tmm{y}, [{p1} + {s}*1]",
            p0 = in(reg) p0,
            p1 = in(reg) p1,
            s = in(reg) 64usize,
            x = const X,
            y = const Y,
            options(nostack, readonly),
        );
    }

    /// `C0 += A0 · B0`, `C1 += A1 · B1` (tiles 0/2/4 and 1/3/5): `A` is 16 rows of 32 signed
    /// bytes at `a0`/`a1` (row stride `sa`), `B` the tiles `load2::<4, 5>` left; `C[m][n] +=
    /// Σ_k A[m][4k..4k+4] · B[k][4n..4n+4]`, exact in i32.
    ///
    /// # Safety
    /// `load2::<4, 5>` ran on this thread since the [`super::Tiles`]`<32>` was loaded; the pointers cover the rows read.
    #[inline(always)]
    pub unsafe fn dot2_b(a0: *const u8, a1: *const u8, sa: usize) {
        asm!(
            "tileloadd tmm2, [{a0} + {sa}*1]",
            "tileloadd tmm3, [{a1} + {sa}*1]",
            "tdpbsud tmm0, tmm2, tmm4",
            "tdpbsud tmm1, tmm3, tmm5",
            a0 = in(reg) a0,
            a1 = in(reg) a1,
            sa = in(reg) sa,
            options(nostack, readonly),
        );
    }

    /// Tiles 0 and 1 to `c0` and `c1` (16 rows of 16 i32 each, 64-byte rows).
    ///
    /// # Safety
    /// a [`super::Tiles`]`<32>` is loaded on this thread; each pointer covers 1 KiB.
    #[inline(always)]
    pub unsafe fn store_acc(c0: *mut u8, c1: *mut u8) {
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            c0 = in(reg) c0,
            c1 = in(reg) c1,
            s = in(reg) 64usize,
            options(nostack),
        );
    }
}
