//! What a measured profile records about the machine it was measured on: the CPU's model
//! name, its last-level cache (which jobs find their weights cached) and the SIMD features
//! the kernels choose from at run time.

/// The CPU's model name (`/proc/cpuinfo`), or `unknown`.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The last-level cache's size in bytes (Linux sysfs: the highest-level data or unified
/// cache of CPU 0), if known.
pub fn last_level_cache_bytes() -> Option<u64> {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    caches
        .filter_map(|entry| {
            let dir = entry.ok()?.path();
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
            let level: u32 = read("level")?.trim().parse().ok()?;
            if read("type")?.trim() == "Instruction" {
                return None;
            }
            Some((level, cache_size_bytes(read("size")?.trim())?))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// A sysfs cache size (`32768K`, `8M`, `512`) in bytes.
fn cache_size_bytes(size: &str) -> Option<u64> {
    let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => size.split_at(at),
        None => (size, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// The SIMD features detected at run time that the kernels can use.
pub fn cpu_features() -> Vec<String> {
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($feature:tt),*) => {
                $(if std::is_x86_feature_detected!($feature) {
                    found.push($feature.to_string());
                })*
            };
        }
        probe!(
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            found.push("neon".into());
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            found.push("dotprod".into());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn sysfs_cache_sizes_read_in_bytes() {
        assert_eq!(super::cache_size_bytes("32768K"), Some(32 << 20));
        assert_eq!(super::cache_size_bytes("8M"), Some(8 << 20));
        assert_eq!(super::cache_size_bytes("512"), Some(512));
        assert_eq!(super::cache_size_bytes("12Q"), None);
        assert_eq!(super::cache_size_bytes(""), None);
    }
}
