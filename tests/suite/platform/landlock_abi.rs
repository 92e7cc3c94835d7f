//! The Landlock ABI wfjail builds rulesets for is pinned (`plan::landlock::PINNED_ABI`): the
//! newest one the test suite ran on. These tests fail when the kernel offers another ABI
//! than expected, so that a newer ABI is looked at (and the pin raised) on purpose, and they
//! check that reports and `wfjail check` show both the kernel's ABI and the enforced one.
//!
//! On a kernel whose ABI differs on purpose, say which one it offers:
//! `WFJAIL_EXPECT_LANDLOCK_ABI=N cargo test --test suite -- platform::landlock_abi`.

use std::process::Command;

use crate::common::{PY, py, wfjail_bin};
use wfjail::plan::landlock::{PINNED_ABI, enforced_abi};

/// The kernel's Landlock ABI, asked without wfjail: `landlock_create_ruleset(NULL, 0,
/// LANDLOCK_CREATE_RULESET_VERSION)`.
fn kernel_abi() -> u32 {
    let out = Command::new(PY)
        .args([
            "-c",
            "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(444, None, 0, 1))",
        ])
        .output()
        .expect("run python");
    let v: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a number");
    assert!(
        v > 0,
        "this kernel has no Landlock (landlock_create_ruleset gave {v})"
    );
    v as u32
}

#[test]
fn the_kernel_offers_the_abi_wfjail_was_tested_on() {
    let expected = std::env::var("WFJAIL_EXPECT_LANDLOCK_ABI")
        .ok()
        .map(|v| {
            v.parse::<u32>()
                .expect("WFJAIL_EXPECT_LANDLOCK_ABI is a number")
        })
        .unwrap_or(PINNED_ABI);
    let kernel = kernel_abi();
    assert_eq!(
        kernel, expected,
        "this kernel offers Landlock ABI {kernel}, wfjail is pinned to {PINNED_ABI}. A newer ABI: \
         read what it adds (docs.kernel.org/userspace-api/landlock.html), run the suite with \
         PINNED_ABI raised, and raise it. An older kernel on purpose: set \
         WFJAIL_EXPECT_LANDLOCK_ABI={kernel} (rulesets are then built for ABI {kernel})"
    );
}

#[test]
fn the_enforced_abi_is_the_kernels_at_most_the_pinned_one() {
    assert_eq!(enforced_abi(PINNED_ABI + 2), PINNED_ABI);
    assert_eq!(enforced_abi(PINNED_ABI), PINNED_ABI);
    assert_eq!(enforced_abi(1), 1);
}

#[test]
fn the_report_and_check_show_the_kernels_abi_and_the_enforced_one() {
    let kernel = kernel_abi();
    let enforced = kernel.min(PINNED_ABI);
    let o = py("default", &[], "pass");
    o.check(o.status() == "ok", "status ok");
    let layers = &o.report["layers"];
    o.check(
        layers["landlock"] == format!("abi-{enforced}").as_str(),
        "layers.landlock names the enforced ABI",
    );
    o.check(
        layers["landlock_abi"]["kernel"] == kernel
            && layers["landlock_abi"]["enforced"] == enforced,
        "layers.landlock_abi has the kernel's and the enforced ABI",
    );

    let out = Command::new(wfjail_bin())
        .arg("check")
        .output()
        .expect("run wfjail check");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("landlock "))
        .expect("a landlock row");
    assert!(
        row.contains(&format!("abi-{enforced}")),
        "check names the enforced ABI: {row}"
    );
    if kernel != enforced {
        assert!(
            row.contains(&format!("kernel offers abi-{kernel}")),
            "check names the kernel's ABI: {row}"
        );
    }
}
