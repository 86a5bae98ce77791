"""``opentelemetry-instrument`` with the kaos-otel distro: the zero-code path a new user takes.

A small app runs under the real ``opentelemetry-instrument`` (with every installed instrumentor,
``opentelemetry-instrumentation-logging`` among them, as ``opentelemetry-bootstrap`` installs it)
and exports to an in-process OTLP receiver.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kaos_otel.receiver import OtlpReceiver

APP = textwrap.dedent(
    """
    import logging
    from opentelemetry import metrics, trace

    logging.getLogger("app").setLevel(logging.INFO)
    with trace.get_tracer("app").start_as_current_span("work"):
        logging.getLogger("app").info("one record")
        metrics.get_meter("kaos_otel").create_counter("kaos.requests").add(1)
    """
)


def run_instrumented(tmp_path: Path, code: str = APP, **environ: str) -> subprocess.CompletedProcess[str]:
    """``code`` under ``opentelemetry-instrument``; kaos-otel's distro is the one installed."""
    instrument = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    assert instrument, "opentelemetry-instrument is installed with the `instrument` extra"
    app = tmp_path / "app.py"
    app.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KAOS_"))}
    env.update({"OTEL_SERVICE_NAME": "distro-app", "OTEL_METRIC_EXPORT_INTERVAL": "600000", **environ})
    return subprocess.run(
        [instrument, sys.executable, str(app)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("log_auto_instrumentation", [None, "true"])
def test_with_instrumentation_logging_installed_each_record_is_exported_once(
    otlp_receiver: OtlpReceiver, tmp_path: Path, log_auto_instrumentation: str | None
) -> None:
    assert importlib.util.find_spec("opentelemetry.instrumentation.logging"), "a dev dependency"
    asked = (
        {"OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION": log_auto_instrumentation} if log_auto_instrumentation else {}
    )
    done = run_instrumented(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint, **asked)
    assert done.returncode == 0, done.stderr
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 1 and len(r.logs()) >= 1, 10)
    otlp_receiver.wait_for(lambda r: len(r.logs()) >= 2, 1)  # a second copy would arrive with the first
    app_records = [log for log in otlp_receiver.logs() if log.scope_name == "app"]
    assert [log.body for log in app_records] == ["one record"]
    assert ("OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION=true is not followed" in done.stderr) == bool(asked)
    (record,) = app_records
    (span,) = otlp_receiver.spans()
    assert record.trace_id == span.trace_id


def test_an_app_instrumenting_logging_itself_gets_no_second_handler(tmp_path: Path) -> None:
    """With the entry point left out, ``LoggingInstrumentor().instrument()`` in the app's code
    adds no handler next to kaos-otel's either (it would export every record twice)."""
    code = textwrap.dedent(
        """
        import logging
        from opentelemetry.instrumentation.logging import LoggingInstrumentor
        LoggingInstrumentor().instrument(set_logging_format=True)
        print(sorted(type(handler).__name__ for handler in logging.getLogger().handlers))
        """
    )
    done = run_instrumented(
        tmp_path, code, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="logging",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "KaosLoggingHandler" in done.stdout and "'LoggingHandler'" not in done.stdout, done.stdout


def test_exporter_variables_none_and_console_are_followed(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    endpoint = otlp_receiver.grpc_endpoint
    others_off = {"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    done = run_instrumented(
        tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_EXPORTER="console", **others_off
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "work"' in done.stdout  # the SDK's console exporter
    assert "not exported" not in done.stderr  # a signal turned off is a choice, not a missing endpoint
    everything_off = run_instrumented(
        tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_EXPORTER="none", **others_off
    )
    assert everything_off.returncode == 0, everything_off.stderr
    assert "not exported" not in everything_off.stderr
    assert not otlp_receiver.raw_requests()


def test_an_exporter_kaos_otel_cannot_build_is_named(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    done = run_instrumented(
        tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint, OTEL_TRACES_EXPORTER="zipkin"
    )
    assert done.returncode == 0, done.stderr
    assert "OTEL_TRACES_EXPORTER=zipkin" in done.stderr


def test_a_service_name_given_in_code_that_cannot_apply_is_named(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """The distro made the providers first: a manager's ``service_name`` cannot reach them."""
    code = "from kaos_otel import KaosOtelManager\nKaosOtelManager('named-in-code').shutdown(2)\n"
    done = run_instrumented(tmp_path, code, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint)
    assert done.returncode == 0, done.stderr
    assert "keep their resource: service.name given here not applied" in done.stderr


def test_an_app_that_does_not_use_mem0_does_not_load_it(tmp_path: Path) -> None:
    """The mem0 instrumentor waits for the app's own import (mem0 is installed here)."""
    assert importlib.util.find_spec("mem0"), "the mem0 extra is installed for the tests"
    code = "import sys\nprint(sorted({name.split('.')[0] for name in sys.modules} & {'mem0', 'posthog'}))\n"
    done = run_instrumented(tmp_path, code, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_apps_and_other_instrumentations_metrics_are_exported(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Under the distro the process has no other way to export them (a plain SDK setup does)."""
    code = textwrap.dedent(
        """
        from opentelemetry import metrics
        metrics.get_meter("shop").create_counter("shop.orders").add(2, {"shop.region": "eu"})
        metrics.get_meter("opentelemetry.instrumentation.httpx").create_counter("http.client.requests").add(1)
        metrics.get_meter("kaos_otel").create_counter("kaos.requests").add(1)
        """
    )
    done = run_instrumented(tmp_path, code, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint)
    assert done.returncode == 0, done.stderr
    assert "records nothing" not in done.stderr
    assert otlp_receiver.wait_for(lambda r: len({p.name for p in r.metric_points()}) >= 3, 10)
    points = {(p.scope_name, p.name): p for p in otlp_receiver.metric_points()}
    assert points[("shop", "shop.orders")].value == 2
    assert points[("shop", "shop.orders")].attributes == {"shop.region": "eu"}
    assert ("opentelemetry.instrumentation.httpx", "http.client.requests") in points
    assert points[("kaos_otel", "kaos.requests")].value == 1


def test_no_other_installed_configurator_runs_after_the_kaos_distro(tmp_path: Path) -> None:
    """With ``opentelemetry-distro`` installed too, its configurator would build a second set of
    providers the API refuses but that still export (its logging handler past the content-safety
    layer): the distro sets ``OTEL_PYTHON_CONFIGURATOR=kaos`` unless the environment sets it, for
    the setup only."""
    site = tmp_path / "site"
    dist_info = site / "other_configurator-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: other-configurator\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[opentelemetry_configurator]\nconfigurator = other_configurator:Configurator\n"
    )
    (site / "other_configurator.py").write_text(
        "class Configurator:\n    def configure(self, **kwargs):\n        print('other configurator ran')\n"
    )
    code = (
        "import os\nfrom opentelemetry import trace\nprint(type(trace.get_tracer_provider()).__name__)\n"
        "print(os.environ.get('OTEL_PYTHON_CONFIGURATOR'))\n"
    )
    done = run_instrumented(tmp_path, code, PYTHONPATH=str(site), OTEL_TRACES_EXPORTER="none")
    assert done.returncode == 0, done.stderr
    # kaos-otel's, and no other ran; the variable is gone once the configurators are loaded, so a
    # child process run under another distro loads its own configurator
    assert done.stdout.splitlines() == ["TracerProvider", "None"], done.stdout
    assert "Configuration of configurator not loaded" in done.stderr  # opentelemetry-instrument says so
    chosen = run_instrumented(
        tmp_path,
        code,
        PYTHONPATH=str(site),
        OTEL_TRACES_EXPORTER="none",
        OTEL_PYTHON_CONFIGURATOR="configurator",
    )
    assert "other configurator ran" in chosen.stdout, chosen.stderr  # the environment's choice stands
    assert chosen.stdout.splitlines()[-1] == "configurator"  # and is left as it was


def test_a_setup_that_fails_leaves_the_environment_as_it_found_it(tmp_path: Path) -> None:
    """An ``OTEL_*`` value an exporter refuses stops ``opentelemetry-instrument`` before the
    ``opentelemetry_pre_instrument`` hook: the variables the distro set must not stay behind
    (a child process run under another distro would load no configurator)."""
    code = (
        "import os\nprint(os.environ.get('OTEL_PYTHON_CONFIGURATOR'), "
        "os.environ.get('OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION'))\n"
    )
    refused = {"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}  # the gRPC exporter raises for it
    done = run_instrumented(tmp_path, code, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", **refused)
    assert done.returncode == 0, done.stderr
    assert "Failed to auto initialize OpenTelemetry" in done.stderr  # opentelemetry-instrument says why
    assert done.stdout.split() == ["None", "None"], done.stdout


def test_a_declarative_configuration_file_the_distro_does_not_read_is_named(tmp_path: Path) -> None:
    """The SDK's configurator builds everything from ``OTEL_CONFIG_FILE`` when it is set; the
    kaos-otel distro configures from the variables, and must not ignore the file in silence."""
    done = run_instrumented(
        tmp_path, "print('ran')\n", OTEL_CONFIG_FILE=str(tmp_path / "otel.yaml"), OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"
    assert f"OTEL_CONFIG_FILE={tmp_path / 'otel.yaml'} is not followed" in done.stderr
