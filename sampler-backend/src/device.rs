//! Run-time device selection from a string (`flex`, `ndarray`, `wgpu`,
//! `vulkan`, `cuda`, `cuda:N`, `wgpu:N`, `vulkan:N`).

use burn_tensor::Device;

use crate::BackendError;

/// Device names this build accepts, in the order of their cargo features.
///
/// `cuda`, `wgpu` and `vulkan` also accept an index suffix (`cuda:1`); for
/// wgpu/vulkan an index selects that discrete GPU, no index the default adapter.
pub fn compiled_devices() -> &'static [&'static str] {
    &[
        #[cfg(feature = "flex")]
        "flex",
        #[cfg(feature = "ndarray")]
        "ndarray",
        #[cfg(feature = "wgpu")]
        "wgpu",
        #[cfg(feature = "vulkan")]
        "vulkan",
        #[cfg(feature = "cuda")]
        "cuda",
    ]
}

fn unknown(given: &str, reason: impl Into<String>) -> BackendError {
    BackendError::UnknownDevice {
        given: given.to_string(),
        reason: reason.into(),
        available: compiled_devices().to_vec(),
    }
}

/// The device and offload policy for a `[device] kind` / `--device` name: the
/// one place that gives `cpu` its meaning. `cpu` is the whole chain on the
/// host with sampler-cpu (logits on `flex`, [`sampler_core::OffloadPolicy::Off`] whatever
/// `policy` says); any other name is [`parse_device`] with `policy` unchanged.
///
/// # Errors
/// As [`parse_device`].
pub fn resolve_device(
    name: &str,
    policy: sampler_core::OffloadPolicy,
) -> Result<(Device, sampler_core::OffloadPolicy), BackendError> {
    if name.trim().eq_ignore_ascii_case("cpu") {
        Ok((parse_device("flex")?, sampler_core::OffloadPolicy::Off))
    } else {
        Ok((parse_device(name)?, policy))
    }
}

/// Parse a device string into a burn [`Device`].
///
/// Accepted (case-insensitive, surrounding spaces ignored): `flex`, `ndarray`,
/// `wgpu`, `wgpu:N`, `vulkan`, `vulkan:N`, `cuda`, `cuda:N`. `cpu` gives
/// `flex`, the device that holds the logits when the chain runs on the host:
/// `cpu` means "sampler-cpu only, nothing offloaded", which
/// [`resolve_device`] applies to the offload policy too.
///
/// # Errors
/// [`BackendError::UnknownDevice`] for an unknown name, a bad index, or a
/// backend whose cargo feature was not compiled in; the error lists
/// [`compiled_devices`].
pub fn parse_device(s: &str) -> Result<Device, BackendError> {
    let lower = s.trim().to_ascii_lowercase();
    let (name, index) = match lower.split_once(':') {
        Some((n, i)) => {
            let idx: usize = i
                .trim()
                .parse()
                .map_err(|_| unknown(s, format!("`{i}` is not a device index")))?;
            (n.trim().to_string(), Some(idx))
        }
        None => (lower.clone(), None),
    };
    let name = if name == "cpu" {
        if index.is_some() {
            return Err(unknown(s, "`cpu` takes no device index"));
        }
        "flex".to_string()
    } else {
        name
    };
    let known = ["flex", "ndarray", "wgpu", "vulkan", "cuda"];
    if !known.contains(&name.as_str()) {
        return Err(unknown(s, "not a device name"));
    }
    if !compiled_devices().contains(&name.as_str()) {
        return Err(unknown(
            s,
            format!("the `{name}` cargo feature of sampler-backend was not compiled in"),
        ));
    }
    if index.is_some() && (name == "flex" || name == "ndarray") {
        return Err(unknown(s, format!("`{name}` takes no device index")));
    }
    make(&name, index).ok_or_else(|| unknown(s, "not available in this build"))
}

/// [`parse_device`], then one tiny operation on the device (a sum of two
/// numbers, read back) to find out whether it can run on this machine: a
/// compiled-in GPU backend with no adapter or driver here is an error, not a
/// panic at the first step.
///
/// Costs what starting the device costs (about a second for wgpu on a
/// software Vulkan driver); the device is usable afterwards.
///
/// # Errors
/// As [`parse_device`]; [`BackendError::DeviceUnavailable`] when the device
/// cannot start here or returns a wrong sum (a broken driver).
pub fn probe_device(name: &str) -> Result<Device, BackendError> {
    let device = parse_device(name)?;
    let probe = device.clone();
    let unavailable = |reason: &str| BackendError::DeviceUnavailable {
        given: name.to_string(),
        reason: reason.to_string(),
    };
    let sum = std::panic::catch_unwind(move || {
        let t = burn_tensor::Tensor::<1>::from_data(
            burn_tensor::TensorData::new(vec![1.0f32, 2.0], [2]),
            &probe,
        );
        t.sum().into_data().iter::<f32>().next()
    });
    match sum {
        Ok(Some(3.0)) => Ok(device),
        Ok(_) => Err(unavailable(
            "it returned a wrong sum of [1, 2] (a broken driver?)",
        )),
        Err(_) => Err(unavailable(
            "it could not start (no adapter or driver for it on this machine)",
        )),
    }
}

/// The compiled-in devices ([`compiled_devices`]) that start on this machine
/// ([`probe_device`]), with the reason for each one left out.
pub fn usable_devices() -> (Vec<&'static str>, Vec<(&'static str, BackendError)>) {
    let (mut ok, mut skipped) = (Vec::new(), Vec::new());
    for &name in compiled_devices() {
        match probe_device(name) {
            Ok(_) => ok.push(name),
            Err(e) => skipped.push((name, e)),
        }
    }
    (ok, skipped)
}

/// Whether `device` computes on this machine's CPU: `flex`, `ndarray`, or a
/// GPU API served by a software driver with no card behind it (lavapipe,
/// SwiftShader). Such a device gives the same tokens as a GPU, but every
/// kernel it compiles costs seconds (the driver's LLVM), so a test of a
/// large model's forward pass can ask before it starts. Opens the device.
#[allow(unused_variables)]
pub fn is_software_device(device: &Device) -> bool {
    #[cfg(feature = "cubecl-kernels")]
    if let Some(identity) = device.identity() {
        return identity.physical.is_none();
    }
    true
}

#[allow(unused_variables)]
fn make(name: &str, index: Option<usize>) -> Option<Device> {
    match name {
        #[cfg(feature = "flex")]
        "flex" => Some(Device::flex()),
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Some(Device::ndarray()),
        #[cfg(feature = "wgpu")]
        "wgpu" => Some(Device::wgpu(match index {
            Some(i) => burn_tensor::DeviceKind::DiscreteGpu(i),
            None => burn_tensor::DeviceKind::DefaultDevice,
        })),
        #[cfg(feature = "vulkan")]
        "vulkan" => Some(Device::vulkan(match index {
            Some(i) => burn_tensor::DeviceKind::DiscreteGpu(i),
            None => burn_tensor::DeviceKind::DefaultDevice,
        })),
        #[cfg(feature = "cuda")]
        "cuda" => Some(Device::cuda(index.unwrap_or(0))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_name_lists_choices() {
        let e = parse_device("tpu").unwrap_err();
        let msg = e.to_string();
        for d in compiled_devices() {
            assert!(msg.contains(d), "{msg}");
        }
        assert!(parse_device("cuda:x").is_err());
    }

    #[cfg(feature = "flex")]
    #[test]
    fn flex_probes_and_is_usable() {
        assert!(probe_device("flex").is_ok());
        assert!(usable_devices().0.contains(&"flex"));
        assert!(matches!(
            probe_device("tpu"),
            Err(BackendError::UnknownDevice { .. })
        ));
    }

    #[cfg(feature = "flex")]
    #[test]
    fn flex_is_a_software_device() {
        assert!(is_software_device(&parse_device("flex").unwrap()));
    }

    /// lavapipe (`llvmpipe`) and SwiftShader name themselves; a GPU does not
    /// use those names.
    #[cfg(feature = "wgpu")]
    #[test]
    fn a_software_vulkan_driver_is_a_software_device() {
        let device = match probe_device("wgpu") {
            Ok(d) => d,
            Err(e) => return println!("SKIP wgpu: {e}"),
        };
        let name = device.identity().map(|i| i.name).unwrap_or_default();
        let lower = name.to_lowercase();
        let named_software = ["llvmpipe", "swiftshader"]
            .iter()
            .any(|n| lower.contains(n));
        assert_eq!(is_software_device(&device), named_software, "{name}");
    }

    #[cfg(feature = "flex")]
    #[test]
    fn flex_parses() {
        assert!(parse_device(" Flex ").is_ok());
        assert!(parse_device("flex:1").is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn missing_feature_is_named() {
        let e = parse_device("cuda:1").unwrap_err().to_string();
        assert!(e.contains("cargo feature"), "{e}");
    }
}
