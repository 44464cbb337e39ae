//! Finding the loader and the devices behind it, without creating a logical device:
//! what `llamay version` prints and what `--device auto` chooses from.

use crate::error::{Check, VulkanError};
use ash::vk;
use std::ffi::CStr;

/// The loader's file name where `LLAMAY_VULKAN_LOADER` does not name another.
#[cfg(target_os = "windows")]
pub const DEFAULT_LOADER: &str = "vulkan-1.dll";
#[cfg(target_os = "macos")]
pub const DEFAULT_LOADER: &str = "libvulkan.dylib";
#[cfg(not(any(target_os = "windows", target_os = "macos")))]
pub const DEFAULT_LOADER: &str = "libvulkan.so.1";

/// The Vulkan version the kernels are written for (subgroups, `vkGetPhysicalDevice*2`).
pub(crate) const API_VERSION: u32 = vk::API_VERSION_1_1;

/// The device extensions llamay uses where a device has them.
pub const INTEGER_DOT_PRODUCT: &str = "VK_KHR_shader_integer_dot_product";

/// Opens the loader: `LLAMAY_VULKAN_LOADER` if set (a path or a file name), else the
/// platform's. Never linked: on a machine without one this is an error, not a crash.
pub(crate) fn load_entry() -> Result<ash::Entry, VulkanError> {
    let path = std::env::var("LLAMAY_VULKAN_LOADER").unwrap_or_else(|_| DEFAULT_LOADER.into());
    // SAFETY: opening the Vulkan loader runs its initialisers; the library is the
    // system's (or the one the user named for exactly this purpose).
    unsafe { ash::Entry::load_from(&path) }.map_err(|e| {
        let reason = match e {
            ash::LoadingError::LibraryLoadFailure(e) => e.to_string(),
            ash::LoadingError::MissingEntryPoint(e) => e.to_string(),
        };
        // dlerror's text starts with the path the error already names.
        let reason = reason
            .strip_prefix(&format!("{path}: "))
            .unwrap_or(&reason)
            .to_string();
        VulkanError::NoLoader { path, reason }
    })
}

/// An instance for probing or computing.
pub(crate) fn create_instance(entry: &ash::Entry) -> Result<ash::Instance, VulkanError> {
    // SAFETY: a loader function with no arguments beyond the output.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .check("vkEnumerateInstanceVersion")?
        .unwrap_or(vk::API_VERSION_1_0);
    if version < API_VERSION {
        return Err(VulkanError::NoDevice(format!(
            "the loader offers Vulkan {}; llamay needs 1.1",
            version_string(version)
        )));
    }
    let app = vk::ApplicationInfo::default()
        .application_name(c"llamay")
        .api_version(API_VERSION);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `info` and what it points to live across the call.
    unsafe { entry.create_instance(&info, None) }.check("vkCreateInstance")
}

/// What kind of device Vulkan says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    /// A CPU pretending (Mesa's lavapipe): chosen only by name, never by `auto`.
    Cpu,
    Other,
}

impl DeviceKind {
    fn of(t: vk::PhysicalDeviceType) -> DeviceKind {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
            _ => DeviceKind::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Discrete => "discrete GPU",
            DeviceKind::Integrated => "integrated GPU",
            DeviceKind::Virtual => "virtual GPU",
            DeviceKind::Cpu => "CPU",
            DeviceKind::Other => "other",
        }
    }
}

/// One physical device as `llamay version` lists it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Its index in the loader's order: `--device vulkan:N`.
    pub index: usize,
    pub name: String,
    pub kind: DeviceKind,
    /// The Vulkan version the driver implements, "1.3.230".
    pub api_version: String,
    /// "llvmpipe: Mesa 22.3.6 (LLVM 15.0.6)".
    pub driver: String,
    /// Bytes of device-local memory (the largest such heap).
    pub memory_bytes: u64,
    pub subgroup_size: u32,
    /// Of the extensions llamay uses, those the device has.
    pub extensions: Vec<&'static str>,
    /// Why llamay cannot compute on it, if it cannot (no compute queue, too old).
    pub unusable: Option<String>,
}

impl DeviceInfo {
    /// One line: `0: llvmpipe (LLVM 15.0.6, 256 bits) — CPU, Vulkan 1.3.230, ...`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}: {} — {}, Vulkan {}, driver {}, {:.1} GiB, subgroup {}",
            self.index,
            self.name,
            self.kind.name(),
            self.api_version,
            self.driver,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.subgroup_size
        );
        if !self.extensions.is_empty() {
            s += &format!(", has {}", self.extensions.join(" "));
        }
        if let Some(why) = &self.unusable {
            s += &format!(" (not usable: {why})");
        }
        s
    }
}

pub(crate) fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

/// Every device the loader offers, in its order.
pub fn probe() -> Result<Vec<DeviceInfo>, VulkanError> {
    let entry = load_entry()?;
    let instance = create_instance(&entry)?;
    let result = enumerate(&instance);
    // SAFETY: nothing made from the instance outlives this call.
    unsafe { instance.destroy_instance(None) };
    result
}

fn enumerate(instance: &ash::Instance) -> Result<Vec<DeviceInfo>, VulkanError> {
    // SAFETY: a valid instance.
    let physical =
        unsafe { instance.enumerate_physical_devices() }.check("vkEnumeratePhysicalDevices")?;
    physical
        .iter()
        .enumerate()
        .map(|(index, &pd)| describe(instance, pd, index))
        .collect()
}

/// The compute-capable queue family of a device, if any.
pub(crate) fn compute_family(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Option<u32> {
    // SAFETY: a physical device of this instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .map(|i| i as u32)
}

/// The device's extension names.
pub(crate) fn extension_names(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<Vec<String>, VulkanError> {
    // SAFETY: a physical device of this instance.
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
        .check("vkEnumerateDeviceExtensionProperties")?;
    Ok(exts
        .iter()
        .filter_map(|e| e.extension_name_as_c_str().ok())
        .map(|c| c.to_string_lossy().into_owned())
        .collect())
}

pub(crate) fn describe(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    index: usize,
) -> Result<DeviceInfo, VulkanError> {
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut driver)
        .push_next(&mut subgroup);
    // SAFETY: a physical device of this instance; the chained structs outlive the call.
    unsafe { instance.get_physical_device_properties2(pd, &mut props) };
    let p = props.properties;
    // SAFETY: as above.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    let memory_bytes = mem.memory_heaps[..mem.memory_heap_count as usize]
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0);
    let names = extension_names(instance, pd)?;
    let extensions = [INTEGER_DOT_PRODUCT]
        .into_iter()
        .filter(|e| names.iter().any(|n| n == e))
        .collect();
    let c_str = |s: Result<&CStr, _>| {
        s.map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let driver_name = c_str(driver.driver_name_as_c_str());
    let driver_info = c_str(driver.driver_info_as_c_str());
    let unusable = if p.api_version < API_VERSION {
        Some(format!(
            "it implements Vulkan {}; llamay needs 1.1",
            version_string(p.api_version)
        ))
    } else if compute_family(instance, pd).is_none() {
        Some("no compute queue".into())
    } else if p.limits.max_per_stage_descriptor_storage_buffers < crate::kernels::MAX_BINDINGS {
        Some(format!(
            "a kernel binds {} storage buffers; it allows {}",
            crate::kernels::MAX_BINDINGS,
            p.limits.max_per_stage_descriptor_storage_buffers
        ))
    } else {
        None
    };
    Ok(DeviceInfo {
        index,
        name: c_str(p.device_name_as_c_str()),
        kind: DeviceKind::of(p.device_type),
        api_version: version_string(p.api_version),
        driver: if driver_info.is_empty() {
            driver_name
        } else {
            format!("{driver_name}: {driver_info}")
        },
        memory_bytes,
        subgroup_size: subgroup.subgroup_size,
        extensions,
        unusable,
    })
}

/// The device `--device auto` takes: the first usable discrete GPU, else the first
/// usable integrated one. Never a CPU-type device (it must be asked for by name).
pub fn pick_auto(devices: &[DeviceInfo]) -> Option<&DeviceInfo> {
    [DeviceKind::Discrete, DeviceKind::Integrated]
        .iter()
        .find_map(|&k| devices.iter().find(|d| d.kind == k && d.unusable.is_none()))
}
