//! Which cooperative-matrix shapes the device offers (`vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR`,
//! which vulkano 0.35 loads but does not wrap).

// Calling a raw Vulkan entry point is `unsafe`: vulkano cannot check its arguments. The
// one call below says why it holds.
#![allow(unsafe_code)]

use ash::vk;
use vulkano::{VulkanObject, device::physical::PhysicalDevice};

/// The `[m, n, k]` shapes of subgroup-scope f16 x f16 + f32 -> f32 matrices the device offers
/// through `VK_KHR_cooperative_matrix`; empty when it offers the extension not at all.
pub(crate) fn khr_f16_shapes(physical: &PhysicalDevice) -> Vec<[u32; 3]> {
    if !physical.supported_extensions().khr_cooperative_matrix {
        return Vec::new();
    }
    let query = physical
        .instance()
        .fns()
        .khr_cooperative_matrix
        .get_physical_device_cooperative_matrix_properties_khr;
    let mut count = 0u32;
    // SAFETY: the extension is offered, so vulkano loaded the entry point; a null array
    // asks only for the count.
    let result = unsafe { query(physical.handle(), &mut count, std::ptr::null_mut()) };
    if result != vk::Result::SUCCESS {
        return Vec::new();
    }
    let mut props = vec![vk::CooperativeMatrixPropertiesKHR::default(); count as usize];
    // SAFETY: `props` holds `count` default-initialised structures (sType set, pNext null),
    // which the driver fills; it writes back how many it filled.
    let result = unsafe { query(physical.handle(), &mut count, props.as_mut_ptr()) };
    if result != vk::Result::SUCCESS && result != vk::Result::INCOMPLETE {
        return Vec::new();
    }
    props.truncate(count as usize);
    props
        .iter()
        .filter(|p| {
            p.a_type == vk::ComponentTypeKHR::FLOAT16
                && p.b_type == vk::ComponentTypeKHR::FLOAT16
                && p.c_type == vk::ComponentTypeKHR::FLOAT32
                && p.result_type == vk::ComponentTypeKHR::FLOAT32
                && p.scope == vk::ScopeKHR::SUBGROUP
                && p.saturating_accumulation == vk::FALSE
        })
        .map(|p| [p.m_size, p.n_size, p.k_size])
        .collect()
}
