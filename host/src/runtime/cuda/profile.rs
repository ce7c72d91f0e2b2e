//! A window of steps for a profiler: `KILN_PROFILE_STEPS=decode:A..B` (or
//! `prefill:A..B`) opens the device's profiling range (`cuProfilerStart`)
//! before the A-th step of that kind and closes it (`cuProfilerStop`) before
//! the first step after the B-th, counting from 0 over the run. Nsight
//! Compute (`--profile-from-start off`) and Nsight Systems
//! (`--capture-range=cudaProfilerApi`) then see exactly those steps, their
//! token picks included, and nothing of loading, warm-up or the steps
//! around them. A decode step is one whose every sequence feeds one token
//! ([`buckets::is_decode_step`](super::buckets::is_decode_step)); any other
//! step counts as prefill.

use std::fmt;
use std::ops::Range;

use kiln_kernels::cuda::{Device, DeviceError};

/// Which steps a window counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Every sequence feeds one token.
    Decode,
    /// Any other step (prompts, chunks of them, mixed batches).
    Prefill,
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepKind::Decode => "decode",
            StepKind::Prefill => "prefill",
        })
    }
}

/// The steps to profile, and where the run is in them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileWindow {
    kind: StepKind,
    steps: Range<u64>,
    /// Steps of `kind` seen so far.
    seen: u64,
    /// Kernels run when the range opened, while it is open.
    opened_at: Option<u64>,
}

impl ProfileWindow {
    /// `KILN_PROFILE_STEPS` (see [`ProfileWindow::parse`]), if set.
    pub fn from_env() -> Result<Option<Self>, String> {
        std::env::var("KILN_PROFILE_STEPS")
            .ok()
            .map(|v| Self::parse(&v))
            .transpose()
    }

    /// `decode:A..B` or `prefill:A..B`, A < B.
    pub fn parse(value: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "KILN_PROFILE_STEPS={value}: expected decode:A..B or prefill:A..B (steps A to \
                 B - 1 of that kind, from 0)"
            )
        };
        let (kind, range) = value.split_once(':').ok_or_else(bad)?;
        let kind = match kind {
            "decode" => StepKind::Decode,
            "prefill" => StepKind::Prefill,
            _ => return Err(bad()),
        };
        let (start, end) = range.split_once("..").ok_or_else(bad)?;
        let (start, end): (u64, u64) = (
            start.parse().map_err(|_| bad())?,
            end.parse().map_err(|_| bad())?,
        );
        if start >= end {
            return Err(bad());
        }
        Ok(Self {
            kind,
            steps: start..end,
            seen: 0,
            opened_at: None,
        })
    }

    /// Called before each step's launches: closes the range once the
    /// window's last step is behind, opens it at the window's first.
    pub fn before_step(&mut self, kind: StepKind, device: &dyn Device) -> Result<(), DeviceError> {
        if let Some(opened_at) = self.opened_at.filter(|_| self.seen >= self.steps.end) {
            device.profiler(false)?;
            self.opened_at = None;
            log::info!(
                "profiled {} steps {}..{}: {} kernels",
                self.kind,
                self.steps.start,
                self.steps.end,
                device.kernels_run() - opened_at
            );
        }
        if kind != self.kind {
            return Ok(());
        }
        if self.seen == self.steps.start {
            device.profiler(true)?;
            self.opened_at = Some(device.kernels_run());
        }
        self.seen += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_refuse_what_they_cannot_mean() {
        let window = ProfileWindow::parse("decode:20..22").unwrap();
        assert_eq!((window.kind, window.steps), (StepKind::Decode, 20..22));
        let window = ProfileWindow::parse("prefill:1..2").unwrap();
        assert_eq!((window.kind, window.steps), (StepKind::Prefill, 1..2));
        for bad in [
            "decode",
            "decode:3",
            "decode:3..3",
            "decode:4..2",
            "sample:1..2",
            "decode:a..b",
        ] {
            let err = ProfileWindow::parse(bad).unwrap_err();
            assert!(err.contains("expected decode:A..B"), "{bad}: {err}");
        }
    }
}
