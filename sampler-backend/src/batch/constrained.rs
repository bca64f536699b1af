//! A request's structured-output constraint in the batch: its matcher and
//! the next step's mask, computed on the thread pool as soon as the
//! request's last token is known, so that it overlaps the engine's next
//! forward pass and `submit` only collects it.

use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use sampler_core::{ConstraintError, TokenConstraint, TokenId};

type Shared = Arc<Mutex<Box<dyn TokenConstraint>>>;
type MaskResult = Result<Arc<[u32]>, ConstraintError>;

/// Where the next step's mask stands.
enum Next {
    /// Being computed on the thread pool.
    Computing(Receiver<MaskResult>),
    /// Computed: the mask for the next step (kept until a token is
    /// consumed, so a failed or filtered step uses it again).
    Ready(Arc<[u32]>),
    /// The matcher failed: the request takes no more tokens under it.
    Failed(ConstraintError),
}

/// A constrained request's matcher and next mask.
pub(crate) struct Constrained {
    matcher: Shared,
    next: Next,
    words: usize,
}

impl Constrained {
    /// Start from `matcher`'s current state: its first mask is computed now,
    /// in the background.
    pub(crate) fn new(matcher: Box<dyn TokenConstraint>, words: usize) -> Self {
        let matcher = Arc::new(Mutex::new(matcher));
        let next = spawn_mask(&matcher, words);
        Self {
            matcher,
            next,
            words,
        }
    }

    /// The mask for the next step (waits for it if still being computed);
    /// the matcher's error once it has failed.
    pub(crate) fn mask(&mut self) -> MaskResult {
        if let Next::Computing(rx) = &self.next {
            self.next = match wait(rx) {
                Some(Ok(m)) => Next::Ready(m),
                Some(Err(e)) => Next::Failed(e),
                None => Next::Failed(ConstraintError {
                    kind: "mask",
                    message: "the mask computation stopped without a result".into(),
                }),
            };
        }
        match &self.next {
            Next::Ready(m) => Ok(Arc::clone(m)),
            Next::Failed(e) => Err(e.clone()),
            Next::Computing(_) => unreachable!("collected above"),
        }
    }

    /// The error that ended the constraint, if it failed.
    pub(crate) fn failure(&self) -> Option<&ConstraintError> {
        match &self.next {
            Next::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Run `f` on the matcher once no mask computation holds it.
    fn with_matcher<T>(&mut self, f: impl FnOnce(&mut dyn TokenConstraint) -> T) -> T {
        let mut m = self.matcher.lock().unwrap_or_else(PoisonError::into_inner);
        f(m.as_mut())
    }

    /// Consume accepted tokens and start the next mask. A token the
    /// constraint refuses (one the engine committed past the mask) ends it.
    pub(crate) fn accept(&mut self, tokens: &[TokenId]) {
        if self.failure().is_some() || tokens.is_empty() {
            return;
        }
        let done = self.with_matcher(|m| tokens.iter().try_for_each(|&t| m.consume(t)));
        self.next = match done {
            Ok(()) => spawn_mask(&self.matcher, self.words),
            Err(e) => Next::Failed(e),
        };
    }

    /// Back to the matcher's first state (the request was reset).
    pub(crate) fn reset(&mut self) {
        let done = self.with_matcher(|m| m.reset());
        self.next = match done {
            Ok(()) => spawn_mask(&self.matcher, self.words),
            Err(e) => Next::Failed(e),
        };
    }

    /// An independent copy in the same state, its mask already known
    /// when this one's is.
    pub(crate) fn fork(&mut self) -> Self {
        let copy = self.with_matcher(|m| m.box_clone());
        let matcher = Arc::new(Mutex::new(copy));
        let next = match self.mask() {
            Ok(m) => Next::Ready(m),
            Err(e) => Next::Failed(e),
        };
        Self {
            matcher,
            next,
            words: self.words,
        }
    }

    /// Whether the constraint has finished (only an end-of-sequence token
    /// is allowed now).
    pub(crate) fn is_finished(&mut self) -> bool {
        self.with_matcher(|m| m.is_finished())
    }
}

/// The mask job's result. A caller that is itself a thread-pool worker
/// (an engine stepping from inside a parallel loop) runs other pool jobs
/// while it waits, so the mask job cannot starve behind it.
fn wait(rx: &Receiver<MaskResult>) -> Option<MaskResult> {
    if rayon::current_thread_index().is_none() {
        return rx.recv().ok();
    }
    loop {
        match rx.try_recv() {
            Ok(r) => return Some(r),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Compute `matcher`'s mask on the thread pool.
fn spawn_mask(matcher: &Shared, words: usize) -> Next {
    let (tx, rx) = sync_channel(1);
    let matcher = Arc::clone(matcher);
    rayon::spawn(move || {
        let mut mask = vec![0u32; words];
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            matcher
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .fill_mask(&mut mask)
        }))
        .unwrap_or_else(|_| {
            Err(ConstraintError {
                kind: "mask",
                message: "the matcher panicked computing the mask".into(),
            })
        })
        .map(|()| Arc::from(mask));
        // The request may be gone: nobody to tell.
        let _ = tx.send(res);
    });
    Next::Computing(rx)
}
