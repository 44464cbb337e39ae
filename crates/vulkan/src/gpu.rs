//! One opened device: its queue, the buffers it holds, the kernels' pipelines, and the
//! command buffer that dispatches are recorded into until something must come back to
//! the host. Work is submitted only by `flush` (and by what needs the host to see the
//! device's memory: `read`, `write`): a step recorded whole is one submission.

use crate::error::{Check, VulkanError};
use crate::kernels::{self, Kernel};
use crate::probe::{self, DeviceInfo};
use ash::vk;

/// A buffer the device holds (an index into its table; meaningless to another `Gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub u32);

/// What the device has done since it was opened: what a test of "one submission per
/// step, only the logits back" counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Queue submissions.
    pub submissions: u64,
    /// Kernel dispatches recorded.
    pub dispatches: u64,
    /// Bytes copied from the device to the host.
    pub bytes_read: u64,
    /// Bytes copied from the host to the device.
    pub bytes_written: u64,
}

struct Buffer {
    raw: vk::Buffer,
    memory: vk::DeviceMemory,
    bytes: u64,
    /// The mapping, where the memory is host-visible (then reads and writes are copies,
    /// no staging); null where it is not.
    mapped: *mut u8,
}

struct Pipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    buffers: u32,
    push_words: u32,
}

/// Descriptor sets one submission may use before it is flushed to free them.
const SETS_PER_SUBMISSION: u32 = 4096;

pub struct Gpu {
    info: DeviceInfo,
    /// The packed-dot-product kernels are in use (VK_KHR_shader_integer_dot_product).
    dot4: bool,
    // Field order is drop order where it matters: `Drop` destroys everything made from
    // the device, then the device, then the instance; the entry (the loader) last.
    instance: ash::Instance,
    device: ash::Device,
    queue: vk::Queue,
    memory_types: vk::PhysicalDeviceMemoryProperties,
    max_buffer: u64,
    command_pool: vk::CommandPool,
    command: vk::CommandBuffer,
    fence: vk::Fence,
    descriptor_pool: vk::DescriptorPool,
    sets_used: u32,
    recording: bool,
    pipelines: Vec<Option<Pipeline>>,
    buffers: Vec<Option<Buffer>>,
    free: Vec<u32>,
    stats: Stats,
    _entry: ash::Entry,
}

// SAFETY: the raw pointers are mappings of memory this `Gpu` owns, used only through
// `&mut self`; Vulkan handles may move between threads (external synchronisation is
// what `&mut self` gives).
unsafe impl Send for Gpu {}

impl Gpu {
    /// Opens device `index` of `probe()`'s list, with packed integer dot products
    /// where the device has them (unless `LLAMAY_VULKAN_DOT4=0`).
    pub fn open(index: usize) -> Result<Gpu, VulkanError> {
        let allowed = std::env::var("LLAMAY_VULKAN_DOT4").map_or(true, |v| v != "0");
        Self::open_with(index, allowed)
    }

    /// Opens device `index`; `integer_dot` allows the packed-dot-product kernels (a test
    /// compares both paths on one device).
    pub fn open_with(index: usize, integer_dot: bool) -> Result<Gpu, VulkanError> {
        let entry = probe::load_entry()?;
        let instance = probe::create_instance(&entry)?;
        let chosen = Self::choose(&instance, index);
        let (pd, info, family) = match chosen {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: nothing was made from the instance; the loader (`entry`) is
                // still open, as destroying needs it.
                unsafe { instance.destroy_instance(None) };
                return Err(e);
            }
        };
        // From here the Gpu owns the instance: on a failure its `Drop` destroys
        // whatever exists, the instance last, before the loader is closed.
        Self::open_on(entry, instance, pd, info, family, integer_dot)
    }

    /// Device `index` of the instance, if it can compute: (device, what it is, its
    /// compute queue family).
    fn choose(
        instance: &ash::Instance,
        index: usize,
    ) -> Result<(vk::PhysicalDevice, DeviceInfo, u32), VulkanError> {
        // SAFETY: a valid instance.
        let physical =
            unsafe { instance.enumerate_physical_devices() }.check("vkEnumeratePhysicalDevices")?;
        let &pd = physical.get(index).ok_or(VulkanError::NoSuchDevice {
            index,
            count: physical.len(),
        })?;
        let info = probe::describe(instance, pd, index)?;
        if let Some(why) = &info.unusable {
            return Err(VulkanError::NoDevice(format!("{}: {why}", info.name)));
        }
        let family = probe::compute_family(instance, pd)
            .ok_or_else(|| VulkanError::NoDevice(format!("{}: no compute queue", info.name)))?;
        Ok((pd, info, family))
    }

    fn open_on(
        entry: ash::Entry,
        instance: ash::Instance,
        pd: vk::PhysicalDevice,
        info: DeviceInfo,
        family: u32,
        integer_dot: bool,
    ) -> Result<Gpu, VulkanError> {
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        // Packed 4x8-bit dot products: the extension listed and its feature on.
        let dot4 = integer_dot && info.extensions.contains(&probe::INTEGER_DOT_PRODUCT) && {
            let mut f = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f);
            // SAFETY: a physical device of this instance (Vulkan 1.1: features2 is core).
            unsafe { instance.get_physical_device_features2(pd, &mut f2) };
            f.shader_integer_dot_product == vk::TRUE
        };
        let extensions = [c"VK_KHR_shader_integer_dot_product".as_ptr()];
        let mut enable = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
            .shader_integer_dot_product(true);
        let mut create = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
        if dot4 {
            create = create
                .enabled_extension_names(&extensions)
                .push_next(&mut enable);
        }
        // SAFETY: `create` and what it points to live across the call.
        let device = match unsafe { instance.create_device(pd, &create, None) } {
            Ok(d) => d,
            Err(result) => {
                // SAFETY: nothing else was made from the instance; the loader is open.
                unsafe { instance.destroy_instance(None) };
                return Err(VulkanError::Call {
                    call: "vkCreateDevice",
                    result,
                });
            }
        };
        // SAFETY: the device was created with one queue in `family`.
        let queue = unsafe { device.get_device_queue(family, 0) };
        // SAFETY: a physical device of this instance.
        let memory_types = unsafe { instance.get_physical_device_memory_properties(pd) };
        // SAFETY: as above.
        let props = unsafe { instance.get_physical_device_properties(pd) };
        let mut gpu = Gpu {
            info,
            dot4,
            instance,
            device,
            queue,
            memory_types,
            max_buffer: u64::from(props.limits.max_storage_buffer_range),
            command_pool: vk::CommandPool::null(),
            command: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            descriptor_pool: vk::DescriptorPool::null(),
            sets_used: 0,
            recording: false,
            pipelines: kernels::ALL.iter().map(|_| None).collect(),
            buffers: Vec::new(),
            free: Vec::new(),
            stats: Stats::default(),
            _entry: entry,
        };
        // From here `Drop` cleans up whatever exists if a step fails.
        gpu.init_commands(family)?;
        Ok(gpu)
    }

    fn init_commands(&mut self, family: u32) -> Result<(), VulkanError> {
        let d = &self.device;
        let pool = vk::CommandPoolCreateInfo::default().queue_family_index(family);
        // SAFETY: valid device and create infos (for all the calls below).
        self.command_pool =
            unsafe { d.create_command_pool(&pool, None) }.check("vkCreateCommandPool")?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: as above.
        self.command =
            unsafe { d.allocate_command_buffers(&alloc) }.check("vkAllocateCommandBuffers")?[0];
        // SAFETY: as above.
        self.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
            .check("vkCreateFence")?;
        let sizes = [vk::DescriptorPoolSize {
            ty: vk::DescriptorType::STORAGE_BUFFER,
            descriptor_count: SETS_PER_SUBMISSION * kernels::MAX_BINDINGS,
        }];
        let dp = vk::DescriptorPoolCreateInfo::default()
            .max_sets(SETS_PER_SUBMISSION)
            .pool_sizes(&sizes);
        // SAFETY: as above.
        self.descriptor_pool =
            unsafe { d.create_descriptor_pool(&dp, None) }.check("vkCreateDescriptorPool")?;
        Ok(())
    }

    /// Whether matmuls use packed 4x8-bit integer dot products.
    pub fn integer_dot(&self) -> bool {
        self.dot4
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The largest buffer a kernel may bind (`maxStorageBufferRange`).
    pub fn max_buffer_bytes(&self) -> u64 {
        self.max_buffer
    }

    fn memory_type(&self, bits: u32, want: vk::MemoryPropertyFlags) -> Option<u32> {
        let types = &self.memory_types.memory_types[..self.memory_types.memory_type_count as usize];
        (0..types.len() as u32)
            .find(|&i| bits & (1 << i) != 0 && types[i as usize].property_flags.contains(want))
    }

    /// A buffer of `bytes` (rounded up to whole words) in device memory, host-visible
    /// where the device has such memory (integrated GPUs, lavapipe, resizable BAR).
    /// `what` names it in errors.
    pub fn buffer(&mut self, bytes: u64, what: &str) -> Result<BufferId, VulkanError> {
        let size = bytes.max(4).next_multiple_of(4);
        if size > self.max_buffer {
            return Err(VulkanError::TooLarge {
                what: what.to_string(),
                bytes,
                limit: self.max_buffer,
            });
        }
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let shared =
            local | vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        self.make_buffer(size, usage, &[shared, local], what)
    }

    /// A host-visible buffer for copies to or from device-only memory.
    fn staging(&mut self, bytes: u64) -> Result<BufferId, VulkanError> {
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        self.make_buffer(
            bytes.max(4).next_multiple_of(4),
            usage,
            &[host],
            "a staging buffer",
        )
    }

    fn make_buffer(
        &mut self,
        size: u64,
        usage: vk::BufferUsageFlags,
        prefer: &[vk::MemoryPropertyFlags],
        what: &str,
    ) -> Result<BufferId, VulkanError> {
        let d = &self.device;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let raw = unsafe { d.create_buffer(&info, None) }.check("vkCreateBuffer")?;
        // SAFETY: `raw` was just created on this device.
        let req = unsafe { d.get_buffer_memory_requirements(raw) };
        let Some(ty) = prefer
            .iter()
            .find_map(|&p| self.memory_type(req.memory_type_bits, p))
        else {
            // SAFETY: `raw` is unused.
            unsafe { d.destroy_buffer(raw, None) };
            return Err(VulkanError::NoMemoryType("a storage buffer"));
        };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty);
        // SAFETY: valid device and allocate info.
        let memory = match unsafe { d.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(result) => {
                // SAFETY: `raw` is unused.
                unsafe { d.destroy_buffer(raw, None) };
                return Err(match result {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
                    | vk::Result::ERROR_OUT_OF_HOST_MEMORY => VulkanError::TooLarge {
                        what: format!("{what} (out of device memory)"),
                        bytes: size,
                        limit: self.info.memory_bytes,
                    },
                    result => VulkanError::Call {
                        call: "vkAllocateMemory",
                        result,
                    },
                });
            }
        };
        let host_visible = self.memory_types.memory_types[ty as usize]
            .property_flags
            .contains(vk::MemoryPropertyFlags::HOST_VISIBLE);
        // SAFETY: `memory` fits `raw` (its requirements) and neither is bound yet.
        let bound = unsafe { d.bind_buffer_memory(raw, memory, 0) }.check("vkBindBufferMemory");
        let mapped = match bound {
            // SAFETY: host-visible memory, mapped whole, once.
            Ok(()) if host_visible => {
                unsafe { d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                    .check("vkMapMemory")
                    .map(|p| p.cast::<u8>())
            }
            Ok(()) => Ok(std::ptr::null_mut()),
            Err(e) => Err(e),
        };
        let mapped = match mapped {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: neither is in use.
                unsafe {
                    d.destroy_buffer(raw, None);
                    d.free_memory(memory, None);
                }
                return Err(e);
            }
        };
        let buf = Buffer {
            raw,
            memory,
            bytes: size,
            mapped,
        };
        Ok(match self.free.pop() {
            Some(i) => {
                self.buffers[i as usize] = Some(buf);
                BufferId(i)
            }
            None => {
                self.buffers.push(Some(buf));
                BufferId(self.buffers.len() as u32 - 1)
            }
        })
    }

    fn buf(&self, id: BufferId) -> Result<&Buffer, VulkanError> {
        (self.buffers.get(id.0 as usize))
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                VulkanError::Shape(format!("buffer {} is not held by this device", id.0))
            })
    }

    /// Bytes of a buffer (as allocated: whole words).
    pub fn buffer_bytes(&self, id: BufferId) -> Result<u64, VulkanError> {
        Ok(self.buf(id)?.bytes)
    }

    /// Frees a buffer; recorded work that uses it is flushed first.
    pub fn free(&mut self, id: BufferId) -> Result<(), VulkanError> {
        self.flush()?;
        let Some(buf) = self.buffers.get_mut(id.0 as usize).and_then(Option::take) else {
            return Ok(());
        };
        self.destroy(buf);
        self.free.push(id.0);
        Ok(())
    }

    fn destroy(&self, buf: Buffer) {
        // SAFETY: no submitted work is pending (callers flush), so nothing uses it.
        unsafe {
            if !buf.mapped.is_null() {
                self.device.unmap_memory(buf.memory);
            }
            self.device.destroy_buffer(buf.raw, None);
            self.device.free_memory(buf.memory, None);
        }
    }

    fn check_range(&self, id: BufferId, offset: u64, len: usize) -> Result<&Buffer, VulkanError> {
        let buf = self.buf(id)?;
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > buf.bytes)
        {
            return Err(VulkanError::Shape(format!(
                "{len} bytes at {offset} do not fit buffer {} of {} bytes",
                id.0, buf.bytes
            )));
        }
        Ok(buf)
    }

    /// Copies `data` into the buffer at byte `offset`. Recorded work is submitted first,
    /// so it reads what the buffer held when it was recorded.
    pub fn write(&mut self, id: BufferId, offset: u64, data: &[u8]) -> Result<(), VulkanError> {
        self.flush()?;
        let buf = self.check_range(id, offset, data.len())?;
        let (raw, mapped) = (buf.raw, buf.mapped);
        self.stats.bytes_written += data.len() as u64;
        if !mapped.is_null() {
            // SAFETY: the range was checked against the mapped buffer; the device is idle.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    mapped.add(offset as usize),
                    data.len(),
                )
            };
            return Ok(());
        }
        let staging = self.staging(data.len() as u64)?;
        let s = self.buf(staging)?;
        // SAFETY: the staging buffer is mapped and at least `data.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.mapped, data.len()) };
        let region = vk::BufferCopy {
            src_offset: 0,
            dst_offset: offset,
            size: data.len() as u64,
        };
        let src = s.raw;
        self.record_copy(src, raw, region)?;
        self.flush()?;
        self.free(staging)
    }

    /// Copies bytes from the buffer at byte `offset` into `out`, after submitting the
    /// recorded work and waiting for it.
    pub fn read(&mut self, id: BufferId, offset: u64, out: &mut [u8]) -> Result<(), VulkanError> {
        self.flush()?;
        let buf = self.check_range(id, offset, out.len())?;
        let (raw, mapped) = (buf.raw, buf.mapped);
        self.stats.bytes_read += out.len() as u64;
        if !mapped.is_null() {
            // SAFETY: the range was checked; the device is idle (flushed).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    mapped.add(offset as usize),
                    out.as_mut_ptr(),
                    out.len(),
                )
            };
            return Ok(());
        }
        let staging = self.staging(out.len() as u64)?;
        let dst = self.buf(staging)?.raw;
        let region = vk::BufferCopy {
            src_offset: offset,
            dst_offset: 0,
            size: out.len() as u64,
        };
        self.record_copy(raw, dst, region)?;
        self.flush()?;
        let s = self.buf(staging)?;
        // SAFETY: the staging buffer is mapped, `out.len()` bytes, and the copy finished.
        unsafe { std::ptr::copy_nonoverlapping(s.mapped, out.as_mut_ptr(), out.len()) };
        self.free(staging)
    }

    /// Reads `out.len()` f32 values starting at value `offset`.
    pub fn read_f32(
        &mut self,
        id: BufferId,
        offset: usize,
        out: &mut [f32],
    ) -> Result<(), VulkanError> {
        let mut bytes = vec![0u8; out.len() * 4];
        self.read(id, offset as u64 * 4, &mut bytes)?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// Writes f32 values starting at value `offset`.
    pub fn write_f32(
        &mut self,
        id: BufferId,
        offset: usize,
        values: &[f32],
    ) -> Result<(), VulkanError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(id, offset as u64 * 4, &bytes)
    }

    fn begin(&mut self) -> Result<(), VulkanError> {
        if !self.recording {
            let info = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            // SAFETY: the command buffer is idle (reset by the last flush, or new).
            unsafe { self.device.begin_command_buffer(self.command, &info) }
                .check("vkBeginCommandBuffer")?;
            self.recording = true;
        }
        Ok(())
    }

    /// Makes every earlier write visible to every later read or write in the stream.
    fn barrier(&self) {
        let b = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE,
            )];
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        // SAFETY: recording; the barrier references nothing.
        unsafe {
            self.device.cmd_pipeline_barrier(
                self.command,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &b,
                &[],
                &[],
            )
        };
    }

    /// Records a copy of `bytes` bytes between buffers, ordered with the dispatches.
    pub fn copy(
        &mut self,
        src: BufferId,
        src_offset: u64,
        dst: BufferId,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<(), VulkanError> {
        let s = self.check_range(src, src_offset, bytes as usize)?.raw;
        let d = self.check_range(dst, dst_offset, bytes as usize)?.raw;
        if bytes == 0 {
            return Ok(());
        }
        let region = vk::BufferCopy {
            src_offset,
            dst_offset,
            size: bytes,
        };
        self.record_copy(s, d, region)
    }

    fn record_copy(
        &mut self,
        src: vk::Buffer,
        dst: vk::Buffer,
        region: vk::BufferCopy,
    ) -> Result<(), VulkanError> {
        self.begin()?;
        // SAFETY: recording; both buffers are live and the region was range-checked.
        unsafe {
            self.device
                .cmd_copy_buffer(self.command, src, dst, &[region])
        };
        self.barrier();
        Ok(())
    }

    fn pipeline(&mut self, k: Kernel) -> Result<&Pipeline, VulkanError> {
        let i = k.index();
        if self.pipelines[i].is_none() {
            self.pipelines[i] = Some(self.make_pipeline(k)?);
        }
        Ok(self.pipelines[i].as_ref().expect("made above"))
    }

    fn make_pipeline(&self, k: Kernel) -> Result<Pipeline, VulkanError> {
        let spec = k.spec();
        let d = &self.device;
        let code = ash::util::read_spv(&mut std::io::Cursor::new(spec.spirv))
            .map_err(|e| VulkanError::Shape(format!("SPIR-V of {k:?}: {e}")))?;
        let bindings: Vec<_> = (0..spec.buffers)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: valid device and create infos, for every call below; on an error the
        // objects made so far are destroyed before returning.
        let set_layout = unsafe { d.create_descriptor_set_layout(&set_info, None) }
            .check("vkCreateDescriptorSetLayout")?;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(spec.push_words * 4)];
        let layouts = [set_layout];
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&layouts)
            .push_constant_ranges(&ranges);
        // SAFETY: as above.
        let layout = match unsafe { d.create_pipeline_layout(&layout_info, None) } {
            Ok(l) => l,
            Err(result) => {
                // SAFETY: unused.
                unsafe { d.destroy_descriptor_set_layout(set_layout, None) };
                return Err(VulkanError::Call {
                    call: "vkCreatePipelineLayout",
                    result,
                });
            }
        };
        let module_info = vk::ShaderModuleCreateInfo::default().code(&code);
        // SAFETY: as above; the code is SPIR-V words.
        let module = unsafe { d.create_shader_module(&module_info, None) };
        let pipeline = module.and_then(|module| {
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)];
            // SAFETY: as above.
            let p = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) };
            // SAFETY: the module is not needed once the pipeline exists (or failed).
            unsafe { d.destroy_shader_module(module, None) };
            p.map(|ps| ps[0]).map_err(|(_, r)| r)
        });
        match pipeline {
            Ok(pipeline) => Ok(Pipeline {
                set_layout,
                layout,
                pipeline,
                buffers: spec.buffers,
                push_words: spec.push_words,
            }),
            Err(result) => {
                // SAFETY: unused.
                unsafe {
                    d.destroy_pipeline_layout(layout, None);
                    d.destroy_descriptor_set_layout(set_layout, None);
                }
                Err(VulkanError::Call {
                    call: "vkCreateComputePipelines",
                    result,
                })
            }
        }
    }

    /// Records kernel `k` over `groups` workgroups, binding `buffers` in order and
    /// pushing `push`; a barrier follows, so the next dispatch sees what it wrote.
    pub fn dispatch(
        &mut self,
        k: Kernel,
        buffers: &[BufferId],
        push: &[u32],
        groups: [u32; 3],
    ) -> Result<(), VulkanError> {
        let (layout, pipeline, set_layout) = {
            let p = self.pipeline(k)?;
            if buffers.len() != p.buffers as usize || push.len() != p.push_words as usize {
                return Err(VulkanError::Shape(format!(
                    "{k:?} binds {} buffers and {} push words, given {} and {}",
                    p.buffers,
                    p.push_words,
                    buffers.len(),
                    push.len()
                )));
            }
            (p.layout, p.pipeline, p.set_layout)
        };
        let raws = buffers
            .iter()
            .map(|&b| self.buf(b).map(|b| b.raw))
            .collect::<Result<Vec<_>, _>>()?;
        if groups.contains(&0) {
            return Ok(());
        }
        if self.sets_used == SETS_PER_SUBMISSION {
            self.flush()?;
        }
        self.begin()?;
        let layouts = [set_layout];
        let alloc = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(self.descriptor_pool)
            .set_layouts(&layouts);
        // SAFETY: the pool has room (counted by `sets_used`, reset by flush).
        let set = unsafe { self.device.allocate_descriptor_sets(&alloc) }
            .check("vkAllocateDescriptorSets")?[0];
        self.sets_used += 1;
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = raws
            .iter()
            .map(|&raw| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(raw)
                    .offset(0)
                    .range(vk::WHOLE_SIZE)]
            })
            .collect();
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(b, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(b as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        let push_bytes: Vec<u8> = push.iter().flat_map(|w| w.to_le_bytes()).collect();
        // SAFETY: recording; the set, pipeline and layout are live and match (checked
        // counts above); the buffers are live until the flush that runs this.
        unsafe {
            self.device.update_descriptor_sets(&writes, &[]);
            let c = self.command;
            self.device
                .cmd_bind_pipeline(c, vk::PipelineBindPoint::COMPUTE, pipeline);
            self.device.cmd_bind_descriptor_sets(
                c,
                vk::PipelineBindPoint::COMPUTE,
                layout,
                0,
                &[set],
                &[],
            );
            self.device.cmd_push_constants(
                c,
                layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &push_bytes,
            );
            self.device.cmd_dispatch(c, groups[0], groups[1], groups[2]);
        }
        self.barrier();
        self.stats.dispatches += 1;
        Ok(())
    }

    /// Submits what was recorded and waits for it (nothing to do if nothing was).
    pub fn flush(&mut self) -> Result<(), VulkanError> {
        if !self.recording {
            return Ok(());
        }
        self.recording = false;
        let d = &self.device;
        // SAFETY: the command buffer is recording; after the wait nothing is in flight,
        // so resetting the pools is allowed.
        unsafe {
            d.end_command_buffer(self.command)
                .check("vkEndCommandBuffer")?;
            let cmds = [self.command];
            let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
            d.queue_submit(self.queue, &submit, self.fence)
                .check("vkQueueSubmit")?;
            self.stats.submissions += 1;
            d.wait_for_fences(&[self.fence], true, u64::MAX)
                .check("vkWaitForFences")?;
            d.reset_fences(&[self.fence]).check("vkResetFences")?;
            d.reset_command_pool(self.command_pool, vk::CommandPoolResetFlags::empty())
                .check("vkResetCommandPool")?;
            d.reset_descriptor_pool(self.descriptor_pool, vk::DescriptorPoolResetFlags::empty())
                .check("vkResetDescriptorPool")?;
        }
        self.sets_used = 0;
        Ok(())
    }

    /// Workgroups of `local` invocations that cover `n`.
    pub(crate) fn groups(n: usize, local: u32) -> Result<u32, VulkanError> {
        u32::try_from(n.div_ceil(local as usize)).map_err(|_| {
            VulkanError::Shape(format!("{n} invocations are more than a dispatch holds"))
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: waiting for idle makes every object below unused; each is destroyed
        // once (null handles are allowed by Vulkan's destroy functions).
        unsafe {
            let _ = self.device.device_wait_idle();
            for buf in std::mem::take(&mut self.buffers).into_iter().flatten() {
                self.destroy(buf);
            }
            for p in std::mem::take(&mut self.pipelines).into_iter().flatten() {
                self.device.destroy_pipeline(p.pipeline, None);
                self.device.destroy_pipeline_layout(p.layout, None);
                self.device
                    .destroy_descriptor_set_layout(p.set_layout, None);
            }
            self.device
                .destroy_descriptor_pool(self.descriptor_pool, None);
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_command_pool(self.command_pool, None);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
