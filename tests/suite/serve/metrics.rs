//! `wfjail serve`'s counters as a worker reads them: the `--metrics` file, written without
//! following what another user planted in its directory, and the zygote restarts in the
//! answer to STATUS (only the server sees a zygote die), and the guest's pid in OPENED.

use std::os::unix::fs::symlink;

use crate::common::{serve_scratch, serve_with_metrics};

#[test]
fn the_metrics_file_never_follows_a_link_planted_in_its_directory() {
    let (s, module) = serve_scratch(
        "metrics-links",
        "mlink",
        "def ok(req):\n    return b'ok'\n",
        "",
        &[],
        "c = Client()\nwith c.session(handler=MOD + ':ok') as s:\n    s.call(b'1')\n\
         time.sleep(2.5)\n",
    );
    let out = s.path("out");
    std::fs::create_dir(&out).unwrap();
    // What another user would like wfjail to overwrite, outside the metrics directory.
    let victim = s.write("victim", "untouched\n");
    let metrics = out.join("metrics.prom");
    // The names a writer by path would use: the old `FILE.tmp`, the temporary names' prefix
    // with common suffixes, and the file itself.
    for name in [
        "metrics.prom.tmp",
        ".metrics.prom.tmp",
        ".metrics.prom.",
        ".metrics.prom.0000000000000000.tmp",
        "metrics.prom",
    ] {
        symlink(&victim, out.join(name)).unwrap();
    }
    let (code, _, stderr) = serve_with_metrics(&s, &module, &metrics);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
    // The file itself was replaced by a file of wfjail's (rename replaces a link, it does not
    // follow it), holding the counters as they were at shutdown.
    let meta = std::fs::symlink_metadata(&metrics).unwrap();
    assert!(meta.file_type().is_file(), "{meta:?}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.contains("wfjail_sessions_opened_total 1\n"), "{text}");
    assert!(
        text.contains("wfjail_sessions_ended_total{status=\"ok\"} 1\n"),
        "{text}"
    );
    // No temporary file is left behind, and every planted link is still a link to the victim.
    let mut left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            ".metrics.prom.",
            ".metrics.prom.0000000000000000.tmp",
            ".metrics.prom.tmp",
            "metrics.prom",
            "metrics.prom.tmp"
        ]
    );
    assert_eq!(
        std::fs::read_link(out.join("metrics.prom.tmp")).unwrap(),
        victim
    );
}

#[test]
fn a_zygote_restart_is_counted_in_status_and_in_the_metrics_file() {
    let (s, module) = serve_scratch(
        "metrics-restart",
        "mrestart",
        "def ok(req):\n    return b'ok'\n",
        "",
        &[],
        // The zygote is the server's other child (the worker is one too); killed, the server
        // replaces it and counts it.
        "import signal\nc = Client()\nassert c.status()['zygote_restarts'] == 0, c.status()\n\
         serve = os.getppid()\n\
         kids = set()\n\
         for t in os.listdir('/proc/%d/task' % serve):\n    \
             kids |= set(int(p) for p in open('/proc/%d/task/%s/children' % (serve, t)).read().split())\n\
         kids.discard(os.getpid())\n\
         assert len(kids) == 1, kids\n\
         os.kill(kids.pop(), signal.SIGKILL)\n\
         deadline = time.time() + 20\n\
         while c.status()['zygote_restarts'] < 1 and time.time() < deadline:\n    time.sleep(0.05)\n\
         print('restarts', c.status()['zygote_restarts'])\n\
         with c.session(handler=MOD + ':ok') as s:\n    print('after', s.call(b'1'))\n    \
             print('pid', open('/proc/%d/cmdline' % s.pid).read() != '')\n",
    );
    let metrics = s.path("metrics.prom");
    let (code, stdout, stderr) = serve_with_metrics(&s, &module, &metrics);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("restarts 1\n"), "{stdout}\n{stderr}");
    assert!(stdout.contains("after b'ok'"), "{stdout}\n{stderr}");
    // OPENED names the guest's process, as the worker's log does.
    assert!(stdout.contains("pid True\n"), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.contains("wfjail_zygote_restarts_total 1\n"), "{text}");
}
