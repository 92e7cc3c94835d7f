"""worker.py and plugin.py import each other in one direction only: plugin imports worker
(``JailedPlugin`` makes runners), worker nothing of plugin, not even inside a function. The
step a runner adds to its Worker's run (``ReadyFirst``) lives in worker and plugin re-exports
it. No server is needed:

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k ImportCycle
"""

import ast
import subprocess
import sys
import unittest

from wfjail.temporal import plugin, worker


def _imports(path):
    """Every module name ``path`` imports, at any depth (relative ones with their dots)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names.append(module)
            # ``from . import plugin`` names the module in its names.
            names += [module.rstrip(".") + "." + a.name for a in node.names]
    return names


class ImportCycleTests(unittest.TestCase):
    def test_worker_imports_nothing_of_plugin(self):
        found = [n for n in _imports(worker.__file__) if "plugin" in n.split(".")]
        self.assertEqual(found, [])

    def test_plugin_still_exports_ready_first_and_the_worker_runs_without_plugin(self):
        self.assertIs(plugin.ReadyFirst, worker.ReadyFirst)
        self.assertTrue(issubclass(plugin.ReadyFirst, worker.temporalio.worker.Plugin))
        # Importing the runner alone does not import the plugin module.
        # (the package's __init__ imports plugin for JailedPlugin: an empty package stands
        # in for it, so that only what worker.py imports is loaded)
        code = ("import importlib.util, sys, types\n"
                "import wfjail\n"
                "spec = importlib.util.find_spec('wfjail.temporal')\n"
                "pkg = types.ModuleType('wfjail.temporal')\n"
                "pkg.__path__ = spec.submodule_search_locations\n"
                "sys.modules['wfjail.temporal'] = pkg\n"
                "import wfjail.temporal.worker as w\n"
                "w.ReadyFirst\n"
                "print('wfjail.temporal.plugin' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        self.assertEqual(out.stdout.strip(), "False")


if __name__ == "__main__":
    unittest.main()
