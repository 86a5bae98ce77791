"""Managers on shared global providers and the process-wide default do what a user expects.

Each test runs in a fresh interpreter: global providers can be set once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kaos_otel import catalog
from kaos_otel.receiver import OtlpReceiver


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KAOS_OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_configure_twice_returns_the_default_and_says_which_arguments_it_cannot_apply() -> None:
    result = run_python(
        """
        import logging
        import kaos_otel

        logging.basicConfig(level=logging.WARNING)
        first = kaos_otel.configure(service_name="svc-a", bridge_logging=False)
        assert kaos_otel.configure() is first
        assert kaos_otel.configure(service_name="svc-a", bridge_logging=False) is first
        assert kaos_otel.configure(service_name="svc-a") is first  # some of the same: nothing to say
        for _ in range(3):  # said once, however often it is called
            assert kaos_otel.configure(service_name="svc-b", bridge_logging=False) is first
        first.shutdown(1)
        second = kaos_otel.configure(service_name="svc-c", bridge_logging=False)
        assert second is not first
        assert kaos_otel.configure(service_name="svc-d", bridge_logging=False) is second  # said again
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    warnings = [line for line in result.stderr.splitlines() if "configure() was already called" in line]
    assert len(warnings) == 2, result.stderr  # once per default manager
    assert all("service_name" in line and "bridge_logging" not in line for line in warnings)


def test_configure_again_with_an_arguments_default_value_is_not_told_it_is_not_applied() -> None:
    """Two libraries share the default manager: one calls ``configure()``, the other passes
    default values explicitly; that is what applies, so nothing is said."""
    result = run_python(
        """
        import logging
        import kaos_otel

        logging.basicConfig(level=logging.WARNING)
        first = kaos_otel.configure()
        assert kaos_otel.configure(bridge_logging=True, global_providers=True, service_name=None) is first
        assert kaos_otel.configure(bridge_logging=False) is first  # not what applies: said
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "configure() was already called" in line]
    assert [line.rsplit(": ", 1)[1] for line in warnings] == ["bridge_logging"], result.stderr


def test_configure_again_with_arguments_changing_nothing_applied_is_not_told_they_are_not_applied() -> None:
    """``disabled=False`` where telemetry is on, ``capture_content=True`` after ``"SPAN_AND_EVENT"``:
    not the arguments given first, but what the default manager applies, so nothing is said."""
    result = run_python(
        """
        import logging
        import kaos_otel

        logging.basicConfig(level=logging.WARNING)
        first = kaos_otel.configure(bridge_logging=False, capture_content="SPAN_AND_EVENT")
        assert first.enabled
        same = {"disabled": False, "console": False, "capture_content": True, "trust": "Trusted"}
        assert kaos_otel.configure(**same) is first
        assert kaos_otel.configure(disabled=True, capture_content="SPAN_ONLY") is first  # said
        assert kaos_otel.configure(span_max_queue_size=0) is first  # refused, so not applied: said
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "configure() was already called" in line]
    assert [line.rsplit(": ", 1)[1] for line in warnings] == [
        "capture_content, disabled",
        "span_max_queue_size",
    ], result.stderr


def test_a_child_forked_while_another_thread_creates_the_default_can_configure() -> None:
    """A thread of the parent is inside ``configure()`` (building the manager) as the process
    forks: the child's own ``configure()`` returns (it waited for ever on the parent's lock)."""
    result = run_python(
        """
        import os, time
        import kaos_otel
        from kaos_otel import _manager

        with _manager._default_lock:  # as the thread creating the default holds it
            pid = os.fork()
            if pid == 0:
                otel = kaos_otel.configure(bridge_logging=False)
                print("CHILD", otel is kaos_otel.configure(), flush=True)
                os._exit(0)
        deadline = time.monotonic() + 20
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("CHILD HUNG", flush=True)
                break
            time.sleep(0.05)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["CHILD True"], result.stdout + result.stderr


def test_a_manager_on_another_managers_providers_tells_their_losses(otlp_receiver: OtlpReceiver) -> None:
    """An app's manager on the default manager's providers (or the distro's): its ``health``
    counts what those providers lose, its own spans included (it said nothing was lost)."""
    otlp_receiver.set_failure("hang")
    result = run_python(
        """
        import kaos_otel

        first = kaos_otel.configure(bridge_logging=False)
        app = kaos_otel.KaosOtelManager(bridge_logging=False)
        for _ in range(30):
            with app.span("lost"):
                pass
        assert app.shutdown(0.5) is False and first.shutdown(0.5) is False
        print("APP", app.health.dropped("traces"), "FIRST", first.health.dropped("traces"))
        """,
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_BSP_MAX_QUEUE_SIZE="10",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="10",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["APP 30 FIRST 30"], result.stdout + result.stderr


SHARED = """
import os
from kaos_otel import KaosOtelManager

first = KaosOtelManager("first", endpoint=os.environ["TEST_ENDPOINT"], bridge_logging=False)
second = KaosOtelManager("second", bridge_logging=False)
assert second.tracer_provider is first.tracer_provider
"""


def test_a_second_manager_flushes_the_shared_providers(otlp_receiver: OtlpReceiver) -> None:
    """The second manager uses the first one's global providers: its flush exports them."""
    result = run_python(
        SHARED
        + """
with second.span("from-second"):
    pass
assert second.force_flush(5) is True
os._exit(0)  # no exit-time flush: only second.force_flush can have exported the span
""",
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert [span.name for span in otlp_receiver.spans()] == ["from-second"]


@pytest.mark.parametrize("flusher", ["first", "second"])
def test_after_the_second_managers_shutdown_the_shared_providers_still_export(
    otlp_receiver: OtlpReceiver, flusher: str
) -> None:
    """The second manager's shutdown leaves the shared providers to their owner, which keeps them
    running: a span made after it is exported by either manager's ``force_flush`` (the shut-down
    one's returned ``True`` having sent nothing)."""
    result = run_python(
        SHARED
        + f"""
assert second.shutdown(5) is True
with {flusher}.span("after-second-shutdown"):
    pass
assert {flusher}.force_flush(5) is True
os._exit(0)
""",
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert [span.name for span in otlp_receiver.spans()] == ["after-second-shutdown"]


def test_other_libraries_get_a_no_op_meter_and_kaos_metrics_arrive_once(otlp_receiver: OtlpReceiver) -> None:
    """The global meter provider is a ``CatalogMeterProvider``: another library's meter records
    nothing, kaos-otel's instruments (on any manager sharing it) export each record once."""
    result = run_python(
        SHARED
        + """
from opentelemetry import metrics
from opentelemetry.metrics import NoOpMeter
from kaos_otel import CatalogMeterProvider, Outcome

assert isinstance(metrics.get_meter_provider(), CatalogMeterProvider)
assert second.meter_provider is first.meter_provider
metrics.get_meter("opentelemetry-sdk")  # the SDK's metrics about itself (1.40 asks at start-up)
httpx_meter = metrics.get_meter("opentelemetry.instrumentation.httpx")
assert isinstance(httpx_meter, NoOpMeter), type(httpx_meter)
httpx_meter.create_counter("http.client.requests").add(1)
first.record_compaction("agent", Outcome.SUCCESS)
second.record_compaction("agent", Outcome.SUCCESS)
assert second.force_flush(5) is True
os._exit(0)
""",
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert "meter 'opentelemetry.instrumentation.httpx' records nothing" in result.stderr  # said once
    assert result.stderr.count("records nothing") == 1
    points = otlp_receiver.metric_points()
    assert "http.client.requests" not in {point.name for point in points}
    compactions = [point.value for point in points if point.name == catalog.KAOS_MEMORY_COMPACTIONS]
    assert compactions == [2]


def test_export_other_metrics_exports_every_meter_and_is_reported_when_it_cannot_apply(
    otlp_receiver: OtlpReceiver,
) -> None:
    result = run_python(
        """
import os
from opentelemetry import metrics
from kaos_otel import KaosOtelManager

first = KaosOtelManager("first", endpoint=os.environ["TEST_ENDPOINT"], bridge_logging=False)
KaosOtelManager("second", bridge_logging=False, export_other_metrics=True)
private = KaosOtelManager(
    "private", endpoint=os.environ["TEST_ENDPOINT"], global_providers=False, export_other_metrics=True
)
private.meter_provider.get_meter("shop").create_counter("shop.orders").add(3)
metrics.get_meter("shop").create_counter("shop.refunds").add(1)  # the first manager's: kaos-otel's only
assert private.force_flush(5) and first.force_flush(5)
os._exit(0)
""",
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert "export_other_metrics=True not applied" in result.stderr
    assert "meter 'shop' records nothing" in result.stderr
    orders = [p.value for p in otlp_receiver.metric_points() if p.name == "shop.orders"]
    assert orders == [3]
    assert "shop.refunds" not in {p.name for p in otlp_receiver.metric_points()}


def test_the_first_managers_shutdown_leaves_a_second_one_exporting(otlp_receiver: OtlpReceiver) -> None:
    """Shared global providers stop with the last manager using them, whichever built them; so
    does the logging bridge the first one added."""
    result = run_python(
        """
import logging, os
from kaos_otel import KaosOtelManager

first = KaosOtelManager("first", endpoint=os.environ["TEST_ENDPOINT"])
second = KaosOtelManager()  # no service name of its own: nothing to report
with first.span("before"):
    pass
assert first.shutdown(5) is True
with second.span("after-first-shutdown"):
    logging.getLogger("app").warning("logged after the first shutdown")
assert second.shutdown(5) is True
with second.span("after-both"):
    logging.getLogger("app").warning("logged after both")
print(sum(type(h).__name__ == "KaosLoggingHandler" for h in logging.getLogger().handlers))
os._exit(0)
""",
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_BLRP_SCHEDULE_DELAY="600000",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", "the bridge left with the last manager"
    assert [span.name for span in otlp_receiver.spans()] == ["before", "after-first-shutdown"]
    assert [log.body for log in otlp_receiver.logs()] == ["logged after the first shutdown"]


def test_configure_after_the_default_was_shut_down_gives_a_manager_that_exports(
    otlp_receiver: OtlpReceiver,
) -> None:
    result = run_python(
        """
        import os
        import kaos_otel

        first = kaos_otel.configure(endpoint=os.environ["TEST_ENDPOINT"], bridge_logging=False)
        first.shutdown(5)
        again = kaos_otel.configure(endpoint=os.environ["TEST_ENDPOINT"], bridge_logging=False)
        assert again is not first
        assert kaos_otel.configure() is again
        with again.span("after-restart"):
            pass
        assert again.force_flush(5)
        os._exit(0)
        """,
        TEST_ENDPOINT=otlp_receiver.grpc_endpoint,
    )
    assert result.returncode == 0, result.stderr
    assert "was shut down by an earlier manager" in result.stderr
    assert [span.name for span in otlp_receiver.spans()] == ["after-restart"]


def test_a_shutdown_that_only_flushes_shared_providers_says_whether_the_flush_finished() -> None:
    result = run_python(
        """
import os
from kaos_otel import KaosOtelManager

first = KaosOtelManager("first", endpoint="http://127.0.0.1:9", bridge_logging=False)  # nothing listens
second = KaosOtelManager(bridge_logging=False)
with second.span("cannot leave"):
    pass
print(first.shutdown(1), second.queued())
os._exit(0)
""",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "0"], (
        "the second manager keeps the providers: flushed, not stopped"
    )


def test_a_shutdown_during_another_threads_dictconfig_still_removes_its_logging_bridge() -> None:
    """``dictConfig`` sets the bridge aside while it runs; the shutdown must not miss it, nor may
    ``dictConfig`` put a released bridge back."""
    result = run_python(
        """
import logging, logging.config, threading, time
from kaos_otel import KaosOtelManager
from kaos_otel._logs import KaosLoggingHandler

otel = KaosOtelManager("svc", global_providers=False)
building = threading.Event()

class SlowHandler(logging.StreamHandler):  # a handler that opens a socket or a file
    def __init__(self):
        building.set()
        time.sleep(0.5)
        super().__init__()

config = {"version": 1, "disable_existing_loggers": False, "handlers": {"h": {"()": SlowHandler}},
          "root": {"handlers": ["h"], "level": "INFO"}}
configuring = threading.Thread(target=logging.config.dictConfig, args=(config,))
configuring.start()
building.wait()
otel.shutdown(2)
configuring.join()
print(sum(isinstance(h, KaosLoggingHandler) for h in logging.getLogger().handlers),
      hasattr(logging.basicConfig, "__wrapped__"))
""",
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="http://127.0.0.1:9",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "False"], "no bridge left, basicConfig unwrapped"


def test_a_construction_that_fails_installs_nothing_and_leaves_no_thread_so_a_retry_starts_afresh(
    otlp_receiver: OtlpReceiver,
) -> None:
    result = run_python(
        """
import os, threading
from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger_provider
from kaos_otel import KaosOtelManager

def exporting_threads():
    names = (t.name for t in threading.enumerate())
    return sorted(n for n in names if n.endswith("-export") or "MetricReader" in n)

try:
    KaosOtelManager("first")  # fails at the log exporter, after building the tracer and meter providers
except Exception:  # the SDK's InvalidCompressionValueException
    pass
print(type(trace.get_tracer_provider()).__name__, type(metrics.get_meter_provider()).__name__,
      type(get_logger_provider()).__name__, exporting_threads())
del os.environ["OTEL_EXPORTER_OTLP_LOGS_COMPRESSION"]
second = KaosOtelManager("second")
assert second.tracer_provider is trace.get_tracer_provider()
print(second.tracer_provider.resource.attributes["service.name"])
assert second.shutdown(5)
print(exporting_threads())
os._exit(0)
""",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_EXPORTER_OTLP_LOGS_COMPRESSION="bogus",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    failed, retried, stopped = result.stdout.strip().splitlines()
    assert failed == "ProxyTracerProvider _ProxyMeterProvider ProxyLoggerProvider []", "nothing left behind"
    assert retried == "second", "the retry's own service name"
    assert stopped == "[]"


def test_a_manager_whose_globals_another_installed_meanwhile_says_so() -> None:
    result = run_python(
        """
import logging, os, threading
import kaos_otel._pipeline as pipeline
from opentelemetry import trace
from kaos_otel import KaosOtelManager

building, second_done = threading.Event(), threading.Event()
real_log_exporter = pipeline.otlp_log_exporter

def log_exporter_while_another_manager_is_made(settings):
    if threading.current_thread().name == "first":
        building.set()
        second_done.wait(10)
    return real_log_exporter(settings)

pipeline.otlp_log_exporter = log_exporter_while_another_manager_is_made
made = {}
first = threading.Thread(name="first", target=lambda: made.setdefault("first", KaosOtelManager("first")))
first.start()
building.wait(10)
made["second"] = KaosOtelManager("second")
second_done.set()
first.join(10)
print(made["second"].tracer_provider is trace.get_tracer_provider(),
      made["first"].tracer_provider is trace.get_tracer_provider())
os._exit(0)
""",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]
    assert "installed by another manager or the application while this manager was being created" in (
        result.stderr
    )


def test_a_manager_made_inside_dictconfig_while_another_shuts_down_does_not_deadlock() -> None:
    """``dictConfig`` holds logging's lock while a handler factory makes a manager (which keeps its
    bridge on the root); a shutdown on another thread releases a bridge meanwhile."""
    result = run_python(
        """
import logging, logging.config, os, threading, time
from kaos_otel import KaosOtelManager

first = KaosOtelManager("first", global_providers=False)
building = threading.Event()

def factory():
    building.set()
    time.sleep(0.5)  # the other thread's shutdown runs now
    KaosOtelManager("second", global_providers=False)
    return logging.NullHandler()

configuring = threading.Thread(target=logging.config.dictConfig, daemon=True, args=({
    "version": 1, "disable_existing_loggers": False, "handlers": {"h": {"()": factory}},
    "root": {"handlers": ["h"]}},))
configuring.start()
building.wait()
stopping = threading.Thread(target=first.shutdown, args=(1,), daemon=True)
stopping.start()
configuring.join(10)
stopping.join(10)
print(configuring.is_alive(), stopping.is_alive())
os._exit(0)
""",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"], "both threads finished"
