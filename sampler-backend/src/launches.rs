//! The kernels a device step launches, counted (cubecl devices: wgpu,
//! vulkan, cuda).
//!
//! cubecl tells one process-wide observer about every kernel it issues, on
//! the issuing thread, before the kernel is submitted. [`count_launches`]
//! installs a counter for the length of a closure; under burn's fusion the
//! queued element-wise ops are issued at the readback, which a step performs
//! before it returns, so a closure around one `Executor::step` /
//! `SamplingBatch::step` sees exactly that step's kernels. Launches from other
//! threads in the meantime are counted too: callers are serialised by a lock,
//! and a measurement should run while nothing else uses a cubecl device.
//! The first step of a new shape also compiles and autotunes (autotune runs
//! candidate kernels): measure a warm step.
//!
//! flex and ndarray run burn's ops directly, without kernels to count: the
//! count is `None` for a build without a cubecl backend.
//!
//! **Bytes read.** cubecl's observer gives names only, so this crate's own
//! kernels ([`crate::kernels`]) declare at each launch the bytes of device
//! memory they read by construction (each pass over a row counted as a
//! read of it, the top-k kernel's fast path, see its docs), and
//! [`KernelCount::reads`] collects them. burn's own kernels declare
//! nothing: [`KernelCount::undeclared`] says how many launches
//! [`KernelCount::bytes_read`] leaves out.

/// The kernels launched while a closure ran, in issue order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCount {
    /// Each launch's kernel name, shortened to its type name (cubecl's names
    /// are Rust type paths with generics).
    pub kernels: Vec<String>,
    /// The custom kernels' declared reads, in launch order: the kernel's
    /// function name and the bytes of device memory it reads.
    pub reads: Vec<(String, u64)>,
}

impl KernelCount {
    /// Kernels launched.
    pub fn total(&self) -> usize {
        self.kernels.len()
    }

    /// Bytes of device memory read by the launches that declared their
    /// reads (all of them when [`KernelCount::undeclared`] is 0).
    pub fn bytes_read(&self) -> u64 {
        self.reads.iter().map(|(_, b)| b).sum()
    }

    /// Launches that declared no reads (burn's own kernels): with any,
    /// [`KernelCount::bytes_read`] is a lower bound.
    pub fn undeclared(&self) -> usize {
        self.total().saturating_sub(self.reads.len())
    }

    /// Launches per kernel name, most frequent first (ties by name).
    pub fn by_name(&self) -> Vec<(String, usize)> {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for k in &self.kernels {
            *counts.entry(k).or_default() += 1;
        }
        let mut out: Vec<(String, usize)> = counts
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// `crate::module::Kernel<T, U>` -> `Kernel`.
#[cfg_attr(
    not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    allow(dead_code)
)]
fn short_name(name: &str) -> String {
    let base = name.split('<').next().unwrap_or(name);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

/// Run `f` and count the kernels cubecl launches meanwhile; `None` when this
/// build has no cubecl backend (see the module docs for what is counted).
pub fn count_launches<T>(f: impl FnOnce() -> T) -> (T, Option<KernelCount>) {
    imp::count(f)
}

/// Declared reads of the launches while a count runs (`None`: no count).
static READS: std::sync::Mutex<Option<Vec<(&'static str, u64)>>> = std::sync::Mutex::new(None);

/// A custom kernel's launch declares the bytes of device memory it reads
/// (recorded only while [`count_launches`] runs).
#[cfg_attr(
    not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    allow(dead_code)
)]
pub(crate) fn declare_read(kernel: &'static str, bytes: usize) {
    let mut reads = READS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = reads.as_mut() {
        r.push((kernel, bytes as u64));
    }
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
mod imp {
    use std::sync::{Arc, Mutex, PoisonError};

    use cubecl_runtime::logging::{LaunchObservation, LaunchObserver};

    use super::{KernelCount, READS, short_name};

    /// One measurement at a time: cubecl has one observer slot.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[derive(Default)]
    struct Counter(Mutex<Vec<&'static str>>);

    impl LaunchObserver for Counter {
        fn launched(&self, kernel: &'static str) {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(kernel);
        }
    }

    pub(super) fn count<T>(f: impl FnOnce() -> T) -> (T, Option<KernelCount>) {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let counter = Arc::new(Counter::default());
        *READS.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
        let watching = LaunchObservation::new(counter.clone());
        let out = f();
        drop(watching);
        let reads = READS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, b)| (k.to_string(), b))
            .collect();
        let kernels = counter
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|k| short_name(k))
            .collect();
        (out, Some(KernelCount { kernels, reads }))
    }
}

#[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
mod imp {
    use super::KernelCount;

    pub(super) fn count<T>(f: impl FnOnce() -> T) -> (T, Option<KernelCount>) {
        (f(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_shortened_and_grouped() {
        assert_eq!(short_name("a::b::Reduce<f32, Max>"), "Reduce");
        assert_eq!(short_name("plain"), "plain");
        let c = KernelCount {
            kernels: ["b", "a", "b", "c", "a", "b"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            reads: vec![("a".into(), 100), ("a".into(), 28)],
        };
        assert_eq!(c.total(), 6);
        assert_eq!((c.bytes_read(), c.undeclared()), (128, 4));
        assert_eq!(
            c.by_name(),
            vec![("b".into(), 3), ("a".into(), 2), ("c".into(), 1)]
        );
    }

    #[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
    #[test]
    fn no_cubecl_backend_no_count() {
        let (v, count) = count_launches(|| 7);
        assert_eq!((v, count), (7, None));
    }
}
