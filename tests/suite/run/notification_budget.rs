//! The supervisor's work for one guest is bounded (issue 16, part B, fairness): a guest that
//! floods it with notifications (wall-clock reads under the virtual clock, seeded
//! `getrandom`) is killed, and the report says `limit`, limit `notifications`
//! (`notify::Budget`). `wfjail serve` sessions: tests/hostile_serve.rs.

use crate::common::py;

/// Asserts the run ended `limit`, limit `notifications`, exit 5, before the guest's end.
fn assert_budget_limit(o: &crate::common::Outcome, what: &str) {
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "notifications",
        &format!("{what}: status limit, limit notifications, exit 5"),
    );
    o.check(!o.stdout.contains("done"), &format!("{what}: killed"));
}

#[test]
fn a_guest_flooding_the_virtual_clock_is_stopped_as_over_its_notification_budget() {
    // Every time.time() is a notification under clock = "virtual" (the vDSO is patched).
    let o = py(
        "temporal-python",
        &["--timeout", "120s"],
        "import time\nfor i in range(10 ** 8):\n    time.time()\nprint('done')\n",
    );
    assert_budget_limit(&o, "a clock_gettime loop");
}

#[test]
fn a_guest_flooding_seeded_getrandom_is_stopped_as_over_its_notification_budget() {
    let o = py(
        "temporal-python",
        &["--timeout", "120s"],
        "import os\nfor i in range(10 ** 8):\n    os.urandom(8)\nprint('done')\n",
    );
    assert_budget_limit(&o, "a getrandom loop");
}

#[test]
fn a_workflow_that_logs_draws_and_reads_the_clock_stays_within_its_budget() {
    // 3,000 log records, each with the time, a uuid4 and datetime.now(): 9,000
    // notifications in a burst, under the budget.
    let o = py(
        "temporal-python",
        &[],
        "import logging, uuid, datetime\nlogging.basicConfig(level=logging.INFO)\n\
         log = logging.getLogger('wf')\nfor i in range(3000):\n    \
         log.info('step %d %s %s', i, uuid.uuid4(), datetime.datetime.now())\nprint('done')\n",
    );
    o.check(o.status() == "ok" && o.stdout == "done\n", "ok");
}
