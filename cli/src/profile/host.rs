//! What a measured profile records about the machine it was measured on: the CPU's model
//! name and the SIMD features the kernels choose from at run time.

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
