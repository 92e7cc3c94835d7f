"""Which `wfjail` binary the runner runs (``wfjail.binary.find_wfjail``), and the wheel's own:
installed from the wheel (scripts/test builds it and installs it into a fresh venv), the
runner finds the binary in the package with no WFJAIL_BIN and nothing on PATH, and runs
workflows with it on a real dev server.

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -p test_binary.py

(The wheel's tests skip when the package was installed from python/, which has no binary.)
"""

import asyncio
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import uuid
from importlib import metadata
from unittest import mock

from temporalio.worker import Worker

import wfjail
from test_jailed_runner import DevServer, W
from wfjail import binary
from wfjail.binary import WfjailNotFound, find_wfjail, packaged_wfjail
from wfjail.temporal import JailedWorkflowRunner


def _executable(directory, name="wfjail"):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


class FindTests(unittest.TestCase):
    """The order: the argument, WFJAIL_BIN, the package's own, PATH; and what a miss says."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dirs = {n: os.path.join(tmp.name, n) for n in ("arg", "env", "path", "empty")}
        for d in self.dirs.values():
            os.mkdir(d)
        self.arg = _executable(self.dirs["arg"])
        self.env = _executable(self.dirs["env"])
        self.on_path = _executable(self.dirs["path"])

    def environ(self, **env):
        base = {k: v for k, v in os.environ.items() if k != binary.ENV}
        return mock.patch.dict(os.environ, {**base, **env}, clear=True)

    def test_the_argument_comes_before_wfjail_bin_and_path(self):
        with self.environ(WFJAIL_BIN=self.env, PATH=self.dirs["path"]):
            self.assertEqual(find_wfjail(self.arg), self.arg)

    def test_an_argument_without_a_slash_is_looked_up_on_path(self):
        with self.environ(PATH=self.dirs["arg"]):
            self.assertEqual(find_wfjail("wfjail"), self.arg)

    def test_a_relative_path_becomes_absolute(self):
        cwd = os.getcwd()
        os.chdir(self.dirs["arg"])
        try:
            self.assertEqual(find_wfjail(os.path.join(".", "wfjail")), self.arg)
        finally:
            os.chdir(cwd)

    def test_wfjail_bin_comes_before_the_package_and_path(self):
        with self.environ(WFJAIL_BIN=self.env, PATH=self.dirs["path"]):
            self.assertEqual(find_wfjail(), self.env)

    def test_a_named_binary_that_is_not_there_is_an_error_not_a_fallback(self):
        missing = os.path.join(self.dirs["empty"], "wfjail")
        with self.environ(PATH=self.dirs["path"]):
            with self.assertRaises(WfjailNotFound) as raised:
                find_wfjail(missing)
        self.assertIn("the wfjail argument names %s" % missing, str(raised.exception))
        with self.environ(WFJAIL_BIN=missing, PATH=self.dirs["path"]):
            with self.assertRaises(WfjailNotFound) as raised:
                find_wfjail()
        self.assertIn("WFJAIL_BIN=%s" % missing, str(raised.exception))
        self.assertIn("not an executable file", str(raised.exception))

    def test_a_file_that_cannot_be_executed_is_refused(self):
        plain = os.path.join(self.dirs["empty"], "wfjail")
        with open(plain, "w"):
            pass
        with self.assertRaises(WfjailNotFound):
            find_wfjail(plain)

    def test_the_package_s_own_binary_comes_before_path(self):
        packaged, _ = packaged_wfjail()
        with self.environ(PATH=self.dirs["path"]):
            # Installed from the wheel: the package's; from python/ (no binary): PATH's.
            self.assertEqual(find_wfjail(), packaged or self.on_path)

    def test_path_is_the_last_place(self):
        with mock.patch.object(binary, "packaged_wfjail", return_value=(None, "no package")):
            with self.environ(PATH=self.dirs["path"]):
                self.assertEqual(find_wfjail(), self.on_path)

    def test_nothing_found_names_every_place_tried_and_how_to_install(self):
        with mock.patch.object(binary, "packaged_wfjail",
                               return_value=(None, "the package says why")):
            with self.environ(PATH=self.dirs["empty"]):
                with self.assertRaises(WfjailNotFound) as raised:
                    find_wfjail()
        said = str(raised.exception)
        for part in ("no wfjail argument", "WFJAIL_BIN unset", "the package says why",
                     "no `wfjail` on PATH (%s)" % self.dirs["empty"],
                     "pip install 'wfjail[temporal]'", "cargo install --locked --path .",
                     "JailedWorkflowRunner(wfjail=PATH)"):
            self.assertIn(part, said)

    def test_a_runner_without_a_binary_fails_when_it_is_made(self):
        # Before the worker starts, not on the first workflow task.
        missing = os.path.join(self.dirs["empty"], "wfjail")
        with self.assertRaises(WfjailNotFound):
            JailedWorkflowRunner(wfjail=missing)
        with self.environ(WFJAIL_BIN=self.arg):
            self.assertEqual(JailedWorkflowRunner()._wfjail, self.arg)


class InstallRecordTests(unittest.TestCase):
    """Whose binary is "the package's own": a distribution found first on sys.path gives its
    binary only if it installed this very package (its files, or an editable install's .pth)."""

    def record(self, pth_line):
        """A fake ``wfjail`` 9.9.9 distribution (dist-info, RECORD, a .pth holding
        ``pth_line``, a binary) first on a fresh interpreter's path; its
        ``packaged_wfjail()``."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        site = os.path.join(tmp.name, "site")
        info = os.path.join(site, "wfjail-9.9.9.dist-info")
        os.makedirs(info)
        os.mkdir(os.path.join(tmp.name, "bin"))
        self.binary = _executable(os.path.join(tmp.name, "bin"))
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: wfjail\nVersion: 9.9.9\n")
        with open(os.path.join(info, "RECORD"), "w") as f:
            f.write("wfjail.pth,,\n../bin/wfjail,,\nwfjail-9.9.9.dist-info/RECORD,,\n")
        with open(os.path.join(site, "wfjail.pth"), "w") as f:
            f.write(pth_line + "\n")
        out = subprocess.run(
            [sys.executable, "-c", "import json; from wfjail.binary import packaged_wfjail; "
             "print(json.dumps(packaged_wfjail()))"],
            check=True, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": site})
        return tuple(json.loads(out.stdout))

    def test_an_editable_install_of_this_package_gives_its_binary(self):
        # maturin develop / pip install -e: the package is a .pth to the source directory.
        source_root = os.path.dirname(os.path.dirname(os.path.abspath(binary.__file__)))
        self.assertEqual(self.record(source_root), (self.binary, ""))

    def test_a_distribution_of_another_tree_gives_nothing(self):
        path, why_not = self.record(tempfile.gettempdir())
        self.assertIsNone(path)
        self.assertIn("is not the installed `wfjail` 9.9.9's", why_not)


def _packaged():
    path, why_not = packaged_wfjail()
    if not path:
        raise unittest.SkipTest("not installed from the wheel (%s): scripts/test builds the "
                                "wheel and runs these from a fresh venv" % why_not)
    return path


def _without_wfjail_env():
    """The environment with no WFJAIL_BIN and a PATH on which there is no `wfjail`."""
    env = {k: v for k, v in os.environ.items() if k != binary.ENV}
    env["PATH"] = os.pathsep.join(["/usr/bin", "/bin"])
    return env


class WheelTests(unittest.TestCase):
    """The package as installed from the wheel: its binary, found with nothing configured."""

    def test_the_wheel_put_its_binary_in_the_interpreter_s_scripts_directory(self):
        self.assertEqual(os.path.dirname(_packaged()), sysconfig.get_path("scripts"))

    def test_the_binary_the_package_and_the_wheel_have_one_version(self):
        out = subprocess.run([_packaged(), "--version"], check=True, capture_output=True,
                             text=True, timeout=30).stdout
        self.assertEqual(out.split(), ["wfjail", wfjail.__version__])
        self.assertEqual(metadata.version("wfjail"), wfjail.__version__)

    def test_a_new_user_s_runner_finds_the_binary_with_nothing_configured(self):
        packaged = _packaged()
        env = _without_wfjail_env()
        out = subprocess.run(
            [sys.executable, "-c", "from wfjail.temporal import JailedWorkflowRunner; "
             "print(JailedWorkflowRunner()._wfjail)"],
            check=True, capture_output=True, text=True, env=env, cwd="/", timeout=120)
        self.assertEqual(out.stdout.strip(), packaged)

    def test_workflows_run_on_the_wheel_s_binary_on_a_real_server(self):
        packaged = _packaged()
        with mock.patch.dict(os.environ, _without_wfjail_env(), clear=True):
            runner = JailedWorkflowRunner()
            self.assertEqual(runner._wfjail, packaged)
            server = DevServer()
            try:
                result = asyncio.run(self._greet(server, runner))
            finally:
                server.stop()
        self.assertEqual(result, "Hello, wheel!")

    async def _greet(self, server, runner):
        client = await server.client()
        queue = "wheel-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=[W.Greeting],
                          activities=[W.greet], workflow_runner=runner):
            return await client.execute_workflow(W.Greeting.run, "wheel",
                                                 id=str(uuid.uuid4()), task_queue=queue)


if __name__ == "__main__":
    unittest.main()
