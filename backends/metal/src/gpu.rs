//! The device: which adapter this backend opens and why it may not, the compiled kernels, and
//! the few things every op does with buffers (upload, queue launches and copies, read back).
//!
//! Apple machines open their Metal device. Elsewhere there is none, unless
//! `MOLLM_METAL_ADAPTER=vulkan` asks for a Vulkan adapter: the same WGSL kernels then run there
//! (Mesa's lavapipe in CI), so that every kernel is checked on machines without a Mac.

use mollm_gpu_common::{Device, Error, Launch};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// `metal` (the default) or `vulkan`.
pub const ADAPTER_ENV: &str = abi::settings::METAL_ADAPTER.name;

/// Workgroups per dispatch row; more work spreads over y (`wg_index` in common.wgsl).
const MAX_GROUPS_X: u32 = 32768;

pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The adapter's name and API, for messages.
    pub name: String,
    /// Largest storage binding, in bytes (128 MiB on lavapipe; tensors larger than this are
    /// split, or refused where they cannot be).
    pub max_binding: u64,
    /// Rows a subgroup-per-row kernel covers per workgroup of 64: 64 / the largest subgroup
    /// size the adapter may use.
    pub rows_per_group: u32,
    /// Whether the device's `fma` rounds once (else kernels emulate it: `fma_x`).
    pub fma_fused: bool,
    /// Whether shaders may use f64: the reference's f64 sums (rms_norm, softmax) are then
    /// `wide` = f64 in the kernels, else f32.
    pub has_f64: bool,
    /// Largest buffer, in bytes.
    pub max_buffer: u64,
    pipelines: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
    /// The first error the device reported since the last check (validation, out of memory,
    /// device lost): wgpu's default would panic.
    failure: Arc<Mutex<Option<String>>>,
}

/// Which wgpu backend to open, or why there is no device.
pub fn requested(env: Option<&str>) -> Result<wgpu::Backends, String> {
    match env {
        Some("vulkan") => Ok(wgpu::Backends::VULKAN),
        Some("metal") | Some("") | None => {
            if cfg!(target_vendor = "apple") {
                Ok(wgpu::Backends::METAL)
            } else {
                Err(format!(
                    "no Metal device (Metal exists on Apple machines only; {ADAPTER_ENV}=vulkan \
                     runs these kernels on a Vulkan adapter instead, for tests)"
                ))
            }
        }
        Some(other) => Err(format!("{ADAPTER_ENV}={other}: expected metal or vulkan")),
    }
}

fn open() -> Result<Gpu, String> {
    let backends = requested(abi::settings::METAL_ADAPTER.get().as_deref())?;
    let api = if backends == wgpu::Backends::VULKAN {
        "Vulkan"
    } else {
        "Metal"
    };
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .map_err(|e| format!("no {api} device ({e})"))?;
    let info = adapter.get_info();
    let limits = adapter.limits();
    // The matmul kernels reduce a row in one subgroup (Metal's SIMD-groups, Vulkan's
    // subgroups).
    if !adapter.features().contains(wgpu::Features::SUBGROUP) {
        return Err(format!(
            "{api} device {} has no subgroup operations",
            info.name
        ));
    }
    let has_f64 = adapter.features().contains(wgpu::Features::SHADER_F64);
    let mut features = wgpu::Features::SUBGROUP;
    if has_f64 {
        features |= wgpu::Features::SHADER_F64;
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("mollm"),
        required_limits: limits.clone(),
        required_features: features,
        ..Default::default()
    }))
    .map_err(|e| format!("{api} device {} refused to open: {e}", info.name))?;
    let failure = Arc::new(Mutex::new(None::<String>));
    let slot = failure.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        s.get_or_insert_with(|| e.to_string());
    }));
    let mut gpu = Gpu {
        device,
        queue,
        name: format!("{} ({api})", info.name),
        max_binding: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        max_buffer: limits.max_buffer_size,
        rows_per_group: (64 / info.subgroup_max_size.clamp(1, 64)).max(1),
        fma_fused: false,
        has_f64,
        pipelines: Mutex::new(HashMap::new()),
        failure,
    };
    gpu.fma_fused = gpu
        .fma_rounds_once()
        .map_err(|e| format!("{api} device {}: {}", info.name, e.message()))?;
    gpu.pipelines
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    Ok(gpu)
}

/// The process's device, opened on first use; `Err` says why there is none.
pub fn gpu() -> Result<&'static Gpu, &'static str> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| match std::panic::catch_unwind(open) {
        Ok(r) => r,
        Err(_) => Err("opening the GPU panicked".into()),
    })
    .as_ref()
    .map_err(|e| e.as_str())
}

thread_local! {
    /// Commands recorded and not yet submitted, per thread (a backend context is used from
    /// one thread at a time; threads' work is independent): launches and copies queue here,
    /// and a wait (or a host write, which the queue runs before the next submission) submits
    /// them.
    static PENDING: std::cell::RefCell<Option<wgpu::CommandEncoder>> =
        const { std::cell::RefCell::new(None) };
    /// Launches recorded since the last submission.
    static RECORDED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Launches after which the pending commands are submitted without a wait: the device starts
/// on them while the host records the rest of the step, and the scratch buffers of what it
/// finished are freed as it goes instead of at the step's end.
const SUBMIT_EVERY: u32 = 32;

/// Rounds a byte size up to what a storage buffer may have (a multiple of 4, at least 4).
fn padded(n: u64) -> u64 {
    n.max(4).div_ceil(4) * 4
}

impl Gpu {
    /// The kernel `name` (a file in `shaders/`), compiled once.
    fn pipeline(&self, name: &'static str) -> Result<Arc<wgpu::ComputePipeline>, Error> {
        let mut map = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(name) {
            return Ok(p.clone());
        }
        let body = crate::shaders::source(name)
            .ok_or_else(|| Error::Device(format!("no kernel named {name}")))?;
        let src = format!(
            "const FMA_FUSED: bool = {};\nalias wide = {};\n{}\n{}",
            self.fma_fused,
            if self.has_f64 { "f64" } else { "f32" },
            crate::shaders::COMMON,
            body
        );
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        self.check()
            .map_err(|e| Error::Device(format!("kernel {name}: {e}")))?;
        let p = Arc::new(p);
        map.insert(name, p.clone());
        Ok(p)
    }

    /// `fma(a, b, c)` on the device for each `[a, b, c, _]`: its own (`emulated` false) or
    /// `fma_x`.
    pub fn fma(&self, abc: &[[f32; 4]], emulated: bool) -> Result<Vec<f32>, Error> {
        use mollm_gpu_common::host;
        let n = abc.len();
        let flat: Vec<f32> = abc.iter().flatten().copied().collect();
        let ib = self.upload("fma operands", host::bytes(&flat))?;
        let ob = self.empty("fma results", (n * 4) as u64)?;
        let launch = Launch {
            kernel: "fma_probe",
            meta: vec![n as u32, emulated as u32],
            bufs: vec![&ib, &ob],
            groups: (n as u32).div_ceil(64),
        };
        Ok(host::f32s(&Device::run(
            self,
            &[launch],
            &ob,
            (n * 4) as u64,
        )?))
    }

    /// Whether the device's `fma` rounds once: (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 exactly,
    /// and 0 when the product is rounded first.
    fn fma_rounds_once(&self) -> Result<bool, Error> {
        let a = 1.0 + 2f32.powi(-12);
        let r = self.fma(&[[a, a, -(1.0 + 2f32.powi(-11)), 0.0]], false)?;
        Ok(r[0] == 2f32.powi(-24))
    }

    /// Compiles every kernel (tests).
    #[cfg(test)]
    pub fn compile_all(&self) -> Result<(), Error> {
        for name in crate::shaders::names() {
            self.pipeline(name)?;
        }
        Ok(())
    }

    /// Takes the device's last reported error, if any.
    pub fn check(&self) -> Result<(), String> {
        match self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A storage buffer holding `bytes`, or refused when it would exceed a binding.
    pub fn upload(&self, what: &str, bytes: &[u8]) -> Result<wgpu::Buffer, Error> {
        let b = self.empty(what, bytes.len() as u64)?;
        // Writes are whole words: only a ragged tail needs a padded copy (weights never do).
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&b, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(&b, whole as u64, &tail);
        }
        Ok(b)
    }

    /// An uninitialised (zeroed) storage buffer of `size` bytes.
    pub fn empty(&self, what: &str, size: u64) -> Result<wgpu::Buffer, Error> {
        if size > self.max_binding {
            return Err(Error::Unsupported(format!(
                "{what}: {size} bytes exceed the device's {} MiB storage binding",
                self.max_binding >> 20
            )));
        }
        self.buffer(what, size)
    }

    fn buffer(&self, what: &str, size: u64) -> Result<wgpu::Buffer, Error> {
        if size > self.max_buffer {
            return Err(Error::Unsupported(format!(
                "{what}: {size} bytes exceed the device's largest buffer ({} MiB)",
                self.max_buffer >> 20
            )));
        }
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: padded(size),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.check().map_err(|e| {
            if e.to_lowercase().contains("out of memory") {
                Error::OutOfMemory(format!(
                    "{}: out of device memory: {what} asked for {size} bytes (the device does \
                     not say how much is free): {e}",
                    self.name
                ))
            } else {
                Error::Device(format!("{}: {what} ({size} bytes): {e}", self.name))
            }
        })?;
        Ok(b)
    }

    /// Records into this thread's pending command encoder.
    fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let enc =
                p.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
            f(enc)
        })
    }

    /// Submits this thread's pending commands, if any.
    fn submit(&self) {
        RECORDED.set(0);
        if let Some(enc) = PENDING.with(|p| p.borrow_mut().take()) {
            self.queue.submit([enc.finish()]);
        }
    }

    fn wait(&self) -> Result<(), Error> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("{}: {e}", self.name)))?;
        self.check()
            .map_err(|e| Error::Device(format!("{}: {e}", self.name)))
    }
}

impl Device for Gpu {
    type Buf = wgpu::Buffer;

    fn max_binding(&self) -> u64 {
        self.max_binding
    }

    fn max_buffer(&self) -> u64 {
        self.max_buffer
    }

    fn matmul_rows_per_group(&self) -> u32 {
        self.rows_per_group
    }

    fn upload(&self, what: &str, bytes: &[u8]) -> Result<wgpu::Buffer, Error> {
        Gpu::upload(self, what, bytes)
    }

    fn empty(&self, what: &str, size: u64) -> Result<wgpu::Buffer, Error> {
        Gpu::empty(self, what, size)
    }

    fn alloc(&self, what: &str, size: u64) -> Result<wgpu::Buffer, Error> {
        self.buffer(what, size)
    }

    /// Each launch's meta words as its binding 0, then its buffers, recorded after the
    /// pending commands.
    fn enqueue(&self, launches: &[Launch<'_, wgpu::Buffer>]) -> Result<(), Error> {
        let metas = launches
            .iter()
            .map(|l| {
                let words: Vec<u8> = l.meta.iter().flat_map(|w| w.to_le_bytes()).collect();
                self.upload("meta", &words)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (l, m) in launches.iter().zip(&metas) {
            let mut bufs = vec![m];
            bufs.extend(l.bufs.iter().copied());
            let pipe = self.pipeline(l.kernel)?;
            self.record(|enc| self.dispatch(enc, &pipe, l.kernel, &bufs, l.groups));
        }
        let n = RECORDED.get() + launches.len() as u32;
        RECORDED.set(n);
        if n >= SUBMIT_EVERY {
            self.submit();
        }
        Ok(())
    }

    fn copy(
        &self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) -> Result<(), Error> {
        if (src_off | dst_off | size) % 4 != 0 {
            return Err(Error::Invalid(format!(
                "device copy of {size} bytes from {src_off} to {dst_off}: not whole words"
            )));
        }
        if size > 0 {
            self.record(|enc| enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, size));
        }
        Ok(())
    }

    fn write(&self, dst: &wgpu::Buffer, off: u64, bytes: &[u8]) -> Result<(), Error> {
        if (off as usize | bytes.len()) % 4 != 0 {
            return Err(Error::Invalid(format!(
                "device write of {} bytes at {off}: not whole words",
                bytes.len()
            )));
        }
        // The queue runs writes before the next submission: what is recorded goes first.
        self.submit();
        self.queue.write_buffer(dst, off, bytes);
        Ok(())
    }

    fn read(&self, src: &wgpu::Buffer, off: u64, size: u64) -> Result<Vec<u8>, Error> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size: padded(size),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let whole = padded(size).min(src.size().saturating_sub(off));
        self.record(|enc| enc.copy_buffer_to_buffer(src, off, &staging, 0, whole));
        self.submit();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            _ => {
                return Err(Error::Device(format!(
                    "{}: the result could not be read back",
                    self.name
                )))
            }
        }
        let out = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::Device(format!("{}: {e}", self.name)))?;
            view[..size as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }

    fn sync(&self) -> Result<(), Error> {
        self.submit();
        self.wait()
    }
}

impl Gpu {
    /// Records `groups` workgroups of kernel `pipe` with `bufs` at bindings 0, 1, ...
    fn dispatch(
        &self,
        enc: &mut wgpu::CommandEncoder,
        pipe: &wgpu::ComputePipeline,
        name: &'static str,
        bufs: &[&wgpu::Buffer],
        groups: u32,
    ) {
        if groups == 0 {
            return;
        }
        let entries: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        let x = groups.min(MAX_GROUPS_X);
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(x, groups.div_ceil(x), 1);
    }
}
