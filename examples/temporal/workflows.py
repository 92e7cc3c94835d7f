"""Workflows for the JailedWorkflowRunner example and tests: clean ones, and one that
misbehaves per category (each must fail its workflow task, naming the syscall)."""

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def greet(name: str) -> str:
    return "Hello, %s!" % name


@workflow.defn
class Greeting:
    @workflow.run
    async def run(self, name: str) -> str:
        workflow.logger.info("greeting %s", name)
        greeting = await workflow.execute_activity(
            greet, name, start_to_close_timeout=timedelta(seconds=10))
        await workflow.sleep(0.01)
        return greeting


@workflow.defn
class Lucky:
    """Randomness the workflow way: seeded from history, the same on replay."""

    @workflow.run
    async def run(self) -> list:
        return [workflow.random().randint(0, 1000) for _ in range(3)] + [str(workflow.uuid4())]


@workflow.defn
class Counter:
    """Signals, a query and an update against state that lives in the confined process."""

    def __init__(self) -> None:
        self.count = 0
        self.done = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.done)
        return self.count

    @workflow.signal
    def add(self, n: int) -> None:
        self.count += n

    @workflow.query
    def value(self) -> int:
        return self.count

    @workflow.update
    def finish(self) -> int:
        self.done = True
        return self.count


@workflow.defn
class Network:
    """Reaches for the network, and swallows the error: the task must fail anyway."""

    @workflow.run
    async def run(self) -> str:
        import socket

        try:
            socket.create_connection(("127.0.0.1", 7233), timeout=1)
        except OSError:
            pass
        return "pretended it worked"


@workflow.defn
class Thread:
    """Starts a thread: denied (threads would escape the workflow's determinism)."""

    @workflow.run
    async def run(self) -> str:
        import threading

        threading.Thread(target=print).start()
        return "started"


@workflow.defn
class ReadFile:
    """Reads a host file outside the policy."""

    @workflow.run
    async def run(self) -> str:
        with open("/etc/hostname") as f:
            return f.read()


@workflow.defn
class Subprocess:
    """Runs a program through C (posix.system): denied."""

    @workflow.run
    async def run(self) -> int:
        import posix

        return posix.system("true")


@workflow.defn
class Leaky:
    """Keeps state in a module global: in a process per run, no other run sees it."""

    @workflow.run
    async def run(self, tag: str) -> list:
        _SEEN.append(tag)
        return list(_SEEN)


_SEEN = []


@workflow.defn
class Parent:
    """A child workflow and a local activity."""

    @workflow.run
    async def run(self, name: str) -> list:
        child = await workflow.execute_child_workflow(Greeting.run, name)
        local = await workflow.execute_local_activity(
            greet, "local " + name, start_to_close_timeout=timedelta(seconds=10))
        return [child, local]


@workflow.defn
class Again:
    """Continues as new until n reaches 0."""

    @workflow.run
    async def run(self, n: int) -> str:
        if n > 0:
            workflow.continue_as_new(n - 1)
        return "done"


@workflow.defn
class Spin:
    """Never yields: the SDK's deadlock detection must fire, and the worker go on."""

    @workflow.run
    async def run(self) -> None:
        while True:
            pass


@workflow.defn
class Sqlite:
    """Writes a database file through C (sqlite3): denied and reported."""

    @workflow.run
    async def run(self) -> str:
        import sqlite3

        sqlite3.connect("/tmp/wfjail-example.db").execute("create table t (x)")
        return "written"


@workflow.defn
class Unrestricted:
    """Runs under the permissive policy (`wfjail_policy`, the analogue of the SDK's
    sandbox_unrestricted): its socket is made, and reported to the worker as a warning."""

    wfjail_policy = "permissive"

    @workflow.run
    async def run(self) -> str:
        import socket

        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        return "socket made"


@workflow.defn
class Measured:
    """Records metrics through workflow.metric_meter(): they reach the worker's meter."""

    @workflow.run
    async def run(self, n: int) -> int:
        meter = workflow.metric_meter()
        meter.create_counter("wfjail_example_runs", "example runs").add(1, {"kind": "example"})
        meter.create_histogram_float("wfjail_example_size", unit="items").record(n / 2)
        return n
